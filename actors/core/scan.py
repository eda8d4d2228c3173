"""A rolling scan: every key of a mapping looked at about once per cycle, a slice per call.

Pure (the time is passed in). Why it exists: a shard's once-a-second sweep looked at every
account it held to find the idle ones to evict, although none can become evictable sooner than
`account_idle_evict_s` (600 s) after its last use. That walk grew with the shard: 0.4 ms at
5,000 accounts, 13-17 ms at 50,000 (bench/profiles/README.md, "The sweep"), every second, while
every batch, pull and delivery of the shard waited behind it. A rolling scan looks at a slice
sized by the time since the last call, so the whole mapping is still seen once per `cycle_s`
and a sweep costs about the same at any size.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator, Mapping
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")
_GONE = object()

# The defaults of every rolling sweep (the shard's publication windows and lookup buckets, an
# edge's accept buckets): each entry looked at about once per cycle, and a mapping this small
# handed out whole. Forgetting an entry later costs only its memory meanwhile.
SWEEP_CYCLE_S = 10.0
SWEEP_AT_LEAST = 1_000


class RollingScan(Generic[K]):
    """Hands out the keys of a mapping in slices, each key about once per `cycle_s`.

    A mapping of at most `at_least` keys is handed out whole at every call (small shards, and
    every unit test, behave as if there were no scan). Past that, a call hands out the next
    `size * elapsed / cycle_s` keys (at least `at_least`; `size` the mapping's or the copy's,
    the larger) of a copy taken when the cycle began: a key removed since may still come (the
    caller checks it is there), a key added is seen in the next cycle, so no key waits more
    than about two cycles."""

    def __init__(self, cycle_s: float, at_least: int) -> None:
        if cycle_s <= 0 or at_least < 1:
            raise ValueError("a rolling scan needs a positive cycle and at least one key a call")
        self.cycle_s = cycle_s
        self.at_least = at_least
        self.cycles = 0  # copies taken (or whole hand-outs), for tests
        self._queue: list[K] = []
        self._next = 0
        self._last: float | None = None

    def due(self, keys: Collection[K], now: float) -> list[K]:
        """The keys to look at by `now` (`keys` is copied only when a cycle begins)."""
        elapsed = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        if len(keys) <= self.at_least:
            self._queue, self._next = [], 0
            self.cycles += 1
            return list(keys)
        # Sized by the larger of the mapping and the cycle's copy: a copy taken when the mapping
        # was larger still ends within its cycle.
        size = max(len(keys), len(self._queue))
        budget = max(self.at_least, math.ceil(size * elapsed / self.cycle_s))
        out: list[K] = []
        copied = False
        while len(out) < budget:
            if self._next >= len(self._queue):
                if copied:  # the whole mapping handed out in this one call: enough
                    break
                self._queue, self._next, copied = list(keys), 0, True
                self.cycles += 1
            take = self._queue[self._next : self._next + budget - len(out)]
            self._next += len(take)
            out.extend(take)
        return out

    def due_items(self, mapping: Mapping[K, V], now: float) -> Iterator[tuple[K, V]]:
        """`due`'s keys still in `mapping`, with their values: what every sweep looks at. Each
        key is looked up when its turn comes, so the caller may delete as it goes: a key of the
        cycle's copy may have gone since, and a call that ends one copy and begins the next may
        name a key twice (its second turn finds it gone if the first deleted it)."""
        for key in self.due(mapping.keys(), now):
            value = mapping.get(key, _GONE)
            if value is not _GONE:
                yield key, value  # type: ignore[misc]
