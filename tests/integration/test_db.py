"""The database layer against a real PostgreSQL: migration, `presence load`, the shards' batched
reads and writes, and NOTIFY delivery through AudienceListener (including across a restart)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg
import pytest

from actors.core.audience import Relations
from actors.pgstore import PostgresStore, create_pool
from cluster import db as database
from cluster.embedded import EmbeddedPostgres

from .wsclient import eventually

# A choice time (epoch seconds, whole so it survives timestamptz exactly).
T = 1_790_000_000.0

pytestmark = pytest.mark.integration

SENTINEL = "u:__sentinel__"


async def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    try:
        await eventually(condition, timeout, interval=0.01)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


class Notifications:
    """Collects raw `presence_audience` payloads on a plain LISTEN connection.

    `drain()` sends a sentinel and waits for it: NOTIFYs are delivered in commit order, so once the
    sentinel is in, everything committed before it is too, and "nothing arrived" is a fact rather
    than a hope.
    """

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.payloads: list[str] = []

    def _on(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        self.payloads.append(payload)

    async def drain(self) -> set[str]:
        await self.conn.execute("SELECT pg_notify($1, $2)", database.NOTIFY_CHANNEL, SENTINEL)
        await wait_for(lambda: SENTINEL in self.payloads, what="sentinel notification")
        got = set(self.payloads[: self.payloads.index(SENTINEL)])
        self.payloads.clear()
        return got


@pytest.fixture
async def notes(db: asyncpg.Connection, migrated_pg_url: str) -> AsyncIterator[Notifications]:
    conn = await asyncpg.connect(migrated_pg_url)
    recorder = Notifications(conn)
    await conn.add_listener(database.NOTIFY_CHANNEL, recorder._on)
    try:
        yield recorder
    finally:
        await conn.close()


async def table(conn: asyncpg.Connection, sql: str) -> set[tuple[Any, ...]]:
    return {tuple(r) for r in await conn.fetch(sql)}


# -- migrate ---------------------------------------------------------------------------------------


@pytest.fixture
async def fresh_database_url(pg_url: str) -> AsyncIterator[str]:
    """An empty database on the shared server, so migrations really create everything."""
    name = f"migrate_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


async def test_migrate_twice_and_concurrently(fresh_database_url: str) -> None:
    await asyncio.gather(*(database.migrate(fresh_database_url) for _ in range(3)))
    await database.migrate(fresh_database_url)
    conn = await asyncpg.connect(fresh_database_url)
    try:
        tables = {
            r["tablename"]
            for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname='public'")
        }
        assert tables == {
            "users",
            "friendships",
            "servers",
            "server_members",
            "channels",
            "pool_size",
            "slot_map",
        }
        triggers = await conn.fetchval("SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal")
        assert triggers == 8  # server_members: one per row on UPDATE, one per statement on INSERT, DELETE
        pool = await asyncpg.create_pool(fresh_database_url, min_size=1, max_size=2)
        await database.migrate(pool)  # a pool works too
        await pool.close()
        await database.migrate(conn)  # and a connection
    finally:
        await conn.close()


async def test_the_pool_size_presence_scale_set_outlives_ray(fresh_database_url: str) -> None:
    """Issue 25: a head restart without GCS fault tolerance brought back the configured pool,
    not the one `presence scale` had made; `presence up` now starts at the recorded size."""
    from cluster.config import Settings
    from cluster.up import pool_size

    await database.migrate(fresh_database_url)
    assert await database.recorded_pool_size(fresh_database_url) is None
    assert await asyncio.to_thread(pool_size, Settings(shards=8), fresh_database_url) == 8
    await database.record_pool_size(fresh_database_url, 12)
    await database.record_pool_size(fresh_database_url, 12)
    assert await database.recorded_pool_size(fresh_database_url) == 12
    assert await asyncio.to_thread(pool_size, Settings(shards=8), fresh_database_url) == 12


# -- presence load ---------------------------------------------------------------------------------

BASE = {
    "users": [{"id": "u1", "lastSeenVisibility": "friends"}, {"id": "u2"}],
    "friendships": [["u2", "u1"], ["u1", "u3"]],
    "servers": [{"id": "g1", "members": ["u1", "u2", "u4"], "channels": ["c1", "c2"]}],
}


async def test_load_fixture_creates_everything(db: asyncpg.Connection) -> None:
    counts = await database.load_fixture(db, BASE)
    assert counts == {
        "users": 4,
        "friendships_added": 2,
        "friendships_removed": 0,
        "servers_added": 1,
        "members_added": 3,
        "members_removed": 0,
        "channels_upserted": 2,
        "channels_removed": 0,
    }
    assert await table(db, "SELECT id, last_seen_visibility FROM users") == {
        ("u1", "friends"),
        ("u2", "everyone"),
        ("u3", "everyone"),
        ("u4", "everyone"),
    }
    assert await table(db, "SELECT a, b FROM friendships") == {("u1", "u2"), ("u1", "u3")}
    assert await table(db, "SELECT server_id, user_id FROM server_members") == {
        ("g1", "u1"),
        ("g1", "u2"),
        ("g1", "u4"),
    }
    assert await table(db, "SELECT id, server_id FROM channels") == {("c1", "g1"), ("c2", "g1")}


async def test_load_fixture_twice_changes_nothing(db: asyncpg.Connection, notes: Notifications) -> None:
    await database.load_fixture(db, BASE)
    assert await notes.drain()  # the first load did notify
    counts = await database.load_fixture(db, BASE)
    assert set(counts.values()) == {0}
    assert await notes.drain() == set()


async def test_load_fixture_replaces_lists_and_removes_friendships(
    db: asyncpg.Connection, notes: Notifications
) -> None:
    await database.load_fixture(db, BASE)
    await database.load_fixture(db, {"servers": [{"id": "g2", "channels": ["c9"]}]})
    await notes.drain()

    counts = await database.load_fixture(
        db,
        {
            "users": [{"id": "u1", "lastSeenVisibility": "nobody"}],
            "removedFriendships": [["u3", "u1"], ["u5", "u6"]],
            "servers": [
                {"id": "g1", "members": ["u2", "u5"], "channels": ["c2", "c9"]},
                {"id": "g2", "members": []},
            ],
        },
    )
    assert counts == {
        "users": 2,  # u1's setting changed, u5 created
        "friendships_added": 0,
        "friendships_removed": 1,
        "servers_added": 0,
        "members_added": 1,
        "members_removed": 2,
        "channels_upserted": 1,  # c9 moved from g2 to g1
        "channels_removed": 1,  # c1
    }
    assert await table(db, "SELECT a, b FROM friendships") == {("u1", "u2")}
    assert await table(db, "SELECT server_id, user_id FROM server_members") == {("g1", "u2"), ("g1", "u5")}
    assert await table(db, "SELECT id, server_id FROM channels") == {("c2", "g1"), ("c9", "g1")}
    # Notifications for exactly what changed: u2 kept its membership and is not mentioned.
    assert await notes.drain() == {"s:u1", "u:u1", "u:u3", "u:u4", "u:u5", "c:c1", "c:c9"}


async def test_load_fixture_leaves_absent_lists_alone(db: asyncpg.Connection) -> None:
    await database.load_fixture(db, BASE)
    counts = await database.load_fixture(db, {"servers": [{"id": "g1"}], "users": [{"id": "u1"}]})
    assert set(counts.values()) == {0}
    assert len(await database.server_member_ids(db, "g1")) == 3
    assert await db.fetchval("SELECT last_seen_visibility FROM users WHERE id='u1'") == "friends"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"user": []}, "user"),
        ({"users": [{"id": ""}]}, "users[0].id"),
        ({"users": [{"id": "x" * 129}]}, "users[0].id"),
        ({"users": [{"id": 7}]}, "users[0].id"),
        ({"users": [{"id": "u1", "lastSeenVisibility": "some"}]}, "users[0].lastSeenVisibility"),
        ({"users": [{"id": "u1", "name": "x"}]}, "users[0].name"),
        ({"users": [{"id": "u1"}, {"id": "u1"}]}, "users[1]"),
        ({"friendships": [["u1"]]}, "friendships[0]"),
        ({"friendships": [["u1", "u1"]]}, "friendships[0]"),
        ({"friendships": [["u1", "u2"]], "removedFriendships": [["u2", "u1"]]}, "removedFriendships"),
        ({"servers": [{"id": "g1", "members": ["u1", ""]}]}, "servers[0].members[1]"),
        ({"servers": [{"id": "g1", "channels": ["c"]}, {"id": "g2", "channels": ["c"]}]}, "'c'"),
        ({"servers": [{"id": "g1"}, {"id": "g1"}]}, "servers[1]"),
        ([], "input"),
    ],
)
async def test_load_fixture_rejects_bad_input(db: asyncpg.Connection, data: Any, field: str) -> None:
    with pytest.raises(ValueError, match="invalid presence load data") as caught:
        await database.load_fixture(db, data)
    assert isinstance(caught.value, database.FixtureError)
    assert field in str(caught.value) or field == "input"
    assert await db.fetchval("SELECT count(*) FROM users") == 0


async def test_load_fixture_large_member_lists(db: asyncpg.Connection) -> None:
    first = [f"user-{i}" for i in range(20_000)]
    second = first[5_000:] + [f"new-{i}" for i in range(5_000)]
    started = time.monotonic()
    await database.load_fixture(db, {"servers": [{"id": "big", "members": first}]})
    counts = await database.load_fixture(db, {"servers": [{"id": "big", "members": second}]})
    elapsed = time.monotonic() - started
    assert (counts["members_added"], counts["members_removed"]) == (5_000, 5_000)
    assert len(await database.server_member_ids(db, "big")) == 20_000
    assert elapsed < 10, f"two loads of 20,000 members took {elapsed:.1f} s"


# -- the shards' reads and writes ------------------------------------------------------------------


async def test_fetch_accounts_creates_missing_rows(db: asyncpg.Connection) -> None:
    await db.execute(
        "INSERT INTO users (id, chosen_status, last_seen_visibility, last_seen_at)"
        " VALUES ('old', 'invisible', 'nobody', to_timestamp(1700000000.5))"
    )
    rows = await database.fetch_accounts(db, ["old", "new", "new"])
    assert rows == {
        "old": database.AccountRow("invisible", "nobody", 1700000000.5),
        "new": database.AccountRow("online", "everyone", None),
    }
    assert await db.fetchval("SELECT count(*) FROM users") == 2
    assert await database.fetch_accounts(db, []) == {}


async def test_fetch_relations(db: asyncpg.Connection) -> None:
    await database.load_fixture(
        db,
        {
            "users": [{"id": "u2", "lastSeenVisibility": "friends"}],
            "friendships": [["u1", "u2"], ["u3", "u2"]],
            "servers": [{"id": "g1", "members": ["u1", "u2"]}, {"id": "g2", "members": ["u2"]}],
        },
    )
    rel = await database.fetch_relations(db, ["u1", "u2", "ghost"])
    assert rel == {
        "u1": Relations(frozenset({"u2"}), frozenset({"g1"}), "everyone"),
        "u2": Relations(frozenset({"u1", "u3"}), frozenset({"g1", "g2"}), "friends"),
        "ghost": Relations(frozenset(), frozenset(), "everyone"),
    }


async def test_channels_and_members(db: asyncpg.Connection) -> None:
    await database.load_fixture(db, {"servers": [{"id": "g1", "members": ["b", "a"], "channels": ["c1"]}]})
    assert await database.fetch_channel_servers(db, ["c1", "nope"]) == {"c1": "g1", "nope": None}
    assert await database.server_member_ids(db, "g1") == ["a", "b"]
    assert await database.server_member_ids(db, "none") == []


async def test_save_settings(db: asyncpg.Connection, notes: Notifications) -> None:
    await database.fetch_accounts(db, ["u1"])
    # The newest choice of each account wins, within the batch (whatever its order) ...
    saved = [("u1", "invisible", T + 2), ("u2", "online", T), ("u1", "dnd", T + 1)]
    assert await database.save_chosen_status(db, saved) == 2
    assert await database.save_visibility(db, [("u1", "friends", T), ("u3", "everyone", T)]) == 2
    assert await database.save_visibility(db, [("u1", "friends", T)]) == 0  # the same choice: not rewritten
    # ... and against the row: a late or replayed older write changes nothing.
    assert await database.save_chosen_status(db, [("u1", "online", T + 1)]) == 0
    assert await database.save_visibility(db, [("u1", "nobody", T - 5)]) == 0
    assert await table(db, "SELECT id, chosen_status, last_seen_visibility FROM users") == {
        ("u1", "invisible", "friends"),
        ("u2", "online", "everyone"),
        ("u3", "online", "everyone"),
    }
    rows = await database.read_accounts(db, ["u1"])
    assert (rows["u1"].chosen_at, rows["u1"].visibility_at) == (T + 2, T)
    assert await notes.drain() == {"s:u1"}
    assert await database.save_visibility(db, [("u1", "nobody", T + 3)]) == 1  # a newer one does
    with pytest.raises(ValueError, match="chosen_status"):
        await database.save_chosen_status(db, [("u1", "idle", T)])
    with pytest.raises(ValueError, match="last_seen_visibility"):
        await database.save_visibility(db, [("u1", "all", T)])


async def test_choice_times_of_rows_stored_before_them_are_unknown(db: asyncpg.Connection) -> None:
    """Rows from before the time columns (NULL) take any choice, and read back without a time."""
    await db.execute("INSERT INTO users (id, chosen_status) VALUES ('old', 'dnd')")
    assert (await database.read_accounts(db, ["old"]))["old"].chosen_at is None
    assert await database.save_chosen_status(db, [("old", "online", T)]) == 1


async def test_triggers_cover_direct_writes(db: asyncpg.Connection, notes: Notifications) -> None:
    """What a host application may do to the tables by hand reaches the shards too."""
    await db.execute("INSERT INTO friendships VALUES ('a', 'b')")
    await db.execute("UPDATE friendships SET b = 'c' WHERE a = 'a'")
    assert await notes.drain() == {"u:a", "u:b", "u:c"}
    await db.execute("INSERT INTO server_members VALUES ('g', 'm1')")
    await db.execute("UPDATE server_members SET user_id = 'm2'")
    await db.execute("DELETE FROM server_members")
    assert await notes.drain() == {"u:m1", "u:m2"}
    await db.execute("INSERT INTO channels VALUES ('ch', 'g')")
    await db.execute("UPDATE channels SET server_id = 'h'")
    assert await notes.drain() == {"c:ch"}
    await db.execute("INSERT INTO users (id) VALUES ('plain')")
    await db.execute("INSERT INTO users (id, last_seen_visibility) VALUES ('private', 'nobody')")
    await db.execute("UPDATE users SET last_seen_at = now()")
    assert await notes.drain() == {"s:private"}
    await db.execute("DELETE FROM users WHERE id = 'private'")
    assert await notes.drain() == {"s:private"}


async def test_a_big_membership_change_notifies_once(db: asyncpg.Connection, notes: Notifications) -> None:
    """More than 1,000 memberships changed by one statement (`presence load` of a big server) are
    one 'a:' notification (every shard reloads what it holds), not one per member; up to 1,000, one
    per member as before (issue 28 item 3: a million members were a million notifications)."""
    members = [f"huge-{i}" for i in range(1_001)]
    await database.load_fixture(db, {"servers": [{"id": "huge", "members": members}]})
    assert await notes.drain() == {"a:"}
    await database.load_fixture(db, {"servers": [{"id": "huge", "members": members[1:]}]})
    assert await notes.drain() == {"u:huge-0"}
    await db.execute("DELETE FROM server_members WHERE server_id = 'huge'")
    assert await notes.drain() == {f"u:{m}" for m in members[1:]}


# -- AudienceListener ------------------------------------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.resets = 0

    def listener(self, url: str, **kwargs: Any) -> database.AudienceListener:
        async def on_channel(channel_id: str) -> None:  # async callbacks are supported too
            self.events.append(("c", channel_id))

        return database.AudienceListener(
            url,
            on_user=lambda i: self.events.append(("u", i)),
            on_channel=on_channel,
            on_settings=lambda i: self.events.append(("s", i)),
            on_reset=self.reset,
            **kwargs,
        )

    def reset(self) -> None:
        self.resets += 1


async def test_listener_receives_audience_changes(db: asyncpg.Connection, migrated_pg_url: str) -> None:
    rec = Recorder()
    listener = rec.listener(migrated_pg_url)
    await listener.start()
    try:
        await listener.wait_connected(10)
        assert rec.resets == 1
        await database.load_fixture(db, BASE)
        expected = {("u", u) for u in ("u1", "u2", "u3", "u4")} | {("c", "c1"), ("c", "c2")}
        await wait_for(lambda: expected <= set(rec.events), what="load notifications")
        rec.events.clear()

        await database.load_fixture(db, {"servers": [{"id": "g1", "members": ["u1", "u2"]}]})
        await database.save_visibility(db, [("u2", "nobody", T)])
        await database.load_fixture(db, {"removedFriendships": [["u1", "u3"]]})
        await db.execute("SELECT pg_notify('presence_audience', 'garbage')")  # ignored
        await database.load_fixture(db, {"servers": [{"id": "g1", "channels": ["c1"]}]})
        await wait_for(lambda: ("c", "c2") in rec.events, what="channel notification")
        assert set(rec.events) == {("u", "u4"), ("s", "u2"), ("u", "u1"), ("u", "u3"), ("c", "c2")}
        await db.execute("SELECT pg_notify('presence_audience', 'a:')")  # many memberships at once
        await wait_for(lambda: rec.resets == 2, what="a reload of everything")
    finally:
        await listener.stop()
    assert not listener.connected


async def test_listener_recovers_after_postgres_restart(embedded_pg: EmbeddedPostgres) -> None:
    await database.migrate(embedded_pg.url)
    rec = Recorder()
    listener = rec.listener(embedded_pg.url, max_backoff_s=0.5, check_interval_s=1.0)
    await listener.start()
    try:
        await listener.wait_connected(10)
        assert rec.resets == 1

        await asyncio.to_thread(embedded_pg.stop)
        await wait_for(lambda: not listener.connected, what="listener to notice the server went away")
        await asyncio.sleep(1.0)  # let it fail a few reconnects while the server is down
        assert rec.resets == 1
        await asyncio.to_thread(embedded_pg.start, embedded_pg.data_dir)
        await wait_for(lambda: rec.resets == 2, what="listener to reconnect and reset")

        conn = await asyncpg.connect(embedded_pg.url)
        try:
            await database.load_fixture(conn, {"friendships": [["x", "y"]]})
        finally:
            await conn.close()
        await wait_for(lambda: {("u", "x"), ("u", "y")} <= set(rec.events), what="notification after restart")
    finally:
        await listener.stop()


# -- the shards' pool -------------------------------------------------------------------------------


async def test_the_shards_pool_skips_the_reset_query_and_still_rolls_back(migrated_pg_url: str) -> None:
    """A released connection goes back to the pool without asyncpg's reset query (a round trip
    before every batch that loads could go on, resetting nothing this store sets), and a
    transaction left open is still rolled back."""
    pool = await create_pool(migrated_pg_url, 1, 1)
    try:
        sent: list[str] = []
        async with pool.acquire() as c:
            c.add_query_logger(lambda record: sent.append(record.query))
            await c.fetchval("SELECT 1")
            await c.execute("BEGIN")
            await c.execute("CREATE TEMP TABLE left_open (x int)")
        async with pool.acquire() as again:
            assert not again.is_in_transaction()
            assert await again.fetchval("SELECT to_regclass('pg_temp.left_open')") is None
        assert "SELECT 1" in sent and "ROLLBACK" in sent, sent
        assert not any("RESET ALL" in q for q in sent), sent
    finally:
        await pool.close()


async def test_a_connection_that_failed_below_sql_is_not_handed_out_again(migrated_pg_url: str) -> None:
    """Without the reset query on release, nothing would find out a connection asyncpg lost its
    place on (an InternalClientError, seen as PostgreSQL restarted) or whose server went away:
    the store closes such a connection instead of giving it back, and counts the error as the
    store being away. An error of PostgreSQL's own keeps the connection. (Connections are told
    apart by their server process.)"""
    store = PostgresStore(migrated_pg_url, min_size=1, max_size=1)
    store.pool = await create_pool(migrated_pg_url, 1, 1)
    try:
        async with store._connection() as conn:
            first = conn.get_server_pid()
        with pytest.raises(asyncpg.UndefinedTableError):
            async with store._connection() as conn:
                await conn.fetch("SELECT * FROM no_such_table")
        async with store._connection() as conn:
            assert conn.get_server_pid() == first  # PostgreSQL's own error: kept
        for below_sql in (asyncpg.InternalClientError("lost its place"), asyncpg.InterfaceError("gone")):
            with pytest.raises(type(below_sql)) as raised:
                async with store._connection() as conn:
                    failed = conn.get_server_pid()
                    raise below_sql
            assert isinstance(raised.value, store.errors)
            async with store._connection() as conn:
                assert conn.get_server_pid() != failed
                assert await conn.fetchval("SELECT 1") == 1
    finally:
        await store.pool.close()
