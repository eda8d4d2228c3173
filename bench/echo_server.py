"""The bare `websockets` echo server: the ceiling the edge is measured against.

It is what a websocket server costs with nothing of ours in it, configured as our edge configures
its own server (`edge.server.Edge.start`): websockets' asyncio server on uvloop, compression off,
no keepalive pings, the same maximum frame size and incoming queue. Every text or binary message
is sent straight back.

With `--sansio`, the floor instead: the same echo on websockets' sans-I/O protocol over uvloop's
transports (`edge.transport.Socket`, which the edge is built on), with nothing else of ours: what
the library and the event loop cost by themselves, the least an edge could cost.

Runs as its own process, so that its CPU and memory are its own:

    python -m bench.echo_server [--host 127.0.0.1] [--port 0] [--sansio]

prints `listening on PORT pid PID` once it accepts connections, and stops on SIGTERM or SIGINT.
The other bare servers of the benchmarks (`bench.query_server`, `bench.fanout_server`) are set up
by the helpers here (`arguments`, `serve_until_stopped`, `run`), so that all of them are
configured alike.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from websockets.asyncio.server import ServerConnection, serve

from edge.transport import Socket
from edge.transport import serve as serve_sockets

# The edge's settings (edge/server.py, EdgeConfig.max_frame_bytes, .listen_backlog and `serve(...)`).
MAX_FRAME_BYTES = 16 * 1024
MAX_QUEUE = 16
LISTEN_BACKLOG = 100

Handler = Callable[[ServerConnection], Awaitable[None]]


async def echo(ws: ServerConnection) -> None:
    async for message in ws:
        await ws.send(message)


async def listening_until_stopped(port: int) -> None:
    """Print `listening on PORT pid PID` once a server accepts connections on `port` (what
    `bench.loadgen.ServerProcess` waits for), then wait for SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"listening on {port} pid {os.getpid()}", flush=True)
    await stop.wait()


async def serve_until_stopped(handler: Handler, host: str, port: int) -> None:
    """Serve `handler` with the edge's settings until SIGINT or SIGTERM (`listening_until_stopped`)."""
    async with serve(
        handler,
        host,
        port,
        compression=None,
        ping_interval=None,
        max_size=MAX_FRAME_BYTES,
        max_queue=MAX_QUEUE,
        backlog=LISTEN_BACKLOG,
    ) as server:
        await listening_until_stopped(server.sockets[0].getsockname()[1])


class EchoSocket(Socket):
    """The floor: every message sent straight back, on the edge's transport with nothing of ours."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(max_size=MAX_FRAME_BYTES)

    def on_message(self, message: str | bytes) -> None:
        if isinstance(message, str):
            self.send_text(message)
        else:
            self.protocol.send_binary(message)
            self.writelines(self.protocol.data_to_send())

    def on_slow(self) -> None:
        self.abort()


async def serve_sansio_until_stopped(host: str, port: int) -> None:
    """`EchoSocket` with the edge's listen backlog, until SIGINT or SIGTERM (as `serve_until_stopped`)."""
    server = await serve_sockets(EchoSocket, host, port, LISTEN_BACKLOG)
    await listening_until_stopped(server.sockets[0].getsockname()[1])
    server.close()


def arguments(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The options every bare server takes (`--host`, `--port`)."""
    p = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    return p


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run a server's main coroutine on uvloop, as the edge runs (asyncio's loop without it)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency wherever the edge runs
        asyncio.run(main)
    else:
        uvloop.run(main)


def main(argv: list[str] | None = None) -> int:
    p = arguments("python -m bench.echo_server", __doc__)
    p.add_argument(
        "--sansio", action="store_true", help="the floor: websockets' sans-I/O protocol, no asyncio layer"
    )
    args = p.parse_args(argv)
    run(
        serve_sansio_until_stopped(args.host, args.port)
        if args.sansio
        else serve_until_stopped(echo, args.host, args.port)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
