"""edge.transport (websockets' sans-I/O protocol on asyncio transports) and edge.outbound, over real
sockets on localhost with websockets' own asyncio client (no Ray: nothing here needs it)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gc
import os
import socket
import struct
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.frames import Frame, Opcode
from websockets.http11 import SERVER, Request, Response
from websockets.server import ServerProtocol

from edge import transport
from edge.http import json_response
from edge.outbound import fan_out, prepare, send_batch
from edge.transport import Socket, serve


class Recorder(Socket):
    """Records what happens to it; `refuse` answers the upgrade with a 404, `pause_on` pauses
    after a message of that text (the test resumes it)."""

    __slots__ = ("events", "messages", "pause_on", "refuse", "requests")

    def __init__(self, write_limit: int = 1 << 20) -> None:
        super().__init__(max_size=1024, write_limit=write_limit)
        self.events: list[str] = []
        self.messages: list[str | bytes] = []
        self.refuse = False
        self.pause_on: str | None = None
        self.requests: list[weakref.ref[Request]] = []

    def on_request(self, request: Request) -> Response | None:
        self.events.append(f"request {request.path}")
        self.requests.append(weakref.ref(request))
        return json_response(None, 404, {"error": "nothing here"}) if self.refuse else None

    def on_open(self) -> None:
        assert self.request is not None  # still there for the edge to read its headers
        self.events.append("open")

    def on_message(self, message: str | bytes) -> None:
        self.messages.append(message)
        if message == self.pause_on:
            self.pause()

    def on_close(self) -> None:
        self.events.append("close")

    def on_control(self) -> None:
        self.events.append("control")

    def on_fragment(self) -> None:
        self.events.append("fragment")

    def on_slow(self) -> None:
        self.events.append("slow")
        self.abort()

    def on_refused(self, code: int) -> None:
        self.events.append(f"refused {code}")


class Server:
    def __init__(self, make: Callable[[], Recorder]) -> None:
        self.sockets: list[Recorder] = []
        self.arrived = asyncio.Condition()
        self.make = make
        self.port = 0

    def factory(self) -> Recorder:
        s = self.make()
        self.sockets.append(s)
        return s

    async def until(self, check: Callable[[], bool], timeout: float = 5.0) -> None:
        async def wait() -> None:
            while not check():
                await asyncio.sleep(0.01)

        await asyncio.wait_for(wait(), timeout)


@asynccontextmanager
async def _server(make: Callable[[], Recorder] = Recorder) -> AsyncIterator[Server]:
    s = Server(make)
    listener = await serve(s.factory, "127.0.0.1", 0)
    s.port = listener.sockets[0].getsockname()[1]
    try:
        yield s
    finally:
        listener.close()
        for sock in s.sockets:
            sock.abort()


async def _client(s: Server, path: str = "/ws", **kw: Any) -> ClientConnection:
    return await connect(f"ws://127.0.0.1:{s.port}{path}", **kw)


async def _recv(c: ClientConnection) -> Any:
    return await asyncio.wait_for(c.recv(), 5)


async def test_a_socket_opens_hands_over_text_and_binary_in_order_and_answers_pings() -> None:
    async with _server() as s:
        c = await _client(s, "/ws/presence?v=1")
        sock = s.sockets[0]
        await c.send("héllo")
        await c.send(b"\x00\x01")
        pong = await c.ping()
        await asyncio.wait_for(pong, 5)
        await s.until(lambda: len(sock.messages) == 2)
        assert sock.messages == ["héllo", b"\x00\x01"]
        assert sock.events == ["request /ws/presence?v=1", "open", "control"]
        assert sock.request is None  # dropped once open: a socket keeps no headers
        assert sock.open and sock.remote_address is not None
        await c.close()
        await s.until(lambda: sock.lost)
        assert sock.events[-1] == "close" and sock.events.count("close") == 1
        assert sock.closed_by_client  # its close frame: it was there to end it


async def test_pings_and_pongs_are_told_to_the_socket_and_pings_answered() -> None:
    async with _server() as s:
        c = await _client(s, ping_interval=None)
        sock = s.sockets[0]
        await asyncio.wait_for(await c.ping(b"one"), 5)  # answered by websockets' pong
        await c.pong(b"unsolicited")
        await c.send("after")
        await s.until(lambda: sock.messages == ["after"])
        assert sock.events == ["request /ws", "open", "control", "control"]
        await c.close()


async def test_a_client_that_closes_is_answered_and_nothing_is_told_refused() -> None:
    async with _server() as s:
        c = await _client(s)
        sock = s.sockets[0]
        await c.close(1000, "bye")
        await s.until(lambda: sock.lost)
        assert sock.closed_by_client
        assert sock.events[1:] == ["open", "close"]


@pytest.mark.parametrize("how", ["reset", "end of stream"])
async def test_a_connection_that_ends_without_a_close_frame_was_not_closed_by_its_client(how: str) -> None:
    """A balancer's side closed (its FIN, or a reset answering a write): the edge cannot tell when
    its client went, so `Edge._closed` does not take the moment it noticed for the departure when
    the edge was cut off meanwhile (edge/conn.py `Conn.lost`)."""
    async with _server() as s:
        raw = await asyncio.to_thread(_raw_upgrade, s.port)
        sock = s.sockets[0]
        await s.until(lambda: sock.open)
        if how == "reset":
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
        raw.close()
        await s.until(lambda: sock.lost)
        assert not sock.closed_by_client


async def test_a_refused_upgrade_gets_the_answer_and_never_opens() -> None:
    def refusing() -> Recorder:
        r = Recorder()
        r.refuse = True
        return r

    async with _server(refusing) as s:
        with pytest.raises(InvalidStatus) as e:
            await _client(s)
        assert e.value.response.status_code == 404
        sock = s.sockets[0]
        await s.until(lambda: sock.lost)
        assert sock.events == ["request /ws", "close"]


async def test_fragments_are_joined_and_a_message_too_big_closes_1009() -> None:
    async with _server() as s:
        c = await _client(s)
        sock = s.sockets[0]
        await c.send(["ab", "c", "dé"])  # one message in three frames
        await s.until(lambda: len(sock.messages) == 1)
        assert sock.messages == ["abcdé"]
        await c.send("x" * 2000)  # over max_size (1024)
        with pytest.raises(ConnectionClosed):
            await _recv(c)
        assert c.close_code == 1009
        assert sock.events.count("refused 1009") == 1  # told, for the edge's count of closes


async def test_each_fragment_before_the_last_is_told_and_no_empty_one_is_kept() -> None:
    """websockets bounds a fragmented message's bytes (`max_size`), not its frames: a client may
    send empty continuation frames for ever without finishing its message. Each is told
    (`on_fragment`: the edge charges it to the flood bucket), and none is kept: a list grew by
    one entry a frame, and nothing ever closed such a socket."""
    async with _server() as s:
        raw = await asyncio.to_thread(_raw_upgrade, s.port)
        try:
            sock = s.sockets[0]
            await s.until(lambda: sock.open)
            empty = Frame(Opcode.CONT, b"", fin=False).serialize(mask=True)
            first = Frame(Opcode.TEXT, b"a", fin=False).serialize(mask=True)
            await asyncio.to_thread(raw.sendall, first + empty * 5_000)
            await s.until(lambda: sock.events.count("fragment") == 5_001)
            assert sock._fragments is not None and len(sock._fragments) <= 2  # its kind, "a"
            assert sock.messages == []
            await asyncio.to_thread(raw.sendall, Frame(Opcode.CONT, b"b").serialize(mask=True))
            await s.until(lambda: sock.messages == ["ab"])
            assert sock.events.count("fragment") == 5_001  # the last one is the message
        finally:
            raw.close()


class ClosingOnControl(Recorder):
    """Closes its socket at the first ping, as the edge closes a ping flood."""

    __slots__ = ()

    def on_control(self) -> None:
        super().on_control()
        self.close(1008, "sustained flood")


async def test_a_close_of_the_socket_s_own_is_not_told_as_websockets_refusal() -> None:
    """`on_refused` is for what websockets closed by itself: a subclass's own close from a
    handler of the same read (the edge's 1008 for a ping flood) was told too, and counted twice
    in `presence_closes_total`."""
    async with _server(ClosingOnControl) as s:
        c = await _client(s, ping_interval=None)
        sock = s.sockets[0]
        await c.ping()
        with pytest.raises(ConnectionClosed):
            await _recv(c)
        assert c.close_code == 1008
        await s.until(lambda: sock.lost)
        assert not [e for e in sock.events if e.startswith("refused")]


@pytest.mark.parametrize("fragmented", [False, True], ids=["one-frame", "fragmented"])
async def test_a_text_frame_that_is_not_utf8_closes_1007(fragmented: bool) -> None:
    async with _server() as s:
        c = await _client(s)
        await c.send([b"\xff", b"\xfe"] if fragmented else b"\xff\xfe", text=True)
        with pytest.raises(ConnectionClosed):
            await _recv(c)
        assert c.close_code == 1007
        assert s.sockets[0].messages == []
        assert s.sockets[0].events.count("refused 1007") == 1


async def test_messages_after_a_pause_wait_in_order_until_resume() -> None:
    def pausing() -> Recorder:
        r = Recorder()
        r.pause_on = "wait"
        return r

    async with _server(pausing) as s:
        c = await _client(s)
        sock = s.sockets[0]
        for m in ("wait", "1", "2", "wait", "3"):
            await c.send(m)
        await s.until(lambda: len(sock.messages) == 1)
        await asyncio.sleep(0.05)  # the others arrive meanwhile, and are held
        assert sock.messages == ["wait"]
        sock.resume()
        assert sock.messages == ["wait", "1", "2", "wait"]  # paused again by the second
        sock.resume()
        await s.until(lambda: len(sock.messages) == 5)
        assert sock.messages == ["wait", "1", "2", "wait", "3"]
        await c.send("4")  # reading went on
        await s.until(lambda: len(sock.messages) == 6)


def _count_parsed(sock: Socket) -> list[int]:
    """The bytes of this socket handed to websockets' parser from now on (one total, updated)."""
    parsed = [0]
    receive = sock.protocol.receive_data

    def counting(data: bytes) -> None:
        parsed[0] += len(data)
        receive(data)

    sock.protocol.receive_data = counting  # type: ignore[method-assign]
    return parsed


async def test_a_paused_socket_parses_nothing_more_of_its_read_until_resumed() -> None:
    """A read was parsed whole before its first frame was handled: a client's 256 KiB of tiny
    frames behind one that pauses the socket (its identify, waiting on a shard) cost the edge
    40,000 frames' parsing at once. The rest of the read now waits unparsed, in order."""

    def pausing() -> Recorder:
        r = Recorder()
        r.pause_on = "wait"
        return r

    async with _server(pausing) as s:
        raw = await asyncio.to_thread(_raw_upgrade, s.port)
        try:
            sock = s.sockets[0]
            await s.until(lambda: sock.open)
            parsed = _count_parsed(sock)
            frames = b"".join(_masked(m) for m in ["wait", *map(str, range(5_000))])
            await asyncio.to_thread(raw.sendall, frames)
            await s.until(lambda: sock.messages == ["wait"])
            await asyncio.sleep(0.05)
            assert parsed[0] <= transport.READ_SLICE_BYTES < len(frames)
            sock.resume()
            await s.until(lambda: len(sock.messages) == 5_001)
            assert sock.messages == ["wait", *map(str, range(5_000))]
            assert parsed[0] == len(frames)
        finally:
            raw.close()


def _send_until_refused(raw: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):
        raw.sendall(data)


async def test_a_socket_closed_by_this_side_reads_a_bounded_number_of_frames_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After its close frame a socket waits for the client's, and read everything the client sent
    meanwhile for the whole close timeout: a client closed at its first frame (4001, no token
    needed) and streaming empty frames had the edge parse 4 million of them in 26 s, 24 s of
    its CPU, over two connections. Past `CLOSING_FRAMES` the connection is dropped."""
    monkeypatch.setattr(transport, "CLOSE_TIMEOUT_S", 60.0)
    async with _server() as s:
        raw = await asyncio.to_thread(_raw_upgrade, s.port)
        try:
            sock = s.sockets[0]
            await s.until(lambda: sock.open)
            sock.close(4001, "no")
            parsed = _count_parsed(sock)
            empty = Frame(Opcode.BINARY, b"").serialize(mask=True)
            sending = asyncio.create_task(asyncio.to_thread(_send_until_refused, raw, empty * 200_000))
            await s.until(lambda: sock.lost)
            await sending
            bound = (transport.CLOSING_FRAMES + 1) * len(empty) + transport.READ_SLICE_BYTES
            assert parsed[0] <= bound
            assert sock.messages == []
        finally:
            raw.close()


async def test_close_sends_the_code_and_reason_and_drops_what_arrives_after() -> None:
    async with _server() as s:
        c = await _client(s)
        sock = s.sockets[0]
        sock.close(4001, "no")
        assert not sock.open
        await c.send("late")  # may or may not leave before the close frame is read
        with pytest.raises(ConnectionClosed):
            await _recv(c)
        assert (c.close_code, c.close_reason) == (4001, "no")
        await s.until(lambda: sock.lost)
        assert sock.closed_by_client  # it answered the close
        assert sock.messages == [] and sock.events.count("close") == 1
        assert not [e for e in sock.events if e.startswith("refused")]  # its own close, not one
        assert not sock.send_text("gone") and not sock.write(prepare("gone"))


def _upgrade_request(port: int) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nX-Padding: {'p' * 2000}\r\n\r\n"
    ).encode()


def _raw_upgrade(port: int, then: bytes = b"") -> socket.socket:
    """A client socket past the handshake (`then` sent in the same write as the request), that
    reads nothing more unless told."""
    raw = socket.create_connection(("127.0.0.1", port))
    raw.sendall(_upgrade_request(port) + then)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += raw.recv(4096)
    assert answer.startswith(b"HTTP/1.1 101")
    return raw


async def test_a_client_that_does_not_read_is_reported_slow() -> None:
    async with _server(lambda: Recorder(write_limit=64 * 1024)) as s:
        raw = await asyncio.to_thread(_raw_upgrade, s.port)
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        try:
            sock = s.sockets[0]
            await s.until(lambda: sock.open)
            chunk = prepare("x" * 16_000)
            for _ in range(2000):  # 32 MB: far more than the kernel's buffers hold
                if not sock.write(chunk):
                    break
                if "slow" in sock.events:
                    break
            await s.until(lambda: sock.lost)
            assert "slow" in sock.events
        finally:
            raw.close()


async def test_a_client_that_never_answers_the_close_is_dropped_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport, "CLOSE_TIMEOUT_S", 0.2)
    async with _server() as s:
        raw = await asyncio.to_thread(_raw_upgrade, s.port)
        try:
            sock = s.sockets[0]
            await s.until(lambda: sock.open)
            sock.close(1012, "restart")
            await s.until(lambda: sock.lost, timeout=3)
            assert not sock.closed_by_client
        finally:
            raw.close()


def _raw_upgrade_not_reading(port: int) -> socket.socket:
    """`_raw_upgrade`'s client with the smallest receive buffer (its window shuts at once)."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1)
    raw.connect(("127.0.0.1", port))
    raw.sendall(_upgrade_request(port))
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += raw.recv(1)
    assert answer.startswith(b"HTTP/1.1 101")
    return raw


async def test_a_client_that_ends_its_side_without_reading_is_dropped_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A client that sends its end of stream (a FIN, no close frame) while the edge still has
    unsent bytes for it, and never reads them: the transport's own close waited for its buffer
    to drain, for ever (the client's kernel answers the window probes). The socket was CLOSED for
    websockets, so no close of the edge's could end it: against `presence up` such a socket
    outlived the liveness timeout with its account online. It is dropped after the close
    timeout now."""
    monkeypatch.setattr(transport, "CLOSE_TIMEOUT_S", 0.3)
    async with _server() as s:
        raw = await asyncio.to_thread(_raw_upgrade_not_reading, s.port)
        try:
            sock = s.sockets[0]
            await s.until(lambda: sock.open)
            assert sock.transport is not None
            chunk = prepare("x" * 16_000)
            while sock.transport.get_write_buffer_size() == 0:  # the kernel's buffers are full
                assert sock.write(chunk)
                await asyncio.sleep(0.001)
            await asyncio.to_thread(raw.shutdown, socket.SHUT_WR)
            await s.until(lambda: not sock.open)
            sock.close(1000)  # what the edge's liveness sweep does: nothing to send any more
            await s.until(lambda: sock.lost, timeout=3)
            assert not sock.closed_by_client and "slow" not in sock.events
        finally:
            raw.close()


async def test_a_connection_that_never_sends_its_request_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "OPEN_TIMEOUT_S", 0.2)
    async with _server() as s:
        raw = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", s.port))
        try:
            await s.until(lambda: bool(s.sockets) and s.sockets[0].lost, timeout=3)
            assert s.sockets[0].events == ["close"]
        finally:
            raw.close()


async def test_a_held_connection_is_read_only_once_released() -> None:
    def holding() -> Recorder:
        r = Recorder()
        r.hold()
        return r

    async with _server(holding) as s:
        opening = asyncio.create_task(_client(s))
        await s.until(lambda: bool(s.sockets))
        sock = s.sockets[0]
        await asyncio.sleep(0.05)
        assert sock.held and sock.events == [] and not opening.done()
        sock.release()
        c = await asyncio.wait_for(opening, 5)
        assert sock.events == ["request /ws", "open"]
        await c.close()


async def test_fan_out_reaches_every_open_socket_and_skips_closed_ones() -> None:
    async with _server() as s:
        clients = [await _client(s) for _ in range(3)]
        await clients[2].close()
        await s.until(lambda: s.sockets[2].lost)
        assert fan_out(s.sockets, '{"type":"presence.changed","userId":"é"}') == 2
        assert [await _recv(c) for c in clients[:2]] == ['{"type":"presence.changed","userId":"é"}'] * 2


async def test_writes_stay_in_order_whatever_road_they_take() -> None:
    async with _server() as s:
        c = await _client(s)
        sock = s.sockets[0]
        assert sock.send_text("one")
        fan_out([sock], "two")
        assert send_batch(sock, [b"three", "ü".encode()])
        assert sock.write(prepare("x" * 70_000))  # a 64-bit length header
        assert [await _recv(c) for _ in range(5)] == ["one", "two", "three", "ü", "x" * 70_000]
        assert not send_batch(sock, [])


def test_prepare_is_websockets_own_unmasked_text_frame() -> None:
    frame = Frame(Opcode.TEXT, b'{"a":1}')
    assert prepare('{"a":1}') == frame.serialize(mask=False)


async def test_an_open_socket_keeps_nothing_of_its_upgrade_request() -> None:
    """websockets' own parser would keep the request (headers and all) for the socket's life."""
    async with _server() as s:
        c = await _client(s, additional_headers={"X-Padding": "p" * 2000})
        sock = s.sockets[0]
        await c.send("after")
        await s.until(lambda: sock.messages == ["after"])
        gc.collect()
        assert [r() for r in sock.requests] == [None]
        await c.send("still parsed")
        await s.until(lambda: len(sock.messages) == 2)
        await c.close()


def _masked(text: str) -> bytes:
    return Frame(Opcode.TEXT, text.encode()).serialize(mask=True)


async def test_frames_sent_with_the_request_and_split_anywhere_are_read() -> None:
    """A client may send frames before the 101 arrives (in the request's own segment), and a
    frame may be cut anywhere: the request is still dropped only between frames."""
    async with _server() as s:
        whole, cut = _masked("with the request"), _masked("cut in two" * 30)
        raw = await asyncio.to_thread(_raw_upgrade, s.port, whole + cut[:5])
        try:
            sock = s.sockets[0]
            await s.until(lambda: sock.messages == ["with the request"])
            await asyncio.sleep(0.05)
            await asyncio.to_thread(raw.sendall, cut[5:] + _masked("next"))
            await s.until(lambda: len(sock.messages) == 3)
            assert sock.messages[1:] == ["cut in two" * 30, "next"]
            gc.collect()
            assert [r() for r in sock.requests] == [None]
        finally:
            raw.close()


@pytest.mark.parametrize(
    "then",
    [b"\x00garbage that is no frame\r\n", Frame(Opcode.TEXT, b"unmasked").serialize(mask=False)],
    ids=["garbage", "unmasked-frame"],
)
async def test_bytes_after_the_request_that_are_no_frame_drop_it_without_an_error(
    then: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """The request and, in the same write, what cannot be read as a client's frame: websockets
    fails the connection (its end of stream goes first), so the edge answers nothing and drops
    it, quietly: no 101 written after the end of stream, no traceback in the log."""
    caplog.set_level("WARNING")
    async with _server() as s:
        raw = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", s.port))
        try:
            await asyncio.to_thread(raw.sendall, _upgrade_request(s.port) + then)
            await s.until(lambda: bool(s.sockets) and s.sockets[0].lost)
            raw.settimeout(5)
            assert await asyncio.to_thread(_read_to_end, raw) == b""
            assert s.sockets[0].events == ["close"]
            await asyncio.sleep(0.05)  # a fatal-error callback would be logged by now
            assert [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")] == []
        finally:
            raw.close()


def _read_to_end(raw: socket.socket) -> bytes:
    """Everything the server wrote before it closed (a reset counts as the end)."""
    got = b""
    try:
        while chunk := raw.recv(4096):
            got += chunk
    except ConnectionResetError:
        pass
    return got


class Echo(Recorder):
    """Answers every text message with itself, as the edge answers a heartbeat."""

    __slots__ = ()

    def on_message(self, message: str | bytes) -> None:
        super().on_message(message)
        assert isinstance(message, str)
        self.send_text(message)


class CountingTransport:
    """A transport that counts its writes (each one a send() to the kernel)."""

    def __init__(self, inner: asyncio.Transport) -> None:
        self.inner, self.writes = inner, 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.inner.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_the_answers_to_frames_read_together_leave_in_one_write_in_order() -> None:
    """A client pipelining frames (8 heartbeats in flight) gets their answers in one send(), not
    one each; answers to frames read apart still leave at once."""
    async with _server(Echo) as s:
        raw = await asyncio.to_thread(_raw_upgrade, s.port)
        try:
            sock = s.sockets[0]
            await s.until(lambda: sock.open)
            counting = CountingTransport(sock.transport)  # type: ignore[arg-type]
            sock.transport = counting  # type: ignore[assignment]
            texts = [f"beat {i}" for i in range(8)]
            await asyncio.to_thread(raw.sendall, b"".join(_masked(t) for t in texts))
            await s.until(lambda: len(sock.messages) == 8)
            assert counting.writes == 1
            expected = b"".join(prepare(t) for t in texts)
            got = b""
            while len(got) < len(expected):
                got += await asyncio.to_thread(raw.recv, 65536)
            assert got == expected
            await asyncio.to_thread(raw.sendall, _masked("alone"))
            await s.until(lambda: len(sock.messages) == 9)
            assert counting.writes == 2
        finally:
            raw.close()


def _without_date(response: bytes) -> bytes:
    return b"\r\n".join(line for line in response.split(b"\r\n") if not line.startswith(b"Date: "))


async def test_a_plain_upgrade_gets_websockets_own_101_without_its_parser(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The usual request is answered without websockets' parser and checks (edge/upgrade.py),
    with the bytes websockets would have sent; a socket opened so works as any other."""
    async with _server(Echo) as s:
        request = _upgrade_request(s.port)
        websockets_own = ServerProtocol()
        websockets_own.receive_data(request)
        (parsed,) = websockets_own.events_received()
        assert isinstance(parsed, Request)
        answer = websockets_own.accept(parsed)
        answer.headers["Server"] = SERVER
        websockets_own.send_response(answer)
        expected = websockets_own.data_to_send()[0]

        def not_used(*_: object) -> None:
            raise AssertionError("websockets' request check ran for a plain request")

        monkeypatch.setattr(ServerProtocol, "process_request", not_used)
        raw = await asyncio.to_thread(socket.create_connection, ("127.0.0.1", s.port))
        try:
            await asyncio.to_thread(raw.sendall, request)
            got = b""
            while b"\r\n\r\n" not in got:
                got += await asyncio.to_thread(raw.recv, 4096)
            assert _without_date(got) == _without_date(expected)
            assert s.sockets[0].events == ["request /", "open"]
            await asyncio.to_thread(raw.sendall, _masked("hello"))
            assert await asyncio.to_thread(raw.recv, 4096) == prepare("hello")
        finally:
            raw.close()
