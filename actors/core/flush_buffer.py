"""Coalescing buffer for last-seen writes: the pure core of the FlushActor.

Last-seen values arrive one departure at a time from many shards. Writing each one through would
turn departures into database statements one for one, so this buffer coalesces them by account
(keeping the latest value, because last-seen never moves backwards) and hands out batches of at
most `max_rows` rows, at most every `interval_s`, one batch in flight at a time. A failed batch
comes back into the buffer and is retried with exponential backoff: nothing is ever dropped.

No I/O, no asyncio, no clock: every method that depends on time takes `now` (epoch seconds), so
tests can drive hours of retries and clock jumps in microseconds.

Clock jumps. `now` is wall-clock time (the same clock that stamps departures). If it jumps
backwards, a deadline computed from an earlier `now` could lie far in the future and stall the
flush for as long as the jump; so any deadline whose start is later than `now` counts as already
expired. A backwards jump therefore costs at most one early statement, never a stall.

Overload. `add` never drops data, however much is pending. Once more than `max_pending` rows are
pending, `overloaded` becomes true; the shell is expected to push back (the FlushActor makes
new `write` calls wait before adding, so the departures stay with the shards that sent them).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from actors.core.backoff import Backoff

__all__ = ["Batch", "FlushBuffer", "clamp_timestamp"]


def clamp_timestamp(ts: float, now: float) -> float:
    """A last-seen time as it may be stored: never later than `now`.

    A departure stamped in the future (a skewed clock on some node) would otherwise win every
    GREATEST for that account until real time caught up, freezing its last-seen. Clamping to
    `now` keeps it "just now", which is what the user actually saw.

    Raises ValueError for NaN, infinities and times before the epoch: such a value could not be
    converted to a timestamptz, and one unwritable row would block its whole batch forever.
    """
    if not math.isfinite(ts) or ts < 0.0:
        raise ValueError(f"last-seen timestamp must be a finite epoch time >= 0, got {ts!r}")
    return ts if ts <= now else now


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows handed to the shell for exactly one UPDATE statement.

    `ids` are sorted so that concurrent writers lock rows in the same order; `times[i]` is the
    value for `ids[i]`. `batch_id` increases by one for every batch taken (a retried batch's rows
    come back in a new batch with a new id).
    """

    batch_id: int
    ids: list[str]
    times: list[float]

    def __len__(self) -> int:
        return len(self.ids)


class _Row:
    """A pending row. `arrived` is when the row first entered the buffer (unflushed since)."""

    __slots__ = ("arrived", "key", "ts")

    def __init__(self, key: str, ts: float, arrived: float) -> None:
        self.key = key
        self.ts = ts
        self.arrived = arrived


