"""Issue 29: the internal port's own HTTP reading (edge/http_server.py) and its guards' rules
(edge/http.py): strict percent-decoding, the Host names served."""

from __future__ import annotations

import asyncio

import pytest

from edge.http import BadEncoding, allowed_host_names, host_name, strict_query, strict_unquote
from edge.http_server import (
    MAX_HEADERS,
    BadRequest,
    HttpRequest,
    HttpServer,
    parse_header_line,
    parse_request_line,
    read_request,
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
