"""FlushActor against a real PostgreSQL: the seed's verification, racing writers, clamping, one
statement per batch, and a database that goes away while writes are pending."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import asyncpg
import pytest

from actors.flush import UPDATE_SQL, FlushActor, FlushStoppedError
from cluster.db import migrate
from tests.timing import patience

from .wsclient import eventually

if TYPE_CHECKING:
    from cluster.embedded import EmbeddedPostgres

pytestmark = pytest.mark.integration


async def make_users(conn: asyncpg.Connection, ids: list[str]) -> None:
    await conn.execute("INSERT INTO users (id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING", ids)


async def stored(conn: asyncpg.Connection, ids: list[str] | None = None) -> dict[str, float | None]:
    if ids is None:
        rows = await conn.fetch("SELECT id, last_seen_at FROM users")
    else:
        rows = await conn.fetch("SELECT id, last_seen_at FROM users WHERE id = ANY($1::text[])", ids)
    return {r["id"]: (r["last_seen_at"].timestamp() if r["last_seen_at"] else None) for r in rows}


async def holds(actor: FlushActor, pending: int) -> bool:
    """`pending` rows buffered and not yet sent."""
    return bool((await actor.stats())["pending_rows"] == pending)


async def failed(actor: FlushActor, times: int) -> bool:
    """The actor has failed to write (or to connect) at least `times` times."""
    return bool((await actor.stats())["errors"] >= times)


def close(a: float | None, b: float) -> bool:
    # timestamptz keeps microseconds; a float epoch time has ~0.2 µs resolution today.
    return a is not None and abs(a - b) < 2e-6


@pytest.fixture
async def actors(migrated_pg_url: str) -> AsyncIterator[Callable[..., FlushActor]]:
    """A factory of started FlushActors on the shared database, all stopped afterwards."""
    made: list[FlushActor] = []

    def make(**kwargs: object) -> FlushActor:
        actor = FlushActor(migrated_pg_url, **kwargs)  # type: ignore[arg-type]
        made.append(actor)
        return actor

    yield make
    for actor in made:
        await actor.stop()


# ---------------------------------------------------------------------------- the seed's check


async def test_stored_value_equals_submitted_within_flush_interval(
    db: asyncpg.Connection, actors: Callable[..., FlushActor]
) -> None:
    """Scripted scenario: departures written through the actor are stored exactly, and `write`
    returns within about one flush interval."""
    interval = 0.2
    actor = actors(interval_s=interval)
    await actor.start()
    ids = [f"seed-{i}" for i in range(50)]
    await make_users(db, ids)
    # Several "coarse" records while online, then the exact departure time, per account.
    now = time.time()
    departures = {uid: now - random.uniform(0, 5) for uid in ids}
    coarse = [(uid, t - 600 * k) for uid, t in departures.items() for k in (1, 2, 3)]

    started = time.monotonic()
    await asyncio.gather(actor.write(coarse), actor.write(list(departures.items())))
    elapsed = time.monotonic() - started
    assert elapsed < interval + 1.0, f"write took {elapsed:.2f}s"

    values = await stored(db, ids)
    for uid, t in departures.items():
        assert close(values[uid], t), (uid, values[uid], t)
    stats = await actor.stats()
    # 200 entries for 50 accounts, coalesced into one statement of 50 rows.
    assert stats["statements"] == 1
    assert stats["rows_written"] == 50
    assert stats["pending_rows"] == 0 and stats["in_flight_rows"] == 0


async def test_null_column_takes_the_value_and_unknown_ids_do_not_block(
    db: asyncpg.Connection, actors: Callable[..., FlushActor]
) -> None:
    actor = actors(interval_s=0.05)
    await make_users(db, ["known"])
    t = time.time() - 10
    await actor.write([("known", t), ("no-such-user", t)])
    values = await stored(db)
    assert close(values["known"], t)
    assert "no-such-user" not in values  # UPDATE only: the shards create users rows
    stats = await actor.stats()
    assert stats["rows_written"] == 2 and stats["rows_updated"] == 1


async def test_write_returns_only_after_commit(
    db: asyncpg.Connection, actors: Callable[..., FlushActor]
) -> None:
    actor = actors(interval_s=0.3)
    await make_users(db, ["a"])
    t = time.time()
    task = asyncio.create_task(actor.write([("a", t)]))
    await eventually(lambda: holds(actor, pending=1))  # buffered, the interval not yet over
    assert not task.done()
    assert (await stored(db, ["a"]))["a"] is None
    await asyncio.wait_for(task, patience(5))
    assert close((await stored(db, ["a"]))["a"], t)


async def test_coalesced_entries_are_satisfied_by_a_later_value(
    db: asyncpg.Connection, actors: Callable[..., FlushActor]
) -> None:
    actor = actors(interval_s=0.2)
    await make_users(db, ["a"])
    t = time.time()
    # The older value is merged into the newer one and never written itself: its caller must
    # still be released when the newer value commits.
    await asyncio.wait_for(
        asyncio.gather(actor.write([("a", t - 100)]), actor.write([("a", t)])), patience(5)
    )
    assert close((await stored(db, ["a"]))["a"], t)
    assert (await actor.stats())["rows_written"] == 1


async def test_empty_write_returns_at_once(actors: Callable[..., FlushActor]) -> None:
    actor = actors()
    await asyncio.wait_for(actor.write([]), 1)


async def test_bad_timestamp_is_refused_and_nothing_is_buffered(actors: Callable[..., FlushActor]) -> None:
    actor = actors()
    with pytest.raises(ValueError):
        await actor.write([("a", time.time()), ("b", float("nan"))])
    assert (await actor.stats())["pending_rows"] == 0


# ---------------------------------------------------------------------------- idempotency


async def test_two_actors_racing_and_replays_never_move_time_backwards(
    db: asyncpg.Connection, actors: Callable[..., FlushActor], migrated_pg_url: str
) -> None:
    rng = random.Random(7)
    ids = [f"race-{i:03}" for i in range(300)]
    await make_users(db, ids)
    base = time.time() - 3600
    # Every account's history: 8 increasing departures.
    history = {uid: sorted(base + rng.uniform(0, 3000) for _ in range(8)) for uid in ids}
    a = actors(interval_s=0.02, max_rows=40)
    b = actors(interval_s=0.02, max_rows=40)

    async def writer(actor: FlushActor, seed: int) -> None:
        r = random.Random(seed)
        entries = [(uid, t) for uid, ts in history.items() for t in ts]
        r.shuffle(entries)  # values for one account arrive in any order
        for i in range(0, len(entries), 150):
            await actor.write(entries[i : i + 150])

    snapshots: list[dict[str, float | None]] = []
    done = asyncio.Event()

    async def watcher() -> None:
        conn = await asyncpg.connect(migrated_pg_url)
        try:
            while not done.is_set():
                snapshots.append(await stored(conn, ids))
                # The sampling interval: every value the table ever showed is recorded.
                await asyncio.sleep(0.01)
            snapshots.append(await stored(conn, ids))
        finally:
            await conn.close()

    watch = asyncio.create_task(watcher())
    # Two actors with overlapping batches, twice each (the second round replays everything).
    await asyncio.wait_for(
        asyncio.gather(writer(a, 1), writer(b, 2), writer(a, 3), writer(b, 4)), patience(30)
    )
    done.set()
    await watch

    # Replaying an old batch directly, after the fact, changes nothing either.
    old_times = [datetime.fromtimestamp(history[uid][0], UTC) for uid in ids]
    await db.execute(UPDATE_SQL, ids, old_times)
    snapshots.append(await stored(db, ids))

    assert len(snapshots) >= 3
    for before, after in itertools.pairwise(snapshots):
        for uid in ids:
            old, new = before[uid], after[uid]
            if old is not None:
                assert new is not None and new >= old, uid
    final = snapshots[-1]
    for uid, ts in history.items():
        assert close(final[uid], ts[-1]), uid
    sa, sb = await a.stats(), await b.stats()
    assert sa["errors"] == 0 and sb["errors"] == 0  # no deadlocks between the racing writers


# ---------------------------------------------------------------------------- clamping


async def test_future_timestamps_are_clamped(
    db: asyncpg.Connection, actors: Callable[..., FlushActor]
) -> None:
    await make_users(db, ["future", "skewed"])
    # The actor's own clamp: a departure an hour ahead of the actor's clock.
    actor = actors(interval_s=0.02)
    before = time.time()
    await actor.write([("future", time.time() + 3600)])
    after = time.time()
    value = (await stored(db, ["future"]))["future"]
    assert value is not None and before - 1e-3 <= value <= after + 1e-3

    # The database's clamp (LEAST with now()), for an actor whose own clock runs an hour fast.
    fast = actors(interval_s=0.02, clock=lambda: time.time() + 3600)
    db_before = (await db.fetchval("SELECT now()")).timestamp()
    await fast.write([("skewed", time.time() + 1800)])
    db_after = (await db.fetchval("SELECT now()")).timestamp()
    value = (await stored(db, ["skewed"]))["skewed"]
    assert value is not None and db_before <= value <= db_after + 1.0


async def test_an_invisible_accounts_last_seen_stays_frozen_at_the_moment_it_hid(
    db: asyncpg.Connection, actors: Callable[..., FlushActor]
) -> None:
    """A writer that could not read the row (a departure recorded after a restart with PostgreSQL
    away) sends a later time: the statement itself keeps an invisible account's last-seen at the
    moment it hid (chosen_at), and moves everybody else's as usual."""
    await make_users(db, ["hidden", "visible", "legacy"])
    hid = time.time() - 600
    await db.execute(
        "UPDATE users SET chosen_status = 'invisible', chosen_at = to_timestamp($1), "
        "last_seen_at = to_timestamp($1 - 60) WHERE id = 'hidden'",
        hid,
    )
    # Invisible since a moment nobody knows (stored before the time columns, or by the host
    # application): not written at all.
    await db.execute("UPDATE users SET chosen_status = 'invisible' WHERE id = 'legacy'")
    actor = actors(interval_s=0.02)
    left = time.time() - 5
    await actor.write([("hidden", left), ("visible", left), ("legacy", left)])
    values = await stored(db, ["hidden", "visible", "legacy"])
    assert close(values["hidden"], hid) and close(values["visible"], left) and values.get("legacy") is None


