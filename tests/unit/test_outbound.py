"""edge.outbound over real websockets connections on localhost (no Ray: nothing here needs it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve

from edge.outbound import fan_out, prepare, send_batch, send_prepared

Scenario = Callable[[list[ServerConnection], list[ClientConnection]], Awaitable[None]]


@asynccontextmanager
async def _pairs(
    n: int, compression: str | None = None
) -> AsyncIterator[tuple[list[ServerConnection], list[ClientConnection]]]:
    server_side: list[ServerConnection] = []
    arrived = asyncio.Condition()

    async def handler(ws: ServerConnection) -> None:
        async with arrived:
            server_side.append(ws)
            arrived.notify_all()
        await ws.wait_closed()

    async with serve(handler, "127.0.0.1", 0, compression=compression) as server:
        port = server.sockets[0].getsockname()[1]
        clients = [await connect(f"ws://127.0.0.1:{port}", compression=compression) for _ in range(n)]
        async with arrived:
            await asyncio.wait_for(arrived.wait_for(lambda: len(server_side) == n), 5)
        try:
            yield server_side, clients
        finally:
            for c in clients:
                await c.close()


async def _recv(c: ClientConnection) -> Any:
    return await asyncio.wait_for(c.recv(), 5)


async def test_fan_out_reaches_every_open_connection_and_skips_closed_ones() -> None:
    async with _pairs(3) as (servers, clients):
        await clients[2].close()
        await asyncio.wait_for(servers[2].wait_closed(), 5)
        assert fan_out(servers, '{"type":"presence.changed","userId":"é"}') == 2
        assert [await _recv(c) for c in clients[:2]] == ['{"type":"presence.changed","userId":"é"}'] * 2


async def test_fan_out_frames_stay_in_order_with_websockets_own_sends() -> None:
    async with _pairs(1) as (servers, clients):
        await servers[0].send("one")
        fan_out(servers, "two")
        await servers[0].send("three")
        fan_out(servers, "x" * 70_000)  # a 64-bit length header
        assert [await _recv(clients[0]) for _ in range(4)] == ["one", "two", "three", "x" * 70_000]


async def test_fan_out_falls_back_to_websockets_when_an_extension_was_negotiated() -> None:
    async with _pairs(2, compression="deflate") as (servers, clients):
        assert servers[0].protocol.extensions  # compressed frames differ per socket
        assert fan_out(servers, "hello" * 100) == 2
        assert [await _recv(c) for c in clients] == ["hello" * 100] * 2


async def test_send_batch_writes_several_frames_in_order() -> None:
    async with _pairs(1) as (servers, clients):
        assert send_batch(servers[0], [b"a", "ü".encode(), b"c"])
        assert [await _recv(clients[0]) for _ in range(3)] == ["a", "ü", "c"]


async def test_send_batch_refuses_a_closed_connection_and_an_empty_batch() -> None:
    async with _pairs(1) as (servers, clients):
        assert not send_batch(servers[0], [])
        await clients[0].close()
        await asyncio.wait_for(servers[0].wait_closed(), 5)
        assert not send_batch(servers[0], [b"late"])


async def test_send_prepared_writes_the_prepared_bytes_and_falls_back_with_an_extension() -> None:
    text = '{"type":"heartbeat.ack"}'
    data = prepare(text)
    for compression in (None, "deflate"):
        async with _pairs(1, compression=compression) as (servers, clients):
            await servers[0].send("first")
            assert send_prepared(servers[0], text, data)
            await servers[0].send("last")
            assert [await _recv(clients[0]) for _ in range(3)] == ["first", text, "last"]
            await clients[0].close()
            await asyncio.wait_for(servers[0].wait_closed(), 5)
            assert not send_prepared(servers[0], text, data)


async def test_fan_out_names_the_connections_whose_output_passes_the_limit() -> None:
    async with _pairs(2) as (servers, clients):
        slow: list[ServerConnection] = []
        assert fan_out(servers, "hello", max_buffer=1 << 20, slow=slow) == 2
        assert slow == []  # nothing waits unsent on localhost
        # A limit below any buffer: every connection written to is named, the others are not.
        await clients[1].close()
        await asyncio.wait_for(servers[1].wait_closed(), 5)
        assert fan_out(servers, "again", max_buffer=-1, slow=slow) == 1
        assert slow == [servers[0]]
