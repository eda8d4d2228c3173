"""The internal port's HTTP/1.1 server: one request per connection, answered and closed.

The internal API used to ride on websockets' `process_request` hook, but websockets' request
parser refuses any request with a body (`Content-Length` above 0, `Transfer-Encoding`) and drops
the connection before the hook runs: `curl -X POST -d '{}'` got an empty reply instead of the 405
the contract asks for. Here the head is read by rules of our own (`parse_request_line`,
`parse_header_line`: plain functions, unit-tested), every refusal is a JSON answer (400, 414, 431)
and a body is never read, only discarded after the answer (a lingering close: closing a socket
with unread bytes makes the kernel send a reset that can destroy the answer in flight).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
from websockets.datastructures import Headers
from websockets.http11 import Response

from actors.core.handshake_gate import Entry, HandshakeGate

log = logging.getLogger("presence.internal")

# websockets' own limits, kept: a request line or header line of at most 8 KiB, 128 headers.
MAX_LINE_BYTES = 8192
MAX_HEADERS = 128
# The whole head, request line and header lines: the two limits above let one connection hold
# 1 MiB of headers for the head's 10 s (1,000 connections from one local process took an edge
# from 120 MB to 1 GB, never given back). nginx's default is about as much as this; a browser
# opening /admin sends the cookies of every service on the host, hence not less.
MAX_HEAD_BYTES = 32 * 1024
# Connections served at once, in all and from one address; one more is answered 503 at once and
# closed. With the head's bound, what the port can be made to hold is bounded too (8 MiB of heads
# in all); per address, so that one caller holding its share keeps no other one out.
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_ADDRESS = 32
# How long a client may take to send its request head, and how long (and how much) of a body
# is read and thrown away after the answer so that closing does not reset the connection.
HEAD_TIMEOUT_S = 10.0
LINGER_S = 2.0
LINGER_MAX_BYTES = 1024 * 1024
# A connection refused over the limits lingers less (its 503 must not be reset away by the
# request it sent), and only so many at once; past that it is closed without an answer.
REFUSED_LINGER_S = 0.25
REFUSED_LINGER_MAX_BYTES = 16 * 1024

_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_VALUE = re.compile(rb"[\x09\x20-\x7e\x80-\xff]*")


class BadRequest(Exception):
    """The request head cannot be served; `status` says why (400, 414, 431, 505)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class HttpRequest:
    method: str
    # The request target as sent (path and query, still percent-encoded, ASCII).
    target: str
    headers: Headers
    # The address this connection arrived on (the server's end of the socket).
    local_host: str = ""

    @property
    def path(self) -> str:  # the name websockets' Request uses, for shared helpers
        return self.target


def parse_request_line(line: bytes) -> tuple[str, str]:
    """(method, target) of `METHOD TARGET HTTP/1.x`, without its line ending."""
    if len(line) > MAX_LINE_BYTES:
        raise BadRequest(414, "request line too long")
    parts = line.split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1]:
        raise BadRequest(400, "malformed request line")
    method, target, version = parts
    if not version.startswith(b"HTTP/1."):
        raise BadRequest(505, "only HTTP/1.x is served here")
    try:
        return method.decode("ascii"), target.decode("ascii")
    except UnicodeDecodeError:
        raise BadRequest(400, "the request target must be ASCII (percent-encode the rest)") from None


def parse_header_line(line: bytes) -> tuple[str, str]:
    """(name, value) of one `Name: value` header line, without its line ending."""
    if len(line) > MAX_LINE_BYTES:
        raise BadRequest(431, "header line too long")
    name, colon, value = line.partition(b":")
    value = value.strip(b" \t")
    if not colon or not _TOKEN.fullmatch(name) or not _VALUE.fullmatch(value):
        raise BadRequest(400, "malformed header line")
    return name.decode("ascii"), value.decode("iso-8859-1")


async def _line(reader: asyncio.StreamReader, too_long: int, what: str) -> bytes:
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise BadRequest(too_long, f"{what} too long") from None
    except asyncio.IncompleteReadError:
        raise EOFError from None
    if len(line) > MAX_LINE_BYTES + 2:
        raise BadRequest(too_long, f"{what} too long")
    return line.rstrip(b"\r\n")


