"""Websockets on asyncio transports directly: `websockets`' sans-I/O `ServerProtocol`, fed by an
`asyncio.Protocol` per socket, with no task, future or queue per connection.

Why: an idle socket served by `websockets.asyncio` cost ~12.5 KiB of the edge's memory (its
connection object, a handler task suspended in `recv()`, the message assembler and its futures, the
keepalive state) and each frame a task wake-up; one edge process could not hold 100,000 sockets
(issue 28). websockets documents its sans-I/O layer for exactly such integrations: the protocol
object parses and frames, and this module does the I/O as its own asyncio connection does
(`websockets/asyncio/connection.py`: `data_received` feeds `receive_data`, writes every
`data_to_send()`, an empty chunk half-closes; the server closes the TCP connection after the
closing handshake, or after `CLOSE_TIMEOUT_S` if the client never answers).

A `Socket` is one connection. Subclasses say what happens (`on_request`, `on_open`, `on_message`,
`on_close`, `on_slow`), the edge's (edge/server.py) and the benchmark's sans-I/O echo floor
(bench/echo_server.py). What a `Socket` does by itself:

- the opening handshake: `on_request` may answer the upgrade request with an HTTP response of its
  own (refusal, a page); else websockets checks the request and accepts it (101), or answers it
  400/426 as `websockets.asyncio` does; no request within `OPEN_TIMEOUT_S`: the connection is
  dropped;
- messages: text (UTF-8 checked: else closed with 1007) and binary, fragments joined up to
  `max_size` (else 1009), pings answered with pongs; frames after a close are dropped; every
  frame that is no message of its own is told (`on_control`, `on_fragment`), so that a subclass
  can count it: websockets bounds a fragmented message's bytes, not its frames, and a client
  sending empty continuation frames for ever never completes a message;
- order: `pause()` holds the messages after the current one (and stops reading) until
  `resume()`, so that a subclass handles one message at a time while its work waits elsewhere;
  the rest of the read is not even parsed meanwhile (`READ_SLICE_BYTES`);
- work per read: a read is parsed a slice at a time, each slice's frames handled before the next
  (a read of 256 KiB of empty frames was 40,000 frames parsed before the first was looked at),
  and a socket this side closed reads at most `CLOSING_FRAMES` more before its client's close
  frame, then the connection is dropped (a client streaming frames at a closing socket had it
  parse them for the whole close timeout: 10 s of the edge's CPU per connection, no token
  needed);
- `hold()` / `release()`: before the handshake, the bytes that arrive are kept unread (the edge's
  opening gate);
- writes: `send_text`, `write` (a frame serialised once for many sockets: edge/outbound.py);
  the transport's write buffer is bounded (`write_limit`): past it the transport calls
  `pause_writing`, which is `on_slow` (the edge aborts such a client: a reader that does not
  read holds nobody up).
"""

from __future__ import annotations

import asyncio
import email.utils
import http
import logging
import time
from collections import deque
from collections.abc import Callable, Generator
from typing import TypeVar, cast

from websockets.frames import Frame, Opcode
from websockets.http11 import SERVER, Request, Response
from websockets.protocol import Event, Protocol, State
from websockets.server import ServerProtocol
from websockets.typing import Origin

from edge.upgrade import Plain, plain_upgrade

log = logging.getLogger("presence.transport")

OPEN_TIMEOUT_S = 10.0  # websockets' open_timeout: from accept (or the end of a hold) to the request
CLOSE_TIMEOUT_S = 10.0  # websockets' close_timeout: the client's answer to a close frame
# What a read hands websockets' parser at a time: its frames are handled before the next slice is
# parsed, so a handler that pauses or closes the socket stops the parsing too (`Socket._read`).
READ_SLICE_BYTES = 4096
# Frames read after the socket's own close frame, before its client's: more, and the connection
# is dropped (a client answers a close at once; what it sent meanwhile is dropped anyway).
CLOSING_FRAMES = 1_000

Message = str | bytes
_Read = TypeVar("_Read")  # what `Socket._corked` hands its handler: bytes read, or a plain request

OPEN = State.OPEN
CONNECTING = State.CONNECTING


