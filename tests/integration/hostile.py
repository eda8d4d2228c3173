"""Helpers for hostile-input and fault tests: a raw websocket client that can stop reading, and
counters of what reached the actors."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import struct
from typing import Any

from actors.clients import DirectoryClient, ShardClient
from edge.server import Edge


def ops_sent(edge: Edge) -> float:
    """Operations this edge has sent to any shard (the router counts every batch it sends)."""
    summary = edge.metrics.summaries.get(("edge_batch_ops", ()))
    return summary[1] if summary else 0.0


async def shard_ops(op: str) -> float:
    """`shard_ops_total{op=…}` summed over every shard of the pool."""
    _, _, count = await DirectoryClient().get_map()
    total = 0.0
    for i in range(count):
        stats = await ShardClient(i).stats(timeout_s=5)
        for name, labels, value in stats.metrics["counters"]:
            if name == "shard_ops_total" and dict(labels).get("op") == op:
                total += value
    return total


def ws_frame(payload: bytes, opcode: int = 0x1) -> bytes:
    """One masked client frame (RFC 6455 §5.2)."""
    mask = os.urandom(4)
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + masked


class RawClient:
    """A websocket client on a bare TCP socket: it reads the upgrade answer and then only what it
    is told to, so a test can make it stop reading altogether (a tiny receive buffer makes the
    server's output back up quickly)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(
        cls, port: int, headers: dict[str, str] | None = None, rcvbuf: int | None = None
    ) -> RawClient:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
        key = base64.b64encode(os.urandom(16)).decode()
        lines = [
            "GET /ws/presence HTTP/1.1",
            f"Host: 127.0.0.1:{port}",
            "Upgrade: websocket",
            "Connection: Upgrade",
            f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            *(f"{k}: {v}" for k, v in (headers or {}).items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert answer.startswith(b"HTTP/1.1 101"), answer
        return cls(reader, writer)

    def stop_reading(self) -> None:
        """Read nothing more, not even into this process's stream buffer (which would otherwise
        take up to twice its 64 KiB limit off the socket): only the kernel's buffers are left."""
        self.writer.transport.pause_reading()

    async def send(self, payload: bytes | str, opcode: int = 0x1) -> None:
        self.writer.write(ws_frame(payload.encode() if isinstance(payload, str) else payload, opcode))
        await self.writer.drain()

    async def wait_reset(self, timeout: float) -> Any:
        """Wait until the server drops the connection (a write or a read fails)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if self.writer.is_closing() or self.reader.at_eof():
                return True
            try:
                await self.send(b'{"type":"heartbeat"}')
            except (ConnectionError, OSError):
                return True
            # The polling interval of the probe (a reset has no event here but a failed write).
            await asyncio.sleep(0.2)
        return False

    def close(self) -> None:
        self.writer.transport.abort()
