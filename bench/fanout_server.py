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

    python -m bench.fanout_server --secret SECRET [--owners PORT,PORT…] [--host 127.0.0.1] [--port 0]

prints `listening on PORT pid PID` once it accepts connections; stops on SIGTERM or SIGINT.

**The relay floor.** Our design puts a separate process (a shard) between a status change and
its fan-out: the edge asks the account's owner, the owner answers, the edge delivers. What that
hop alone costs, with nothing of ours in it, is measured on this same server: given `--owners`,
it connects to those owner processes (`python -m bench.fanout_server --owner`, one per shard of
ours, each an echo of newline-framed JSON on uvloop), and from SIGUSR1 on each `presence.update`
goes to its account's owner first (one write, unbatched, the fastest such a road can answer) and
is broadcast when the owner's answer comes back. `bench fanout` runs a window of it after the
bare server's on the same sockets, and reports it beside both (bench/profiles/README.md, "The
relay floor").
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import zlib
from collections.abc import Awaitable, Callable
from typing import cast

import jwt
import orjson
from websockets.asyncio.connection import broadcast
from websockets.asyncio.server import ServerConnection

from bench.echo_server import arguments, listening_until_stopped, run, serve_until_stopped

READY = orjson.dumps({"type": "ready"}).decode()
SYNC = orjson.dumps({"type": "presence.sync", "users": []}).decode()


class _Lines(asyncio.Protocol):
    """Newline-framed messages on a TCP connection, each handed to `on_line`."""

    def __init__(self, on_line: Callable[[asyncio.Transport, bytes], None]) -> None:
        self.on_line = on_line
        self.transport: asyncio.Transport | None = None
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass of it

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        for line in lines:
            self.on_line(self.transport, line)


def _own(statuses: dict[str, object], transport: asyncio.Transport, line: bytes) -> None:
    """An owner's whole work: note the account's status, answer with the change."""
    user, status = orjson.loads(line)
    statuses[user] = status
    transport.write(line + b"\n")


async def serve_owner_until_stopped(host: str, port: int) -> None:
    """An owner process of the relay floor, until SIGINT or SIGTERM."""
    statuses: dict[str, object] = {}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Lines(lambda t, line: _own(statuses, t, line)), host, port)
    await listening_until_stopped(server.sockets[0].getsockname()[1])
    server.close()


class Relay:
    """The bare server's road through the owners (the relay floor), once switched on."""

    def __init__(self, watchers: dict[str, set[ServerConnection]]) -> None:
        self.watchers = watchers
        self.owners: list[asyncio.Transport] = []
        self.on = False

    async def connect(self, host: str, ports: list[int]) -> None:
        loop = asyncio.get_running_loop()
        for port in ports:
            transport, _ = await loop.create_connection(lambda: _Lines(self._answered), host, port)
            self.owners.append(transport)
        loop.add_signal_handler(signal.SIGUSR1, self._switch_on)

    def _switch_on(self) -> None:
        self.on = bool(self.owners)
        print("relay on" if self.on else "relay off: no owners", flush=True)

    def send(self, user: str, status: object) -> None:
        owner = self.owners[zlib.crc32(user.encode()) % len(self.owners)]
        owner.write(orjson.dumps([user, status]) + b"\n")

    def _answered(self, _transport: asyncio.Transport, line: bytes) -> None:
        user, status = orjson.loads(line)
        changed = {"type": "presence.changed", "userId": user, "status": status}
        broadcast(self.watchers.get(user, ()), orjson.dumps(changed).decode())


def handler(secret: str, relay: Relay | None = None) -> Callable[[ServerConnection], Awaitable[None]]:
    # account → the sockets watching it
    watchers: dict[str, set[ServerConnection]] = relay.watchers if relay is not None else {}

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
                if kind == "presence.update" and user is not None and relay is not None and relay.on:
                    relay.send(user, frame.get("status"))
                elif kind == "presence.update" and user is not None:
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
    p.add_argument("--secret", help="the key the load's tokens are signed with")
    p.add_argument(
        "--owners", default="", help="owner processes' ports (comma-separated) for the relay floor"
    )
    p.add_argument("--owner", action="store_true", help="run as an owner process of the relay floor")
    args = p.parse_args(argv)
    if not args.owner and not args.secret:
        p.error("--secret is required (except with --owner)")
    return args


async def _serve(args: argparse.Namespace) -> None:
    relay = Relay({})
    await relay.connect(args.host, [int(port) for port in args.owners.split(",") if port])
    await serve_until_stopped(handler(args.secret, relay), args.host, args.port)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    run(serve_owner_until_stopped(args.host, args.port) if args.owner else _serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
