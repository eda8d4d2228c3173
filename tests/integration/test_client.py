"""The internal-API client answers within two seconds, and None on any failure."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator

import asyncpg
import pytest

from cluster.embedded import free_port
from edge.client import PresenceClient
from edge.server import Edge

from .conftest import INTERNAL_TOKEN, Cluster, Ids, internal_request, internal_url, load
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


@contextlib.contextmanager
def one_answer_server(answer: Callable[[socket.socket], None]) -> Iterator[tuple[int, list[bytes]]]:
    """A server that reads each request head, keeps it, and lets `answer` write to the socket."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.2)
    heads: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(5)
                head = b""
                while b"\r\n\r\n" not in head and not stop.is_set():
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                heads.append(head)
                with contextlib.suppress(OSError):
                    answer(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], heads
    finally:
        stop.set()
        thread.join()
        listener.close()


def test_an_answer_sent_a_byte_at_a_time_gives_none_within_two_seconds() -> None:
    """Each byte comes within the socket's timeout, so a per-operation bound never ran out: the
    call took as long as the server liked (a review, 2026-12-05). The bound is the whole call's."""
    body = b'{"online": 12}'

    def trickle(conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        for byte in body:
            conn.sendall(bytes([byte]))
            time.sleep(0.5)  # the trickle's own pace: the scenario

    with one_answer_server(trickle) as (port, _):
        result, took = timed(PresenceClient(f"http://127.0.0.1:{port}").online_count, "g")
    assert result is None
    assert took < 2.6, took


def test_a_redirect_is_not_followed_and_the_token_goes_nowhere_else() -> None:
    with one_answer_server(
        lambda conn: conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 13\r\n\r\n{"online": 7}')
    ) as (
        elsewhere,
        seen_elsewhere,
    ):
        redirect = (
            f"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{elsewhere}/steal\r\nContent-Length: 0\r\n\r\n"
        ).encode()
        with one_answer_server(lambda conn: conn.sendall(redirect)) as (port, seen):
            client = PresenceClient(f"http://127.0.0.1:{port}", token="internal-secret-token")
            assert client.online_count("g") is None
        assert seen and b"Bearer internal-secret-token" in seen[0]  # the service itself got it
    assert seen_elsewhere == [], "the redirect was followed"


async def test_async_variants_against_a_black_hole(black_hole: int) -> None:
    client = PresenceClient(f"http://127.0.0.1:{black_hole}")
    started = time.monotonic()
    results = await asyncio.gather(client.aonline_count("g"), client.ais_focused("u", "c"))
    assert results == [None, None] and time.monotonic() - started < 2.6


async def test_real_answers(cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids) -> None:
    user, server, channel = ids("u"), ids("g"), ids("c")
    await load(conn, {"servers": [{"id": server, "members": [user], "channels": [channel]}]})
    client = PresenceClient(internal_url(edge), token=INTERNAL_TOKEN)
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


async def test_metrics_cover_what_operators_watch(cluster: Cluster, edge: Edge, ids: Ids) -> None:
    import urllib.request

    c = await connect(cluster, edge, ids("u"))
    await c.roundtrip()
    await c.send({"type": "presence.update", "status": "dnd"})
    await c.roundtrip()
    await c.close()

    def fetch() -> str:
        with urllib.request.urlopen(internal_request(f"{internal_url(edge)}/metrics"), timeout=3) as r:
            return r.read().decode()

    text = await eventually(lambda: _has_flush(asyncio.to_thread(fetch)), timeout=10)
    for series in (
        "presence_open_connections",  # sockets on this edge
        "presence_process_open_fds",  # the edge's first limit
        "presence_edge_actor_call_seconds_bucket",  # actor call latency histogram
        'presence_frames_in_total{type="heartbeat"',  # frames in, by type
        "presence_frames_out_total",
        'presence_events_total{type="presence.self"',  # events delivered by the shards, by type
        "presence_deliveries_total",
        "presence_edge_batch_ops_count",  # batch sizes
        "presence_edge_actor_call_seconds_sum",  # actor call latency
        "presence_shard_pending_last_seen",  # pending departures
        "presence_flush_statements_total",  # flush statements and rows
        "presence_flush_rows_written_total",
        "presence_flush_pending_rows",
        # Counters of events that have not happened here are exported at 0 all the same.
        "presence_slow_clients_closed_total{",  # the edge's, unlabelled
        'presence_edge_pull_failures_total{shard="0"',  # the edge's, per shard
        "presence_mail_dropped_total{",  # a shard's
        'presence_shard_errors_total{loop="_flush_loop"',  # a shard's, per loop
    ):
        assert series in text, series
    types = [line for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "one TYPE line per metric"
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(text))  # raises on anything malformed
    assert all(f.documentation for f in families)
    kinds = {f.name: f.type for f in families}
    assert kinds["presence_edge_actor_call_seconds"] == "histogram"
    assert kinds["presence_flush_write_seconds"] == "histogram"


async def test_a_new_edge_exports_its_counters_by_type_at_zero(cluster: Cluster) -> None:
    """Before its first close of a kind, so that rate() and increase() see that first one."""
    fresh = Edge(cluster.edge_config())  # not started: what it exports from its construction
    counters = {
        (name, tuple(map(tuple, labels))): v for name, labels, v in fresh.metrics.snapshot()["counters"]
    }
    for code in ("4000", "4001", "1008", "1009", "1011", "1012", "4029"):
        assert counters[("closes_total", (("code", code),))] == 0, code
    # Frames in and replies by type: every type the contract has, and the edge's own labels.
    for kind in ("identify", "heartbeat", "presence.query", "settings.update", "invalid", "refused"):
        assert counters[("frames_in_total", (("type", kind),))] == 0, kind
    for kind in ("ready", "heartbeat.ack", "presence.sync", "presence.changed", "error"):
        assert counters[("replies_total", (("type", kind),))] == 0, kind


async def test_replies_and_closes_are_counted_whichever_road_they_take(
    cluster: Cluster, edge: Edge, ids: Ids
) -> None:
    """`ready`, `presence.sync` and a query's answers leave the edge by roads of their own, and
    websockets closes an oversized frame's socket itself: each is counted all the same (they were
    not: an operator's pass, 2026-12-05)."""
    import urllib.request

    def counted() -> dict[str, float]:
        with urllib.request.urlopen(internal_request(f"{internal_url(edge)}/metrics"), timeout=3) as r:
            text = r.read().decode()
        wanted = {
            "ready": 'presence_replies_total{type="ready"',
            "sync": 'presence_replies_total{type="presence.sync"',
            "answers": 'presence_replies_total{type="presence.changed"',
            "too big": 'presence_closes_total{code="1009"',
        }
        return {
            name: sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))
            for name, prefix in wanted.items()
        }

    before = await asyncio.to_thread(counted)
    user, other = ids("u"), ids("other")
    c = await connect(cluster, edge, user)
    await c.request(
        {"type": "presence.subscribe", "userIds": [other]}, lambda f: f.get("type") == "presence.sync"
    )
    await c.request({"type": "presence.query", "userIds": [user]}, lambda f: f.get("userId") == user)
    await c.send('{"type":"heartbeat"}'.ljust(16 * 1024 + 1))
    assert await c.closed(5) == 1009
    after = await asyncio.to_thread(counted)
    assert after["ready"] - before["ready"] == 1
    assert after["sync"] - before["sync"] == 1
    assert after["answers"] - before["answers"] == 1
    assert after["too big"] - before["too big"] == 1


async def _has_flush(text: object) -> str | None:
    value = await text  # type: ignore[misc]
    # The flush-write histogram appears with the first write (the departure of the socket above).
    return value if "presence_flush_write_seconds_bucket" in value else None
