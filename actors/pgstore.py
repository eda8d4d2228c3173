"""The shard's PostgreSQL store: batched reads and writes of what a shard keeps in memory, and
the LISTEN side of the audience-change notifications.

Every helper is one statement (arrays passed through `unnest`), never one round trip per row, so
a shard warming up thousands of accounts costs a handful of queries. Helpers accept an asyncpg
connection or pool; nothing here knows about Ray. The schema, its migration and `presence load`
are `cluster.db`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeAlias

import asyncpg

from actors.core.audience import Relations
from actors.core.backoff import Backoff
from actors.core.contract import AccountRow
from actors.core.status import CHOSEN_STATUSES, VISIBILITIES
from actors.store import AudienceEvents

log = logging.getLogger("presence.pgstore")

NOTIFY_CHANNEL = "presence_audience"

Queryable: TypeAlias = asyncpg.Connection | asyncpg.Pool

__all__ = [
    "NOTIFY_CHANNEL",
    "AccountRow",
    "AudienceListener",
    "PostgresStore",
    "Queryable",
    "fetch_accounts",
    "fetch_channel_servers",
    "fetch_relations",
    "last_seen_since",
    "read_accounts",
    "save_chosen_status",
    "save_visibility",
    "server_member_ids",
]


def _columns(rows: Iterable[tuple[str, str]]) -> tuple[list[str], list[str]]:
    """Sorted, de-duplicated pairs as two parallel arrays for `unnest($1, $2)`."""
    ordered = sorted(set(rows))
    return [r[0] for r in ordered], [r[1] for r in ordered]


def _affected(status: str) -> int:
    """Rows affected, from a command tag such as 'INSERT 0 3' or 'DELETE 2'."""
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


# -- the shards' reads and writes ------------------------------------------------------------------


_ROW_COLUMNS = "id, chosen_status, last_seen_visibility, last_seen_at, chosen_at, visibility_at"


def _epoch(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _account_row(r: Any) -> AccountRow:  # an asyncpg Record
    return AccountRow(
        r["chosen_status"],
        r["last_seen_visibility"],
        _epoch(r["last_seen_at"]),
        _epoch(r["chosen_at"]),
        _epoch(r["visibility_at"]),
    )


async def fetch_accounts(conn: Queryable, ids: Iterable[str]) -> dict[str, AccountRow]:
    """The durable state of each account, creating rows with defaults for unknown ones.

    One statement: the CTE inserts the missing rows and returns them; the rows that existed come
    from the statement's snapshot (which cannot see the CTE's inserts, so nothing is counted
    twice). A row inserted concurrently by somebody else falls between the two and is answered
    with the defaults, which is what it was created with.
    """
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = await conn.fetch(
        f"""WITH created AS (
               INSERT INTO users (id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING
               RETURNING {_ROW_COLUMNS})
           SELECT {_ROW_COLUMNS} FROM created
           UNION ALL
           SELECT {_ROW_COLUMNS} FROM users WHERE id = ANY($1::text[])""",
        wanted,
    )
    found = {r["id"]: _account_row(r) for r in rows}
    default = AccountRow("online", "everyone", None)
    return {i: found.get(i, default) for i in wanted}


async def read_accounts(conn: Queryable, ids: Iterable[str]) -> dict[str, AccountRow]:
    """The durable state of the accounts that exist; unlike `fetch_accounts`, creates nothing
    (the operator's view: reading an account never creates one)."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = await conn.fetch(f"SELECT {_ROW_COLUMNS} FROM users WHERE id = ANY($1::text[])", wanted)
    return {r["id"]: _account_row(r) for r in rows}


async def fetch_relations(conn: Queryable, ids: Iterable[str]) -> dict[str, Relations]:
    """Friends, servers and last-seen visibility of each account; unknown ids get empty sets and
    'everyone'. Each per-id subquery is an index lookup (friendships' primary key and its `b`
    index, server_members' `user_id` index)."""
    wanted = sorted(set(ids))
    if not wanted:
        return {}
    rows = await conn.fetch(
        """SELECT w.id,
                  ARRAY(SELECT f.b FROM friendships f WHERE f.a = w.id
                        UNION ALL
                        SELECT f.a FROM friendships f WHERE f.b = w.id) AS friends,
                  ARRAY(SELECT m.server_id FROM server_members m WHERE m.user_id = w.id) AS servers,
                  COALESCE(u.last_seen_visibility, 'everyone') AS visibility
           FROM unnest($1::text[]) AS w(id) LEFT JOIN users u ON u.id = w.id""",
        wanted,
    )
    return {
        r["id"]: Relations(
            friends=frozenset(r["friends"]),
            servers=frozenset(r["servers"]),
            last_seen_visibility=r["visibility"],
        )
        for r in rows
    }


async def fetch_channel_servers(conn: Queryable, channel_ids: Iterable[str]) -> dict[str, str | None]:
    """The server of each channel; None for a channel the database does not know."""
    wanted = sorted(set(channel_ids))
    if not wanted:
        return {}
    rows = await conn.fetch(
        """SELECT w.id, c.server_id FROM unnest($1::text[]) AS w(id)
           LEFT JOIN channels c ON c.id = w.id""",
        wanted,
    )
    return {r["id"]: r["server_id"] for r in rows}


async def server_member_ids(conn: Queryable, server_id: str) -> list[str]:
    """Every member of a server, sorted (the primary key's order, so no sort step)."""
    rows = await conn.fetch(
        "SELECT user_id FROM server_members WHERE server_id = $1 ORDER BY user_id", server_id
    )
    return [r["user_id"] for r in rows]


async def last_seen_since(
    conn: asyncpg.Connection, since: float, chunk: int = 1_000
) -> AsyncIterator[list[tuple[str, float]]]:
    """Stored last-seen times at or after `since` (epoch seconds), in chunks: what refills the
    active counts after Redis lost them (actors/core/activity.py)."""
    async with conn.transaction():
        batch: list[tuple[str, float]] = []
        async for r in conn.cursor(
            "SELECT id, extract(epoch FROM last_seen_at)::float8 AS t FROM users WHERE last_seen_at >= "
            "to_timestamp($1)",
            since,
            prefetch=chunk,
        ):
            batch.append((r["id"], r["t"]))
            if len(batch) >= chunk:
                yield batch
                batch = []
        if batch:
            yield batch


async def _save_setting(
    conn: Queryable, column: str, allowed: frozenset[str], items: Iterable[tuple[str, str, float]]
) -> int:
    """Upsert one settings column for many accounts with the time each value was chosen. The
    newest choice wins, within the batch and against the row's time column (schema.sql): a late
    or replayed write never reverts a newer one. Returns the number of rows written."""
    latest: dict[str, tuple[str, float]] = {}
    for user_id, value, at in items:
        if user_id not in latest or latest[user_id][1] <= at:
            latest[user_id] = (value, at)
    bad = {v for v, _ in latest.values() if v not in allowed}
    if bad:
        raise ValueError(f"{column}: invalid value(s) {sorted(bad)}, expected one of {sorted(allowed)}")
    if not latest:
        return 0
    ids = sorted(latest)
    stamp = _TIME_COLUMN[column]
    status = await conn.execute(
        f"""INSERT INTO users (id, {column}, {stamp})
            SELECT * FROM unnest($1::text[], $2::text[], $3::timestamptz[])
            ON CONFLICT (id) DO UPDATE SET {column} = EXCLUDED.{column}, {stamp} = EXCLUDED.{stamp}
            WHERE users.{stamp} IS NULL OR users.{stamp} < EXCLUDED.{stamp}""",
        ids,
        [latest[i][0] for i in ids],
        [datetime.fromtimestamp(latest[i][1], UTC) for i in ids],
    )
    return _affected(status)


_TIME_COLUMN = {"chosen_status": "chosen_at", "last_seen_visibility": "visibility_at"}


async def save_chosen_status(conn: Queryable, items: Iterable[tuple[str, str, float]]) -> int:
    """Persist chosen statuses (online, dnd, invisible) with their times; returns rows written."""
    return await _save_setting(conn, "chosen_status", CHOSEN_STATUSES, items)


async def save_visibility(conn: Queryable, items: Iterable[tuple[str, str, float]]) -> int:
    """Persist last-seen visibilities with their times; the settings trigger tells every shard."""
    return await _save_setting(conn, "last_seen_visibility", VISIBILITIES, items)


# -- LISTEN ----------------------------------------------------------------------------------------

IdCallback: TypeAlias = Callable[[str], object]
ResetCallback: TypeAlias = Callable[[], object]


class AudienceListener:
    """Receives the schema's `presence_audience` notifications on a dedicated connection.

    A notification sent while the connection was down is lost for good, so after every
    (re)connect, the first included, `on_reset()` is called once LISTEN is in place: the shard drops
    its whole audience cache and reloads on demand, and anything that changes from then on is
    notified. The connection is re-established with exponential backoff (with jitter, so many
    shards do not stampede a recovering server), and a periodic `SELECT 1` catches a connection
    that died without the socket noticing.

    Callbacks may be plain functions or coroutine functions; their exceptions are logged, never
    propagated into the listener.
    """

    def __init__(
        self,
        dsn: str,
        *,
        on_user: IdCallback,
        on_channel: IdCallback,
        on_settings: IdCallback,
        on_reset: ResetCallback,
        min_backoff_s: float = 0.1,
        max_backoff_s: float = 5.0,
        check_interval_s: float = 5.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self._dsn = dsn
        self._handlers: dict[str, IdCallback] = {
            "u": on_user,
            "c": on_channel,
            "s": on_settings,
            # More memberships changed at once than are worth a notification each (schema.sql):
            # whatever the shard holds may have changed, as after a reconnection.
            "a": lambda _ident: on_reset(),
        }
        self._on_reset = on_reset
        # Equal jitter: at least half of each window, so that a recovering server is not hit
        # again at once, and the shards' reconnections spread over the other half.
        self._backoff = Backoff(min_backoff_s, max_backoff_s, floor=0.5)
        self._check_interval = check_interval_s
        self._connect_timeout = connect_timeout_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._connected = asyncio.Event()
        self._pending: set[asyncio.Task[Any]] = set()
        self.resets = 0  # how many times on_reset was called (connections established)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def start(self) -> None:
        """Start listening in the background; returns at once (PostgreSQL may still be away)."""
        if self._task is not None and not self._task.done():
            return
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="presence-audience-listener")

    async def wait_connected(self, timeout: float) -> None:
        await asyncio.wait_for(self._connected.wait(), timeout)

    async def stop(self) -> None:
        """Stop listening and close the connection; pending async callbacks are cancelled."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for pending in list(self._pending):
            pending.cancel()
        self._connected.clear()

    async def _run(self) -> None:
        attempt = 0
        while not self._stopping.is_set():
            try:
                conn = await asyncpg.connect(self._dsn, timeout=self._connect_timeout)
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                wait = self._backoff.delay(attempt, random.random)
                log.debug("audience listener: connect failed (%s), retrying in %.1f s", exc, wait)
                await self._sleep(wait)
                attempt += 1
                continue
            try:
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _conn, event=lost: event.set())
                await conn.add_listener(NOTIFY_CHANNEL, self._notified)
                self._connected.set()
                self.resets += 1
                self._call(self._on_reset)
                attempt = 0
                await self._watch(conn, lost)
                if not self._stopping.is_set():
                    log.warning("audience listener: connection lost, reconnecting")
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as exc:
                log.warning("audience listener: connection failed (%s), reconnecting", exc)
            finally:
                self._connected.clear()
                conn.terminate()

    async def _watch(self, conn: asyncpg.Connection, lost: asyncio.Event) -> None:
        """Return when the connection is lost or we stop; probe it every check interval."""
        while not self._stopping.is_set() and not lost.is_set():
            waiters = [asyncio.ensure_future(lost.wait()), asyncio.ensure_future(self._stopping.wait())]
            try:
                await asyncio.wait(waiters, timeout=self._check_interval, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
            if not self._stopping.is_set() and not lost.is_set():
                await conn.fetchval("SELECT 1", timeout=self._connect_timeout)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but wake up at once when stopping."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        kind, sep, ident = payload.partition(":")
        handler = self._handlers.get(kind)
        if not sep or handler is None:
            log.warning("audience listener: ignoring unknown payload %r", payload)
            return
        self._call(handler, ident)

    def _call(self, callback: Callable[..., object], *args: str) -> None:
        try:
            result = callback(*args)
        except Exception:
            log.exception("audience listener: callback %r failed", callback)
            return
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(_logged(result, callback))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)


async def _logged(awaitable: Awaitable[object], callback: object) -> None:
    try:
        await awaitable
    except Exception:
        log.exception("audience listener: callback %r failed", callback)


# -- the store a shard is given --------------------------------------------------------------------


class _ConnectionLoads:
    """`actors.store.Loads` on one pooled connection."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def relations(self, user_ids: list[str]) -> dict[str, Relations]:
        return await fetch_relations(self.conn, user_ids)

    async def accounts(self, user_ids: list[str]) -> dict[str, AccountRow]:
        return await fetch_accounts(self.conn, user_ids)

    async def channel_servers(self, channel_ids: list[str]) -> dict[str, str | None]:
        return await fetch_channel_servers(self.conn, channel_ids)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """The pool's reset of a released connection, without asyncpg's default reset query
    (`pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`): this pool's connections
    never take a session advisory lock, keep a cursor past its transaction, LISTEN (the audience
    listener has a connection of its own) or SET anything, so the query reset nothing, and it
    cost a round trip to PostgreSQL before every batch that loads could go on (4 % of the shards'
    samples during a storm of connects). asyncpg still rolls back a transaction left open and
    drops the connection's listeners before calling this."""


async def create_pool(database_url: str, min_size: int, max_size: int) -> asyncpg.Pool:
    pool: asyncpg.Pool = await asyncpg.create_pool(
        database_url, min_size=min_size, max_size=max_size, reset=_keep_session
    )
    return pool


class PostgresStore:
    """`actors.store.ShardStore` on PostgreSQL: a small pool, and the audience listener."""

    # asyncpg.InternalClientError too: asyncpg raised it ("cannot switch to state 12; another
    # operation is in progress") on a connection made while PostgreSQL restarted (the suite's
    # restart test, 2026-12-05); the store is away then as surely as on a reset connection.
    errors: tuple[type[BaseException], ...] = (
        OSError,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        asyncpg.InternalClientError,
    )

    def __init__(self, database_url: str, min_size: int = 1, max_size: int = 4) -> None:
        self.database_url = database_url
        self.min_size = min_size
        self.max_size = max_size
        self.pool: asyncpg.Pool | None = None
        self.listener: AudienceListener | None = None

    async def start(self, events: AudienceEvents) -> None:
        self.pool = await create_pool(self.database_url, self.min_size, self.max_size)
        self.listener = AudienceListener(
            self.database_url,
            on_user=events.on_user,
            on_settings=events.on_settings,
            on_channel=events.on_channel,
            on_reset=events.on_reset,
        )
        await self.listener.start()

    async def stop(self) -> None:
        if self.listener is not None:
            await self.listener.stop()
        if self.pool is not None:
            await self.pool.close()

    def _pool(self) -> asyncpg.Pool:
        assert self.pool is not None, "PostgresStore used before start()"
        return self.pool

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection of the pool. One that failed below SQL (the server went away mid-query,
        asyncpg lost its place in the protocol) is closed, not handed out again: the pool no
        longer sends a reset query on release (`create_pool`), which used to find such a
        connection out. An error of PostgreSQL's own leaves the connection as good as before."""
        async with self._pool().acquire() as conn:
            try:
                yield conn
            except (OSError, asyncpg.InterfaceError, asyncpg.InternalClientError):
                conn.terminate()
                raise

    @contextlib.asynccontextmanager
    async def loading(self) -> AsyncIterator[_ConnectionLoads]:
        # One connection for the batch's reads (an acquire and its release are not free).
        async with self._connection() as conn:
            yield _ConnectionLoads(conn)

    async def read_accounts(self, user_ids: list[str]) -> dict[str, AccountRow]:
        async with self._connection() as conn:
            return await read_accounts(conn, user_ids)

    async def server_members(self, server_id: str) -> list[str]:
        async with self._connection() as conn:
            return await server_member_ids(conn, server_id)

    async def last_seen_since(self, since: float) -> AsyncIterator[list[tuple[str, float]]]:
        async with self._connection() as conn:
            async for chunk in last_seen_since(conn, since):
                yield chunk

    async def persist(
        self, chosen: list[tuple[str, str, float]], visibility: list[tuple[str, str, float]]
    ) -> None:
        async with self._connection() as conn:
            if chosen:
                await save_chosen_status(conn, chosen)
            if visibility:
                await save_visibility(conn, visibility)

    async def healthy(self, timeout_s: float) -> bool:
        if self.pool is None:
            return False
        away: tuple[type[BaseException], ...] = (TimeoutError, *self.errors)
        try:
            async with asyncio.timeout(timeout_s), self._connection() as conn:
                return bool(await conn.fetchval("SELECT 1") == 1)
        except away:
            return False