class FlushBuffer:
    def __init__(
        self,
        interval_s: float = 1.0,
        max_rows: int = 1000,
        max_pending: int = 1_000_000,
        *,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 30.0,
    ) -> None:
        if interval_s < 0:
            raise ValueError("interval_s must be >= 0")
        if max_rows < 1:
            raise ValueError("max_rows must be >= 1")
        if max_pending < 1:
            raise ValueError("max_pending must be >= 1")
        if backoff_initial_s < 0 or backoff_max_s < backoff_initial_s:
            raise ValueError("need 0 <= backoff_initial_s <= backoff_max_s")
        self.interval_s = interval_s
        self.max_rows = max_rows
        self.max_pending = max_pending
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self._backoff = Backoff(backoff_initial_s, backoff_max_s, floor=0.5)

        # key -> its pending row. The dict is the truth; `_order` only gives arrival order.
        self._pending: dict[str, _Row] = {}
        # Rows in arrival order (oldest first), so batches are taken first-come first-served and
        # the oldest row's age is O(1). Entries are invalidated lazily: an entry is live only
        # while `_pending[row.key] is row`, which avoids O(n) removals from the middle.
        self._order: deque[_Row] = deque()

        self._in_flight: Batch | None = None
        # The in-flight rows with their arrival times, to put them back unchanged on failure and
        # to recognise additions the in-flight batch already covers.
        self._in_flight_rows: dict[str, _Row] = {}

        self._next_batch_id = 1
        self._failures = 0  # consecutive failed batches; 0 when the last batch succeeded
        self._failed_at: float | None = None
        self._retry_delay = 0.0

    # ------------------------------------------------------------------ inspection

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def in_flight_count(self) -> int:
        return len(self._in_flight_rows)

    @property
    def in_flight(self) -> Batch | None:
        return self._in_flight

    @property
    def overloaded(self) -> bool:
        """More than `max_pending` rows wait: the shell should stop accepting new work for now."""
        return len(self._pending) > self.max_pending

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def oldest_pending_since(self) -> float | None:
        """When the oldest unflushed pending row arrived, or None when nothing is pending."""
        row = self._front()
        return None if row is None else row.arrived

    def pending_value(self, key: str) -> float | None:
        row = self._pending.get(key)
        return None if row is None else row.ts

    # ------------------------------------------------------------------ input

    def add(self, entries: Iterable[tuple[str, float]], now: float) -> None:
        """Merge (account id, last-seen) entries, keeping the latest value per account.

        Values later than `now` are clamped to `now`. Every entry is validated before anything
        changes, so a bad entry (ValueError) leaves the buffer untouched.
        """
        clean = [(key, clamp_timestamp(ts, now)) for key, ts in entries]
        for key, ts in clean:
            row = self._pending.get(key)
            if row is not None:
                if ts > row.ts:
                    row.ts = ts  # keeps its arrival time: it has been waiting since then
                continue
            flying = self._in_flight_rows.get(key)
            if flying is not None and flying.ts >= ts:
                # The batch in flight already writes this value or a later one, and comes back
                # into the buffer if it fails: queueing it again would only cost a redundant row.
                continue
            row = _Row(key, ts, now)
            self._pending[key] = row
            self._order.append(row)

    # ------------------------------------------------------------------ scheduling

    def _front(self) -> _Row | None:
        order, pending = self._order, self._pending
        while order:
            row = order[0]
            if pending.get(row.key) is row:
                return row
            order.popleft()  # stale: taken, or replaced by an older arrival after a failure
        return None

    def _ready(self, t: float, front: _Row, force: bool) -> bool:
        """Whether a batch may leave at time `t` (given something pending, nothing in flight).

        Both conditions treat a `t` earlier than the moment they start from (the failure, the
        row's arrival) as a backwards clock jump and give way rather than stall.
        """
        failed_at = self._failed_at
        if failed_at is not None and failed_at <= t < failed_at + self._retry_delay:
            return False  # retry backoff running
        if force or len(self._pending) >= self.max_rows:
            return True
        return t < front.arrived or t - front.arrived >= self.interval_s

    def due(self, now: float, *, force: bool = False) -> bool:
        """Whether `take(now, force=force)` would return a batch.

        A batch is due when nothing is in flight, no retry backoff is running, and either
        `max_rows` rows wait or the oldest has waited `interval_s`. `force` (used to drain on
        shutdown) waives the interval and the row threshold, never the backoff.
        """
        if self._in_flight is not None:
            return False
        front = self._front()
        return front is not None and self._ready(now, front, force)

    def next_wakeup(self, now: float, *, force: bool = False) -> float | None:
        """When the shell should call `take` again (<= now means: now).

        The earliest time from `now` on at which a batch is due if nothing changes meanwhile.
        None means nothing can happen until the buffer is changed from outside: nothing is
        pending, or a batch is in flight (its outcome, `succeeded` or `failed`, comes first).
        An `add` may make a batch due earlier than the time returned here.
        """
        if self._in_flight is not None:
            return None
        front = self._front()
        if front is None:
            return None
        if self._ready(now, front, force):
            return now
        # Readiness only changes at these instants; the last one is always ready (both the
        # interval and the backoff are over), so the minimum exists.
        interval_end = front.arrived + self.interval_s
        backoff_end = interval_end if self._failed_at is None else self._failed_at + self._retry_delay
        candidates = (backoff_end, interval_end, max(backoff_end, interval_end))
        return min(c for c in candidates if c > now and self._ready(c, front, force))

    # ------------------------------------------------------------------ batches

    def take(self, now: float, *, force: bool = False) -> Batch | None:
        """Move up to `max_rows` of the oldest pending rows into a new in-flight batch."""
        if not self.due(now, force=force):
            return None
        taken: list[_Row] = []
        order, pending = self._order, self._pending
        while order and len(taken) < self.max_rows:
            row = order.popleft()
            if pending.get(row.key) is row:
                del pending[row.key]
                taken.append(row)
        # Sorted keys: concurrent writers then lock rows in the same order, avoiding deadlocks.
        taken.sort(key=lambda r: r.key)
        batch = Batch(self._next_batch_id, [r.key for r in taken], [r.ts for r in taken])
        self._next_batch_id += 1
        self._in_flight = batch
        self._in_flight_rows = {r.key: r for r in taken}
        return batch

    def _finish(self, batch: Batch) -> dict[str, _Row]:
        if self._in_flight is None or batch.batch_id != self._in_flight.batch_id:
            raise ValueError(f"batch {batch.batch_id} is not the batch in flight")
        rows = self._in_flight_rows
        self._in_flight = None
        self._in_flight_rows = {}
        return rows

    def succeeded(self, batch: Batch, now: float) -> None:
        """The batch is committed: forget it and end any backoff."""
        self._finish(batch)
        self._failures = 0
        self._failed_at = None
        self._retry_delay = 0.0

    def backoff_delay(self, failures: int, jitter: float = 0.0) -> float:
        """Delay after the `failures`-th consecutive failure: 0.5 s doubling, capped at 30 s.

        `jitter` in [0, 1] shortens the delay by up to half ("equal jitter"); the default 0 keeps
        the core deterministic. Shortening rather than lengthening keeps the cap a true cap.
        """
        if not 0.0 <= jitter <= 1.0:
            raise ValueError("jitter must be in [0, 1]")
        return self._backoff.delay(failures - 1, random=lambda: 1.0 - jitter)

    def failed(self, batch: Batch, now: float, jitter: float = 0.0) -> float:
        """The batch was not (known to be) committed: put its rows back and back off.

        Rows return with their original arrival time, ahead of newer rows, and max-merge with
        values added for the same accounts meanwhile. Returns the retry delay chosen.
        """
        rows = self._finish(batch)
        for row in sorted(rows.values(), key=lambda r: r.arrived, reverse=True):
            newer = self._pending.get(row.key)
            if newer is not None:
                # Whichever is later wins; the older arrival keeps its place in the queue.
                row.ts = max(row.ts, newer.ts)
            self._pending[row.key] = row  # invalidates `newer`'s queue entry, if any
            self._order.appendleft(row)
        self._failures += 1
        self._failed_at = now
        self._retry_delay = self.backoff_delay(self._failures, jitter)
        return self._retry_delay
