"""FlushActor: the asyncio + asyncpg shell around `actors.core.flush_buffer.FlushBuffer`.

A plain class with async methods; the Ray wrapping (`ray.remote`) lives elsewhere so that this
module can be used and tested without Ray.

Contract with the shards: `write(entries)` returns only once every entry is committed to
PostgreSQL (possibly in a batch shared with other callers). A shard keeps a departure until its
`write` returned, so an actor that dies with uncommitted rows loses nothing: the shard sends them
again, and GREATEST makes the replay harmless.

One background task drives the buffer: it sleeps until the buffer's next wakeup (or until an
`add` wakes it), takes a batch and runs exactly one UPDATE for it. On any error the batch goes
back into the buffer and is retried with backoff on a fresh connection; a departure is never
dropped while the process lives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg

from actors.core.flush_buffer import Batch, FlushBuffer, clamp_timestamp
from actors.metrics import Metrics
from actors.retry import supervise

log = logging.getLogger(__name__)

# GREATEST: batches are idempotent and order-independent (a replay or a racing writer can never
# move a stored time backwards); it also ignores NULL, so a never-written column takes the value.
# LEAST(.., now()): a future timestamp is clamped to the database's clock as a second line of
# defence behind the clamp in the buffer (the two clocks may disagree). LEAST(.., chosen_at) of an
# invisible account: its last-seen is frozen at the moment it hid, whatever a writer that could not
# read the row sends (a departure recorded after a restart, with PostgreSQL away: see
# ShardState.departed); LEAST ignores the NULL of every other account. An invisible account whose
# hide moment is unknown (chosen_at NULL: set before the column existed, or by a host application)
# is not written at all. Shards write an account's last-seen only after its choices are saved
# (PresenceShard._flush_once), so the stored status the freeze reads is never older than theirs.
UPDATE_SQL = (
    "UPDATE users AS u SET last_seen_at = GREATEST(u.last_seen_at, LEAST(v.ts, now(), "
    "CASE WHEN u.chosen_status = 'invisible' THEN u.chosen_at END)) "
    "FROM unnest($1::text[], $2::timestamptz[]) AS v(id, ts) "
    "WHERE u.id = v.id AND (u.chosen_status <> 'invisible' OR u.chosen_at IS NOT NULL)"
)


class FlushStoppedError(RuntimeError):
    """The actor stopped before these entries were committed; the caller still owns them."""


class _Ticket:
    """One `write` call: resolved when all of its entries are covered by committed batches."""

    __slots__ = ("future", "remaining")

    def __init__(self, future: asyncio.Future[None], remaining: int) -> None:
        self.future = future
        self.remaining = remaining


class FlushActor:
    def __init__(
        self,
        database_url: str,
        interval_s: float = 1.0,
        max_rows: int = 1000,
        clock: Callable[[], float] = time.time,
        *,
        max_pending: int = 1_000_000,
        connect_timeout_s: float = 5.0,
        statement_timeout_s: float = 30.0,
    ) -> None:
        self._url = database_url
        self._clock = clock
        self._buffer = FlushBuffer(interval_s=interval_s, max_rows=max_rows, max_pending=max_pending)
        self._connect_timeout_s = connect_timeout_s
        self._statement_timeout_s = statement_timeout_s

        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        # Set whenever the buffer may have become due earlier than the loop planned.
        self._wake: asyncio.Event | None = None
        # Set while the buffer is not overloaded; writers wait on it before adding.
        self._room: asyncio.Event | None = None
        # > 0 while drain() runs: batches are taken without waiting for the interval.
        self._draining = 0
        # Futures resolved when the buffer is empty (nothing pending, nothing in flight).
        self._empty_waiters: list[asyncio.Future[None]] = []
        # account id -> [(value, ticket)]: the entries of `write` calls not yet committed.
        self._waiting: dict[str, list[tuple[float, _Ticket]]] = {}

        self._statements = 0
        self._rows_written = 0
        self._rows_updated = 0
        self._errors = 0
        self.metrics = Metrics()  # the write-time histogram (the rest is in stats())
        self._retries = 0

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the flush loop. Never touches the database: a database that is down at start
        must not keep the actor from starting; the loop connects when it has something to write.
        """
        if self._task is not None:
            return
        self._stopped = False
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="flush-loop")

    async def stop(self) -> None:
        """Stop at once, without draining (call `drain` first for a clean shutdown).

        Writers still waiting get FlushStoppedError: their entries may not be committed, and
        the shards keep and resend them.
        """
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for entries in self._waiting.values():
            for _, ticket in entries:
                if not ticket.future.done():
                    ticket.future.set_exception(FlushStoppedError("flush actor stopped"))
        self._waiting.clear()
        for fut in self._empty_waiters:
            if not fut.done():
                fut.set_result(None)
        self._empty_waiters.clear()
        if self._room is not None:
            self._room.set()  # release writers held back by overload; they see _stopped
        await self._close()

    # ------------------------------------------------------------------ API

    async def write(self, entries: list[tuple[str, float]]) -> None:
        """Buffer (account id, last-seen epoch seconds) entries and return once all are committed.

        An entry counts as committed when a batch holding the same account with a value at least
        as late has committed (coalescing may have merged it into a later value). Rows for ids
        with no `users` row are committed as no-ops. While the buffer is overloaded the call
        waits before adding anything, so the entries stay with the caller meanwhile.
        """
        if self._stopped:
            raise FlushStoppedError("flush actor stopped")
        if self._task is None:
            await self.start()
        assert self._room is not None and self._wake is not None
        while self._buffer.overloaded:
            self._room.clear()
            await self._room.wait()
            if self._stopped:
                raise FlushStoppedError("flush actor stopped")
        if not entries:
            return
        now = self._clock()
        # Validates everything first (ValueError leaves the buffer untouched).
        self._buffer.add(entries, now)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ticket = _Ticket(future, len(entries))
        for key, ts in entries:
            # Clamped exactly as the buffer clamped it, so the comparison at commit matches.
            self._waiting.setdefault(key, []).append((clamp_timestamp(ts, now), ticket))
        self._wake.set()
        # A caller that gives up (timeout, cancellation) cancels only its own future: its rows
        # stay buffered and are written anyway; _resolve skips futures already done.
        await future

    async def drain(self, timeout_s: float) -> int:
        """Flush everything pending now, ignoring the interval; returns rows still unwritten."""
        if self._buffer.pending_count == 0 and self._buffer.in_flight_count == 0:
            return 0
        if self._stopped:
            return self._unwritten()
        if self._task is None:
            await self.start()
        assert self._wake is not None
        self._draining += 1
        try:
            future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._empty_waiters.append(future)
            self._wake.set()
            await asyncio.wait({future}, timeout=max(timeout_s, 0.0))
            if not future.done():
                future.cancel()
                with contextlib.suppress(ValueError):
                    self._empty_waiters.remove(future)
        finally:
            self._draining -= 1
        return self._unwritten()

    async def stats(self) -> dict[str, Any]:
        since = self._buffer.oldest_pending_since()
        return {
            "pending_rows": self._buffer.pending_count,
            "in_flight_rows": self._buffer.in_flight_count,
            "statements": self._statements,
            "rows_written": self._rows_written,
            "rows_updated": self._rows_updated,
            "errors": self._errors,
            "retries": self._retries,
            "consecutive_failures": self._buffer.consecutive_failures,
            "waiting_writes": sum(len(v) for v in self._waiting.values()),
            "overloaded": int(self._buffer.overloaded),
            "connected": int(self._conn is not None and not self._conn.is_closed()),
            "oldest_pending_age_seconds": 0.0 if since is None else max(self._clock() - since, 0.0),
            "metrics": self.metrics.snapshot(),
        }

    # ------------------------------------------------------------------ the loop

    def _unwritten(self) -> int:
        return self._buffer.pending_count + self._buffer.in_flight_count

    async def _run(self) -> None:
        def failed(e: Exception) -> None:
            log.error("last-seen flush loop failed; continuing", exc_info=e)

        await supervise(self._step, restart_after_s=0.5, on_failure=failed)

    async def _step(self) -> None:
        assert self._wake is not None
        # Clear before looking at the buffer: an add after this point sets it again, so no
        # wakeup is lost between the check and the wait.
        self._wake.clear()
        self._settle()
        now = self._clock()
        force = self._draining > 0
        batch = self._buffer.take(now, force=force)
        if batch is not None:
            await self._execute(batch)
            return
        at = self._buffer.next_wakeup(now, force=force)
        timeout = None if at is None else max(at - now, 0.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def _execute(self, batch: Batch) -> None:
        if self._buffer.consecutive_failures:
            self._retries += 1
        started = time.perf_counter()
        try:
            conn = await self._connection()
            times = [datetime.fromtimestamp(t, tz=UTC) for t in batch.times]
            try:
                status = await conn.execute(UPDATE_SQL, batch.ids, times, timeout=self._statement_timeout_s)
            finally:
                self.metrics.observe("flush_write_seconds", time.perf_counter() - started)
        except asyncio.CancelledError:
            # Stopping mid-statement: whether it committed is unknown, so keep the rows (they
            # are counted as unwritten); callers are told by stop() and resend if needed.
            self._buffer.failed(batch, self._clock())
            raise
        except Exception as exc:  # any failure: keep the batch, never drop a departure
            self._errors += 1
            delay = self._buffer.failed(batch, self._clock())
            log.warning(
                "last-seen flush of %d rows failed (%s: %s); retrying in %.1fs",
                len(batch),
                type(exc).__name__,
                exc,
                delay,
            )
            # The connection may be broken or in an unknown state: start afresh next time.
            await self._close()
            return
        self._buffer.succeeded(batch, self._clock())
        self._statements += 1
        self._rows_written += len(batch)
        self._rows_updated += _updated_count(status)
        self._resolve(batch)

    def _resolve(self, batch: Batch) -> None:
        """Resolve the writers whose entries this committed batch covers."""
        waiting = self._waiting
        for key, value in zip(batch.ids, batch.times, strict=True):
            entries = waiting.get(key)
            if entries is None:
                continue
            keep: list[tuple[float, _Ticket]] = []
            for ts, ticket in entries:
                if ts <= value:
                    ticket.remaining -= 1
                    if ticket.remaining == 0 and not ticket.future.done():
                        ticket.future.set_result(None)
                else:
                    keep.append((ts, ticket))
            if keep:
                waiting[key] = keep
            else:
                del waiting[key]

    def _settle(self) -> None:
        """Wake drains when the buffer is empty and writers when there is room again."""
        if self._room is not None and not self._buffer.overloaded:
            self._room.set()
        if self._unwritten() == 0 and self._empty_waiters:
            for fut in self._empty_waiters:
                if not fut.done():
                    fut.set_result(None)
            self._empty_waiters.clear()

    async def _connection(self) -> Any:
        conn = self._conn
        if conn is None or conn.is_closed():
            self._conn = None
            conn = await asyncpg.connect(self._url, timeout=self._connect_timeout_s)
            self._conn = conn
        return conn

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            await asyncio.wait_for(conn.close(), timeout=1.0)
        except Exception:
            # A connection to a dead server cannot close politely; drop it hard.
            conn.terminate()


def _updated_count(status: str) -> int:
    # asyncpg returns the command tag, e.g. "UPDATE 998".
    try:
        return int(status.rsplit(" ", 1)[-1])
    except ValueError:
        return 0
