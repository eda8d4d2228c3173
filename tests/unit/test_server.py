"""edge/server.py's public sockets before anything reaches a shard: an `Edge` built but not
started (no Ray, no router), its connections served on a free port, and raw clients that send
exactly the bytes a test wants (what websockets' own client would never send)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from websockets.frames import Frame, Opcode

from edge import transport
from edge.server import Edge, EdgeConfig, forwarded_ip
from edge.session import Limits
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


class Raw:
    """A raw client's socket and what it read past the upgrade answer's head."""

    def __init__(self, sock: socket.socket, head: bytes, rest: bytes) -> None:
        self.sock, self.head, self.rest = sock, head, rest

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


def upgrade(port: int, headers: tuple[str, ...] = ()) -> Raw:
    """A raw client past its upgrade request."""
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
    head, _, rest = answer.partition(b"\r\n\r\n")
    return Raw(raw, head, rest)


def close_code(raw: Raw) -> int | None:
    """Read the server's frames up to its close frame: its code (None: the connection ended
    without one)."""
    buffer, raw.rest = raw.rest, b""
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
            chunk = raw.sock.recv(65536)
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
        raw = await asyncio.to_thread(upgrade, port)
        try:
            assert raw.head.startswith(b"HTTP/1.1 101")
            await until(lambda: len(edge.conns) == 1)
            first = Frame(Opcode.TEXT, b"{", fin=False).serialize(mask=True)
            empty = Frame(Opcode.CONT, b"", fin=False).serialize(mask=True)
            await asyncio.to_thread(raw.sendall, first + empty * 1_000)
            assert await asyncio.to_thread(close_code, raw) == 1008
            assert edge.metrics.counters[("closes_total", (("code", "1008"),))] == 1  # once
        finally:
            raw.close()


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


async def test_two_authorization_headers_close_4001_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`headers.get` raises on a repeated header: the upgrade was answered 101, then the edge's
    callback raised and asyncio logged a fatal error with its traceback, twice per connection,
    for anybody who can connect (a log flood, no token needed). As on the internal port (401),
    two `Authorization` lines are a refused token."""
    caplog.set_level("WARNING")
    async with serving() as (edge, port):
        raw = await asyncio.to_thread(
            upgrade, port, ("Authorization: Bearer one", "Authorization: Bearer two")
        )
        try:
            assert raw.head.startswith(b"HTTP/1.1 101")
            assert await asyncio.to_thread(close_code, raw) == 4001
            raw.close()
            await until(lambda: not edge.conns)
            assert _errors(caplog) == []
            assert edge.admission.by_ip == {} and edge.admission.handshakes == {}
        finally:
            raw.close()


