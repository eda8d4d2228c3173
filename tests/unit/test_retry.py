"""The loop that retries a call with the one backoff (actors/retry.py), on a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from actors.core.backoff import Backoff
from actors.retry import retry, supervise


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


class TestSupervise:
    """`supervise`: the one loop that keeps a background duty running (the shard's duties, the
    FlushActor's writer)."""

    async def test_a_failing_duty_is_reported_and_started_again_after_the_pause(self) -> None:
        runs: list[int] = []
        failures: list[str] = []
        t = FakeTime()

        async def duty() -> None:
            runs.append(len(runs))
            if len(runs) <= 2:
                raise RuntimeError(f"bug {len(runs)}")
            raise asyncio.CancelledError  # the shell stopping it

        with pytest.raises(asyncio.CancelledError):
            await supervise(
                duty, restart_after_s=1.5, on_failure=lambda e: failures.append(str(e)), sleep=t.sleep
            )
        assert failures == ["bug 1", "bug 2"]
        assert t.sleeps == [1.5, 1.5]
        assert len(runs) == 3

    async def test_a_duty_that_returns_runs_again_at_once(self) -> None:
        runs = 0
        t = FakeTime()

        async def step() -> None:
            nonlocal runs
            runs += 1
            if runs == 4:
                raise asyncio.CancelledError

        with pytest.raises(asyncio.CancelledError):
            await supervise(step, restart_after_s=1.0, on_failure=lambda e: None, sleep=t.sleep)
        assert runs == 4
        assert t.sleeps == []

    async def test_the_failure_hook_sees_the_traceback(self) -> None:
        seen: list[bool] = []

        async def duty() -> None:
            if seen:
                raise asyncio.CancelledError
            raise KeyError("a bug")

        def on_failure(e: Exception) -> None:
            seen.append(e.__traceback__ is not None)

        with pytest.raises(asyncio.CancelledError):
            await supervise(duty, restart_after_s=0.0, on_failure=on_failure, sleep=FakeTime().sleep)
        assert seen == [True]
