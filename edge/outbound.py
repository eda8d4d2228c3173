"""Writing frames to many sockets, or many frames to one socket, for less CPU per frame.

The edge's biggest costs are one write per frame per socket and, around it, building the same
frame again for every socket. Two shortcuts:

- `fan_out`: a server frame is never masked and the edge never negotiates an extension, so its
  bytes are the same for every socket: build them once, write them to each (gorilla/websocket's
  PreparedMessage does the same). A socket not open (closing, or gone) is skipped, as
  `websockets.broadcast` skips it.
- `send_batch`: several frames for one socket (a query's answers) leave in one write.

A client whose unread output passes the edge's limit is noticed by its transport, not here
(edge/transport.py: the write buffer's high-water mark calls `Socket.on_slow`).
"""

from __future__ import annotations

from collections.abc import Iterable

from websockets.frames import Frame, Opcode

from edge.transport import Socket


def fan_out(sockets: Iterable[Socket], text: str) -> int:
    """One text frame to every socket; returns how many were written to."""
    data: bytes | None = None
    written = 0
    for ws in sockets:
        if not ws.open:
            continue
        if data is None:
            data = prepare(text)
        ws.write(data)
        written += 1
    return written


def prepare(text: str) -> bytes:
    """A server text frame's bytes, built once for many sockets (`Socket.write`)."""
    return Frame(Opcode.TEXT, text.encode()).serialize(mask=False)


def send_batch(ws: Socket, texts: list[bytes]) -> bool:
    """Several text frames (UTF-8 encoded) to one socket in one write."""
    if not texts:
        return False
    return ws.writelines([Frame(Opcode.TEXT, text).serialize(mask=False) for text in texts])
