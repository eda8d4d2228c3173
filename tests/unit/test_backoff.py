"""The one backoff (actors/core/backoff.py): the pure policy. The loop that retries with it is
actors/retry.py (tests/unit/test_retry.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.backoff import Backoff


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