# ---------------------------------------------------------------------------- statements


async def test_one_statement_per_batch(db: asyncpg.Connection, actors: Callable[..., FlushActor]) -> None:
    ids = [f"bulk-{i:05}" for i in range(2500)]
    await make_users(db, ids)
    actor = actors(interval_s=0.5, max_rows=1000)
    t = time.time() - 60
    await asyncio.wait_for(actor.write([(uid, t) for uid in ids]), patience(10))
    stats = await actor.stats()
    assert stats["statements"] == 3  # 1000 + 1000 + 500
    assert stats["rows_written"] == 2500
    assert stats["rows_updated"] == 2500
    values = await stored(db, ids)
    assert all(close(values[uid], t) for uid in ids)


async def test_overloaded_buffer_holds_new_writes_back(
    db: asyncpg.Connection, actors: Callable[..., FlushActor]
) -> None:
    ids = [f"ov-{i}" for i in range(8)]
    await make_users(db, ids)
    actor = actors(interval_s=0.3, max_rows=100, max_pending=3)
    t = time.time()
    first = asyncio.create_task(actor.write([(uid, t) for uid in ids[:5]]))  # accepted: never dropped
    await eventually(lambda: holds(actor, pending=5))
    assert (await actor.stats())["overloaded"] == 1
    second = asyncio.create_task(actor.write([(uid, t) for uid in ids[5:]]))
    # One turn of the event loop (the actor runs in it): the write runs until it waits for room.
    await asyncio.sleep(0)
    # Held back before adding: the entries stay with the caller until there is room.
    assert not second.done()
    assert (await actor.stats())["pending_rows"] == 5
    await asyncio.wait_for(asyncio.gather(first, second), patience(5))
    values = await stored(db, ids)
    assert all(close(values[uid], t) for uid in ids)
    assert (await actor.stats())["overloaded"] == 0


