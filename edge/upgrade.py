"""The plain websocket upgrade request, recognised without websockets' general HTTP parser.

Nearly every client sends the same request: `GET <path> HTTP/1.1`, a handful of headers, each
once, `Upgrade: websocket`, `Connection: Upgrade`, a 16-byte key and version 13. websockets reads
it line by line through generators, builds its `Headers` one checked item at a time, then checks
it again in `ServerProtocol.process_request`: about half of what an edge spends on a handshake
(bench/profiles/README.md). `plain_upgrade` recognises such a request in one pass and returns
what websockets would have made of it (the same `Request`, the `Sec-WebSocket-Accept` value), and
None for anything else: a request it does not recognise goes to websockets whole, so every
refusal, every unusual but valid form and every error stays websockets' own.

What "plain" means is a strict subset of what websockets accepts with a 101 when the server has
no origins, extensions or subprotocols configured (the edge's), so the answer is the same either
way (tests/unit/test_upgrade.py compares the two on generated requests). Pure: no I/O, no clock.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass

from websockets.datastructures import Headers
from websockets.http11 import Request
from websockets.utils import accept_key

# Larger or longer requests go to websockets (its own limits are 8,192 bytes a line, 128 headers).
PLAIN_MAX_BYTES = 4096
PLAIN_MAX_HEADERS = 32

# The request line and header lines as websockets reads them, restricted to printable ASCII (a
# subset of what it allows: no tab inside a value, no obsolete text), on the request decoded
# as websockets decodes header values (ISO-8859-1: any byte is one character).
_HEADER_LINE = r"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*([\x20-\x7e]*)\r\n"
_PLAIN = re.compile(r"GET ([\x21-\x7e]+) HTTP/1\.1\r\n((?:" + _HEADER_LINE + ")*)")
_HEADER = re.compile(_HEADER_LINE)
_KEY = re.compile(r"[A-Za-z0-9+/]{22}==")
_CONNECTION = frozenset({"upgrade", "keep-alive, upgrade"})
# Headers websockets parses or refuses (a body, subprotocols): such a request is left to it.
_NOT_PLAIN = frozenset({"transfer-encoding", "content-length", "sec-websocket-protocol"})


@dataclass(frozen=True, slots=True)
class Plain:
    """A plain upgrade request: as websockets would have parsed it, and the accept key it would
    answer with."""

    request: Request
    accept: str


def plain_upgrade(head: bytes) -> Plain | None:
    """`head`: a request's bytes before its blank line (`\\r\\n\\r\\n`). None: not plain."""
    if len(head) > PLAIN_MAX_BYTES:
        return None
    start = _PLAIN.fullmatch(head.decode("iso-8859-1") + "\r\n")
    if start is None:
        return None
    lines = _HEADER.findall(start.group(2))
    if len(lines) > PLAIN_MAX_HEADERS:
        return None
    by_name: dict[str, list[str]] = {}
    items: list[tuple[str, str]] = []
    for name, raw_value in lines:
        value = raw_value.rstrip(" ")  # leading blanks are outside the match, as websockets strips
        lower = name.lower()
        if lower in by_name or lower in _NOT_PLAIN:
            return None  # repeated headers: websockets decides what they mean
        by_name[lower] = [value]
        items.append((name, value))
    upgrade, connection = by_name.get("upgrade"), by_name.get("connection")
    if upgrade is None or upgrade[0].lower() != "websocket":
        return None
    if connection is None or connection[0].lower() not in _CONNECTION:
        return None
    if by_name.get("sec-websocket-version") != ["13"]:
        return None
    key = by_name.get("sec-websocket-key")
    if key is None or _KEY.fullmatch(key[0]) is None or not _sixteen_bytes(key[0]):
        return None
    headers = Headers()
    # websockets' own layout (`Headers.__slots__`): values by lower-cased name, and the items in
    # order; filled at once instead of checked again item by item (they were, above).
    headers._dict = by_name
    headers._list = items
    return Plain(Request(start.group(1), headers), accept_key(key[0]))


def _sixteen_bytes(key: str) -> bool:
    try:
        return len(base64.b64decode(key.encode(), validate=True)) == 16
    except binascii.Error:
        return False
