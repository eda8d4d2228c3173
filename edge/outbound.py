"""Writing frames to many sockets, or many frames to one socket, for less CPU per frame.

The edge's biggest costs are one `send()` per frame per socket and, around it, websockets
building the same frame again for every socket. Two shortcuts, both keeping websockets' own
rules (a socket not OPEN, or in the middle of a fragmented message, is skipped, as
`websockets.broadcast` skips it):

- `fan_out`: a server frame is never masked and the edge never negotiates an extension
  (`compression=None`), so its bytes are the same for every socket: build them once, write them
  to each (gorilla/websocket's PreparedMessage does the same). A socket with an extension
  falls back to `broadcast`.
- `send_batch`: several frames for one socket (a query's answers) leave in one write.
"""

from __future__ import annotations

from collections.abc import Iterable

from websockets.asyncio.connection import broadcast
from websockets.asyncio.server import ServerConnection
from websockets.frames import Frame, Opcode
from websockets.protocol import State


def _writable(ws: ServerConnection) -> bool:
    return ws.protocol.state is State.OPEN and ws.send_in_progress is None and ws.transport is not None


def fan_out(
    connections: Iterable[ServerConnection],
    text: str,
    max_buffer: int | None = None,
    slow: list[ServerConnection] | None = None,
) -> int:
    """One text frame to every connection; returns how many were written to. With `max_buffer`,
    connections whose unsent output passes it after this write are appended to `slow` (checked
    here, where the write is, rather than in a second pass over the recipients)."""
    data: bytes | None = None
    written = 0
    for ws in connections:
        transport = ws.transport
        if transport is None or ws.protocol.state is not State.OPEN or ws.send_in_progress is not None:
            continue
        if ws.protocol.extensions:
            broadcast([ws], text)
        else:
            if data is None:
                data = prepare(text)
            transport.write(data)
        written += 1
        if slow is not None and max_buffer is not None and transport.get_write_buffer_size() > max_buffer:
            slow.append(ws)
    return written


def prepare(text: str) -> bytes:
    """A server text frame's bytes, built once for `send_prepared`."""
    return Frame(Opcode.TEXT, text.encode()).serialize(mask=False)


def send_prepared(ws: ServerConnection, text: str, data: bytes) -> bool:
    """`text` to one connection, writing `data` (its `prepare`d bytes) where they are valid."""
    if not _writable(ws):
        return False
    if ws.protocol.extensions:
        broadcast([ws], text)
    else:
        ws.transport.write(data)
    return True


def send_batch(ws: ServerConnection, texts: list[bytes]) -> bool:
    """Several text frames (UTF-8 encoded) to one connection in one write."""
    if not texts or not _writable(ws):
        return False
    for text in texts:
        ws.protocol.send_text(text)
    ws.transport.writelines([chunk for chunk in ws.protocol.data_to_send() if chunk])
    return True
