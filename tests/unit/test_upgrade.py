"""edge/upgrade.py: a request recognised as plain is one websockets answers with a 101, and makes
the same `Request` of and the same accept key; the usual clients' requests are plain."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st
from websockets.http11 import Request
from websockets.server import ServerProtocol

from edge.upgrade import plain_upgrade

KEY = "dGhlIHNhbXBsZSBub25jZQ=="

# Requests of real clients (header order and spelling as they send them).
WEBSOCKETS_CLIENT = (
    "GET /ws/presence HTTP/1.1\r\nHost: 127.0.0.1:8765\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
    "User-Agent: Python/3.11 websockets/17.4\r\n"
)
CHROME = (
    "GET /ws/presence HTTP/1.1\r\nHost: presence.example\r\nConnection: Upgrade\r\nPragma: no-cache\r\n"
    "Cache-Control: no-cache\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) Chrome/120.0.0.0\r\n"
    "Upgrade: websocket\r\nOrigin: https://presence.example\r\nSec-WebSocket-Version: 13\r\n"
    "Accept-Encoding: gzip, deflate, br\r\nAccept-Language: en-US,en;q=0.9\r\n"
    f"Sec-WebSocket-Key: {KEY}\r\n"
    "Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\n"
)
FIREFOX = (
    "GET /ws/presence?v=1 HTTP/1.1\r\nHost: presence.example\r\nUser-Agent: Mozilla/5.0 Firefox/121.0\r\n"
    "Accept: */*\r\nSec-WebSocket-Version: 13\r\nOrigin: https://presence.example\r\n"
    f"Sec-WebSocket-Key: {KEY}\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n"
    "Authorization: Bearer abc.def.ghi\r\n"
)


def websockets_answer(raw: bytes) -> tuple[int, Request | None, str | None]:
    """What websockets makes of `raw` (a request through its blank line): the response's status,
    the request it parsed (None: it could not) and the accept key it answers with."""
    protocol = ServerProtocol(max_size=16 * 1024)
    protocol.receive_data(raw)
    events = protocol.events_received()
    if not events:
        sent = b"".join(protocol.data_to_send())
        return int(sent.split(b" ", 2)[1]) if sent else 0, None, None
    request = events[0]
    assert isinstance(request, Request)
    response = protocol.accept(request)
    return response.status_code, request, response.headers.get("Sec-WebSocket-Accept")


def assert_same_as_websockets(head: bytes) -> bool:
    """If `head` is plain, websockets accepts it and parses it the same; returns whether plain."""
    plain = plain_upgrade(head)
    if plain is None:
        return False
    status, request, accept = websockets_answer(head + b"\r\n\r\n")
    assert status == 101
    assert request is not None
    assert (plain.request.method, plain.request.protocol) == (request.method, request.protocol)
    assert plain.request.path == request.path
    assert list(plain.request.headers.raw_items()) == list(request.headers.raw_items())
    assert dict(plain.request.headers) == dict(request.headers)
    assert plain.accept == accept
    return True


def test_the_usual_clients_requests_are_plain_and_parsed_as_websockets_parses_them() -> None:
    for request in (WEBSOCKETS_CLIENT, CHROME, FIREFOX):
        assert assert_same_as_websockets(request.removesuffix("\r\n").encode())
    plain = plain_upgrade(FIREFOX.removesuffix("\r\n").encode())
    assert plain is not None
    assert plain.request.headers.get("authorization") == "Bearer abc.def.ghi"
    assert plain.accept == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="  # RFC 6455's own example


def test_anything_unusual_is_left_to_websockets() -> None:
    base = WEBSOCKETS_CLIENT.removesuffix("\r\n")
    unusual = [
        base.replace("GET", "POST"),
        base.replace("HTTP/1.1", "HTTP/1.0"),
        base + "\r\nUpgrade: websocket",  # repeated
        base + "\r\nSec-WebSocket-Protocol: chat",  # subprotocols: websockets parses them
        base + "\r\nContent-Length: 0",
        base + "\r\nTransfer-Encoding: chunked",
        base.replace("Connection: Upgrade", "Connection: Upgrade, keep-alive"),
        base.replace("Upgrade: websocket", "Upgrade: h2c"),
        base.replace("Version: 13", "Version: 8"),
        base.replace(KEY, KEY[:-2]),
        base.replace("Host: ", "Host:\t\x01"),
        base + "\r\nX-Long: " + "x" * 5000,
    ]
    for request in unusual:
        assert plain_upgrade(request.encode()) is None, request


_NAMES = st.sampled_from(
    [
        "Host",
        "host",
        "Upgrade",
        "UPGRADE",
        "Connection",
        "connection",
        "Sec-WebSocket-Key",
        "sec-websocket-key",
        "Sec-WebSocket-Version",
        "Origin",
        "Sec-WebSocket-Extensions",
        "Sec-WebSocket-Protocol",
        "User-Agent",
        "Authorization",
        "Content-Length",
        "X-Forwarded-For",
        "Bad Name",
        "Bad:Name",
        "",
    ]
)
_VALUES = st.sampled_from(
    [
        "websocket",
        "WebSocket",
        "websocket, h2c",
        "Upgrade",
        "upgrade",
        "keep-alive, Upgrade",
        "keep-alive,Upgrade",
        "close",
        "13",
        " 13",
        "13 ",
        "8",
        KEY,
        base64.b64encode(b"x" * 15).decode(),
        KEY.replace("=", "A"),
        "Bearer abc",
        "https://presence.example",
        "0",
        "",
        "a\tb",
        "caf\xe9",
        "permessage-deflate; client_max_window_bits",
    ]
)
_SEPARATORS = st.sampled_from([": ", ":", ":  ", ":\t", " : "])


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(["GET", "GET", "GET", "POST", "get"]))
    path = draw(st.sampled_from(["/ws/presence", "/", "/a?b=c", "/caf\xe9", "/a b", "*"]))
    protocol = draw(st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0", "HTTP/2"]))
    required = [
        ("Host", "127.0.0.1"),
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", KEY),
        ("Sec-WebSocket-Version", "13"),
    ]
    kept = [h for h in required if draw(st.integers(0, 9)) > 0]  # now and then one is missing
    extra = draw(st.lists(st.tuples(_NAMES, _VALUES), max_size=4))
    headers = draw(st.permutations(kept + extra))
    lines = [f"{method} {path} {protocol}"]
    for name, value in headers:
        trail = draw(st.sampled_from(["", "", " ", "\t"]))
        lines.append(f"{name}{draw(_SEPARATORS)}{value}{trail}")
    return "\r\n".join(lines).encode("iso-8859-1")


@st.composite
def near_plain(draw: st.DrawFn) -> bytes:
    """A plain request with now and then one thing wrong or unusual (most are plain)."""

    def one(usual: str, *others: str) -> str:
        return draw(st.sampled_from([usual] * 24 + list(others)))

    headers = [
        ("Host", one("127.0.0.1:8765", "", "caf\xe9")),
        (one("Upgrade", "upgrade", "UPGRADE"), one("websocket", "WebSocket", "websocket, h2c", "h2c")),
        (one("Connection", "connection"), one("Upgrade", "keep-alive, Upgrade", "close", "Upgrade,")),
        ("Sec-WebSocket-Key", one(KEY, KEY[:-1] + "A", base64.b64encode(b"x" * 17).decode())),
        ("Sec-WebSocket-Version", one("13", "8", "13, 8")),
    ]
    headers += draw(st.lists(st.tuples(_NAMES, _VALUES), max_size=1))
    lines = [f"GET {one('/ws/presence', '/', '/a b')} {one('HTTP/1.1', 'HTTP/1.0')}"]
    for name, value in draw(st.permutations(headers)):
        separator, trail = one(": ", ":", ":  ", ":\t"), one("", " ", "  ", "\t")
        lines.append(f"{name}{separator}{value}{trail}")
    return "\r\n".join(lines).encode("iso-8859-1")


@given(st.one_of(requests(), near_plain()))
def test_a_plain_request_is_one_websockets_accepts_and_parses_the_same(head: bytes) -> None:
    assert_same_as_websockets(head)
