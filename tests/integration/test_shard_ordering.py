"""The shard shell (`actors.presence.PresenceShard`) in this process, on the real PostgreSQL and
Redis of the test cluster (no Ray: the shell's own ordering is what is tested).

One edge's batches must apply in the order they arrive even when an earlier one waits on
PostgreSQL and a later one needs nothing loaded; otherwise a disconnect overtakes its connect and
leaves a ghost socket online.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from actors.core import ops
from actors.pgstore import PostgresStore
from actors.presence import PresenceShard, ShardConfig
from tests.integration.conftest import Cluster, Ids, load

pytestmark = pytest.mark.integration


@pytest.fixture
async def shard(cluster: Cluster) -> AsyncIterator[PresenceShard]:
    written: list[Any] = []

    async def flush_write(rows: list[tuple[str, float]]) -> None:
        written.extend(rows)  # where the FlushActor would take them; not under test here

    s = PresenceShard(
        ShardConfig(0, cluster.database_url, cluster.redis_url),
        flush_write=flush_write,
        store=PostgresStore(cluster.database_url),
    )
    await s.start()
    yield s
    await s.stop()


async def test_a_later_batch_never_overtakes_an_earlier_one_of_the_same_edge(
    shard: PresenceShard, conn: asyncpg.Connection, ids: Ids
) -> None:
    user = ids("ordered")
    await load(conn, {"users": [{"id": user}]})
    # The connect must load the account from PostgreSQL; the disconnect needs nothing loaded.
    connect = asyncio.create_task(shard.apply("edge-a", [ops.Connect(user, "s1")]))
    await asyncio.sleep(0)  # the connect is now waiting on PostgreSQL
    disconnect = asyncio.create_task(shard.apply("edge-a", [ops.Disconnect(user, "s1")]))
    (_, [connected]), (_, [disconnected]) = await asyncio.gather(connect, disconnect)
    assert connected[0] == "online" and disconnected is None
    assert shard.state.socket_count() == 0
    assert shard.state.real_status_of(user) == "offline"


async def test_batches_of_different_edges_do_not_wait_for_each_other(
    shard: PresenceShard, conn: asyncpg.Connection, ids: Ids
) -> None:
    loaded, fresh = ids("loaded"), ids("fresh")
    await load(conn, {"users": [{"id": loaded}, {"id": fresh}]})
    await shard.apply("edge-b", [ops.Connect(loaded, "s1")])
    slow = asyncio.create_task(shard.apply("edge-a", [ops.Connect(fresh, "s2")]))
    await asyncio.sleep(0)  # edge-a's batch is waiting on PostgreSQL
    fast = asyncio.create_task(shard.apply("edge-b", [ops.SetStatus(loaded, "s1", "dnd")]))
    done, _ = await asyncio.wait({slow, fast}, return_when=asyncio.FIRST_COMPLETED)
    assert fast in done  # edge-b's batch did not queue behind edge-a's
    await slow
