"""Issue 29: the internal port's own HTTP reading (edge/http_server.py) and its guards' rules
(edge/http.py): strict percent-decoding, the Host names served."""

from __future__ import annotations

import asyncio

import pytest

from actors.core.handshake_gate import Entry
from edge.http import BadEncoding, allowed_host_names, host_name, strict_query, strict_unquote
from edge.http_server import (
    MAX_HEAD_BYTES,
    MAX_HEADERS,
    MAX_LINE_BYTES,
    BadRequest,
    HttpRequest,
    HttpServer,
    connection_gate,
    error_response,
    parse_header_line,
    parse_request_line,
    read_request,
    response,
)


def test_request_line() -> None:
    assert parse_request_line(b"GET /healthz HTTP/1.1") == ("GET", "/healthz")
    assert parse_request_line(b"POST /a?b=c HTTP/1.0") == ("POST", "/a?b=c")
    for bad, status in [
        (b"GET /healthz", 400),
        (b"GET  /healthz HTTP/1.1", 400),
        (b"G(T /x HTTP/1.1", 400),
        (b"GET /x HTTP/2", 505),
        ("GET /zoë HTTP/1.1".encode(), 400),
        (b"GET /" + b"x" * 9000 + b" HTTP/1.1", 414),
    ]:
        with pytest.raises(BadRequest) as e:
            parse_request_line(bad)
        assert e.value.status == status, bad[:40]


def test_header_line() -> None:
    assert parse_header_line(b"Host:  127.0.0.1:8766 ") == ("Host", "127.0.0.1:8766")
    for bad, status in [
        (b"no colon", 400),
        (b"Bad Name: x", 400),
        (b"X: a\x00b", 400),
        (b"X: " + b"y" * 9000, 431),
    ]:
        with pytest.raises(BadRequest) as e:
            parse_header_line(bad)
        assert e.value.status == status


def _read(data: bytes) -> HttpRequest:
    async def run() -> HttpRequest:
        reader = asyncio.StreamReader(limit=8194)
        reader.feed_data(data)
        reader.feed_eof()
        return await read_request(reader, "127.0.0.1")

    return asyncio.run(run())


def test_read_request_reads_the_head_and_never_the_body() -> None:
    request = _read(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}")
    assert request.method == "POST" and request.headers["Host"] == "h"
    headers = b"".join(b"X-%d: 1\r\n" % i for i in range(MAX_HEADERS + 1))
    with pytest.raises(BadRequest) as e:
        _read(b"GET / HTTP/1.1\r\n" + headers + b"\r\n")
    assert e.value.status == 431
    with pytest.raises(BadRequest) as e:
        _read(b"GET /" + b"x" * 20_000 + b" HTTP/1.1\r\n\r\n")
    assert e.value.status == 414
    with pytest.raises(EOFError):
        _read(b"GET / HTTP/1.1\r\nHost: h\r\n")


def test_the_whole_head_is_bounded_not_only_each_line() -> None:
    """128 lines of 8 KiB each were taken: 1 MiB of headers held per connection for the head's
    10 s, and no bound on connections (1,000 from one local process: the edge's memory from
    120 MB to 1 GB, never given back)."""
    line = b"X-%d: " + b"y" * (MAX_LINE_BYTES - 16) + b"\r\n"
    lines = MAX_HEAD_BYTES // len(line) + 1
    assert lines < MAX_HEADERS  # each line and their count within their own limits
    with pytest.raises(BadRequest) as e:
        _read(b"GET / HTTP/1.1\r\n" + b"".join(line % i for i in range(lines)) + b"\r\n")
    assert (e.value.status, e.value.message) == (431, "request head too large")
    fits = b"GET / HTTP/1.1\r\n" + b"".join(line % i for i in range(lines - 1)) + b"\r\n"
    assert len(fits) <= MAX_HEAD_BYTES and len(_read(fits).headers) == lines - 1


def test_connection_gate() -> None:
    gate = connection_gate(total=3, per_address=2)

    def enter(address: str) -> bool:
        return gate.enter(address, None) is Entry.GO

    assert enter("a") and enter("a")
    assert not enter("a")  # its share
    assert enter("b")
    assert not enter("c")  # the total
    assert gate.leave("a") == []  # nobody waits: one over a limit is refused, never kept
    assert enter("c") and not enter("a")
    for address in ("a", "b", "c"):
        gate.leave(address)
    assert gate.in_progress == 0 and gate.running == {} and gate.waiting == 0


async def _get(port: int, source: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    try:
        return await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()


async def test_connections_past_the_limits_are_answered_503_at_once() -> None:
    """Silent connections are held up to the head's 10 s each: past its limits, in all and per
    address, a connection is answered 503 at once, and another address is still served."""

    async def ok(request: HttpRequest) -> object:
        return response(200, b"{}", "application/json")

    server = HttpServer(ok, connection_gate(total=3, per_address=2))  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    silent = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(2)]
    try:
        async with asyncio.timeout(5):  # both held by the server (not a guess at how long that takes)
            while server.counts.in_progress < 2:
                await asyncio.sleep(0.01)
        refused = await _get(server.port, "127.0.0.1")
        assert refused == error_response(503, "too many connections; try again").serialize()
        assert (await _get(server.port, "127.0.0.2")).startswith(b"HTTP/1.1 200")
        assert server.refused == 1
    finally:
        for _, writer in silent:
            writer.close()
        await server.close()
    assert server.counts.in_progress == 0


class _HalfClosingWriter:
    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        pass


def test_a_client_gone_after_its_answer_ends_the_linger_quietly() -> None:
    """ENOTCONN on the linger's read is an OSError but not a ConnectionError: it ended the
    connection with a logged traceback before (the testbed's HAProxy health checks)."""

    async def linger() -> None:
        reader = asyncio.StreamReader()
        reader.set_exception(OSError(107, "Transport endpoint is not connected"))
        await HttpServer._linger(reader, _HalfClosingWriter())  # type: ignore[arg-type]

    asyncio.run(linger())


def test_strict_decoding() -> None:
    assert strict_unquote("zo%C3%AB") == "zoë"
    assert strict_query("userId=u%20v&channelId=c&userId=x") == {"userId": "u v", "channelId": "c"}
    for bad in ("ab%ED%A0%80", "zz%FF", "zz%FE", "%C3", "%80"):
        with pytest.raises(BadEncoding):
            strict_unquote(bad)
        with pytest.raises(BadEncoding):
            strict_query(f"userId={bad}")


def test_host_names() -> None:
    assert host_name("127.0.0.1:8766") == "127.0.0.1"
    assert host_name("[::1]:8766") == "::1"
    assert host_name("::1") == "::1"
    assert host_name("LocalHost.") == "localhost"
    assert allowed_host_names("127.0.0.1", ()) == {"127.0.0.1", "localhost"}
    assert allowed_host_names("10.0.0.5", ["presence.internal", " "]) == {"10.0.0.5", "presence.internal"}
    assert "localhost" not in allowed_host_names("0.0.0.0", ())
