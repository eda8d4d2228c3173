"""The direct lane (actors/lane.py) with real Ray shards: the edges' hot calls take it, it
listens on loopback only for a local Ray, it survives a shard's restart the way a Ray call does,
and the Ray road (`PRESENCE_SHARD_LANE=ray`) still carries a whole presence change."""

from __future__ import annotations

import asyncpg
import psutil
import pytest

from actors import clients
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