async def read_request(reader: asyncio.StreamReader, local_host: str = "") -> HttpRequest:
    """The request head; raises BadRequest (answer it) or EOFError (the client left)."""
    line = await _line(reader, 414, "request line")
    method, target = parse_request_line(line)
    size = len(line) + 2
    headers = Headers()
    while True:
        line = await _line(reader, 431, "header line")
        if not line:
            return HttpRequest(method, target, headers, local_host)
        size += len(line) + 2
        if size > MAX_HEAD_BYTES:
            raise BadRequest(431, "request head too large")
        if len(headers) >= MAX_HEADERS:
            raise BadRequest(431, "too many header lines")
        name, value = parse_header_line(line)
        headers[name] = value


def connection_gate(
    total: int = MAX_CONNECTIONS, per_address: int = MAX_CONNECTIONS_PER_ADDRESS
) -> HandshakeGate[None]:
    """Connections served at once, in all and by client address: the lane's gate with no line
    (one over a limit is refused at once, never kept waiting)."""
    return HandshakeGate(total, per_address, waiting_per_source=0, waiting_total=0)


def response(
    status: int, body: bytes, content_type: str, extra: tuple[tuple[str, str], ...] = ()
) -> Response:
    headers = Headers(
        [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Connection", "close"), *extra]
    )
    return Response(status, http.HTTPStatus(status).phrase, headers, body)


def error_response(status: int, message: str, extra: tuple[tuple[str, str], ...] = ()) -> Response:
    return response(status, orjson.dumps({"error": message}), "application/json", extra)


Handler = Callable[[HttpRequest], Awaitable[Response]]


class HttpServer:
    """Serves `handler` on host:port, one request per connection."""

    def __init__(self, handler: Handler, counts: HandshakeGate[None] | None = None) -> None:
        self.handler = handler
        self.server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.counts = counts or connection_gate()
        self.refused = 0  # connections answered 503 at once (over a limit of `counts`)
        self._refusing = 0  # of those, lingering now

    async def start(self, host: str, port: int) -> None:
        # The reader's limit bounds one line (plus its line ending), so a huge line costs nothing.
        self.server = await asyncio.start_server(self._serve, host, port, limit=MAX_LINE_BYTES + 2)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5)
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        if self.counts.enter(address, None) is not Entry.GO:
            await self._refuse(reader, writer)
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            sockname = writer.get_extra_info("sockname")
            local_host = str(sockname[0]) if sockname else ""
            try:
                request = await asyncio.wait_for(read_request(reader, local_host), HEAD_TIMEOUT_S)
            except BadRequest as e:
                answer = error_response(e.status, e.message)
            except (EOFError, TimeoutError, ConnectionError):
                return
            else:
                answer = await self.handler(request)
                if request.method == "HEAD":
                    # Never content in an answer to HEAD (RFC 9110 9.3.2), whatever its status: a
                    # client reads none, and on a kept connection would take it for the next answer.
                    answer = dataclasses.replace(answer, body=b"")
            writer.write(answer.serialize())
            await writer.drain()
            await self._linger(reader, writer)
        except (ConnectionError, TimeoutError):
            pass
        except Exception:
            log.exception("internal HTTP: a connection failed")
        finally:
            self._connections.discard(task)
            self.counts.leave(address)
            writer.close()

    async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Over the limits: 503 at once, never a request read (nor a line logged each)."""
        self.refused += 1
        if self.refused in (1, 10, 100) or self.refused % 1000 == 0:
            log.warning("internal HTTP: %d connection(s) refused so far (too many open)", self.refused)
        if self._refusing >= self.counts.total:
            writer.close()
            return
        self._refusing += 1
        try:
            writer.write(error_response(503, "too many connections; try again").serialize())
            await self._linger(reader, writer, REFUSED_LINGER_S, REFUSED_LINGER_MAX_BYTES)
        except Exception:
            pass  # gone meanwhile: nothing to answer
        finally:
            self._refusing -= 1
            writer.close()

    @staticmethod
    async def _linger(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        seconds: float = LINGER_S,
        max_bytes: int = LINGER_MAX_BYTES,
    ) -> None:
        """Say we are done sending, then drop whatever the client still sends (a body we never
        read) until it closes, for a short while: closing with unread bytes resets the
        connection, and a reset can destroy the answer before the client read it."""
        if writer.can_write_eof():
            writer.write_eof()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        dropped = 0
        while dropped < max_bytes:
            left = deadline - loop.time()
            if left <= 0:
                return
            try:
                chunk = await asyncio.wait_for(reader.read(65536), left)
            except (TimeoutError, OSError):
                # The answer is sent; the client went away meanwhile. ENOTCONN (not a
                # ConnectionError) came as a traceback a few times a minute in the testbed's edge
                # logs: HAProxy's health checks resetting after their answer.
                return
            if not chunk:
                return
            dropped += len(chunk)
