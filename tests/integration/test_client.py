"""The internal-API client answers within two seconds, and None on any failure."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import asyncpg
import pytest

from cluster.embedded import free_port
from edge.client import PresenceClient
from edge.server import Edge

from .conftest import Cluster, Ids, internal_url, load
from .test_presence_ws import connect
from .wsclient import eventually

pytestmark = pytest.mark.integration


@pytest.fixture
def black_hole() -> Iterator[int]:
    """A server that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for s in accepted:
        s.close()
    listener.close()


def timed(fn: object, *args: str) -> tuple[object, float]:
    started = time.monotonic()
    result = fn(*args)  # type: ignore[operator]
    return result, time.monotonic() - started


def test_nothing_listening_answers_none_at_once() -> None:
    client = PresenceClient(f"http://127.0.0.1:{free_port()}")
    for fn, args in ((client.online_count, ("g",)), (client.is_focused, ("u", "c"))):
        result, took = timed(fn, *args)
        assert result is None and took < 2.0


def test_server_that_never_answers_gives_none_within_two_seconds(black_hole: int) -> None:
    client = PresenceClient(f"http://127.0.0.1:{black_hole}")
    for fn, args in ((client.online_count, ("g",)), (client.is_focused, ("u", "c"))):
        result, took = timed(fn, *args)
        assert result is None
        assert 1.5 < took < 2.6, took


async def test_async_variants_against_a_black_hole(black_hole: int) -> None:
    client = PresenceClient(f"http://127.0.0.1:{black_hole}")
    started = time.monotonic()
    results = await asyncio.gather(client.aonline_count("g"), client.ais_focused("u", "c"))
    assert results == [None, None] and time.monotonic() - started < 2.6


async def test_real_answers(cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids) -> None:
    user, server, channel = ids("u"), ids("g"), ids("c")
    await load(conn, {"servers": [{"id": server, "members": [user], "channels": [channel]}]})
    client = PresenceClient(internal_url(edge))
    assert await client.aonline_count(server) == 0
    assert await client.ais_focused(user, channel) is False
    c = await connect(cluster, edge, user)
    await c.send({"type": "focus", "channelId": channel})
    await eventually(lambda: client.ais_focused(user, channel), timeout=5)
    await eventually(lambda: _equals(client.aonline_count(server), 1), timeout=5)
    await c.send({"type": "focus", "channelId": None})
    await eventually(lambda: _equals(client.ais_focused(user, channel), False), timeout=5)
    await c.close()


async def _equals(awaitable: object, expected: object) -> bool:
    return await awaitable == expected  # type: ignore[misc, no-any-return]
