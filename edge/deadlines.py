"""Which sockets to look at for the liveness rule, and when: a heap of times, checked lazily.

Pure: no I/O, the clock is an argument.

Why: the edge closes a socket that has not identified in time or has been silent past its
timeout (`Session.expired`). Looking at every socket once a second cost a walk over all of them
in one step of the event loop (10,000 sessions: 2-4 ms on the 2-core machine, 50,000 per edge
five times that), and every frame in flight waited behind it.
A socket's deadline only moves later (a frame arrives, or it identifies), so each socket is put
in the heap at a time it cannot expire before; when that time comes it is looked at again, and
either closed or put back at its new deadline. A socket is then looked at about once per
timeout instead of once a second.
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

    def add(self, key: K, at: float) -> None:
        """Look at `key` again at `at` (a key may be in several times: each is handed out once)."""
        heapq.heappush(self._heap, (at, next(self._order), key))

    def due(self, now: float) -> Iterator[K]:
        """Every key whose time has come, earliest first, each taken out as it is handed out (a
        key added meanwhile at a time already past is handed out in the same pass)."""
        while self._heap and self._heap[0][0] <= now:
            yield heapq.heappop(self._heap)[2]

    def __len__(self) -> int:
        return len(self._heap)
