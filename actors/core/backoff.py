"""One backoff for every retry of the project: a pure policy, and one helper that retries a call.

The policy is capped exponential backoff with jitter: the wait before retry `attempt` (0 for the
first) is drawn from the window ``min(cap, first * 2**attempt)``. With full jitter (``floor`` 0)
it is uniform over the whole window: when a shard restarts, every edge notices within the same
second, and edges that all waited "0.1 s, 0.2 s, 0.4 s" would come back in lockstep, each wave a
burst on the new incarnation; drawing the wait spreads each wave over its window (the AWS
architecture blog's "Exponential Backoff And Jitter"). ``floor`` 0.5 ("equal jitter") always waits
at least half the window: for a caller that must back off harder (a client told it is throttled,
a listener reconnecting to a recovering database). The cap is a true cap: no draw exceeds it.

The random source is a parameter (a float in [0, 1)), so tests and benchmarks replay exactly.
`retry` is the one loop around it; its clock and sleep are parameters too, so its tests run in
microseconds. Who uses which policy, and why its numbers, is said where the policy is defined.
"""

from __future__ import annotations

import asyncio
import random as _random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = ["Backoff", "retry"]

T = TypeVar("T")

Random = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Backoff:
    """Windows in seconds: `first_s` for the first retry, doubling up to `cap_s`."""

    first_s: float
    cap_s: float
    # The share of the window always waited: 0 is full jitter, 0.5 equal jitter, 1 none.
    floor: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.first_s <= self.cap_s:
            raise ValueError("need 0 <= first_s <= cap_s")
        if not 0.0 <= self.floor <= 1.0:
            raise ValueError("floor must be in [0, 1]")

    def window(self, attempt: int) -> float:
        """The longest wait before retry `attempt` (0 for the first; negative counts as 0)."""
        n = min(max(0, int(attempt)), 64)  # 2**64 already passes any cap, and never overflows
        return min(self.cap_s, self.first_s * 2.0**n)

    def delay(self, attempt: int, random: Random = _random.random) -> float:
        """The wait before retry `attempt`; `random` returns a float in [0, 1]."""
        window = self.window(attempt)
        return window * (self.floor + (1.0 - self.floor) * random())


async def retry(
    call: Callable[[], Awaitable[T]],
    policy: Backoff,
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    when: Callable[[BaseException], bool] | None = None,
    deadline: float | None = None,
    on_retry: Callable[[BaseException, float], None] | None = None,
    random: Random = _random.random,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """Await `call()` until it returns, waiting `policy.delay(attempt)` after each failure.

    Only exceptions of the `retry_on` types that `when` (if given) accepts are retried; any other
    propagates at once (cancellation always does). With a `deadline` (on `clock`), a failure
    whose next wait would end past it is raised instead; without one the call is retried forever.
    `on_retry(error, wait)` is told of each failure before its wait (metrics, logs)."""
    attempt = 0
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except retry_on as e:
            if when is not None and not when(e):
                raise
            wait = policy.delay(attempt, random)
            if deadline is not None and clock() + wait > deadline:
                raise
            if on_retry is not None:
                on_retry(e, wait)
            await sleep(wait)
            attempt += 1
