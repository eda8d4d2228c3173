"""The bare `websockets` server of `bench fanout`: the physical limit of the library for the same
fan-out, measured beside ours in the same run.

What a user would write with nothing of ours in it: websockets' asyncio server on uvloop,
compression off, no keepalive pings, the edge's frame size and queue (set up by
`bench.echo_server`, as every bare server of the benchmarks), speaking the frames of our contract
that the fan-out load uses:

- `identify`: the token is verified (HS256, the edge's secret) and the socket is the token's
  account; answered `ready`.
- `presence.subscribe`: the socket watches those accounts (no audience rule, no budget: the least
  such a server would do); answered `presence.sync` (empty: the load does not read it).
- `presence.update`: one `presence.changed` (the account and the status sent) goes to every socket
  watching the account, through `websockets.broadcast`, the library's own way to send one message
  to many sockets without waiting on any. No `presence.self`, no repeat suppression.

Everything else is ignored. A benchmark baseline, never product code. Runs as its own process:

    python -m bench.fanout_server --secret SECRET [--host 127.0.0.1] [--port 0]

prints `listening on PORT pid PID` once it accepts connections; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable

import jwt
import orjson
from websockets.asyncio.connection import broadcast
from websockets.asyncio.server import ServerConnection

from bench.echo_server import arguments, run, serve_until_stopped

READY = orjson.dumps({"type": "ready"}).decode()
SYNC = orjson.dumps({"type": "presence.sync", "users": []}).decode()


def handler(secret: str) -> Callable[[ServerConnection], Awaitable[None]]:
    # account → the sockets watching it
    watchers: dict[str, set[ServerConnection]] = {}

    async def handle(ws: ServerConnection) -> None:
        user: str | None = None
        watching: list[str] = []
        try:
            async for message in ws:
                try:
                    frame = orjson.loads(message)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(frame, dict):
                    continue
                kind = frame.get("type")
                if kind == "presence.update" and user is not None:
                    changed = {"type": "presence.changed", "userId": user, "status": frame.get("status")}
                    broadcast(watchers.get(user, ()), orjson.dumps(changed).decode())
                elif kind == "presence.subscribe":
                    ids = [str(u) for u in frame.get("userIds", [])]
                    for u in ids:
                        watchers.setdefault(u, set()).add(ws)
                    watching += ids
                    await ws.send(SYNC)
                elif kind == "identify" and user is None:
                    try:
                        claims = jwt.decode(str(frame.get("token")), secret, algorithms=["HS256"])
                    except jwt.PyJWTError:
                        await ws.close(4001, "bad token")
                        return
                    user = str(claims["sub"])
                    await ws.send(READY)
        finally:
            for u in watching:
                watchers.get(u, set()).discard(ws)

    return handle


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = arguments("python -m bench.fanout_server", __doc__)
    p.add_argument("--secret", required=True, help="the key the load's tokens are signed with")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    run(serve_until_stopped(handler(args.secret), args.host, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
