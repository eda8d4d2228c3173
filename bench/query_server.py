"""The baseline a user would deploy instead of ours for `presence.query`: a bare `websockets`
server that answers the same frames from the seed's Redis TTL design (`presence:<id>` keys kept
alive by `SET … EX 30` heartbeats, bench.baselines_redis), with one pipelined `EXISTS` per query.

Configured as the edge configures its server (websockets' asyncio server on uvloop, compression
off, no keepalive pings, the same frame size and queue; see bench.echo_server), with redis-py's
asyncio client and its connection pool. For each `{"type":"presence.query","userIds":[…]}` it
answers one `presence.changed` per id (`online` when the key exists, else `offline`), the same
frames ours sends, written in one go as our edge writes a query's answers (`send_batch`), so the
two differ in where the answer comes from, not in how it is framed. No authentication, audience
or budget: the least such a server would do. Anything else is ignored.

A benchmark baseline, never product code. Runs as its own process:

    python -m bench.query_server --redis-url URL [--host 127.0.0.1] [--port 0]

prints `listening on PORT pid PID` once it accepts connections; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable

import orjson
import redis.asyncio as redis
from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

from bench.echo_server import arguments, run, serve_until_stopped


def answers(ids: list[str], flags: list[int]) -> list[bytes]:
    """One `presence.changed` per id, in the order asked."""
    return [
        orjson.dumps({"type": "presence.changed", "userId": u, "status": "online" if f else "offline"})
        for u, f in zip(ids, flags, strict=True)
    ]


def _send_all(ws: ServerConnection, texts: list[bytes]) -> None:
    """Several text frames in one write (what edge.outbound.send_batch does)."""
    if ws.protocol.state is not State.OPEN or ws.transport is None:
        return
    for text in texts:
        ws.protocol.send_text(text)
    ws.transport.writelines([chunk for chunk in ws.protocol.data_to_send() if chunk])


def handler(client: redis.Redis) -> Callable[[ServerConnection], Awaitable[None]]:
    async def handle(ws: ServerConnection) -> None:
        async for message in ws:
            try:
                frame = orjson.loads(message)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(frame, dict) or frame.get("type") != "presence.query":
                continue
            ids = [str(u) for u in frame.get("userIds", [])][:100]
            pipe = client.pipeline(transaction=False)
            for uid in ids:
                pipe.exists(f"presence:{uid}")
            flags = await pipe.execute()
            _send_all(ws, answers(ids, flags))

    return handle


async def serve_forever(host: str, port: int, redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    await client.ping()
    try:
        await serve_until_stopped(handler(client), host, port)
    finally:
        await client.aclose()


def main(argv: list[str] | None = None) -> int:
    p = arguments("python -m bench.query_server", __doc__)
    p.add_argument("--redis-url", required=True)
    args = p.parse_args(argv)
    run(serve_forever(args.host, args.port, args.redis_url))
    return 0


if __name__ == "__main__":
    sys.exit(main())
