"""Hostile input through a real edge: each gets the contract's answer, and nobody else notices.

docs/protocol.md, "Limits and floods" and "Close codes": bad input is `bad_frame` with the socket
left open; a frame over 16 KiB closes with 1009; invalid UTF-8 in a text frame closes with 1007
(RFC 6455, before our code sees it) while a binary frame of the same bytes is `bad_frame`; a
flood is `rate_limited` and then 1008; sockets past the per-account or per-address limit are
closed with 4029; a query over the account's budget is `rate_limited`; a socket that never
authenticates properly is closed with 4001 and nothing of it reaches an actor; a client that does
not read is cut off while the edge and everybody else carry on.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import asyncpg
import pytest
import websockets

from edge.server import Edge
from edge.session import Limits
from edge.tokens import mint_token
from tests.timing import patience

from .conftest import Cluster, Ids, load, ws_url
from .hostile import RawClient, ops_sent, shard_ops
from .test_presence_ws import connect, social
from .wsclient import Client, changed, eventually, of_type

pytestmark = pytest.mark.integration

HOSTILE: list[str | bytes] = [
    "not json",
    "{",
    '{"type":"no.such.type"}',
    '{"no":"type"}',
    '{"type":"presence.update","status":"offline"}',
    '{"type":"presence.update","status":1}',
    '{"type":"presence.query","userIds":"u1"}',
    '{"type":"heartbeat","extra":true}',
    '{"type":"focus","channelId":""}',
    json.dumps({"type": "presence.query", "userIds": ["x" * 129]}),
    json.dumps({"type": "presence.subscribe", "userIds": ["a\u0085b"]}),
    json.dumps({"type": "channel.subscribe", "channelId": "a\nb"}),
    "[" * 3000 + "]" * 3000,
    json.dumps({"type": "presence.subscribe", "userIds": [[[[[["deep"]]]]]]}),
    json.dumps({"type": "presence.unsubscribe", "userIds": list(range(2000))}),
    "null",
    "[]",
    b"\xff\xfe\x00binary, not UTF-8",
    b'{"type":"heartbeat"}\xc3\x28',
]


def error_codes(c: Client) -> list[str]:
    return [f["code"] for f in c.log if f.get("type") == "error"]


async def test_bad_input_is_bad_frame_and_nobody_else_notices(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, carol, *_ = await social(conn, ids)
    watcher = await connect(cluster, edge, alice)
    await watcher.request({"type": "presence.subscribe", "userIds": [bob, carol]}, of_type("presence.sync"))
    hostile = await connect(cluster, edge, bob)
    await watcher.expect(changed(bob, "online"))
    before = ops_sent(edge)
    for raw in HOSTILE:
        await hostile.send(raw)
    await hostile.roundtrip()
    assert error_codes(hostile) == ["bad_frame"] * len(HOSTILE)
    assert hostile.close_code is None, "bad input never closes the socket"
    assert ops_sent(edge) == before, "not one operation went upstream"
    # Meanwhile presence carries on for everybody, the hostile socket included.
    c = await connect(cluster, edge, carol)
    await watcher.expect(changed(carol, "online"))
    await hostile.send({"type": "presence.update", "status": "dnd"})
    await watcher.expect(changed(bob, "dnd"))
    assert error_codes(watcher) == []
    for client in (hostile, c, watcher):
        await client.close()


async def test_invalid_utf8_text_frame_closes_1007_binary_frame_is_bad_frame(
    cluster: Cluster, edge: Edge, ids: Ids
) -> None:
    binary = await connect(cluster, edge, ids("bin"))
    await binary.send(b'{"type":"heartbeat"}\xff')
    await binary.expect(lambda f: f.get("code") == "bad_frame")
    await binary.roundtrip()
    text = await connect(cluster, edge, ids("text"))
    await text.ws.send(b'{"type":"heartbeat"}\xff', text=True)  # a text frame that is not UTF-8
    assert await text.closed(5) == 1007  # websockets answers per RFC 6455 §8.1
    await binary.roundtrip()
    await binary.close()


async def test_frame_over_the_size_limit_closes_1009(cluster: Cluster, edge: Edge, ids: Ids) -> None:
    c = await connect(cluster, edge, ids("big"))
    at_limit = '{"type":"heartbeat"}'.ljust(16 * 1024)  # whitespace is valid JSON padding
    await c.send(at_limit)
    await c.expect(of_type("heartbeat.ack"))
    bystander = await connect(cluster, edge, ids("by"))
    await c.send('{"type":"heartbeat"}'.ljust(16 * 1024 + 1))
    assert await c.closed(5) == 1009
    await bystander.roundtrip()
    await bystander.close()


async def test_configured_size_limit(cluster: Cluster, ids: Ids) -> None:
    small = Edge(cluster.edge_config(max_frame_bytes=256))
    await small.start()
    try:
        c = await Client.connect(ws_url(small), cluster.token(ids("u")))
        await c.send(json.dumps({"type": "presence.query", "userIds": ["x" * 100, "y" * 100, "z" * 100]}))
        assert await c.closed(5) == 1009
    finally:
        await small.stop()


async def test_flood_is_rate_limited_then_closed_1008(cluster: Cluster, edge: Edge, ids: Ids) -> None:
    flooder = await connect(cluster, edge, ids("flood"))
    bystander = await connect(cluster, edge, ids("calm"))
    for _ in range(400):
        try:
            await flooder.send({"type": "heartbeat"})
        except websockets.ConnectionClosed:
            break
    assert await flooder.closed(5) == 1008
    acks = sum(1 for f in flooder.log if f.get("type") == "heartbeat.ack")
    assert 50 <= acks <= 70, acks  # the burst of 60 (less identify), plus a little refill
    assert "rate_limited" in error_codes(flooder)
    assert len(error_codes(flooder)) <= 10, "refusals are not answered one by one"
    await bystander.roundtrip()
    await bystander.close()


async def test_a_ping_flood_is_closed_1008_and_pings_keep_a_quiet_socket_alive(
    cluster: Cluster, ids: Ids
) -> None:
    """Pings are frames: charged to the socket's bucket (a flood of them was answered without
    limit) and proof of life (a client whose library pings for it, sending no heartbeat, was
    closed 4000 at the liveness timeout)."""
    quick = Edge(cluster.edge_config(limits=Limits(socket_timeout_s=2.0)))
    await quick.start()
    try:
        flooder = await Client.connect(ws_url(quick), cluster.token(ids("pinger")))
        pinging = await Client.connect(ws_url(quick), cluster.token(ids("keepalive")))
        for _ in range(400):
            try:
                await flooder.ws.ping()
            except websockets.ConnectionClosed:
                break
        assert await flooder.closed(5) == 1008
        # Twice the liveness timeout with nothing but a ping every 0.5 s: still open.
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            await asyncio.wait_for(await pinging.ws.ping(), patience(5))
            await asyncio.sleep(0.5)
        assert pinging.close_code is None
        await pinging.roundtrip()
        await pinging.close()
    finally:
        await quick.stop()


async def test_sockets_per_account_closed_4029_never_reaching_an_actor(
    cluster: Cluster, edge: Edge, ids: Ids
) -> None:
    user = ids("many")
    held = [await connect(cluster, edge, user) for _ in range(20)]  # the default limit
    connects = await shard_ops("connect")
    sent = ops_sent(edge)
    for via in ("identify", "header"):
        with pytest.raises(AssertionError, match=r"closed \(4029\)"):
            await Client.connect(ws_url(edge), cluster.token(user), via=via)
    assert ops_sent(edge) == sent
    assert await shard_ops("connect") == connects
    other = await connect(cluster, edge, ids("other"))  # another account is not affected
    await held[0].close()
    again = await connect(cluster, edge, user)  # one gone, one more may come
    for c in (*held[1:], again, other):
        await c.close()


async def test_sockets_per_address_closed_4029(cluster: Cluster, ids: Ids) -> None:
    narrow = Edge(cluster.edge_config(limits=Limits(max_sockets_per_ip=5)))
    await narrow.start()
    try:
        silent = [await websockets.connect(ws_url(narrow)) for _ in range(4)]  # never identify
        c = await Client.connect(ws_url(narrow), cluster.token(ids("u")))
        extra = await websockets.connect(ws_url(narrow))
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(extra.recv(), patience(5))
        assert extra.close_code == 4029
        assert extra.close_reason is not None and "address" in extra.close_reason
        await c.roundtrip()
        await silent[0].close()
        await eventually(lambda: len(narrow.conns) == 4)
        ok = await Client.connect(ws_url(narrow), cluster.token(ids("v")))
        for w in silent[1:]:
            await w.close()
        await ok.close()
        await c.close()
    finally:
        await narrow.stop()


async def test_query_budget_is_per_account(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, *_ = await social(conn, ids)
    targets = [ids(f"t{i}") for i in range(100)]
    a1, a2 = await connect(cluster, edge, alice), await connect(cluster, edge, alice)
    b = await connect(cluster, edge, bob)
    for i in range(20):  # a burst of 2,000 ids, shared by the account's sockets
        await (a1 if i % 2 else a2).send({"type": "presence.query", "userIds": targets})
    await a1.roundtrip()
    await a2.roundtrip()
    assert error_codes(a1) == error_codes(a2) == []
    await a1.send({"type": "presence.query", "userIds": targets})
    err = await a1.expect(of_type("error"))
    assert err["code"] == "rate_limited" and "budget" in err["message"]
    # The socket stays open, and another account has a budget of its own.
    await a1.roundtrip()
    await b.request({"type": "presence.query", "userIds": [alice]}, changed(alice, "online"))
    for c in (a1, a2, b):
        await c.close()


BAD_TOKENS = [
    "not-a-token",
    "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJ4IiwiZXhwIjo0MTAyNDQ0ODAwfQ.",  # alg none
]


async def test_unauthenticated_sockets_closed_4001_and_nothing_reaches_an_actor(
    cluster: Cluster, ids: Ids
) -> None:
    quick = Edge(cluster.edge_config(limits=Limits(identify_timeout_s=1.0)))
    await quick.start()
    try:
        sent = ops_sent(quick)
        connects = await shard_ops("connect")
        user = ids("victim")
        tokens = [
            *BAD_TOKENS,
            mint_token(user, "another-secret-of-at-least-32-bytes-long"),
            cluster.token(user, ttl_s=-10),
        ]
        attempts: list[tuple[dict[str, str] | None, Any]] = []
        for tok in tokens:
            attempts.append((None, {"type": "identify", "token": tok}))
            attempts.append(({"Authorization": f"Bearer {tok}"}, None))
        attempts += [
            (None, {"type": "heartbeat"}),  # a first frame that is not identify
            (None, "garbage"),
            ({"Authorization": "Basic dXNlcjpwYXNz"}, None),
            (None, None),  # never says anything
        ]
        started = time.monotonic()
        for headers, first in attempts:
            ws = await websockets.connect(ws_url(quick), additional_headers=headers)
            if first is not None:
                await ws.send(first if isinstance(first, str) else json.dumps(first))
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), patience(5))
            assert ws.close_code == 4001, (headers, first)
        assert time.monotonic() - started < 10
        assert ops_sent(quick) == sent, "an unauthenticated socket sent something upstream"
        assert await shard_ops("connect") == connects
    finally:
        await quick.stop()


async def test_slow_reader_is_cut_off_and_everybody_else_carries_on(
    cluster: Cluster, conn: asyncpg.Connection, ids: Ids
) -> None:
    # Long ids make big frames; loose per-socket limits let a few churners make a flood.
    churners = [ids(f"churner-{i}-".ljust(120, "x")) for i in range(4)]
    slow_user, watcher_user = ids("slow"), ids("watcher")
    await load(
        conn, {"servers": [{"id": ids("g"), "members": [slow_user, watcher_user, *churners], "channels": []}]}
    )
    edge = Edge(
        cluster.edge_config(
            send_buffer_bytes=64 * 1024,
            limits=Limits(rate_per_s=100_000, rate_burst=100_000),
        )
    )
    await edge.start()
    try:
        watcher = await Client.connect(ws_url(edge), cluster.token(watcher_user))
        await watcher.request({"type": "presence.subscribe", "userIds": churners}, of_type("presence.sync"))
        slow = await RawClient.connect(
            edge.ws_port, {"Authorization": f"Bearer {cluster.token(slow_user)}"}, rcvbuf=4096
        )
        await slow.send(json.dumps({"type": "presence.subscribe", "userIds": churners}))
        slow.stop_reading()
        await eventually(lambda: len(edge.conns) == 2 and all(c.registered for c in edge.conns.values()))
        # The kernel's own buffers come on top of the edge's limit and grow to megabytes on
        # loopback; pin the server side of this one socket small so that the edge's buffer, the
        # thing under test, fills within a second.
        slow_conn = next(c for c in edge.conns.values() if c.session.user_id == slow_user)
        slow_conn.ws.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        clients = [await Client.connect(ws_url(edge), cluster.token(u)) for u in churners]
        await eventually(lambda: _subscribed(edge, slow_user, len(churners)))
        deadline = time.monotonic() + 30
        while edge.metrics.counters.get(("slow_clients_closed_total", ()), 0) == 0:
            assert time.monotonic() < deadline, "the slow reader was never cut off"
            # Status changes of one account reach it coalesced (5 a second), so the bulk of its
            # unread output is the answers to its own queries (4 big frames each, ~20 KiB a
            # round against the 64 KiB limit and a few KiB of kernel buffers).
            for _ in range(25):
                await slow.send(json.dumps({"type": "presence.query", "userIds": churners}))
            for c in clients:
                for status in ("dnd", "online") * 5:
                    await c.send({"type": "presence.update", "status": status})
            for c in clients:
                await c.roundtrip()
        assert await slow.wait_reset(10), "the slow reader's connection is still up"
        # Everybody else carries on: the watcher saw every churner's last word, and more.
        for u, c in zip(churners, clients, strict=True):
            await c.send({"type": "presence.update", "status": "dnd"})
            await watcher.expect(lambda f, u=u: f.get("userId") == u and f.get("status") == "dnd", timeout=10)
        await watcher.roundtrip()
        for c in (*clients, watcher):
            await c.close()
        slow.close()
    finally:
        await edge.stop()


def _subscribed(edge: Edge, user: str, n: int) -> bool:
    return any(c.session.user_id == user and len(c.session.subscriptions) == n for c in edge.conns.values())
