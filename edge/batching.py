"""When an edge's operations leave for their shard, as a pure object: the router's batching rule.

Operations are queued per shard (a *line*). A line leaves as one call when it is `max_ops` long,
or when its timer runs out: `idle_window_s` when no call to that shard is in flight (Nagle's rule:
only the pieces of the same frame's work gather, an idle line has nothing else to wait for),
`window_s` when one is (the shard applies one edge's batches in turn anyway), `connect_window_s`
for a line holding only connects while a call is in flight (a reconnect storm gathers more per
call). At most `max_in_flight` calls per shard are out: what arrives meanwhile waits and leaves as
one batch when a call comes back, so under load the batches grow instead of the calls.

No clock, no timers, no futures: `add` says whether to send now or (re)arm the line's timer and
for how long, `take` hands out the next batch, `came_back` says whether a returning call lets the
waiting line leave. The router (edge/router.py) keeps the timers and sends; the rule is tested on
its own in tests/unit/test_batching.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# What `add` asks of the caller besides queuing (a wait >= 0 arms the line's timer for that long).
SEND_NOW = -1.0
KEEP_TIMER = -2.0


class Lines(Generic[T]):
    __slots__ = (
        "_armed",
        "_in_flight",
        "_lines",
        "_urgent",
        "connect_window_s",
        "idle_window_s",
        "is_lazy",
        "max_in_flight",
        "max_ops",
        "window_s",
    )

    def __init__(
        self,
        *,
        window_s: float,
        idle_window_s: float,
        connect_window_s: float,
        max_ops: int,
        max_in_flight: int,
        is_lazy: Callable[[T], bool],
    ) -> None:
        self.window_s = window_s
        self.idle_window_s = idle_window_s
        self.connect_window_s = connect_window_s
        self.max_ops = max_ops
        self.max_in_flight = max_in_flight
        # Whether an item may wait `connect_window_s` on a busy line (a socket's connect).
        self.is_lazy = is_lazy
        self._lines: dict[int, list[T]] = {}
        # Lines whose timer is armed, and lines holding something other than a lazy item.
        self._armed: set[int] = set()
        self._urgent: set[int] = set()
        self._in_flight: dict[int, int] = {}

    def add(self, shard: int, item: T) -> float:
        """Queue `item`. Returns SEND_NOW, KEEP_TIMER, or how long to (re)arm the line's timer."""
        line = self._lines.get(shard)
        if line is None:
            line = self._lines[shard] = []
        line.append(item)
        lazy = self.is_lazy(item)
        lazy_line = shard not in self._urgent
        if not lazy:
            self._urgent.add(shard)
        if len(line) >= self.max_ops:
            return SEND_NOW
        # A line of lazy items that gets an urgent one: its shorter window starts now.
        if shard in self._armed and (lazy or not lazy_line):
            return KEEP_TIMER
        self._armed.add(shard)
        if not self._in_flight.get(shard, 0):
            return self.idle_window_s
        return self.connect_window_s if lazy else self.window_s

    def take(self, shard: int) -> list[T] | None:
        """The next batch to send now (the line's timer, if armed, counts as off), or None:
        nothing waits, or `max_in_flight` calls are out (the line waits for one to come back)."""
        self._armed.discard(shard)
        if self._in_flight.get(shard, 0) >= self.max_in_flight:
            return None
        line = self._lines.pop(shard, None)
        if not line:
            return None
        self._urgent.discard(shard)
        if len(line) > self.max_ops:
            batch, rest = line[: self.max_ops], line[self.max_ops :]
            self._lines[shard] = rest
            if not all(self.is_lazy(item) for item in rest):
                self._urgent.add(shard)
        else:
            batch = line
        self._in_flight[shard] = self._in_flight.get(shard, 0) + 1
        return batch

    def came_back(self, shard: int) -> bool:
        """A call to `shard` returned: whether its waiting line leaves now (a line of lazy items
        only, with its timer running, waits for the timer)."""
        self._in_flight[shard] -= 1
        return bool(self._lines.get(shard)) and (shard in self._urgent or shard not in self._armed)

    def in_flight(self, shard: int) -> int:
        return self._in_flight.get(shard, 0)