# ---------------------------------------------------------------------------- drain and stop


async def test_drain_ignores_the_interval(db: asyncpg.Connection, actors: Callable[..., FlushActor]) -> None:
    await make_users(db, ["d1", "d2"])
    actor = actors(interval_s=60.0)
    t = time.time()
    task = asyncio.create_task(actor.write([("d1", t), ("d2", t)]))
    await eventually(lambda: holds(actor, pending=2))
    started = time.monotonic()
    assert await actor.drain(5.0) == 0
    assert time.monotonic() - started < 2.0
    await asyncio.wait_for(task, 1)
    values = await stored(db, ["d1", "d2"])
    assert close(values["d1"], t) and close(values["d2"], t)
    assert await actor.drain(1.0) == 0  # nothing left: immediate


async def test_stop_releases_waiting_writers_with_an_error(actors: Callable[..., FlushActor]) -> None:
    actor = actors(interval_s=60.0)
    task = asyncio.create_task(actor.write([("s1", time.time())]))
    await eventually(lambda: holds(actor, pending=1))  # waiting for its commit
    await actor.stop()
    with pytest.raises(FlushStoppedError):
        await task
    with pytest.raises(FlushStoppedError):
        await actor.write([("s2", time.time())])


# ---------------------------------------------------------------------------- database away


