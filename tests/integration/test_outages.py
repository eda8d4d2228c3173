"""Outages and crashes under a live pool: nothing lost, presence keeps working, counts heal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request

import asyncpg
import pytest
import websockets

from actors.clients import ActorDied, DirectoryClient, FlushClient, ShardClient
from actors.core.slots import slot_of
from edge.server import Edge
from tests.timing import patience

from .conftest import Cluster, Ids, internal_request, internal_url, load, ws_url
from .recorder import no_pending_last_seen
from .test_presence_ws import connect, social
from .wsclient import changed, eventually, of_type

pytestmark = pytest.mark.integration


async def online_count(edge: Edge, server: str) -> object:
    def fetch() -> object:
        with urllib.request.urlopen(
            internal_request(f"{internal_url(edge)}/api/v1/internal/presence/online?serverId={server}"),
            timeout=2,
        ) as r:
            return json.loads(r.read())["online"]

    return await asyncio.to_thread(fetch)


async def count_is(edge: Edge, server: str, expected: object) -> bool:
    return await online_count(edge, server) == expected


async def stored(url: str, users: list[str]) -> dict[str, float]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT id, last_seen_at FROM users WHERE id = ANY($1::text[])", users)
    finally:
        await conn.close()
    return {r["id"]: r["last_seen_at"].timestamp() for r in rows if r["last_seen_at"] is not None}


async def test_redis_away_counts_unknown_presence_unaffected(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    _, redis = cluster.require_servers()
    alice, bob, carol, *_ = await social(conn, ids)
    server = ids("g")
    a = await connect(cluster, edge, alice)
    await a.request({"type": "presence.subscribe", "userIds": [bob]}, of_type("presence.sync"))
    await eventually(lambda: count_is(edge, server, 1), timeout=10)
    redis.stop()
    try:
        assert await online_count(edge, server) is None
        b = await connect(cluster, edge, bob)
        await a.expect(changed(bob, "online"))
        await b.send({"type": "presence.update", "status": "dnd"})
        await a.expect(changed(bob, "dnd"))
        c = await connect(cluster, edge, carol)
    finally:
        redis.restart()
    # The shards rewrite every member within one refresh period of Redis coming back.
    await eventually(lambda: count_is(edge, server, 3), timeout=10)
    for client in (a, b, c):
        await client.close()


async def test_postgres_away_30s_every_departure_stored(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    pg, _ = cluster.require_servers()
    alice, *_ = await social(conn, ids)
    users = [ids(f"leaver{i}") for i in range(8)]
    await load(conn, {"friendships": [[alice, u] for u in users]})
    watcher = await connect(cluster, edge, alice)
    await watcher.request({"type": "presence.subscribe", "userIds": users}, of_type("presence.sync"))
    clients = [await connect(cluster, edge, u) for u in users]
    for u in users:
        await watcher.expect(changed(u, "online"))
    await conn.close()
    pg.stop()
    departed: dict[str, float] = {}
    outage_started = time.monotonic()

    async def newcomer() -> int | None:
        # Never loaded, so its chosen status is unknown: it must not be guessed (an invisible
        # account would flash online). The edge retries, then closes 1011 for a later retry.
        ws = await websockets.connect(ws_url(edge))
        await ws.send(json.dumps({"type": "identify", "token": cluster.token(ids("newcomer"))}))
        with contextlib.suppress(websockets.ConnectionClosed):
            while True:
                frame = json.loads(await asyncio.wait_for(ws.recv(), patience(20)))
                assert frame.get("type") != "ready", "a newcomer cannot be loaded without PostgreSQL"
        return ws.close_code

    try:
        refused = asyncio.create_task(newcomer())
        for u, c in zip(users, clients, strict=True):
            departed[u] = time.time()
            await c.close()
            await watcher.expect(changed(u, "offline"))  # presence keeps working
            # Departures spread over the outage, each at its own time: the scenario.
            await asyncio.sleep(2.5)
        assert await refused == 1011
        # The rest of the 30 s outage: the scenario.
        await asyncio.sleep(max(0.0, 30 - (time.monotonic() - outage_started)))
    finally:
        pg.restart()
    got = await eventually(lambda: _all_stored(cluster.database_url, users), timeout=60)
    for u in users:
        assert abs(got[u] - departed[u]) < 1.0, (u, got[u], departed[u])
    await watcher.close()
    await _settled()


async def _all_stored(url: str, users: list[str]) -> dict[str, float] | None:
    try:
        got = await stored(url, users)
    except (OSError, asyncpg.PostgresError):
        return None
    return got if len(got) == len(users) else None


async def test_shard_killed_edges_register_again(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, carol, *_ = await social(conn, ids)
    server = ids("g")
    _, owners, _ = await DirectoryClient().get_map()
    owner = owners[slot_of(bob)]
    watcher = await connect(cluster, edge, alice)
    await watcher.request({"type": "presence.subscribe", "userIds": [bob, carol]}, of_type("presence.sync"))
    b = await connect(cluster, second_edge, bob)
    c = await connect(cluster, edge, carol)
    await b.send({"type": "presence.update", "status": "idle"})
    await watcher.expect(changed(bob, "idle"))
    await eventually(lambda: count_is(edge, server, 3), timeout=10)

    ShardClient(owner).kill(restart=True)

    # Within a few seconds the restarted shard knows bob's socket again (re-registered by the
    # edge that holds it), with its idle flag; a query says so and changes flow again.
    async def bob_is_idle() -> bool:
        watcher.frames.clear()
        await watcher.send({"type": "presence.query", "userIds": [bob]})
        try:
            answer = await watcher.expect(lambda f: f.get("userId") == bob, timeout=2)
        except AssertionError:
            return False
        return answer["status"] == "idle"

    await eventually(bob_is_idle, timeout=20, interval=0.5)
    await b.send({"type": "presence.update", "status": "dnd"})
    await watcher.expect(changed(bob, "dnd"), timeout=10)
    await eventually(lambda: count_is(edge, server, 3), timeout=15)
    await b.close()
    await watcher.expect(changed(bob, "offline"), timeout=10)
    await c.close()
    await watcher.close()


async def test_flush_actor_killed_with_departures_pending(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    pg, _ = cluster.require_servers()
    users = [ids(f"u{i}") for i in range(5)]
    clients = [await connect(cluster, edge, u) for u in users]
    # Every shard running before PostgreSQL goes: one still to (re)start after an earlier test
    # (they start on their first call) cannot while PostgreSQL is away, and refuses calls until
    # it is back, by design (actors/lazy_start.py); the departures meant for it then waited at
    # the edge instead (a loaded suite, twice on 2026-12-05: "clean-up incomplete", a shard's
    # start failing on its pool). This test is about running shards.
    # One an earlier test killed may still be restarting: Ray answers ActorUnavailableError for
    # it meanwhile (once in a full suite, 2026-12-05), so the wait is for all of them to answer.
    _, _, count = await DirectoryClient().get_map()

    async def all_running() -> bool:
        try:
            await asyncio.gather(*(ShardClient(i).stats(30) for i in range(count)))
        except ActorDied:  # Ray's ActorUnavailableError while it restarts
            return False
        return True

    await eventually(all_running, timeout=60, interval=0.5)
    await conn.close()
    pg.stop()  # departures pile up in the FlushActor and, unacknowledged, in the shards
    try:
        departed = {}
        for u, c in zip(users, clients, strict=True):
            departed[u] = time.time()
            await c.close()
        await eventually(lambda: _departures_pending(len(users)))
        FlushClient().kill(restart=True)
        # Its successor is up, PostgreSQL still away, and the shards hand their departures again.
        await eventually(lambda: _departures_pending(len(users)))
    finally:
        pg.restart()
    got = await eventually(lambda: _all_stored(cluster.database_url, users), timeout=60)
    for u in users:
        assert abs(got[u] - departed[u]) < 1.0
    await _settled()


async def _settled() -> None:
    """Every departure acknowledged to its shard too, not only stored (a shard keeps one until
    the FlushActor confirms it): nothing of the outage is left pending for a later module of the
    same session cluster (test_lastseen_ws's freeze test waits for no departure pending in any
    shard)."""
    await eventually(no_pending_last_seen, timeout=60, interval=0.2)


async def _departures_pending(at_least: int) -> bool:
    """At least `at_least` departures wait, unwritten, in the shards (which keep each until the
    FlushActor acknowledges it), and the FlushActor answers holding some of them."""
    try:
        _, _, count = await DirectoryClient().get_map()
        in_shards = sum([(await ShardClient(i).stats(5)).pending_last_seen for i in range(count)])
        stats = await FlushClient().stats(5)
    except Exception:  # the FlushActor restarting: Ray's errors, or no such actor yet
        return False
    return in_shards >= at_least and stats["pending_rows"] + stats["in_flight_rows"] > 0