async def test_behind_a_proxy_the_last_line_of_its_header_names_the_client(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """HAProxy's `option forwardfor` adds a line of its own after the client's: two lines of the
    header raised while the upgrade was checked (a 500 and a traceback for every such client,
    a client sending the header itself was enough). The last entry of the last line counts, the
    one the proxy added; the client's own are never taken."""
    caplog.set_level("WARNING")
    async with serving(client_ip_header="X-Forwarded-For") as (edge, port):
        lines = ("X-Forwarded-For: 6.6.6.6", "X-Forwarded-For: 10.0.0.1, 192.0.2.7")
        raw = await asyncio.to_thread(upgrade, port, lines)
        try:
            assert raw.head.startswith(b"HTTP/1.1 101")
            await until(lambda: len(edge.conns) == 1)
            assert edge.admission.by_ip == {"192.0.2.7": 1}
            assert edge.admission.handshakes == {"192.0.2.7": 1}  # opening until it identifies
            assert _errors(caplog) == []
        finally:
            raw.close()


@pytest.mark.parametrize(
    ("lines", "ip"),
    [
        ([], None),
        (["1.2.3.4"], "1.2.3.4"),
        (["6.6.6.6, 1.2.3.4"], "1.2.3.4"),
        (["6.6.6.6", "1.2.3.4 "], "1.2.3.4"),
        (["1.2.3.4", ""], None),  # the proxy's line empty: never a client's line instead
    ],
)
def test_forwarded_ip(lines: list[str], ip: str | None) -> None:
    assert forwarded_ip(lines) == ip


async def test_a_stranger_s_frames_behind_a_refused_first_one_are_not_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No token: a first frame that is no identify, and 2 MiB of empty frames behind it in the
    same write. The edge parsed all of it, the rest of the read at once and then whatever came
    for the whole close timeout (`presence up`: 10 connections of 2 MiB, 27 s of the edge's
    CPU). The rest waits unparsed while the close is carried out, and the closing socket reads
    at most `CLOSING_FRAMES` more, then is dropped."""
    monkeypatch.setattr(transport, "CLOSE_TIMEOUT_S", 60.0)
    async with serving() as (edge, port):
        raw = await asyncio.to_thread(upgrade, port)
        try:
            await until(lambda: len(edge.conns) == 1)
            (conn,) = edge.conns.values()
            parsed = [0]
            receive = conn.ws.protocol.receive_data

            def counting(data: bytes) -> None:
                parsed[0] += len(data)
                receive(data)

            conn.ws.protocol.receive_data = counting  # type: ignore[method-assign]
            empty = Frame(Opcode.BINARY, b"").serialize(mask=True)
            flood = Frame(Opcode.TEXT, b"hello").serialize(mask=True) + empty * 350_000
            sending = asyncio.create_task(asyncio.to_thread(_send_until_refused, raw, flood))
            assert await asyncio.to_thread(close_code, raw) == 4001
            await until(lambda: conn.ws.lost)
            await sending
            assert parsed[0] <= 3 * transport.READ_SLICE_BYTES + (transport.CLOSING_FRAMES + 1) * len(empty)
        finally:
            raw.close()


def _send_until_refused(raw: Raw, data: bytes) -> None:
    with contextlib.suppress(OSError):
        raw.sendall(data)


async def test_the_opening_gate_s_places_follow_the_event_loop_s_lateness() -> None:
    """edge/opening.py `OpeningPace`, as the edge runs it (`_pace_loop`): the places start at
    `min_opening` and double while connections wait and the loop keeps time (the waiting ones
    then open), up to `max_opening`; a late loop halves them, and they grow again by a quarter
    while the line waits; once nothing is opening they are back at the floor. The lateness here
    is a blocked loop (0.6 s, past a 0.25 s limit that a loaded machine's timers do not reach by
    themselves)."""
    limits = Limits(
        min_opening=1, max_opening=4, opening_lag_s=0.25, opening_queue_s=60.0, identify_timeout_s=60.0
    )
    async with serving(limits=limits) as (edge, port):
        assert edge.opening.limit == 1
        seen: list[int] = []
        set_limit = edge._set_opening_limit

        def recording(limit: int) -> None:
            seen.append(limit)
            set_limit(limit)

        edge._set_opening_limit = recording  # type: ignore[method-assign]
        pacing = asyncio.create_task(edge._pace_loop())
        raws = [await asyncio.to_thread(socket.create_connection, ("127.0.0.1", port)) for _ in range(6)]
        try:
            # Six connections that never identify: one opens, the line makes the places grow.
            await until(lambda: len(edge.opening.active) == 4 and len(edge.opening.waiting) == 2)
            assert list(dict.fromkeys(seen)) == [1, 2, 4]  # at rest, then doubled (slow start)
            assert edge.metrics.gauges[("opening_limit", ())] == 4
            before = len(seen)
            time.sleep(0.6)  # the loop blocked: lateness to react to, not a wait for something
            await until(lambda: len(seen) > before + 1)
            # Halved, then a quarter more (at least one): the line still waits.
            assert seen[before : before + 2] == [2, 3]
            assert len(edge.opening.active) == 4  # the open ones stay open
        finally:
            for raw in raws:
                raw.close()
        await until(lambda: not edge.opening.active and not edge.opening.waiting and edge.opening.limit == 1)
        pacing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pacing
