"""The last-seen flush buffer: coalescing, batching, retries, and the promises the shell relies on."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from actors.core.flush_buffer import Batch, FlushBuffer, clamp_timestamp

T0 = 1_800_000_000.0  # an epoch time in 2027


def rows(batch: Batch) -> dict[str, float]:
    return dict(zip(batch.ids, batch.times, strict=True))


def drain_all(buf: FlushBuffer, now: float) -> tuple[float, list[Batch]]:
    """Take and commit everything, stepping the clock past backoffs; returns (now, batches)."""
    batches = []
    for _ in range(10_000):
        batch = buf.take(now, force=True)
        if batch is None:
            at = buf.next_wakeup(now, force=True)
            if at is None:
                return now, batches
            now = max(now, at)
            continue
        buf.succeeded(batch, now)
        batches.append(batch)
    raise AssertionError("buffer did not drain")


# ---------------------------------------------------------------------------- clamping


class TestClamp:
    def test_past_and_present_pass_through(self) -> None:
        assert clamp_timestamp(T0 - 5, T0) == T0 - 5
        assert clamp_timestamp(T0, T0) == T0
        assert clamp_timestamp(0.0, T0) == 0.0

    def test_future_is_clamped_to_now(self) -> None:
        assert clamp_timestamp(T0 + 3600, T0) == T0

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0])
    def test_unwritable_values_are_refused(self, bad: float) -> None:
        with pytest.raises(ValueError):
            clamp_timestamp(bad, T0)

    def test_add_clamps_future_values(self) -> None:
        buf = FlushBuffer()
        buf.add([("a", T0 + 1e6), ("b", T0 - 1)], T0)
        assert buf.pending_value("a") == T0
        assert buf.pending_value("b") == T0 - 1

    def test_bad_entry_leaves_buffer_untouched(self) -> None:
        buf = FlushBuffer()
        buf.add([("a", T0 - 10)], T0)
        with pytest.raises(ValueError):
            buf.add([("a", T0), ("b", T0), ("c", math.nan)], T0)
        assert buf.pending_count == 1
        assert buf.pending_value("a") == T0 - 10


# ---------------------------------------------------------------------------- coalescing


class TestCoalescing:
    def test_latest_value_per_account_wins(self) -> None:
        buf = FlushBuffer()
        buf.add([("a", T0 - 30), ("b", T0 - 20), ("a", T0 - 10)], T0)
        buf.add([("a", T0 - 50)], T0)  # older: ignored
        assert buf.pending_count == 2
        assert buf.pending_value("a") == T0 - 10
        assert buf.pending_value("b") == T0 - 20
        assert buf.pending_value("zzz") is None

    def test_empty_add_changes_nothing(self) -> None:
        buf = FlushBuffer()
        buf.add([], T0)
        assert buf.pending_count == 0
        assert not buf.due(T0 + 100)
        assert buf.next_wakeup(T0) is None

    def test_accepts_any_iterable(self) -> None:
        buf = FlushBuffer()
        buf.add(((f"u{i}", T0 - i) for i in range(3)), T0)
        assert buf.pending_count == 3

    def test_merging_keeps_original_arrival(self) -> None:
        buf = FlushBuffer(interval_s=1.0)
        buf.add([("a", T0)], T0)
        buf.add([("a", T0 + 0.9)], T0 + 0.9)
        # Waiting since T0, not since the newer value arrived.
        assert buf.oldest_pending_since() == T0
        assert buf.due(T0 + 1.0)


# ---------------------------------------------------------------------------- scheduling


class TestDue:
    def test_not_due_before_interval_then_due(self) -> None:
        buf = FlushBuffer(interval_s=1.0, max_rows=10)
        buf.add([("a", T0)], T0)
        assert not buf.due(T0)
        assert not buf.due(T0 + 0.999)
        assert buf.take(T0 + 0.5) is None
        assert buf.due(T0 + 1.0)
        assert buf.next_wakeup(T0) == T0 + 1.0

    def test_due_at_once_when_max_rows_wait(self) -> None:
        buf = FlushBuffer(interval_s=60.0, max_rows=3)
        buf.add([("a", T0), ("b", T0)], T0)
        assert not buf.due(T0)
        buf.add([("c", T0)], T0)
        assert buf.due(T0)
        assert buf.next_wakeup(T0) == T0

    def test_coalesced_rows_do_not_count_twice(self) -> None:
        buf = FlushBuffer(interval_s=60.0, max_rows=3)
        buf.add([("a", T0), ("a", T0 - 1), ("b", T0), ("b", T0)], T0)
        assert buf.pending_count == 2
        assert not buf.due(T0)

    def test_interval_counts_from_oldest_remaining_row(self) -> None:
        buf = FlushBuffer(interval_s=10.0, max_rows=2)
        buf.add([("a", T0), ("b", T0)], T0)
        buf.add([("c", T0 + 5)], T0 + 5)
        batch = buf.take(T0 + 5)
        assert batch is not None and batch.ids == ["a", "b"]
        buf.succeeded(batch, T0 + 5)
        assert buf.oldest_pending_since() == T0 + 5
        assert buf.next_wakeup(T0 + 5) == T0 + 15
        assert not buf.due(T0 + 14.9)
        assert buf.due(T0 + 15)

    def test_zero_interval_is_always_due(self) -> None:
        buf = FlushBuffer(interval_s=0.0)
        buf.add([("a", T0)], T0)
        assert buf.due(T0)

    def test_force_waives_interval(self) -> None:
        buf = FlushBuffer(interval_s=60.0)
        buf.add([("a", T0)], T0)
        assert not buf.due(T0)
        assert buf.due(T0, force=True)
        assert buf.next_wakeup(T0, force=True) == T0
        assert buf.take(T0, force=True) is not None

    def test_clock_going_backwards_flushes_rather_than_stalls(self) -> None:
        buf = FlushBuffer(interval_s=1.0)
        buf.add([("a", T0)], T0)
        # An NTP step of an hour backwards must not hold the row for an hour.
        assert buf.due(T0 - 3600)
        at = buf.next_wakeup(T0 - 3600)
        assert at is not None and at <= T0 - 3600

    def test_wakeup_after_backwards_jump_and_failure_is_really_due(self) -> None:
        # Found by the state machine: a row that arrived at T0, a clock stepped back to
        # T0 - 0.5 and a failure there. When the backoff ends (T0) the row is no longer "from
        # the future" but has not waited the interval either: the wakeup must be T0 + 1.
        buf = FlushBuffer(interval_s=1.0, max_rows=3)
        buf.add([("k", T0)], T0)
        batch = buf.take(T0 - 0.5)
        assert batch is not None
        buf.failed(batch, T0 - 0.5)
        at = buf.next_wakeup(T0 - 0.5)
        assert at == T0 + 1.0
        assert not buf.due(T0)
        assert buf.due(at)

    def test_constructor_validates(self) -> None:
        with pytest.raises(ValueError):
            FlushBuffer(interval_s=-1)
        with pytest.raises(ValueError):
            FlushBuffer(max_rows=0)
        with pytest.raises(ValueError):
            FlushBuffer(max_pending=0)
        with pytest.raises(ValueError):
            FlushBuffer(backoff_initial_s=5, backoff_max_s=1)


# ---------------------------------------------------------------------------- batches


class TestTake:
    def test_batch_is_sorted_and_bounded(self) -> None:
        buf = FlushBuffer(interval_s=0.0, max_rows=3)
        buf.add([("d", T0 - 4), ("b", T0 - 2), ("a", T0 - 1), ("c", T0 - 3), ("e", T0 - 5)], T0)
        batch = buf.take(T0)
        assert batch is not None
        assert len(batch) == 3
        # The three that arrived first (d, b, a), in key order.
        assert batch.ids == ["a", "b", "d"]
        assert batch.times == [T0 - 1, T0 - 2, T0 - 4]
        assert buf.pending_count == 2
        assert buf.in_flight_count == 3
        assert buf.in_flight is batch

    def test_first_come_first_served_across_adds(self) -> None:
        buf = FlushBuffer(interval_s=0.0, max_rows=2)
        buf.add([("z", T0)], T0)
        buf.add([("a", T0 + 1), ("b", T0 + 1)], T0 + 1)
        first = buf.take(T0 + 1)
        assert first is not None and first.ids == ["a", "z"]

    def test_only_one_batch_in_flight(self) -> None:
        buf = FlushBuffer(interval_s=0.0, max_rows=1)
        buf.add([("a", T0), ("b", T0)], T0)
        batch = buf.take(T0)
        assert batch is not None
        assert not buf.due(T0 + 100, force=True)
        assert buf.take(T0 + 100, force=True) is None
        assert buf.next_wakeup(T0 + 100) is None
        buf.succeeded(batch, T0 + 100)
        assert buf.take(T0 + 100) is not None

    def test_batch_ids_increase(self) -> None:
        buf = FlushBuffer(interval_s=0.0, max_rows=1)
        buf.add([("a", T0), ("b", T0), ("c", T0)], T0)
        ids = []
        now = T0
        while (batch := buf.take(now)) is not None:
            ids.append(batch.batch_id)
            if batch.batch_id == 2:
                buf.failed(batch, now)
                now += 10
            else:
                buf.succeeded(batch, now)
        assert ids == sorted(ids) and len(set(ids)) == len(ids) == 4

    def test_finishing_a_batch_not_in_flight_is_an_error(self) -> None:
        buf = FlushBuffer(interval_s=0.0)
        buf.add([("a", T0)], T0)
        batch = buf.take(T0)
        assert batch is not None
        with pytest.raises(ValueError):
            buf.succeeded(Batch(batch.batch_id + 1, batch.ids, batch.times), T0)
        buf.succeeded(batch, T0)
        with pytest.raises(ValueError):
            buf.succeeded(batch, T0)
        with pytest.raises(ValueError):
            buf.failed(batch, T0)

    def test_success_forgets_rows(self) -> None:
        buf = FlushBuffer(interval_s=0.0)
        buf.add([("a", T0), ("b", T0)], T0)
        batch = buf.take(T0)
        assert batch is not None
        buf.succeeded(batch, T0)
        assert buf.pending_count == 0 and buf.in_flight_count == 0
        assert buf.take(T0 + 100, force=True) is None
        assert buf.next_wakeup(T0 + 100) is None

    def test_value_already_in_flight_is_not_queued_again(self) -> None:
        buf = FlushBuffer(interval_s=0.0)
        buf.add([("a", T0 - 10)], T0)
        batch = buf.take(T0)
        assert batch is not None
        buf.add([("a", T0 - 10), ("a", T0 - 20)], T0)
        assert buf.pending_count == 0
        buf.add([("a", T0 - 5)], T0)  # later than the batch's value: it must be written
        assert buf.pending_value("a") == T0 - 5

    def test_rows_added_after_success_are_written_again(self) -> None:
        # The buffer does not remember committed values (that would grow without bound): a
        # resent or older value is simply written again, and GREATEST keeps it harmless.
        buf = FlushBuffer(interval_s=0.0)
        buf.add([("a", T0 - 10)], T0)
        batch = buf.take(T0)
        assert batch is not None
        buf.succeeded(batch, T0)
        buf.add([("a", T0 - 10)], T0)
        assert buf.pending_value("a") == T0 - 10


# ---------------------------------------------------------------------------- failures


class TestFailure:
    def test_rows_come_back_and_merge_with_newer_values(self) -> None:
        buf = FlushBuffer(interval_s=0.0)
        buf.add([("a", T0 - 10), ("b", T0 - 10)], T0)
        batch = buf.take(T0)
        assert batch is not None
        buf.add([("a", T0 - 1), ("c", T0 - 3)], T0)
        buf.failed(batch, T0)
        assert buf.in_flight_count == 0
        assert buf.pending_count == 3
        assert buf.pending_value("a") == T0 - 1
        assert buf.pending_value("b") == T0 - 10
        assert buf.pending_value("c") == T0 - 3

    def test_returned_rows_keep_their_age_and_go_first(self) -> None:
        buf = FlushBuffer(interval_s=5.0, max_rows=2)
        buf.add([("x", T0), ("y", T0)], T0)
        batch = buf.take(T0 + 5)
        assert batch is not None
        buf.add([("a", T0 + 6), ("b", T0 + 6)], T0 + 6)
        delay = buf.failed(batch, T0 + 6)
        assert buf.oldest_pending_since() == T0
        retry = buf.take(T0 + 6 + delay)
        assert retry is not None and retry.ids == ["x", "y"]
        assert retry.batch_id != batch.batch_id

    def test_backoff_doubles_to_a_cap(self) -> None:
        buf = FlushBuffer(interval_s=0.0)
        buf.add([("a", T0)], T0)
        now = T0
        delays = []
        for _ in range(10):
            batch = buf.take(now)
            assert batch is not None
            delay = buf.failed(batch, now)
            delays.append(delay)
            assert buf.consecutive_failures == len(delays)
            assert not buf.due(now + delay - 0.001)
            assert not buf.due(now + delay - 0.001, force=True)  # force never waives backoff
            assert buf.next_wakeup(now) == now + delay
            now += delay
            assert buf.due(now)
        assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0, 30.0]

    def test_success_resets_backoff(self) -> None:
        buf = FlushBuffer(interval_s=0.0)
        buf.add([("a", T0)], T0)
        for i in range(3):
            batch = buf.take(T0 + 100 * i)
            assert batch is not None
            buf.failed(batch, T0 + 100 * i)
        batch = buf.take(T0 + 1000)
        assert batch is not None
        buf.succeeded(batch, T0 + 1000)
        assert buf.consecutive_failures == 0
        buf.add([("b", T0 + 1000)], T0 + 1000)
        batch = buf.take(T0 + 1000)
        assert batch is not None
        assert buf.failed(batch, T0 + 1000) == 0.5

    def test_jitter_only_shortens(self) -> None:
        buf = FlushBuffer()
        assert buf.backoff_delay(1, jitter=0.0) == 0.5
        assert buf.backoff_delay(1, jitter=1.0) == 0.25
        assert buf.backoff_delay(100, jitter=0.5) == 22.5
        assert buf.backoff_delay(10_000) == 30.0  # no overflow for long outages
        with pytest.raises(ValueError):
            buf.backoff_delay(1, jitter=1.5)

    def test_injected_jitter_sets_retry_time(self) -> None:
        buf = FlushBuffer(interval_s=0.0)
        buf.add([("a", T0)], T0)
        batch = buf.take(T0)
        assert batch is not None
        assert buf.failed(batch, T0, jitter=1.0) == 0.25
        assert buf.next_wakeup(T0) == T0 + 0.25

    def test_custom_backoff(self) -> None:
        buf = FlushBuffer(backoff_initial_s=0.1, backoff_max_s=0.3)
        assert [buf.backoff_delay(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]

    def test_clock_going_backwards_does_not_extend_backoff(self) -> None:
        buf = FlushBuffer(interval_s=0.0)
        buf.add([("a", T0)], T0)
        for _ in range(8):
            batch = buf.take(buf.next_wakeup(T0) or T0)
            assert batch is not None
            buf.failed(batch, T0)
        # 30 s backoff from T0; the clock steps back an hour: retry now rather than in an hour.
        assert buf.due(T0 - 3600)


# ---------------------------------------------------------------------------- overload


class TestOverload:
    def test_overloaded_but_nothing_dropped(self) -> None:
        buf = FlushBuffer(interval_s=1.0, max_rows=10, max_pending=100)
        buf.add([(f"u{i:04}", T0) for i in range(100)], T0)
        assert not buf.overloaded
        buf.add([(f"v{i:04}", T0) for i in range(50)], T0)
        assert buf.overloaded
        assert buf.pending_count == 150
        _, batches = drain_all(buf, T0)
        assert sum(len(b) for b in batches) == 150
        assert all(len(b) <= 10 for b in batches)
        assert not buf.overloaded

    def test_overload_clears_as_batches_leave(self) -> None:
        buf = FlushBuffer(interval_s=0.0, max_rows=10, max_pending=15)
        buf.add([(f"u{i:04}", T0) for i in range(20)], T0)
        assert buf.overloaded
        batch = buf.take(T0)
        assert batch is not None
        assert not buf.overloaded  # 10 pending, 10 in flight


# ---------------------------------------------------------------------------- scale


def test_large_backlog_is_linear() -> None:
    # 100,000 accounts through batches of 1,000 with every other batch failing once: must stay
    # fast (no quadratic scans of the arrival queue).
    buf = FlushBuffer(interval_s=1.0, max_rows=1000)
    buf.add([(f"user-{i:07}", T0 - i % 1000) for i in range(100_000)], T0)
    now = T0
    written = 0
    flip = False
    while buf.pending_count:
        at = buf.next_wakeup(now)
        assert at is not None
        now = max(now, at)
        batch = buf.take(now)
        assert batch is not None and len(batch) == 1000
        flip = not flip
        if flip:
            buf.failed(batch, now)
        else:
            buf.succeeded(batch, now)
            written += len(batch)
    assert written == 100_000


# ---------------------------------------------------------------------------- properties

KEYS = st.sampled_from([f"k{i}" for i in range(6)])


class FlushModel(RuleBasedStateMachine):
    """Random interleavings of add / take / succeeded / failed and clock jumps.

    A model database applies batches with GREATEST, as the UPDATE does. The shell's promise to
    writers is modelled too: an added entry (k, v) is satisfied once a batch holding k with a
    value >= v commits after the add.
    """

    def __init__(self) -> None:
        super().__init__()
        self.max_rows = 3
        self.buf = FlushBuffer(interval_s=1.0, max_rows=self.max_rows, max_pending=5)
        self.now = T0
        self.db: dict[str, float] = {}
        self.latest: dict[str, float] = {}  # max clamped value ever added, per key
        self.unsatisfied: list[tuple[str, float]] = []
        self.step = 0
        self.added_at: dict[tuple[str, float], list[int]] = {}  # (k, v) -> steps it was added
        self.writes: dict[str, list[tuple[int, float]]] = {}  # k -> [(step committed, value)]
        self.flying: Batch | None = None
        self.last_batch_id = 0

    def _tick_step(self) -> int:
        self.step += 1
        return self.step

    @rule(
        entries=st.lists(
            st.tuples(KEYS, st.floats(min_value=-120.0, max_value=60.0, allow_nan=False)), max_size=6
        )
    )
    def add(self, entries: list[tuple[str, float]]) -> None:
        step = self._tick_step()
        absolute = [(k, self.now + off) for k, off in entries]
        self.buf.add(absolute, self.now)
        for k, ts in absolute:
            v = min(ts, self.now)
            self.latest[k] = max(self.latest.get(k, v), v)
            self.unsatisfied.append((k, v))
            self.added_at.setdefault((k, v), []).append(step)

    @rule(dt=st.one_of(st.floats(min_value=0.0, max_value=40.0), st.floats(min_value=-30.0, max_value=0.0)))
    def tick(self, dt: float) -> None:
        self.now += dt

    @precondition(lambda self: self.flying is None)
    @rule(force=st.booleans())
    def take(self, force: bool) -> None:
        due = self.buf.due(self.now, force=force)
        batch = self.buf.take(self.now, force=force)
        assert (batch is not None) == due
        if batch is None:
            return
        assert 1 <= len(batch) <= self.max_rows
        assert batch.ids == sorted(set(batch.ids)), "keys must be sorted and unique"
        assert len(batch.times) == len(batch.ids)
        assert batch.batch_id > self.last_batch_id
        self.last_batch_id = batch.batch_id
        for k, v in rows(batch).items():
            assert (k, v) in self.added_at, "a batch value must be one that was added"
            assert v <= self.latest[k]
        self.flying = batch

    @precondition(lambda self: self.flying is not None)
    @rule()
    def succeed(self) -> None:
        assert self.flying is not None
        self._commit(self.flying)
        self.buf.succeeded(self.flying, self.now)
        self.flying = None

    @precondition(lambda self: self.flying is not None)
    @rule(jitter=st.sampled_from([0.0, 0.3, 1.0]))
    def fail(self, jitter: float) -> None:
        assert self.flying is not None
        delay = self.buf.failed(self.flying, self.now, jitter)
        assert 0.25 <= delay <= 30.0
        self.flying = None

    def _commit(self, batch: Batch) -> None:
        step = self._tick_step()
        for k, v in rows(batch).items():
            # Never write a value older than one written before, unless that older value was
            # added again after the newer one was committed (a resend the buffer cannot know).
            for w_step, w_value in self.writes.get(k, []):
                if v < w_value:
                    assert any(s > w_step for s in self.added_at[(k, v)])
            self.writes.setdefault(k, []).append((step, v))
            self.db[k] = max(self.db.get(k, v), v)  # GREATEST
        committed = rows(batch)
        self.unsatisfied = [(k, v) for k, v in self.unsatisfied if not (k in committed and committed[k] >= v)]

    @invariant()
    def nothing_is_lost(self) -> None:
        flying = rows(self.flying) if self.flying is not None else {}
        for k, v in self.unsatisfied:
            pending = self.buf.pending_value(k)
            covered = max(pending if pending is not None else -1.0, flying.get(k, -1.0))
            assert covered >= v, f"entry {k}={v} is neither pending nor in flight"
        for k, v in self.latest.items():
            assert max(self.db.get(k, -1.0), self.buf.pending_value(k) or -1.0, flying.get(k, -1.0)) >= v

    @invariant()
    def counts_are_consistent(self) -> None:
        assert self.buf.in_flight_count == (len(self.flying) if self.flying is not None else 0)
        assert self.buf.overloaded == (self.buf.pending_count > 5)

    @invariant()
    def schedule_is_consistent(self) -> None:
        for force in (False, True):
            at = self.buf.next_wakeup(self.now, force=force)
            due = self.buf.due(self.now, force=force)
            if at is None:
                assert not due
                # Nothing can become due by itself only if there is nothing to do or a batch
                # is in flight.
                assert self.flying is not None or self.buf.pending_count == 0
            else:
                assert due == (at <= self.now)
                # Liveness: at the announced time (clock moving forward) a batch is due.
                assert self.buf.due(max(self.now, at), force=force)

    def teardown(self) -> None:
        # Eventually: with the database back and time moving on, every key's latest value is
        # stored and every writer is satisfied.
        if self.flying is not None:
            self.buf.failed(self.flying, self.now)
            self.flying = None
        for _ in range(1000):
            batch = self.buf.take(self.now)
            if batch is None:
                at = self.buf.next_wakeup(self.now)
                if at is None:
                    break
                self.now = max(self.now, at)
                continue
            assert len(batch) <= self.max_rows
            self._commit(batch)
            self.buf.succeeded(batch, self.now)
        assert self.buf.pending_count == 0 and self.buf.in_flight_count == 0
        assert self.db == self.latest
        assert self.unsatisfied == []


TestFlushModel = FlushModel.TestCase
TestFlushModel.settings = settings(
    max_examples=100, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.text(min_size=1, max_size=4), st.floats(min_value=0.0, max_value=2 * T0)),
        max_size=50,
    ),
    st.integers(min_value=1, max_value=7),
)
def test_any_input_drains_to_the_latest_values(entries: list[tuple[str, float]], max_rows: int) -> None:
    buf = FlushBuffer(interval_s=1.0, max_rows=max_rows)
    buf.add(entries, T0)
    expected: dict[str, float] = {}
    for k, ts in entries:
        expected[k] = max(expected.get(k, 0.0), min(ts, T0))
    _, batches = drain_all(buf, T0)
    stored: dict[str, float] = {}
    for b in batches:
        assert len(b) <= max_rows
        assert b.ids == sorted(set(b.ids))
        for k, v in rows(b).items():
            stored[k] = max(stored.get(k, v), v)
    assert stored == expected
    # Coalescing: each account is written exactly once when nothing fails.
    assert sum(len(b) for b in batches) == len(expected)
