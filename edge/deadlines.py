"""Which sockets to look at for the liveness rule, and when: a heap of times, checked lazily.

Pure: no I/O, the clock is an argument.

Why: the edge closes a socket that has not identified in time or has been silent past its
timeout (`Session.expired`). Looking at every socket once a second cost a walk over all of them
in one step of the event loop (10,000 sessions: 2-4 ms on the 2-core machine, 50,000 per edge
five times that), and every frame in flight waited behind it. Once identified, a socket's
deadline only moves later (a frame arrives), so each socket is put in the heap at a time it
cannot expire before (again when it identifies: `add` reschedules); when that time comes it is
looked at again, and either closed or put back at its new deadline. A socket is then looked at
about once per timeout instead of once a second.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class Deadlines(Generic[K]):
    def __init__(self) -> None:
        # (time, insertion order, key): the order keeps the heap from ever comparing two keys.
        self._heap: list[tuple[float, int, K]] = []
        self._order = itertools.count()
        # Each key's latest time: an entry of the heap at any other time was superseded and is
        # skipped when it comes up (cheaper than finding it in the heap), so a key rescheduled
        # at identify is still looked at once per timeout, not once per entry it ever had.
        self._at: dict[K, float] = {}

    def add(self, key: K, at: float) -> None:
        """Look at `key` at `at` (instead of any time given before)."""
        self._at[key] = at
        heapq.heappush(self._heap, (at, next(self._order), key))

    def due(self, now: float) -> Iterator[K]:
        """Every key whose time has come, earliest first, each handed out once and then no longer
        scheduled (add it again to be handed out again; a key added meanwhile at a time already
        past is handed out in the same pass)."""
        while self._heap and self._heap[0][0] <= now:
            at, _, key = heapq.heappop(self._heap)
            if self._at.get(key) == at:
                del self._at[key]
                yield key

    def __len__(self) -> int:
        """Keys scheduled."""
        return len(self._at)
