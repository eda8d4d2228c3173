"""One backoff for every retry of the project: the pure policy (`actors/retry.py` retries with it).

The policy is capped exponential backoff with jitter: the wait before retry `attempt` (0 for the
first) is drawn from the window ``min(cap, first * 2**attempt)``. With full jitter (``floor`` 0)
it is uniform over the whole window: when a shard restarts, every edge notices within the same
second, and edges that all waited "0.1 s, 0.2 s, 0.4 s" would come back in lockstep, each wave a
burst on the new incarnation; drawing the wait spreads each wave over its window (the AWS
architecture blog's "Exponential Backoff And Jitter"). ``floor`` 0.5 ("equal jitter") always waits
at least half the window: for a caller that must back off harder (a client told it is throttled,
a listener reconnecting to a recovering database). The cap is a true cap: no draw exceeds it.

The random source is a parameter (a float in [0, 1)), always given: the core reads no clock and no
entropy of its own, so tests and benchmarks replay exactly. `actors.retry.retry` is the one loop
around it. Who uses which policy, and why its numbers, is said where the policy is defined.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Backoff", "Random"]

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

    def delay(self, attempt: int, random: Random) -> float:
        """The wait before retry `attempt`; `random` returns a float in [0, 1]."""
        window = self.window(attempt)
        return window * (self.floor + (1.0 - self.floor) * random())
