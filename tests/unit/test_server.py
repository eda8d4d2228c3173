"""edge/server.py's public sockets before anything reaches a shard: an `Edge` built but not
started (no Ray, no router), its connections served on a free port, and raw clients that send
exactly the bytes a test wants (what websockets' own client would never send)."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from websockets.frames import Frame, Opcode

from edge.server import Edge, EdgeConfig
from edge.transport import serve

SECRET = "server-unit-test-secret-of-at-least-32-bytes"


@asynccontextmanager
async def serving(**config: object) -> AsyncIterator[tuple[Edge, int]]:
    """An edge's public connections on a free port (the edge itself never starts)."""
    edge = Edge(EdgeConfig(secret=SECRET, redis_url=None, **config))  # type: ignore[arg-type]
    listener = await serve(edge._new_connection, "127.0.0.1", 0)
    try:
        yield edge, int(listener.sockets[0].getsockname()[1])
    finally:
        listener.close()
        for conn in list(edge.conns.values()):
            conn.ws.abort()


def upgrade(port: int, headers: tuple[str, ...] = ()) -> tuple[socket.socket, bytes]:
    """A raw client past its upgrade request: the socket and the answer's head."""
    raw = socket.create_connection(("127.0.0.1", port))
    raw.settimeout(10)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        "GET /ws/presence HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *headers,
    ]
    raw.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = raw.recv(4096)
        if not chunk:
            break
        answer += chunk
    return raw, answer


def close_code(raw: socket.socket) -> int | None:
    """Read the server's frames up to its close frame: its code (None: the connection ended
    without one)."""
    buffer = b""
    while True:
        while len(buffer) >= 2:
            opcode, length = buffer[0] & 0x0F, buffer[1] & 0x7F
            start = 2
            if length == 126:
                (length,), start = struct.unpack("!H", buffer[2:4]), 4
            elif length == 127:
                (length,), start = struct.unpack("!Q", buffer[2:10]), 10
            if len(buffer) < start + length:
                break
            if opcode == Opcode.CLOSE.value:
                return int(struct.unpack("!H", buffer[start : start + 2])[0])
            buffer = buffer[start + length :]
        try:
            chunk = raw.recv(65536)
        except ConnectionResetError:
            return None
        if not chunk:
            return None
        buffer += chunk


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.01)


async def test_empty_continuation_frames_are_charged_and_a_stream_of_them_closed_1008() -> None:
    """A message begun and never finished, its continuation frames empty: websockets' size limit
    never trips, no message ever reaches the session, so nothing counted them. One socket kept
    the edge's one core busy (39 s of CPU in 41 s against `presence up`) and was never closed.
    Each fragment is a frame for the flood bucket now, and such a stream is a flood."""
    async with serving() as (edge, port):
        raw, answer = await asyncio.to_thread(upgrade, port)
        try:
            assert answer.startswith(b"HTTP/1.1 101")
            await until(lambda: len(edge.conns) == 1)
            first = Frame(Opcode.TEXT, b"{", fin=False).serialize(mask=True)
            empty = Frame(Opcode.CONT, b"", fin=False).serialize(mask=True)
            await asyncio.to_thread(raw.sendall, first + empty * 1_000)
            assert await asyncio.to_thread(close_code, raw) == 1008
            assert edge.metrics.counters[("closes_total", (("code", "1008"),))] == 1  # once
        finally:
            raw.close()
