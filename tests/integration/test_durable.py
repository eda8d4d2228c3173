"""Durable choices (issue 13, item 2): a chosen status or setting acknowledged to the client is
never lost nor reverted, even when the shard that acknowledged it dies before PostgreSQL saved it.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from actors import clients
from actors.core.slots import slot_of
from edge.server import Edge

from .conftest import Cluster, Ids, internal_url, load
from .recorder import operator_view
from .test_presence_ws import connect
from .wsclient import Client, changed, eventually, of_type

pytestmark = pytest.mark.integration


async def alice_watched_by_bob(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> tuple[str, Client, Client]:
    """alice connected on `edge`, watched by her friend bob from `second_edge`; `conn` closed
    (the tests stop PostgreSQL next)."""
    alice, bob = ids("alice"), ids("bob")
    await load(conn, {"users": [{"id": alice}, {"id": bob}], "friendships": [[alice, bob]]})
    watcher = await connect(cluster, second_edge, bob)
    await watcher.request({"type": "presence.subscribe", "userIds": [alice]}, of_type("presence.sync"))
    a = await connect(cluster, edge, alice)
    await watcher.expect(changed(alice, "online"))
    await conn.close()
    return alice, watcher, a


async def test_invisible_chosen_while_postgres_is_away_survives_a_shard_kill(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    """The case the contract forbids outright: `invisible` acknowledged while PostgreSQL is away,
    the shard killed, and after the restart the still-open socket shown `online` to a friend."""
    pg, _ = cluster.require_servers()
    alice, watcher, a = await alice_watched_by_bob(cluster, edge, second_edge, conn, ids)
    pg.stop()
    try:
        await a.send({"type": "presence.update", "status": "invisible"})
        await a.expect(lambda f: f.get("type") == "presence.self" and f.get("status") == "invisible")
        await watcher.expect(changed(alice, "offline"))
        told = len(watcher.log)
        _, owners, _ = await clients.DirectoryClient().get_map()
        clients.ShardClient(owners[slot_of(alice)]).kill(restart=True)
        # The shard restarts while PostgreSQL is still away: the scenario (its start fails).
        await asyncio.sleep(1.0)
    finally:
        pg.restart()

    async def registered_invisible() -> bool:
        try:
            view = await operator_view(internal_url(edge), alice)
        except OSError:
            return False
        return view["status"] == "invisible" and view["sockets"] == 1

    await eventually(registered_invisible, timeout=30, interval=0.5)

    async def saved() -> bool:
        c = await asyncpg.connect(cluster.database_url)
        try:
            return await c.fetchval("SELECT chosen_status FROM users WHERE id = $1", alice) == "invisible"
        finally:
            await c.close()

    await eventually(saved, timeout=30, interval=0.5)
    await watcher.roundtrip()
    assert [f for f in watcher.log[told:] if f.get("userId") == alice and f.get("status") != "offline"] == []
    await a.close()
    await watcher.close()


async def test_invisible_chosen_then_gone_while_postgres_is_away_survives_a_shard_kill(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    """`invisible` acknowledged while PostgreSQL is away, then the socket closes, then the shard
    dies: no socket is left to claim the choice when the shard comes back, only the edge's
    journal of the departure. Before, the choice was lost (stored `online`) and the replayed
    departure moved the account's last-seen past the moment it hid."""
    pg, _ = cluster.require_servers()
    alice, watcher, a = await alice_watched_by_bob(cluster, edge, second_edge, conn, ids)
    pg.stop()
    try:
        hid = time.time()
        await a.send({"type": "presence.update", "status": "invisible"})
        await a.expect(lambda f: f.get("type") == "presence.self" and f.get("status") == "invisible")
        await watcher.expect(changed(alice, "offline"))
        told = len(watcher.log)
        await asyncio.sleep(3.0)  # gone well after it hid
        await a.close()
        await eventually(lambda: not [c for c in edge.conns.values() if c.session.user_id == alice])
        _, owners, _ = await clients.DirectoryClient().get_map()
        clients.ShardClient(owners[slot_of(alice)]).kill(restart=True)
        # The shard restarts while PostgreSQL is still away: the scenario (its start fails).
        await asyncio.sleep(1.0)
    finally:
        pg.restart()

    async def stored() -> tuple[str, float] | None:
        try:
            c = await asyncpg.connect(cluster.database_url)
        except OSError:
            return None
        try:
            row = await c.fetchrow("SELECT chosen_status, last_seen_at FROM users WHERE id = $1", alice)
        finally:
            await c.close()
        if row is None or row["chosen_status"] != "invisible" or row["last_seen_at"] is None:
            return None
        return row["chosen_status"], row["last_seen_at"].timestamp()

    _, last_seen = await eventually(stored, timeout=45, interval=0.5)
    assert abs(last_seen - hid) < 1.5, (last_seen, hid)  # frozen at the hide, not the departure
    await watcher.roundtrip()
    assert [f for f in watcher.log[told:] if f.get("userId") == alice and f.get("status") != "offline"] == []
    await watcher.close()