@pytest.fixture
async def private_db(embedded_pg: EmbeddedPostgres) -> AsyncIterator[str]:
    """The private server, migrated, with an empty users table."""
    url = embedded_pg.url
    await migrate(url)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("TRUNCATE users")
    finally:
        await conn.close()
    yield url
    if not embedded_pg.running:
        await asyncio.to_thread(embedded_pg.restart)


async def test_postgres_stopped_with_writes_pending_then_restarted(
    private_db: str, embedded_pg: EmbeddedPostgres
) -> None:
    url = private_db
    ids = [f"outage-{i}" for i in range(20)]
    conn = await asyncpg.connect(url)
    await make_users(conn, ids)
    await conn.close()

    actor = FlushActor(url, interval_s=0.05, max_rows=7)
    try:
        # Prove the connection is established before the outage, so the outage breaks it.
        await asyncio.wait_for(actor.write([(ids[0], time.time() - 100)]), patience(5))
        assert (await actor.stats())["connected"] == 1

        await asyncio.to_thread(embedded_pg.stop)
        t = time.time()
        writes = [asyncio.create_task(actor.write([(uid, t - i)])) for i, uid in enumerate(ids)]
        # Failed, backed off and failed again: no write may have returned meanwhile.
        await eventually(lambda: failed(actor, times=2), timeout=10)
        assert not any(w.done() for w in writes), "write returned although nothing was committed"
        stats = await actor.stats()
        assert stats["pending_rows"] + stats["in_flight_rows"] == len(ids)

        await asyncio.to_thread(embedded_pg.restart)
        await asyncio.wait_for(asyncio.gather(*writes), patience(30))

        conn = await asyncpg.connect(url)
        try:
            values = await stored(conn, ids)
        finally:
            await conn.close()
        for i, uid in enumerate(ids):
            assert close(values[uid], t - i), uid
        stats = await actor.stats()
        assert stats["retries"] >= 1
        assert stats["pending_rows"] == 0 and stats["in_flight_rows"] == 0
    finally:
        await actor.stop()


async def test_actor_starts_with_the_database_down(private_db: str, embedded_pg: EmbeddedPostgres) -> None:
    url = private_db
    conn = await asyncpg.connect(url)
    await make_users(conn, ["early"])
    await conn.close()
    await asyncio.to_thread(embedded_pg.stop)

    actor = FlushActor(url, interval_s=0.05)
    try:
        await asyncio.wait_for(actor.start(), 1)  # never waits for the database
        t = time.time()
        write = asyncio.create_task(actor.write([("early", t)]))
        await eventually(lambda: failed(actor, times=2), timeout=10)
        assert not write.done()
        # A drain that cannot finish reports what is left instead of hanging.
        assert await actor.drain(0.2) == 1

        await asyncio.to_thread(embedded_pg.restart)
        await asyncio.wait_for(write, patience(30))
        conn = await asyncpg.connect(url)
        try:
            assert close((await stored(conn, ["early"]))["early"], t)
        finally:
            await conn.close()
    finally:
        await actor.stop()