class LeanServerProtocol(ServerProtocol):
    """websockets' `ServerProtocol`, less the upgrade request it would keep for the connection's
    whole life.

    Its parser (`ServerProtocol.parse`) reads the request into a local variable and then parses
    frames inside the same generator (`yield from super().parse()`), so the request's headers
    (~1.8 KiB) stay referenced by that suspended generator as long as the socket lives: a third of
    what an idle socket costs. Here websockets' own parser reads the request, and as soon as it
    waits between two frames (nothing consumed of the next one) it is replaced by the frame parser
    alone. If websockets' generators ever look different from what is checked here, its parser is
    simply kept: the same behaviour at the old memory cost."""

    def parse(self) -> Generator[None]:
        handshake = super().parse()
        for _ in handshake:
            if _between_frames(handshake):
                break
            yield
        else:
            return
        handshake.close()
        del handshake
        # As websockets replaces its parser itself (`discard`): this generator is not stepped
        # again, and nothing keeps it.
        self.parser = Protocol.parse(self)
        next(self.parser)
        yield


def _between_frames(parser: Generator[None]) -> bool:
    """`ServerProtocol.parse` has read the request and waits for the next frame's first byte."""
    frames = getattr(parser, "gi_yieldfrom", None)  # a generator object's, not in Generator's type
    if frames is None or getattr(frames, "__qualname__", "") != "Protocol.parse":
        return False
    waiting = getattr(frames, "gi_yieldfrom", None)
    return getattr(waiting, "__qualname__", "") == "StreamReader.at_eof"


