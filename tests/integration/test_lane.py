"""The direct lane (actors/lane.py) with real Ray shards: the edges' hot calls take it, it
listens on loopback only for a local Ray, it survives a shard's restart the way a Ray call does,
and the Ray road (`PRESENCE_SHARD_LANE=ray`) still carries a whole presence change."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import psutil
import pytest

from actors import clients, lane
from actors.core import ops
from edge.server import Edge

from .conftest import SHARDS, Cluster, Ids, load
from .test_presence_ws import connect
from .wsclient import changed, eventually, of_type

pytestmark = pytest.mark.integration


async def test_the_lane_listens_on_loopback_only_with_a_secret_of_its_own(cluster: Cluster) -> None:
    endpoints = {await clients.ShardClient(i).lane_endpoint() for i in range(SHARDS)}
    assert len(endpoints) == SHARDS
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.net_connections("tcp") if c.status == "LISTEN"}
    for host, port in endpoints:
        assert host == "127.0.0.1"
        assert (host, port) in listening
        assert ("0.0.0.0", port) not in listening


async def test_the_ray_road_carries_a_presence_change_end_to_end(
    cluster: Cluster, conn: asyncpg.Connection, ids: Ids
) -> None:
    edge = Edge(cluster.edge_config(shard_lane_direct=False))
    await edge.start()
    try:
        assert not any(s.direct for s in edge.router.shards.values())
        alice, bob = ids("alice"), ids("bob")
        await load(conn, {"users": [{"id": alice}, {"id": bob}], "friendships": [[alice, bob]]})
        watcher = await connect(cluster, edge, bob)
        await watcher.request({"type": "presence.subscribe", "userIds": [alice]}, of_type("presence.sync"))
        a = await connect(cluster, edge, alice)
        await watcher.expect(changed(alice, "online"))
        await a.close()
        await watcher.expect(changed(alice, "offline"))
        await watcher.close()
    finally:
        await edge.stop()


async def test_a_shard_restart_breaks_its_lane_like_a_ray_call_and_the_next_call_finds_the_new_one(
    cluster: Cluster,
) -> None:
    shard = clients.ShardClient(0, direct=True)
    incarnation, _, _ = await shard.apply_and_collect("lane-test-edge", [ops.PING], None, 0)
    before = await shard.lane_endpoint()
    clients.ShardClient(0).kill(restart=True)

    async def failed_as_a_dead_actor() -> bool:  # ray.kill returns before the process is gone
        try:
            await shard.apply_and_collect("lane-test-edge", [ops.PING], incarnation, 0)
        except clients.ActorDied:
            return True
        return False

    await eventually(failed_as_a_dead_actor, timeout=30)

    async def answered_by_the_new_incarnation() -> str | None:
        try:
            now, _, _ = await shard.apply_and_collect("lane-test-edge", [ops.PING], None, 0)
        except clients.ActorDied:
            return None
        return now if now != incarnation else None

    await eventually(answered_by_the_new_incarnation, timeout=60)
    assert await shard.lane_endpoint() != before  # a new process, a new port (and secret)
    shard.close_lane()


async def _squat(host: str, port: int) -> None:
    """One silent connection from 127.0.0.2, opened again whenever the shard drops it."""
    while True:
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.2", 0))
        except OSError:
            # The squatter's pace between attempts (the scenario's attacker).
            await asyncio.sleep(0.05)
            continue
        try:
            await reader.read()
        except OSError:
            pass
        finally:
            writer.close()


async def test_a_real_edge_connects_while_another_source_holds_the_lanes_maximum(
    cluster: Cluster, conn: asyncpg.Connection, ids: Ids
) -> None:
    """Issue 29: a process on 127.0.0.2 keeps more silent handshakes open than a shard's old cap
    for everybody (64) on every shard's lane; a new edge from 127.0.0.1 still takes every lane at
    once and carries a presence change (on the old code its handshakes were refused while the
    squatter held the cap: 7 of 8 failed)."""
    endpoints = [await clients.ShardClient(i).lane_endpoint() for i in range(SHARDS)]
    squatters = [
        asyncio.create_task(_squat(host, port))
        for host, port in endpoints
        for _ in range(lane.MAX_HANDSHAKES + 8)
    ]
    await asyncio.sleep(0.5)  # let them reach the shards
    edge = Edge(cluster.edge_config(call_retry_s=3.0))
    try:
        started = time.monotonic()
        await asyncio.wait_for(edge.start(), 5)
        took = time.monotonic() - started
        alice, bob = ids("alice"), ids("bob")
        await load(conn, {"users": [{"id": alice}, {"id": bob}], "friendships": [[alice, bob]]})
        watcher = await connect(cluster, edge, bob)
        await watcher.request({"type": "presence.subscribe", "userIds": [alice]}, of_type("presence.sync"))
        a = await connect(cluster, edge, alice)
        await watcher.expect(changed(alice, "online"))
        assert took < lane.HANDSHAKE_S, f"the edge waited {took:.1f} s for its lanes"
        await a.close()
        await watcher.close()
    finally:
        for t in squatters:
            t.cancel()
        await asyncio.gather(*squatters, return_exceptions=True)
        await edge.stop()
