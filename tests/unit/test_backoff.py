"""The one backoff (actors/core/backoff.py): the pure policy and the helper that retries with it."""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.backoff import Backoff, retry


class TestPolicy:
    def test_windows_double_up_to_the_cap(self) -> None:
        policy = Backoff(first_s=0.1, cap_s=2.0)
        assert [policy.window(n) for n in range(7)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])

    def test_full_jitter_spans_the_whole_window(self) -> None:
        policy = Backoff(first_s=1.0, cap_s=30.0)
        assert policy.delay(2, random=lambda: 0.0) == 0.0
        assert policy.delay(2, random=lambda: 0.5) == 2.0
        assert policy.delay(2, random=lambda: 0.999) == pytest.approx(3.996)

    def test_equal_jitter_waits_at_least_half(self) -> None:
        policy = Backoff(first_s=0.1, cap_s=5.0, floor=0.5)
        assert policy.delay(0, random=lambda: 0.0) == pytest.approx(0.05)
        assert policy.delay(0, random=lambda: 1.0) == pytest.approx(0.1)

    def test_out_of_range_attempts(self) -> None:
        policy = Backoff(first_s=0.5, cap_s=30.0)
        assert policy.window(-3) == 0.5  # as the first
        assert policy.window(10**9) == 30.0  # no overflow for a long outage

    @given(
        first=st.floats(0.0, 10.0),
        extra=st.floats(0.0, 100.0),
        floor=st.floats(0.0, 1.0),
        attempt=st.integers(-10, 10_000),
        r=st.floats(0.0, 1.0),
    )
    def test_the_cap_holds(self, first: float, extra: float, floor: float, attempt: int, r: float) -> None:
        policy = Backoff(first_s=first, cap_s=first + extra, floor=floor)
        wait = policy.delay(attempt, random=lambda: r)
        assert 0.0 <= wait <= policy.cap_s
        assert wait >= floor * policy.window(attempt) - 1e-12

    def test_refuses_nonsense(self) -> None:
        with pytest.raises(ValueError):
            Backoff(first_s=2.0, cap_s=1.0)
        with pytest.raises(ValueError):
            Backoff(first_s=-1.0, cap_s=1.0)
        with pytest.raises(ValueError):
            Backoff(first_s=1.0, cap_s=2.0, floor=1.5)

    def test_edges_do_not_retry_in_lockstep(self) -> None:
        """Edges that notice the same restart at the same instant spread their retries over the
        window instead of arriving together (each edge has its own random source)."""
        policy = Backoff(first_s=0.1, cap_s=2.0)
        edges = [random.Random(seed) for seed in range(50)]
        for attempt in range(6):
            waits = [policy.delay(attempt, rng.random) for rng in edges]
            assert len(set(waits)) == len(waits)  # no two edges retry at the same moment
            window = policy.window(attempt)
            # ...and the retries cover the window: some in its first and some in its last quarter.
            assert min(waits) < window / 4 and max(waits) > 3 * window / 4
        # Two edges: their whole schedules differ, and neither lags the other at every step.
        a, b = random.Random(1), random.Random(2)
        sa = [policy.delay(n, a.random) for n in range(8)]
        sb = [policy.delay(n, b.random) for n in range(8)]
        assert sa != sb


class FakeTime:
    """A clock that moves only when somebody sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Flaky:
    """Fails `failures` times with `error`, then answers "done"."""

    def __init__(self, failures: int, error: Exception | None = None) -> None:
        self.left = failures
        self.error = error or TimeoutError("not yet")
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise self.error
        return "done"


POLICY = Backoff(first_s=0.1, cap_s=2.0)


class TestRetry:
    async def test_retries_until_it_succeeds_waiting_the_policys_draws(self) -> None:
        t = FakeTime()
        call = Flaky(5)
        seen: list[tuple[str, float]] = []
        result = await retry(
            call,
            POLICY,
            random=lambda: 0.5,
            clock=t.clock,
            sleep=t.sleep,
            on_retry=lambda e, wait: seen.append((type(e).__name__, wait)),
        )
        assert result == "done" and call.calls == 6
        expected = [POLICY.delay(n, lambda: 0.5) for n in range(5)]
        assert t.sleeps == expected
        assert seen == [("TimeoutError", w) for w in expected]

    async def test_without_a_deadline_it_never_gives_up(self) -> None:
        t = FakeTime()
        call = Flaky(200)
        assert await retry(call, POLICY, random=lambda: 0.99, clock=t.clock, sleep=t.sleep) == "done"
        assert max(t.sleeps) <= POLICY.cap_s  # the cap holds however long it lasts

    async def test_gives_up_at_the_deadline_with_the_last_error(self) -> None:
        t = FakeTime()
        call = Flaky(1_000, ValueError("shard gone"))
        with pytest.raises(ValueError, match="shard gone"):
            await retry(
                call, POLICY, deadline=t.now + 5.0, random=lambda: 0.999, clock=t.clock, sleep=t.sleep
            )
        # It never sleeps past the deadline: the failure whose wait would cross it is raised.
        assert t.now <= 105.0
        assert t.now + POLICY.delay(len(t.sleeps), lambda: 0.999) > 105.0

    async def test_other_errors_go_through_at_once(self) -> None:
        t = FakeTime()
        call = Flaky(3, KeyError("bug"))
        with pytest.raises(KeyError):
            await retry(call, POLICY, retry_on=(TimeoutError, ValueError), clock=t.clock, sleep=t.sleep)
        assert call.calls == 1 and t.sleeps == []

    async def test_the_predicate_chooses_which_errors_retry(self) -> None:
        t = FakeTime()
        permanent = Flaky(3, OSError("permanent"))
        with pytest.raises(OSError):
            await retry(permanent, POLICY, when=lambda e: "transient" in str(e), clock=t.clock, sleep=t.sleep)
        assert permanent.calls == 1
        transient = Flaky(3, OSError("transient"))
        assert await retry(
            transient, POLICY, when=lambda e: "transient" in str(e), clock=t.clock, sleep=t.sleep
        ) == ("done")
        assert transient.calls == 4

    async def test_cancellation_is_never_retried(self) -> None:
        async def cancelled() -> None:
            raise asyncio.CancelledError

        with pytest.raises(asyncio.CancelledError):
            await retry(cancelled, POLICY, retry_on=BaseException, sleep=FakeTime().sleep)

    async def test_the_real_sleep_is_awaited(self) -> None:
        call = Flaky(2)
        assert await retry(call, Backoff(first_s=0.001, cap_s=0.002)) == "done"
