"""`presence bench lastseen`: the database write load of last-seen, ours beside the designs users
would otherwise pick, on real PostgreSQL (and real Redis for the seed's design).

The load (the seed document's): 400,000 connected accounts, one heartbeat every 25 s each (16,000
heartbeats per second), 1 % of accounts leaving (last socket closes) and 1 % arriving per minute.
Time is simulated, so 30 simulated minutes take a few real minutes: the workload advances one
simulated second per step, with departures and arrivals at their own millisecond instants inside
the second (ours processes them one by one, its FlushActor's clock stopping at every moment a
batch falls due) and heartbeats at the end of it. The workload comes from a seeded generator, so
each design sees exactly the same departures, arrivals and heartbeats.

Designs, run one after the other in the same invocation, each on its own schema:

- ours: the real pure shard state (`ShardState`, one per shard, accounts placed by `SlotMap`) fed
  connect/disconnect with the virtual time. Heartbeats never reach the shards: the edge answers
  them and liveness is a per-edge lease, so they cost last-seen nothing and are not simulated
  beyond counting them. Departures go `last_seen_to_flush()` → the real `FlushActor` (its clock
  is the virtual clock, so `flush_interval_s` is in simulated seconds) → PostgreSQL, and are
  acknowledged with `last_seen_flushed()`; once a simulated second each shard hands its slice of
  the rolling checkpoint (`checkpoint_chunk(now)`) to the same FlushActor, where it rides along
  with the departures in the once-a-second batch. Interval, batch size, checkpoint interval
  and shard count are the product's settings (`PRESENCE_*` environment variables change them).
- write-through: every heartbeat is a real `UPDATE … WHERE id = $1`. 16,000 statements per
  simulated second cannot be run for 30 simulated minutes here, so it runs for a short window
  (10 simulated seconds by default) and reports both the statements per simulated second it
  executed and how long PostgreSQL took for each simulated second (the load factor).
- coarse + Redis + batched: the seed's TypeScript ported to Python (`bench.baselines`).

Counting: statements and rows are counted by the clients, and independently by PostgreSQL
(`pg_stat_user_tables.n_tup_upd` for rows; `pg_stat_statements` for statements when the server
has it loaded, which the embedded server started by this benchmark does). Redis commands are
counted by the client and by the server (`INFO commandstats`). Rates are per simulated second over
the simulated window; the drain at the end (shutdown) is reported apart and not in the rates.

Departures lost: after the run everything is drained, then PostgreSQL must hold, for every account
that departed, a last-seen no earlier than its last departure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import secrets
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg

from actors.core.contract import AccountRow
from actors.core.flush_buffer import Batch
from actors.core.shard import ShardState
from actors.core.slots import SlotMap, slot_of
from actors.flush import UPDATE_SQL as OURS_FLUSH_SQL
from actors.flush import FlushActor
from bench import results, targets
from bench.baselines import (
    COARSE_INTERVAL_MS,
    SEED_FLUSH_SQL,
    SEED_TABLE,
    WRITE_THROUGH_SQL,
    WRITE_THROUGH_TABLE,
    CoarseRedisBatched,
    PgCounts,
    RespClient,
    WriteThrough,
)

if TYPE_CHECKING:
    from cluster.config import Settings

NAME = "lastseen"
# Virtual time starts here (2023-11-14T22:13:20Z): in the past, so that the FlushActor's
# `LEAST(ts, now())` never clamps a simulated departure, and fixed, so runs are reproducible.
T0 = 1_700_000_000
TARGET_STATEMENTS_PER_S = targets.LASTSEEN_STATEMENTS_PER_S
STATEMENT_TIMEOUT_S = 120.0

DESIGNS = ("ours", "write_through", "coarse_redis_batched")
DESIGN_LABELS = {
    "ours": "ours (shards → FlushActor)",
    "write_through": "write-through",
    "coarse_redis_batched": "coarse + Redis + batched (seed)",
}


# ---------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class Config:
    accounts: int = 400_000  # connected at any time
    minutes: float = 30.0  # simulated, for ours and the seed's design
    write_through_seconds: int = 10  # simulated, every heartbeat a real statement
    heartbeat_s: int = 25
    churn_per_minute: float = 0.01  # leaving, and arriving, per simulated minute
    shards: int = 4
    edges: int = 4
    seed: int = 1
    flush_interval_s: float = 1.0
    flush_max_rows: int = 1000
    checkpoint_interval_s: float = 600.0
    socket_timeout_s: float = 90.0
    write_through_pool: int = 16
    sweep_every_s: int = 300  # the product sweeps every second; it only evicts idle offline accounts
    quick: bool = False

    @property
    def seconds(self) -> int:
        return round(self.minutes * 60)

    @property
    def moves_per_minute(self) -> int:
        return round(self.accounts * self.churn_per_minute)

    @property
    def heartbeats_per_s(self) -> float:
        return self.accounts / self.heartbeat_s


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench lastseen",
        description="Last-seen write load on real PostgreSQL: ours vs write-through vs the seed's "
        "coarse + Redis + batched design, on a compressed clock.",
    )
    p.add_argument(
        "--quick", action="store_true", help="small smoke run: 20k accounts, 12 simulated min, 5 s window"
    )
    p.add_argument("--accounts", type=int, default=None, help="connected accounts (default 400000)")
    p.add_argument(
        "--minutes", type=float, default=None, help="simulated minutes for ours and the seed (default 30)"
    )
    p.add_argument(
        "--write-through-seconds", type=int, default=None,
        help="simulated seconds of real write-through (default 10)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=1, help="random seed of the workload (default 1)")
    p.add_argument(
        "--database-url", default=None, help="PostgreSQL to use (default: an embedded one in a temp dir)"
    )
    p.add_argument("--redis-url", default=None, help="Redis to use (default: an embedded one in a temp dir)")
    p.add_argument("--no-record", action="store_true", help="do not append a row to bench/RESULTS.md")
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="JSON results file (default bench/results/lastseen-<ts>.json)",
    )
    args = p.parse_args(argv)
    for name in ("accounts", "minutes", "write_through_seconds"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def make_config(args: argparse.Namespace, settings: Settings) -> Config:
    base = (
        Config(accounts=20_000, minutes=12.0, write_through_seconds=5, quick=True) if args.quick else Config()
    )
    return Config(
        accounts=args.accounts or base.accounts,
        minutes=args.minutes or base.minutes,
        write_through_seconds=args.write_through_seconds or base.write_through_seconds,
        seed=args.seed,
        shards=settings.shards,
        flush_interval_s=settings.flush_interval_s,
        flush_max_rows=settings.flush_max_rows,
        checkpoint_interval_s=settings.checkpoint_interval_s,
        socket_timeout_s=settings.socket_timeout_s,
        quick=args.quick,
    )


# ---------------------------------------------------------------------------------------- workload


@dataclass
class Step:
    """One simulated second, (t - 1, t]: departures and arrivals at their own instants (epoch
    milliseconds, in order), heartbeats at its end."""

    departures: list[tuple[str, int]]  # (account, ms) whose last socket closed
    arrivals: list[tuple[str, int]]  # (account, ms) that connected
    heartbeats: list[str]  # accounts that sent a heartbeat at t


class Workload:
    """Who leaves, arrives and heartbeats in each simulated second; deterministic for a seed.

    `accounts` are connected at the start, with an offline reserve of one minute's arrivals; ids
    are `u0`, `u1`, … Every connected account heartbeats every `heartbeat_s` seconds, phases spread
    evenly (an arrival's first heartbeat comes `heartbeat_s` after it connects). Each minute
    `moves_per_minute` connected accounts, picked at random, leave and as many offline ones
    arrive, spread evenly over the minute and within each second; the connected count stays at
    `accounts`. Within a second the instants are random (as independent sockets closing are), not
    evenly spaced: evenly spaced instants would line up with the FlushActor's one-second interval
    and flatter it. Times are whole milliseconds, the precision of the seed's Redis scores, so
    every design stores exactly the same instants.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        n, reserve = cfg.accounts, max(cfg.moves_per_minute, 1)
        self.universe = n + reserve
        self.online = [f"u{i}" for i in range(n)]
        self.offline = [f"u{i}" for i in range(n, self.universe)]
        self.buckets: list[dict[str, None]] = [{} for _ in range(cfg.heartbeat_s)]
        self.phase: dict[str, int] = {}
        for i, u in enumerate(self.online):
            self.buckets[i % cfg.heartbeat_s][u] = None
            self.phase[u] = i % cfg.heartbeat_s
        self.last_departure: dict[str, int] = {}  # account -> epoch ms of its last departure
        self.departures = self.arrivals = self.heartbeats = 0

    def moves(self, t: int) -> int:
        """Departures (and arrivals) in second t: the per-minute count spread evenly, exactly."""
        m = self.cfg.moves_per_minute
        return m * t // 60 - m * (t - 1) // 60

    def _pick(self, pool: list[str]) -> str:
        i = self.rng.randrange(len(pool))
        last = pool.pop()
        if i == len(pool):
            return last
        chosen, pool[i] = pool[i], last
        return chosen

    def step(self, t: int) -> Step:
        k = self.moves(t)
        hb = self.cfg.heartbeat_s
        base_ms = (T0 + t - 1) * 1000 + 1

        def instants(n: int) -> list[int]:
            return sorted(base_ms + self.rng.randrange(1000) for _ in range(n))

        gone = [(self._pick(self.online), ms) for ms in instants(k)]
        for u, ms in gone:
            del self.buckets[self.phase.pop(u)][u]
            self.last_departure[u] = ms
        came = [(self._pick(self.offline), ms) for ms in instants(min(k, len(self.offline)))]
        beats = list(self.buckets[t % hb])
        for u, _ in came:
            self.online.append(u)
            self.buckets[t % hb][u] = None
            self.phase[u] = t % hb
        self.offline.extend(u for u, _ in gone)
        self.departures += len(gone)
        self.arrivals += len(came)
        self.heartbeats += len(beats)
        return Step(gone, came, beats)


# ---------------------------------------------------------------------------------------- PostgreSQL


def with_search_path(url: str, schema: str) -> str:
    """The URL with `search_path` set (asyncpg passes unknown query parameters as server settings),
    so the product's unqualified `users` resolves to the design's own table."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "search_path"] + [("search_path", schema)]
    return urlunsplit(parts._replace(query=urlencode(query)))


async def create_users(
    admin: asyncpg.Connection, url: str, schema: str, table_sql: str | None, n: int
) -> None:
    """A fresh schema with a `users` table of n rows (`u0` … ), vacuumed and analysed.

    `table_sql=None` applies the product's own schema (cluster/schema.sql) inside it.
    """
    from cluster.db import migrate

    await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    await admin.execute(f"CREATE SCHEMA {schema}")
    if table_sql is None:
        await migrate(with_search_path(url, schema))
    else:
        await admin.execute(table_sql.replace("CREATE TABLE users", f"CREATE TABLE {schema}.users", 1))
    await admin.execute(
        f"INSERT INTO {schema}.users (id) SELECT 'u' || g FROM generate_series(0, {n - 1}) AS g"
    )
    await admin.execute(f"VACUUM ANALYZE {schema}.users")


async def drop_schema(admin: asyncpg.Connection, schema: str) -> None:
    await admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


class PgCounters:
    """PostgreSQL's own counters, read through a separate monitoring connection."""

    def __init__(self, conn: asyncpg.Connection, statements_view: bool) -> None:
        self.conn = conn
        self.statements_view = statements_view

    async def rows_updated(self, schema: str) -> int:
        await self.conn.execute("SELECT pg_stat_clear_snapshot()")
        value = await self.conn.fetchval(
            "SELECT n_tup_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = 'users'", schema
        )
        return int(value or 0)

    async def rows_updated_settled(self, schema: str, expected: int, timeout_s: float = 10.0) -> int:
        """n_tup_upd once the backends' pending statistics have arrived (they are reported when a
        backend goes idle or exits, not at once): wait until it reaches `expected` or stops moving."""
        deadline = time.monotonic() + timeout_s
        last = await self.rows_updated(schema)
        while last < expected and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
            last = await self.rows_updated(schema)
        return last

    async def statement_calls(self, sql: str) -> tuple[int, float] | None:
        """(calls, total execution ms) of one statement text in this database, or None."""
        if not self.statements_view:
            return None
        # pg_stat_statements keeps a statement with its constants replaced by $n: one with a
        # quoted constant (ours: 'invisible') is found by its text up to that constant.
        match = "starts_with(query, $1)" if "'" in sql else "query = $1"
        row = await self.conn.fetchrow(
            f"""SELECT coalesce(sum(calls), 0) AS calls, coalesce(sum(total_exec_time), 0) AS ms
               FROM pg_stat_statements
               WHERE {match}
                 AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())""",
            sql.split("'", 1)[0],
        )
        return int(row["calls"]), float(row["ms"])


async def has_statements_view(conn: asyncpg.Connection) -> bool:
    try:
        await conn.fetchval("SELECT count(*) FROM pg_stat_statements")
    except (asyncpg.PostgresError, asyncpg.InterfaceError):
        return False
    return True


async def departures_lost(
    conn: asyncpg.Connection, schema: str, column: str, last_departure: dict[str, int]
) -> int:
    """Departed accounts whose stored last-seen is missing or earlier than their last departure."""
    ids = list(last_departure)
    times = [datetime.fromtimestamp(last_departure[u] / 1000, tz=UTC) for u in ids]
    value = await conn.fetchval(
        f"""SELECT count(*) FROM unnest($1::text[], $2::timestamptz[]) AS d(id, ts)
            LEFT JOIN {schema}.users AS u ON u.id = d.id
            WHERE u.{column} IS NULL OR u.{column} < d.ts""",
        ids,
        times,
    )
    return int(value)


# ---------------------------------------------------------------------------------------- ours


class VirtualClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class SteppedFlushActor(FlushActor):
    """The real FlushActor, on the simulation's virtual clock.

    Its loop sleeps for (next wakeup - now) computed on its clock, but sleeps in real time; with a
    virtual clock that only moves when the simulation says so, it must be told that time moved.
    `advance_to(t)` moves the clock to t, stopping at every moment a batch falls due on the way
    (when the oldest row has waited the flush interval, or a full batch waits) and letting the
    actor run it then, exactly as it would on a real clock. This reaches into the actor's buffer
    and wake-up event (FlushActor has no public hook for a virtual clock); what it writes, when,
    in which batches and with which SQL is the actor's own.
    """

    def __init__(self, database_url: str, *, clock: VirtualClock, **kwargs: Any) -> None:
        super().__init__(database_url, clock=clock, **kwargs)
        self.virtual_clock = clock
        self._progress = asyncio.Event()

    async def _execute(self, batch: Batch) -> None:
        try:
            await super()._execute(batch)
        finally:
            self._progress.set()

    async def settle(self) -> None:
        """Return once no batch is in flight and none is due at the current virtual time."""
        buffer = self._buffer
        while True:
            await asyncio.sleep(0)  # writers started just now add their rows, acks run
            self._progress.clear()
            if buffer.in_flight is None and not buffer.due(self._clock()):
                return
            assert self._wake is not None
            self._wake.set()
            await asyncio.wait_for(self._progress.wait(), STATEMENT_TIMEOUT_S)

    async def advance_to(self, t: float) -> None:
        clock = self.virtual_clock
        await self.settle()
        while True:
            wakeup = self._buffer.next_wakeup(clock.now)
            if wakeup is None or wakeup > t:
                break
            clock.now = max(wakeup, clock.now)
            done = self._statements + self._errors
            await self.settle()
            if self._statements + self._errors == done:
                # The wakeup and the due test may disagree in the last bit of a float.
                clock.now = math.nextafter(clock.now, math.inf)
        clock.now = max(t, clock.now)

    @property
    def statements(self) -> int:
        return self._statements

    @property
    def rows_written(self) -> int:
        return self._rows_written


def _rate(n: float, seconds: float) -> float:
    return n / seconds if seconds > 0 else 0.0


def _clock_text(t: int) -> str:
    return f"{t // 60:02d}:{t % 60:02d}"


class _Ours:
    """Our design in the simulation: the real pure shard states (accounts placed by `SlotMap`)
    and the real FlushActor on the virtual clock, fed as PresenceShard's loops feed it."""

    def __init__(self, cfg: Config, actor: SteppedFlushActor) -> None:
        self.cfg = cfg
        self.actor = actor
        self.shards = [
            ShardState(socket_timeout_s=cfg.socket_timeout_s, checkpoint_interval_s=cfg.checkpoint_interval_s)
            for _ in range(cfg.shards)
        ]
        self.slot_map = SlotMap.even(cfg.shards)
        self.edges = [f"edge-{i}" for i in range(cfg.edges)]
        self.row = AccountRow()
        self.flushing: list[asyncio.Task[None] | None] = [None] * len(self.shards)
        self.checkpoint_tasks: list[asyncio.Task[None]] = []
        self.checkpoints = self.checkpoint_rows = self.checkpoint_step_statements = 0
        self.acked = 0

    def shard_of(self, user: str) -> ShardState:
        return self.shards[self.slot_map.shard_of(user)]

    def connect(self, user: str, now: float) -> None:
        # One socket per account, named after it; accounts spread over the edges by slot.
        st = self.shard_of(user)
        if not st.has_account(user):
            st.load_account(user, self.row, now)
        st.connect(user, user, self.edges[slot_of(user) % len(self.edges)], now)

    def warm(self, online: list[str]) -> None:
        """Every initially connected account connected at T0. No departure yet, so no write."""
        for user in online:
            self.connect(user, float(T0))
        for st in self.shards:
            st.outbox.drain()

    async def _flush_shard(self, st: ShardState) -> None:
        # PresenceShard._flush_loop: send what is pending, forget it once committed, and go again
        # at once if more departed meanwhile (its wake-up event was set by them).
        while st.pending_last_seen:
            entries = st.last_seen_to_flush()
            await self.actor.write(entries)
            st.last_seen_flushed(entries)
            self.acked += len(entries)

    def start_flushes(self) -> None:
        for i, st in enumerate(self.shards):
            task = self.flushing[i]
            if (task is None or task.done()) and st.pending_last_seen:
                if task is not None:
                    task.result()  # surface a failure rather than hide it
                self.flushing[i] = asyncio.get_running_loop().create_task(self._flush_shard(st))

    async def second(self, step: Step, t: int) -> None:
        """One simulated second. Departures and arrivals at their own instants; each shard hands
        its departures to the FlushActor at once (one write in flight per shard), as
        PresenceShard's flush loop does."""
        events = sorted([(ms, 0, u) for u, ms in step.departures] + [(ms, 1, u) for u, ms in step.arrivals])
        for ms, kind, user in events:
            now = ms / 1000
            await self.actor.advance_to(now)
            if kind == 0:
                self.shard_of(user).disconnect(user, user, now)
            else:
                self.connect(user, now)
            self.start_flushes()
        now = float(T0 + t)
        await self.actor.advance_to(now)
        for st in self.shards:
            for edge in self.edges:  # edges refresh their leases every few seconds
                st.refresh_edge(edge, now)
            st.outbox.drain()  # frames, counts: not last-seen, not measured here
            if t % self.cfg.sweep_every_s == 0:
                st.sweep(now)
        await self._checkpoint(now)
        self.start_flushes()

    async def _checkpoint(self, now: float) -> None:
        # PresenceShard._checkpoint_loop: once a second each shard hands over its slice of the
        # rolling checkpoint, which rides along with the departures in the FlushActor's batches.
        before = self.actor.statements
        for st in self.shards:
            entries = st.checkpoint_chunk(now)
            if entries:
                self.checkpoint_rows += len(entries)
                self.checkpoint_tasks.append(
                    asyncio.get_running_loop().create_task(self.actor.write(entries))
                )
        self.checkpoints = max(st.checkpoint_rounds for st in self.shards)
        await self.actor.settle()
        self.checkpoint_step_statements += self.actor.statements - before

    def progress_text(self, t: int, wl: Workload, real_s: float) -> str:
        return (
            f"sim {_clock_text(t)}/{_clock_text(self.cfg.seconds)}  departures {wl.departures:,}  "
            f"statements {self.actor.statements:,}  rows {self.actor.rows_written:,}  "
            f"checkpoints {self.checkpoints}  real {real_s:.1f} s"
        )

    def _writers(self) -> list[asyncio.Task[None]]:
        return [t for t in [*self.flushing, *self.checkpoint_tasks] if t is not None]

    async def drain(self) -> None:
        """Shutdown: every shard hands over what it still holds, the actor drains it all. The
        virtual clock stands still from here: drain() writes what is pending without waiting for
        the interval (a checkpoint's last partial batch, the last second's departures)."""
        for _ in range(1000):
            self.start_flushes()
            await asyncio.sleep(0)
            # What remains unwritten after a drain is what a shard sent as soon as its previous
            # write was committed (it had more departures meanwhile): the next round writes it.
            await self.actor.drain(STATEMENT_TIMEOUT_S)
            waiting = [t for t in self._writers() if not t.done()]
            if waiting:
                await asyncio.wait(waiting, timeout=0.05)  # committed writers take their acknowledgement
            elif not any(st.pending_last_seen for st in self.shards):
                break
        else:
            raise RuntimeError("shards still hold departures after draining")
        await asyncio.gather(*self._writers())  # surfaces any failure


async def run_ours(
    cfg: Config, url: str, schema: str, pg: PgCounters, progress: results.Progress
) -> dict[str, Any]:
    actor = SteppedFlushActor(
        with_search_path(url, schema),
        interval_s=cfg.flush_interval_s,
        max_rows=cfg.flush_max_rows,
        clock=VirtualClock(float(T0)),
        statement_timeout_s=STATEMENT_TIMEOUT_S,
    )
    await actor.start()
    ours = _Ours(cfg, actor)
    wl = Workload(cfg)
    ours.warm(wl.online)
    rows_before = await pg.rows_updated(schema)
    calls_before = await pg.statement_calls(OURS_FLUSH_SQL)
    started = time.perf_counter()
    for t in range(1, cfg.seconds + 1):
        await ours.second(wl.step(t), t)
        progress.update(t, ours.progress_text(t, wl, time.perf_counter() - started), time.perf_counter())
    window_real_s = time.perf_counter() - started
    window = await actor.stats()
    drain_started = time.perf_counter()
    await ours.drain()
    final = await actor.stats()
    await actor.stop()  # closes its connection: its statistics reach PostgreSQL
    drain_real_s = time.perf_counter() - drain_started
    rows_pg = await pg.rows_updated_settled(schema, rows_before + int(final["rows_updated"])) - rows_before
    calls_after = await pg.statement_calls(OURS_FLUSH_SQL)
    lost = await departures_lost(pg.conn, schema, "last_seen_at", wl.last_departure)
    progress.done(
        f"done: {cfg.seconds} simulated s in {window_real_s:.1f} s real, "
        f"{window['statements']:,} statements, "
        f"{wl.departures:,} departures, {lost} lost"
    )
    return {
        "label": DESIGN_LABELS["ours"],
        "statements_per_s": _rate(window["statements"], cfg.seconds),
        "rows_per_s": _rate(window["rows_written"], cfg.seconds),
        "redis_commands_per_s": 0.0,
        "departures": wl.departures,
        "departures_lost": lost,
        "departures_check": "after the drain, PostgreSQL's last_seen_at >= the last departure of every "
        "departed account",
        "simulated_seconds": cfg.seconds,
        "real_seconds": round(window_real_s, 3),
        "measured": _ours_measured(ours, wl, window, final, drain_real_s),
        "postgres_check": {
            "client_statements_incl_drain": final["statements"],
            "client_rows_updated_incl_drain": final["rows_updated"],
            "pg_stat_statements_calls_incl_drain": _calls(calls_before, calls_after),
            "n_tup_upd_incl_drain": rows_pg,
        },
        "notes": "heartbeats are answered by the edge and never reach a shard: no last-seen cost; "
        "statements = departures flushed by the FlushActor + periodic checkpoints of present accounts",
    }


def _calls(before: tuple[int, float] | None, after: tuple[int, float] | None) -> int | None:
    """Calls of a statement between two pg_stat_statements readings (None: not available)."""
    return None if after is None or before is None else after[0] - before[0]


def _ours_measured(
    ours: _Ours, wl: Workload, window: dict[str, Any], final: dict[str, Any], drain_real_s: float
) -> dict[str, Any]:
    return {
        "statements": window["statements"],
        "rows_written": window["rows_written"],
        "rows_updated": window["rows_updated"],
        "statements_at_checkpoint_instants": ours.checkpoint_step_statements,
        "statements_between_checkpoints": window["statements"] - ours.checkpoint_step_statements,
        "checkpoints": ours.checkpoints,
        "checkpoint_rows": ours.checkpoint_rows,
        "departure_rows_acknowledged": ours.acked,
        "heartbeats": wl.heartbeats,
        "heartbeat_statements": 0,
        "flush_errors": final["errors"],
        "drain_statements": final["statements"] - window["statements"],
        "drain_rows": final["rows_written"] - window["rows_written"],
        "drain_real_seconds": round(drain_real_s, 3),
    }


# ---------------------------------------------------------------------------------------- write-through


async def run_write_through(
    cfg: Config, url: str, schema: str, pg: PgCounters, progress: results.Progress
) -> dict[str, Any]:
    pool = await asyncpg.create_pool(
        with_search_path(url, schema), min_size=cfg.write_through_pool, max_size=cfg.write_through_pool
    )
    assert pool is not None
    wt = WriteThrough(pool, cfg.write_through_pool)
    wl = Workload(cfg)
    rows_before = await pg.rows_updated(schema)
    calls_before = await pg.statement_calls(WRITE_THROUGH_SQL)
    started = time.perf_counter()
    try:
        for t in range(1, cfg.write_through_seconds + 1):
            step = wl.step(t)
            await wt.heartbeats(step.heartbeats)
            elapsed = time.perf_counter() - started
            progress.update(
                t,
                f"sim {t}/{cfg.write_through_seconds} s  statements {wt.counts.statements:,}  "
                f"real {elapsed:.1f} s ({elapsed / t:.2f} s per simulated s)",
                time.perf_counter(),
            )
    finally:
        await pool.close()
    real_s = time.perf_counter() - started
    c = wt.counts
    rows_pg = await pg.rows_updated_settled(schema, rows_before + c.rows_updated) - rows_before
    calls_after = await pg.statement_calls(WRITE_THROUGH_SQL)
    server = None if calls_after is None or calls_before is None else (
        calls_after[0] - calls_before[0], calls_after[1] - calls_before[1]
    )  # fmt: skip
    progress.done(
        f"done: {c.statements:,} statements for {cfg.write_through_seconds} simulated s in {real_s:.1f} s "
        f"real (load factor {c.exec_seconds / cfg.write_through_seconds:.2f})"
    )
    return _write_through_figures(cfg, c, wl, real_s, server, rows_pg)


def _write_through_figures(
    cfg: Config, c: PgCounts, wl: Workload, real_s: float, server: tuple[int, float] | None, rows_pg: int
) -> dict[str, Any]:
    secs = cfg.write_through_seconds
    load = c.exec_seconds / secs
    return {
        "label": DESIGN_LABELS["write_through"],
        "statements_per_s": _rate(c.statements, secs),
        "rows_per_s": _rate(c.rows_sent, secs),
        "redis_commands_per_s": 0.0,
        "departures": wl.departures,
        "departures_lost": 0,
        "departures_check": "trivial, not checked: every heartbeat is committed before the next simulated "
        "second; note it stores the last heartbeat (up to 25 s before the departure), not the departure",
        "simulated_seconds": secs,
        "real_seconds": round(real_s, 3),
        "measured": {
            "statements": c.statements,
            "rows_updated": c.rows_updated,
            "heartbeats": wl.heartbeats,
            "pool_connections": cfg.write_through_pool,
            "statement_wall_seconds": round(c.exec_seconds, 3),
            "load_factor": load,
            "sustained_statements_per_real_s": _rate(c.statements, c.exec_seconds),
            "server_exec_ms_per_simulated_s": None if server is None else server[1] / secs,
        },
        "derived": {
            "statements_over_full_window": round(c.statements / secs * cfg.seconds),
            "can_keep_up": load <= 1.0,
        },
        "postgres_check": {
            "client_statements": c.statements,
            "client_rows_updated": c.rows_updated,
            "pg_stat_statements_calls": None if server is None else server[0],
            "n_tup_upd": rows_pg,
        },
        "notes": f"run for {secs} simulated seconds only, every heartbeat a real autocommitted statement "
        f"over {cfg.write_through_pool} connections; load factor = real seconds PostgreSQL (and this "
        "client, on "
        "the same machine) took per simulated second",
    }


# ---------------------------------------------------------------------------------------- the seed's design


@dataclass
class _SeedWindow:
    """What the seed's design did in the measured window, and with its drain."""

    real_s: float
    pg: dict[str, Any]
    redis_commands: int
    redis_transactions: int
    client_total: int = 0
    server_commands: int = 0


_SEED_COUNTED = ("multi", "exec", "zadd", "sadd", "spop", "zmscore")


async def _seed_window(
    cfg: Config, seed: CoarseRedisBatched, wl: Workload, progress: results.Progress
) -> _SeedWindow:
    """The simulated window, then the drain; the Redis commands counted by client and server."""
    redis = seed.redis
    server_before = await redis.command_calls()
    client_before = redis.commands
    started = time.perf_counter()
    for t in range(1, cfg.seconds + 1):
        now_ms = (T0 + t) * 1000
        step = wl.step(t)
        for user, ms in step.departures:
            seed.on_user_offline(user, ms)
        for user in step.heartbeats:
            seed.touch(user, now_ms)
        await seed.send()
        await seed.flush_due(now_ms)
        progress.update(
            t,
            f"sim {_clock_text(t)}/{_clock_text(cfg.seconds)}  departures {wl.departures:,}  "
            f"statements {seed.counts.pg.statements:,}  rows {seed.counts.pg.rows_sent:,}  "
            f"redis cmds {redis.commands - client_before:,}  real {time.perf_counter() - started:.1f} s",
            time.perf_counter(),
        )
    window = _SeedWindow(
        time.perf_counter() - started,
        dict(asdict(seed.counts.pg)),
        redis.commands - client_before,
        seed.counts.redis_transactions,
    )
    await seed.drain()
    window.client_total = redis.commands - client_before
    server_after = await redis.command_calls()
    window.server_commands = sum(server_after.get(k, 0) - server_before.get(k, 0) for k in _SEED_COUNTED)
    return window


async def run_seed(
    cfg: Config,
    url: str,
    schema: str,
    redis_url: str,
    key_prefix: str,
    pg: PgCounters,
    progress: results.Progress,
) -> dict[str, Any]:
    redis = RespClient()
    await redis.connect(redis_url)
    db = await asyncpg.connect(with_search_path(url, schema))
    seen_key, dirty_key = f"{key_prefix}lastseen:ts", f"{key_prefix}lastseen:dirty"
    seed = CoarseRedisBatched(redis, db, seen_key=seen_key, dirty_key=dirty_key)
    wl = Workload(cfg)
    # Steady state: the node has been running for longer than the coarsening interval, so every
    # connected account was last recorded at some moment of the past 10 minutes.
    rng = random.Random(cfg.seed + 1)
    for user in wl.online:
        seed.last_recorded[user] = T0 * 1000 - rng.randrange(COARSE_INTERVAL_MS)
    rows_before = await pg.rows_updated(schema)
    calls_before = await pg.statement_calls(SEED_FLUSH_SQL)
    try:
        window = await _seed_window(cfg, seed, wl, progress)
        await redis.call("DEL", seen_key, dirty_key)
    finally:
        await db.close()
        await redis.close()
    final = seed.counts.pg
    rows_pg = await pg.rows_updated_settled(schema, rows_before + final.rows_updated) - rows_before
    calls_after = await pg.statement_calls(SEED_FLUSH_SQL)
    lost = await departures_lost(pg.conn, schema, "last_seen", wl.last_departure)
    progress.done(
        f"done: {cfg.seconds} simulated s in {window.real_s:.1f} s real, {window.pg['statements']:,} "
        f"statements, {window.redis_commands:,} Redis commands, {lost} lost"
    )
    out = _seed_figures(cfg, seed, wl, window, lost)
    out["postgres_check"] = {
        "client_statements_incl_drain": final.statements,
        "client_rows_updated_incl_drain": final.rows_updated,
        "pg_stat_statements_calls_incl_drain": _calls(calls_before, calls_after),
        "n_tup_upd_incl_drain": rows_pg,
    }
    out["redis_check"] = {
        "client_commands_incl_drain": window.client_total,
        "server_commands_incl_drain": window.server_commands,
    }
    return out


def _seed_figures(
    cfg: Config, seed: CoarseRedisBatched, wl: Workload, window: _SeedWindow, lost: int
) -> dict[str, Any]:
    secs, final = cfg.seconds, seed.counts.pg
    return {
        "label": DESIGN_LABELS["coarse_redis_batched"],
        "statements_per_s": _rate(window.pg["statements"], secs),
        "rows_per_s": _rate(window.pg["rows_sent"], secs),
        "redis_commands_per_s": _rate(window.redis_commands, secs),
        "departures": wl.departures,
        "departures_lost": lost,
        "departures_check": "after the drain, PostgreSQL's last_seen >= the last departure of every "
        "departed account",
        "simulated_seconds": secs,
        "real_seconds": round(window.real_s, 3),
        "measured": {
            "statements": window.pg["statements"],
            "rows_written": window.pg["rows_sent"],
            "rows_updated": window.pg["rows_updated"],
            "redis_commands": window.redis_commands,
            "redis_transactions": window.redis_transactions,
            "redis_round_trips": seed.redis.round_trips,
            "heartbeats": wl.heartbeats,
            "heartbeats_answered_locally": seed.counts.coarse_skips,
            "flush_passes": seed.counts.flush_passes,
            "drain_statements": final.statements - window.pg["statements"],
            "drain_rows": final.rows_sent - window.pg["rows_sent"],
        },
        "notes": "per-node coarsening map (10 min) pre-filled as after a long run; each coarse touch and "
        "each offline is one MULTI/ZADD/SADD/EXEC (4 commands), pipelined per simulated second as "
        "node-redis auto-pipelines a tick; flusher SPOP 1000 + ZMSCORE + 1 UPDATE per batch, every 30 s "
        "or at once after a full batch",
    }


# ---------------------------------------------------------------------------------------- servers


@contextlib.contextmanager
def servers(database_url: str | None, redis_url: str | None) -> Iterator[tuple[str, str]]:
    """The PostgreSQL and Redis URLs to use; embedded servers in a temp dir for those not given,
    stopped (and their directory removed) at the end. An embedded PostgreSQL gets
    pg_stat_statements, for the independent statement count; a given one is used as it is."""
    if database_url and redis_url:
        yield database_url, redis_url
        return
    from cluster.embedded import EmbeddedPostgres, EmbeddedRedis

    tmp = Path(tempfile.mkdtemp(prefix="presence-bench-"))
    pg: EmbeddedPostgres | None = None
    rd: EmbeddedRedis | None = None
    try:
        if not database_url:
            pg = EmbeddedPostgres()
            pg.start(tmp)
            _enable_pg_stat_statements(pg)
        if not redis_url:
            rd = EmbeddedRedis()
            rd.start(tmp)
        yield database_url or pg.url, redis_url or rd.url  # type: ignore[union-attr]
    finally:
        if rd is not None:
            rd.stop()
        if pg is not None:
            pg.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _enable_pg_stat_statements(pg: Any) -> None:
    """Load pg_stat_statements into our own throwaway server (needs a restart), for the
    independent statement count."""

    async def configure(sql: str) -> None:
        conn = await asyncpg.connect(pg.url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(configure("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'"))
    pg.restart()
    asyncio.run(configure("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))


# ---------------------------------------------------------------------------------------- report


def _fmt_rate(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _fmt_ratio(r: float) -> str:
    if r <= 0:
        return "0"
    if r >= 0.5:
        return f"{r:.3g}x"
    return f"1/{1 / r:,.0f} ({r * 100:.3g} %)"


def table(report: dict[str, Any]) -> str:
    header = [
        "design",
        "statements/s",
        "rows/s",
        "Redis cmds/s",
        "departures lost",
        "statements vs write-through",
    ]
    rows = []
    for key in DESIGNS:
        d = report["designs"][key]
        lost = f"{d['departures_lost']:,}" + (" (trivial)" if key == "write_through" else "")
        rows.append([
            d["label"], _fmt_rate(d["statements_per_s"]), _fmt_rate(d["rows_per_s"]),
            _fmt_rate(d["redis_commands_per_s"]), lost, _fmt_ratio(d["ratio_to_write_through"]),
        ])  # fmt: skip
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: list[str]) -> str:
        return " | ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    out = [line(header), "-+-".join("-" * w for w in widths), *(line(r) for r in rows)]
    return "\n".join(out)


def notes(report: dict[str, Any]) -> str:
    cfg, d = report["config"], report["designs"]
    ours, wt, seed = d["ours"], d["write_through"], d["coarse_redis_batched"]
    om, wm, sm = ours["measured"], wt["measured"], seed["measured"]
    target = report["target"]
    verdict = "MET" if target["met"] else "MISSED"
    keeps_up = "keeps up" if wm["load_factor"] <= 1 else "cannot keep up"
    paragraphs = [
        f"target: ours <= {target['statements_per_s_max']:g} statement/s, checkpoints included: "
        f"{verdict} ({ours['statements_per_s']:.3f}/s)",
        f"ours, measured over {ours['simulated_seconds']} simulated s: {om['statements']:,} statements, "
        f"{om['rows_written']:,} rows; {om['checkpoints']} checkpoints of {om['checkpoint_rows']:,} rows "
        "in all, "
        f"{om['statements_at_checkpoint_instants']:,} statements at checkpoint instants and "
        f"{om['statements_between_checkpoints']:,} between them (departures, at most one per flush "
        "interval). "
        f"{om['heartbeats']:,} heartbeats: answered by the edge, never reaching a shard, so 0 statements "
        "(modelled as what the product does, not executed).",
        f"write-through, every heartbeat executed for real for {wt['simulated_seconds']} simulated s: "
        f"{wm['statements']:,} statements (measured); PostgreSQL and this client took "
        f"{wm['load_factor']:.2f} real s per simulated s (measured load factor: sustains "
        f"{wm['sustained_statements_per_real_s']:,.0f} statements/s on this machine, so it {keeps_up}). "
        + (
            ""
            if wm["server_exec_ms_per_simulated_s"] is None
            else f"PostgreSQL's executor alone spent {wm['server_exec_ms_per_simulated_s']:,.0f} ms per "
            "simulated s (pg_stat_statements; commits and WAL flushes not included). "
        )
        + "Its statements/s is the count per simulated second, "
        f"which real time would demand; over {cfg['minutes']:g} min that is "
        f"{wt['derived']['statements_over_full_window']:,} statements (derived).",
        f"coarse + Redis + batched, measured over {seed['simulated_seconds']} simulated s: "
        f"{sm['statements']:,} statements, {sm['rows_written']:,} rows, {sm['redis_commands']:,} Redis "
        f"commands ({sm['redis_transactions']:,} MULTI transactions); {sm['heartbeats_answered_locally']:,} "
        f"of {sm['heartbeats']:,} heartbeats answered by the coarsening map.",
        f"drain at shutdown, not in the rates: ours {om['drain_statements']} statements / "
        f"{om['drain_rows']:,} rows, seed {sm['drain_statements']} statements / {sm['drain_rows']:,} rows.",
        "cross-checks, client count vs PostgreSQL's or Redis's own: " + "; ".join(report["checks"]["lines"]),
    ]
    return "\n".join(textwrap.fill(p, width=100, subsequent_indent="  ") for p in paragraphs)


def _checks(designs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    lines: list[str] = []
    ok = True

    def compare(label: str, client: int, server: int | None) -> None:
        nonlocal ok
        if server is None:
            lines.append(f"{label} {client:,} (server count unavailable)")
            return
        good = client == server
        ok = ok and good
        lines.append(f"{label} {client:,} {'=' if good else '!='} {server:,}")

    o, w, s = (designs[k]["postgres_check"] for k in DESIGNS)
    compare("ours statements", o["client_statements_incl_drain"], o["pg_stat_statements_calls_incl_drain"])
    compare("ours rows", o["client_rows_updated_incl_drain"], o["n_tup_upd_incl_drain"])
    compare("write-through statements", w["client_statements"], w["pg_stat_statements_calls"])
    compare("write-through rows", w["client_rows_updated"], w["n_tup_upd"])
    compare("seed statements", s["client_statements_incl_drain"], s["pg_stat_statements_calls_incl_drain"])
    compare("seed rows", s["client_rows_updated_incl_drain"], s["n_tup_upd_incl_drain"])
    r = designs["coarse_redis_batched"]["redis_check"]
    compare("seed Redis commands", r["client_commands_incl_drain"], r["server_commands_incl_drain"])
    return {"ok": ok, "lines": lines}


RESULTS_TITLE = (
    "Last-seen write load, `presence bench lastseen`: statements and rows per simulated second at the "
    "seed's load (N connected accounts, 25 s heartbeats, 1 % leaving and 1 % arriving per minute)."
)
RESULTS_NOTES = (
    "Write-through runs every heartbeat for real only for a short window; its statements/s is the count per "
    "simulated second and its load factor is real seconds PostgreSQL needed per simulated second (> 1: "
    "it cannot keep up on that machine). Ours and the seed's design run the whole simulated duration. "
    "Flush-interval, batch and checkpoint settings are the product's defaults unless the row says otherwise."
)


def results_columns(report: dict[str, Any]) -> results.Columns:
    cfg, d = report["config"], report["designs"]
    ours, wt, seed = d["ours"], d["write_through"], d["coarse_redis_batched"]
    load = f"{cfg['accounts']:,} accts, {cfg['minutes']:g} min" + (" (quick)" if cfg["quick"] else "")
    settings = (cfg["flush_interval_s"], cfg["flush_max_rows"], cfg["checkpoint_interval_s"], cfg["shards"])
    if settings != (1.0, 1000, 600.0, 4):
        flush, rows, checkpoint, shards = settings
        load += f", flush {flush:g} s/{rows} rows, checkpoint {checkpoint:g} s, {shards} shards"
    return [
        ("date (UTC)", report["started_at"][:16].replace("T", " ")),
        ("commit", report["machine"]["commit"]),
        ("machine", results.machine_summary(report["machine"])),
        ("load", load),
        ("ours stmt/s", f"{ours['statements_per_s']:.3f}"),
        ("ours rows/s", _fmt_rate(ours["rows_per_s"])),
        ("seed stmt/s", f"{seed['statements_per_s']:.3f}"),
        ("seed rows/s", _fmt_rate(seed["rows_per_s"])),
        ("seed Redis cmd/s", _fmt_rate(seed["redis_commands_per_s"])),
        ("write-through stmt/s", f"{wt['statements_per_s']:,.0f} ({wt['simulated_seconds']} s window)"),
        ("write-through load factor", f"{wt['measured']['load_factor']:.2f}"),
        ("ours vs write-through", _fmt_ratio(ours["ratio_to_write_through"])),
        ("seed vs write-through", _fmt_ratio(seed["ratio_to_write_through"])),
        ("departures lost (ours/seed)", f"{ours['departures_lost']}/{seed['departures_lost']}"),
        (
            "target ours ≤ 1 stmt/s",
            ("met" if report["target"]["met"] else "missed") + f" ({ours['statements_per_s']:.2f})",
        ),
        ("runtime", f"{report['runtime_s']:.0f} s"),
    ]


# ---------------------------------------------------------------------------------------- main


async def run_all(cfg: Config, database_url: str, redis_url: str) -> dict[str, Any]:
    run_id = secrets.token_hex(3)
    schemas = {d: f"bench_lastseen_{run_id}_{d}" for d in DESIGNS}
    admin = await asyncpg.connect(database_url)
    designs: dict[str, dict[str, Any]] = {}
    try:
        pg = PgCounters(admin, await has_statements_view(admin))
        universe = Workload(cfg).universe
        prefix = f"presence-bench:{run_id}:"
        steps: list[tuple[str, str | None, Callable[[results.Progress], Awaitable[dict[str, Any]]]]] = [
            ("ours", None, lambda p: run_ours(cfg, database_url, schemas["ours"], pg, p)),
            (
                "coarse_redis_batched",
                SEED_TABLE,
                lambda p: run_seed(
                    cfg, database_url, schemas["coarse_redis_batched"], redis_url, prefix, pg, p
                ),
            ),
            (
                "write_through",
                WRITE_THROUGH_TABLE,
                lambda p: run_write_through(cfg, database_url, schemas["write_through"], pg, p),
            ),
        ]
        for key, table_sql, run in steps:
            label = DESIGN_LABELS[key]
            sys.stderr.write(f"[{label}] creating {universe:,} users rows …\n")
            await create_users(admin, database_url, schemas[key], table_sql, universe)
            total = cfg.write_through_seconds if key == "write_through" else cfg.seconds
            try:
                designs[key] = await run(results.Progress(label, total))
            finally:
                await drop_schema(admin, schemas[key])
        server_version = await admin.fetchval("SHOW server_version")
    finally:
        for schema in schemas.values():
            with contextlib.suppress(Exception):
                await drop_schema(admin, schema)
        await admin.close()
    wt_rate = designs["write_through"]["statements_per_s"]
    for d in designs.values():
        d["ratio_to_write_through"] = d["statements_per_s"] / wt_rate if wt_rate else math.nan
    return {"designs": designs, "postgres_version": server_version, "statements_view": pg.statements_view}


def _run(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:  # not installed on Windows
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str], settings: Settings) -> int:
    args = parse_args(argv)
    cfg = make_config(args, settings)
    started_at = results.utc_now().isoformat(timespec="seconds")
    machine = results.machine_info()  # before starting anything: its load average is everybody else's
    t0 = time.perf_counter()
    sys.stderr.write(
        f"presence bench lastseen: {cfg.accounts:,} connected accounts, heartbeat {cfg.heartbeat_s} s, "
        f"{cfg.churn_per_minute:.0%} leaving and arriving per minute, {cfg.minutes:g} simulated min "
        f"(write-through window {cfg.write_through_seconds} simulated s)\n"
    )
    with servers(args.database_url, args.redis_url) as (database_url, redis_url):
        out = _run(run_all(cfg, database_url, redis_url))
    runtime = time.perf_counter() - t0
    report = _report(cfg, out, {**machine, "postgres": out["postgres_version"]}, started_at, runtime)
    print(
        f"\npresence bench lastseen: {cfg.accounts:,} connected accounts, "
        f"{cfg.heartbeats_per_s:,.0f} heartbeats/s, {cfg.moves_per_minute:,} leaving + "
        f"{cfg.moves_per_minute:,} arriving per min, {cfg.minutes:g} simulated min (seed {cfg.seed}); "
        f"flush every {cfg.flush_interval_s:g} s / {cfg.flush_max_rows} rows, checkpoint every "
        f"{cfg.checkpoint_interval_s:g} s, {cfg.shards} shards\n"
    )
    print(table(report))
    print()
    print(notes(report))
    results.record(NAME, report, args, RESULTS_TITLE, results_columns(report), RESULTS_NOTES)
    print(f"runtime {runtime:.1f} s")
    if not report["checks"]["ok"]:
        print(
            "WARNING: a client count differs from the server's own count (see cross-checks)", file=sys.stderr
        )
    lost = sum(report["designs"][k]["departures_lost"] for k in ("ours", "coarse_redis_batched"))
    if lost:
        print(f"ERROR: {lost} departures lost", file=sys.stderr)
        return 1
    return 0


def _report(
    cfg: Config, out: dict[str, Any], machine: dict[str, Any], started_at: str, runtime: float
) -> dict[str, Any]:
    """The run's JSON record: every design's figures, the target, the cross-checks."""
    designs = out["designs"]
    report: dict[str, Any] = {
        **results.run_record(NAME, started_at, runtime, machine),
        "config": {**asdict(cfg), "simulated_seconds": cfg.seconds, "virtual_epoch": T0},
        "designs": {k: designs[k] for k in DESIGNS},
        "target": {
            "statements_per_s_max": TARGET_STATEMENTS_PER_S,
            "design": "ours",
            "met": designs["ours"]["statements_per_s"] <= TARGET_STATEMENTS_PER_S,
        },
    }
    report["checks"] = _checks(report["designs"])
    return report