class Socket(asyncio.Protocol):
    """One websocket connection on its transport (see the module's docstring)."""

    __slots__ = (
        "_backlog",
        "_cork",
        "_early",
        "_fragments",
        "_fresh",
        "_late",
        "_paused",
        "_timer",
        "_unread",
        "_write_limit",
        "protocol",
        "request",
        "transport",
    )

    def __init__(self, max_size: int | None = 16 * 1024, write_limit: int = 1024 * 1024) -> None:
        self.transport: asyncio.Transport | None = None
        self.protocol = LeanServerProtocol(max_size=max_size)
        # The upgrade request, until `on_open` returned (then dropped: its headers are the
        # largest thing a socket would otherwise keep for its whole life).
        self.request: Request | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._early: list[bytes] | None = None  # bytes kept unread while held
        self._paused = False
        self._backlog: deque[Message] | None = None  # messages that arrived while paused
        self._unread: bytes | None = None  # the rest of a read, unparsed while paused
        self._late = 0  # frames read after this side's close frame (`CLOSING_FRAMES`)
        self._fragments: list[bytes] | None = None  # a fragmented message so far (opcode first)
        # While the bytes of one read are handled, what is written to this socket waits here and
        # leaves as one write at the end (`_feed`): a client that pipelines frames gets their
        # answers in one send() instead of one each.
        self._cork: list[bytes] | None = None
        # Nothing read yet: a plain upgrade request arriving whole may skip websockets' parser
        # (`_feed`, edge/upgrade.py).
        self._fresh = True
        self._write_limit = write_limit

    # ------------------------------------------------------------------ what subclasses say

    def on_request(self, request: Request) -> Response | None:
        """The upgrade request: None to let websockets check and accept it, or the answer."""
        return None

    def on_open(self) -> None:
        """The handshake is done (101 sent): messages may come."""

    def on_message(self, message: Message) -> None:
        """A text (str) or binary (bytes) message."""

    def on_close(self) -> None:
        """The connection is gone (also when it never opened); called once."""

    def on_control(self) -> None:
        """A ping or pong arrived on the open socket (a ping is answered already)."""

    def on_fragment(self) -> None:
        """A data frame that does not end its message arrived on the open socket (a fragment
        before the last): a frame for the subclass's limits, though no message comes of it yet."""

    def on_slow(self) -> None:
        """More than `write_limit` bytes wait unsent to this client."""

    def on_refused(self, code: int) -> None:
        """websockets itself closed the connection for what the client sent (1009 a frame too
        big, 1002 a protocol error, 1007 text that is not UTF-8): the close frame is sent."""

    # ------------------------------------------------------------------ what others may call

    @property
    def open(self) -> bool:
        return self.protocol.state is OPEN and self.transport is not None

    @property
    def lost(self) -> bool:
        """The connection is gone (`on_close` was called)."""
        return self.transport is None and self.protocol.state is State.CLOSED

    @property
    def closed_by_client(self) -> bool:
        """The client sent a close frame: it was there to end the connection. False for one that
        was reset or ended without one, or that never answered the server's close."""
        return self.protocol.close_rcvd is not None

    @property
    def remote_address(self) -> tuple[str, int] | None:
        t = self.transport
        return None if t is None else cast("tuple[str, int] | None", t.get_extra_info("peername"))

    def send_text(self, text: str) -> bool:
        """One text message; False if the socket is not open (nothing sent)."""
        if self.protocol.state is not OPEN or self.transport is None:
            return False
        self._send(Frame(Opcode.TEXT, text.encode()).serialize(mask=False))
        return True

    def write(self, frame: bytes) -> bool:
        """A server frame serialised once for many sockets (edge/outbound.py `prepare`). No
        extension is ever negotiated here, so a frame's bytes are the same for every socket."""
        if self.protocol.state is not OPEN or self.transport is None:
            return False
        cork = self._cork
        if cork is None:
            self.transport.write(frame)
        else:
            cork.append(frame)
        return True

    def writelines(self, frames: list[bytes]) -> bool:
        if self.protocol.state is not OPEN or self.transport is None:
            return False
        cork = self._cork
        if cork is None:
            self.transport.writelines(frames)
        else:
            cork.extend(frames)
        return True

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake (an open socket), or drop the connection (one still
        opening). The client's answering close frame ends it; or `CLOSE_TIMEOUT_S`."""
        if self.transport is None:
            return
        if self.protocol.state is OPEN:
            self.protocol.send_close(code, reason)
            self._flush()
            self._expect_close()
        elif self.protocol.state is CONNECTING:
            self.transport.abort()
        else:  # closing already: it ends by the close timeout at the latest
            self._expect_close()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def hold(self) -> None:
        """Keep what arrives unread, and read nothing more, until `release` (before the handshake)."""
        if self._early is None:
            self._early = []
        self._cancel_timer()

    def release(self) -> None:
        """Read what arrived while held, and go on reading."""
        early, self._early = self._early, None
        t = self.transport
        if early is None or t is None or t.is_closing():
            return
        self._timer = asyncio.get_running_loop().call_later(OPEN_TIMEOUT_S, self._open_timed_out)
        for data in early:
            self._feed(data)
        t = self.transport
        if t is not None and not self._paused and not t.is_closing():
            t.resume_reading()

    @property
    def held(self) -> bool:
        return self._early is not None

    def pause(self) -> None:
        """Hold back the messages after this one until `resume` (reading stops meanwhile)."""
        if not self._paused:
            self._paused = True
            if self.transport is not None and not self.transport.is_closing():
                self.transport.pause_reading()

    def resume(self) -> None:
        """Hand over the messages held back, in order, then the rest of their read, then read on
        (unless paused again)."""
        self._paused = False
        backlog = self._backlog
        while backlog and not self._paused:
            message = backlog.popleft()
            if self.protocol.state is OPEN:
                self.on_message(message)
        if self._paused:
            return
        self._backlog = None
        unread, self._unread = self._unread, None
        if unread is not None and self.transport is not None:
            self._feed(unread)
            if self._paused:
                return
        t = self.transport
        if t is not None and self._early is None and not t.is_closing():
            t.resume_reading()

    # ------------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = self.transport = cast(asyncio.Transport, transport)
        t.set_write_buffer_limits(high=self._write_limit)
        self._timer = asyncio.get_running_loop().call_later(OPEN_TIMEOUT_S, self._open_timed_out)

    def data_received(self, data: bytes) -> None:
        if self._early is not None:
            self._early.append(data)
            assert self.transport is not None
            self.transport.pause_reading()
            return
        self._feed(data)

    def eof_received(self) -> bool | None:
        if self._early is not None:
            return None  # gone before it was read: the transport closes
        self.protocol.receive_eof()
        self._handle(self.protocol.events_received())
        self._flush()
        # The transport closes once what waits in its buffer is sent. A client that ended its
        # side but reads nothing (its window shut) would hold that close open for good: the
        # socket CLOSED, so no close of ours would end it, its account online and its buffers
        # held for as long as the client liked. It gets the close timeout to read, like a client
        # that does not answer a close frame.
        self._cancel_timer()
        self._expect_close()
        return None  # never a write after the client's EOF: the transport closes

    def connection_lost(self, exc: Exception | None) -> None:
        self.protocol.receive_eof()  # idempotent: the protocol is CLOSED from here on
        self._cancel_timer()
        self.transport = None
        self._backlog = self._fragments = self._early = self._unread = None
        self.on_close()

    def pause_writing(self) -> None:
        self.on_slow()

    def resume_writing(self) -> None:
        pass  # a slow client is dropped by `on_slow`; nothing waits for the buffer to drain

    # ------------------------------------------------------------------ inside

    def _feed(self, data: bytes) -> None:
        if self._fresh:
            self._fresh = False
            # The whole request and nothing after it (a client waits for the 101 before sending
            # frames; one that does not is left to websockets, as is anything else unusual).
            plain = plain_upgrade(data[:-4]) if data.endswith(b"\r\n\r\n") else None
            if plain is not None:
                self._corked(self._plain_handshake, plain)
                return
        self._corked(self._read, data)

    def _plain_handshake(self, plain: Plain) -> None:
        self._handshake(plain.request, plain.accept)

    def _read(self, data: bytes) -> None:
        """Give `data` to websockets' parser a slice at a time, each slice's frames handled before
        the next is parsed (see `READ_SLICE_BYTES`, `CLOSING_FRAMES`); paused meanwhile, the
        rest is kept unparsed for `resume`."""
        protocol = self.protocol
        size = len(data)
        at = 0
        while at < size:
            if self._paused:
                rest = data[at:] if at else data
                self._unread = rest if self._unread is None else self._unread + rest
                return
            if at:  # the slice before may have dropped or refused it: then nothing more is read
                t = self.transport
                if t is None or t.is_closing():
                    return
                chunk = data[at : at + READ_SLICE_BYTES]
            else:
                chunk = data if size <= READ_SLICE_BYTES else data[:READ_SLICE_BYTES]
            at += READ_SLICE_BYTES
            closing = protocol.close_sent
            protocol.receive_data(chunk)
            # Closed by websockets while it read these bytes (not by a handler below, whose close
            # is its own: an edge counted a ping flood's 1008 twice).
            sent = protocol.close_sent if closing is None and protocol.close_rcvd is None else None
            events = protocol.events_received()
            if closing is not None and protocol.close_rcvd is None and events:
                self._late += len(events)  # this side's close was out before they were read
                if self._late > CLOSING_FRAMES:
                    self.abort()
                    return
            self._feed_events(events)
            if sent is not None:
                self.on_refused(sent.code)

    def _corked(self, handle: Callable[[_Read], None], read: _Read) -> None:
        """`handle(read)`, its writes to this socket in one (`_cork`)."""
        if self._cork is not None:  # fed again from inside a handler (`release`)
            handle(read)
        else:
            cork = self._cork = []
            try:
                handle(read)
            finally:
                self._cork = None
                t = self.transport
                if cork and t is not None and not t.is_closing():
                    t.write(cork[0] if len(cork) == 1 else b"".join(cork))
        if self._timer is None and self.protocol.close_expected():
            self._expect_close()

    def _feed_events(self, events: list[Event]) -> None:
        self._flush()  # pongs, the answer to a close, a refusal of a bad frame
        if events:
            self._handle(events)

    def _send(self, data: bytes) -> None:
        """Write `data` now, or with the rest of this read's answers (`_cork`)."""
        cork = self._cork
        if cork is not None:
            cork.append(data)
        elif self.transport is not None:
            self.transport.write(data)

    def _uncork(self) -> None:
        """Write what waits in the cork now (before an end of writing)."""
        cork = self._cork
        if cork and self.transport is not None:
            self.transport.write(b"".join(cork))
            cork.clear()

    def _handle(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Frame):
                opcode = event.opcode
                if opcode is Opcode.TEXT or opcode is Opcode.BINARY or opcode is Opcode.CONT:
                    self._frame(event)
                elif (opcode is Opcode.PING or opcode is Opcode.PONG) and self.protocol.state is OPEN:
                    self.on_control()
            else:
                self._handshake(cast(Request, event))  # a server receives no Response

    def _frame(self, frame: Frame) -> None:
        if self.protocol.state is not OPEN:
            return  # closing: what the client still sends is dropped
        # websockets' parser reads bytes (Frame.parse); the field's type admits any buffer.
        data = cast(bytes, frame.data)
        if frame.opcode is Opcode.CONT:
            if self._fragments is None:
                return  # the protocol refused it already
            if data:  # websockets bounds the bytes of a message, not its frames: keep no empty one
                self._fragments.append(data)
            if not frame.fin:
                self.on_fragment()
                return
            first, *rest = self._fragments
            self._fragments = None
            text = first == b"t"
            data = b"".join(rest)
        elif not frame.fin:
            self._fragments = [b"t" if frame.opcode is Opcode.TEXT else b"b", data]
            self.on_fragment()
            return
        else:
            text = frame.opcode is Opcode.TEXT
        message: Message
        if text:
            try:
                message = data.decode()
            except UnicodeDecodeError as e:
                self.protocol.fail(1007, f"{e.reason} at position {e.start}")
                self._flush()
                self._expect_close()
                self.on_refused(1007)
                return
        else:
            message = bytes(data)
        if self._paused:
            if self._backlog is None:
                self._backlog = deque()
            self._backlog.append(message)
            return
        self.on_message(message)

    def _handshake(self, request: Request, plain_accept: str | None = None) -> None:
        """The upgrade request: websockets' (parsed by it), or a plain one (`plain_accept` its
        accept key), which is answered as websockets would answer it, without its checks."""
        protocol = self.protocol
        self._cancel_timer()
        if protocol.eof_sent:
            # What came in the same read after the request could not be read (bytes that are no
            # frame, an unmasked one): websockets failed the connection and its end of stream
            # has left, so nothing can be answered. Before, the 101 was written after it, and the
            # transport's RuntimeError logged two tracebacks per such connection (a log flood
            # for anyone who can connect).
            self.abort()
            return
        self.request = request
        try:
            response = self.on_request(request)
        except Exception:
            log.exception("refusing a connection: the upgrade request's check failed")
            response = protocol.reject(
                http.HTTPStatus.INTERNAL_SERVER_ERROR,
                "Failed to open a WebSocket connection.\nSee server log for more information.\n",
            )
        if self.transport is None or self.transport.is_closing():
            return  # dropped by `on_request`
        if response is None and plain_accept is not None:
            self._accept_plain(request, plain_accept)
        else:
            if response is None:
                response = protocol.accept(request)
            if SERVER:
                response.headers["Server"] = SERVER
            protocol.send_response(response)
            self._flush()
        if protocol.state is OPEN:
            try:
                self.on_open()
            finally:
                self.request = None
        else:
            self.request = None
            if self.transport is not None:
                self._uncork()
                self.transport.close()  # refused: the answer is written, then the connection closed

    def _accept_plain(self, request: Request, accept: str) -> None:
        """What `ServerProtocol.accept` and `send_response` do for a plain request (no origins,
        extensions or subprotocols to negotiate): the same 101, byte for byte, and the protocol
        open with its frame parser (as `LeanServerProtocol` leaves it once past the request)."""
        protocol = self.protocol
        protocol.accept_called = True
        protocol.origin = cast("Origin | None", request.headers.get("Origin"))
        self._send(_switching_protocols(accept))
        protocol.state = OPEN
        protocol.logger.info("connection open")
        protocol.parser = Protocol.parse(protocol)
        next(protocol.parser)

    def _flush(self) -> None:
        t = self.transport
        if t is None:
            return
        for data in self.protocol.data_to_send():
            if data:
                self._send(data)
                continue
            self._uncork()
            if t.can_write_eof():
                try:
                    t.write_eof()
                except Exception:  # uvloop may raise RuntimeError on a closing transport
                    t.close()
            else:
                t.close()

    def _expect_close(self) -> None:
        if self._timer is None and self.transport is not None:
            self._timer = asyncio.get_running_loop().call_later(CLOSE_TIMEOUT_S, self.abort)

    def _open_timed_out(self) -> None:
        self._timer = None
        if self.protocol.state is CONNECTING:
            self.abort()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


_date: tuple[int, str] = (0, "")


def _http_date() -> str:
    """The Date header's value, as websockets writes it (made once a second)."""
    global _date
    now = int(time.time())
    if _date[0] != now:
        _date = (now, email.utils.formatdate(now, usegmt=True))
    return _date[1]


def _switching_protocols(accept: str) -> bytes:
    """websockets' 101 response (`ServerProtocol.accept`, `Response.serialize`), Server included."""
    server = f"Server: {SERVER}\r\n" if SERVER else ""
    return (
        f"HTTP/1.1 101 Switching Protocols\r\nDate: {_http_date()}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n{server}\r\n"
    ).encode("iso-8859-1")


async def serve(
    factory: Callable[[], asyncio.Protocol], host: str, port: int, backlog: int = 100
) -> asyncio.Server:
    """Listen on (host, port), each connection served by `factory()` (a `Socket`, or any
    protocol that drops it at once)."""
    return await asyncio.get_running_loop().create_server(factory, host, port, backlog=backlog)
