"""How many connections one edge opens at once: the gate in front of the upgrade and identify.

Pure: no I/O, the clock is an argument; the edge pauses, resumes and drops the connections.

Why: an edge accepts connections as fast as the kernel hands them over, but opening one (the
websocket upgrade, the token, the `connect` through its shard) costs about a millisecond of the
edge's one core. When an edge dies, every client it held comes to the others within a second or
two (`presence bench reconnect`: 19,000 at once). Accepted without a bound, thousands of openings
share the event loop, each one gets a sliver of it, most take longer than their client waits
(10 s), and the work done for them is thrown away when the client gives up: the storm slows
itself down, while every frame for the sockets already there (fan-out) waits behind thousands of
handshake steps in the loop's queue. With the gate:

- at most `limit` connections are being opened at once (from accept until authenticated or
  gone); the event loop's queue stays short, so deliveries to open sockets are not starved;
- a connection past that waits its turn, unread (the edge pauses reading it), first come first
  served, at most `queue_max` of them: they cost a file descriptor and no CPU;
- a waiting connection is dropped once it has waited `queue_s` (its client is about to give up;
  it retries with its backoff), and one arriving at a full queue is dropped at once: a client
  told early backs off early, instead of holding a try that cannot succeed in time.

The edge serves as many openings a second as before, without thrashing; what the bound costs a
client is the wait in line, which it would otherwise have spent inside a slower handshake.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class Entry(Enum):
    """What `OpeningGate.enter` decided for a new connection."""

    GO = "go"  # open it now
    WAIT = "wait"  # keep it unread until `leave` or `expire` hands it over
    REFUSE = "refuse"  # drop it: the queue is full


@dataclass
class Turns(Generic[T]):
    """What a `leave` or `expire` changed: connections to open now, connections to drop."""

    admitted: list[tuple[T, float]] = field(default_factory=list)  # with the time each waited
    expired: list[T] = field(default_factory=list)


@dataclass
class OpeningGate(Generic[T]):
    limit: int
    queue_max: int
    queue_s: float
    active: set[T] = field(default_factory=set)
    # Waiting connections, oldest first, with the time each arrived.
    waiting: OrderedDict[T, float] = field(default_factory=OrderedDict)

    def enter(self, conn: T, now: float) -> Entry:
        """A connection was accepted."""
        if len(self.active) < self.limit:  # then nobody waits: a place that comes free is taken
            self.active.add(conn)
            return Entry.GO
        if len(self.waiting) >= self.queue_max:
            return Entry.REFUSE
        self.waiting[conn] = now
        return Entry.WAIT

    def has_place(self) -> bool:
        """A connection arriving now would open at once."""
        return len(self.active) < self.limit

    def full(self) -> bool:
        """A connection arriving now would be refused (the edge drops it before building it)."""
        return len(self.active) >= self.limit and len(self.waiting) >= self.queue_max

    def leave(self, conn: T, now: float) -> Turns[T]:
        """`conn` is open (authenticated) or gone; harmless to repeat. The next in line get its
        place, those that waited too long are dropped."""
        self.active.discard(conn)
        self.waiting.pop(conn, None)
        return self._admit(now)

    def expire(self, now: float) -> Turns[T]:
        """Drop those that waited too long even if no place came free (all of them slow)."""
        return self._admit(now)

    def drain(self) -> list[T]:
        """Everything waiting, taken out (the edge is stopping: drop them)."""
        out = list(self.waiting)
        self.waiting.clear()
        return out

    def _admit(self, now: float) -> Turns[T]:
        turns: Turns[T] = Turns()
        horizon = now - self.queue_s
        while self.waiting:
            conn, since = next(iter(self.waiting.items()))
            if since < horizon:
                self.waiting.popitem(last=False)
                turns.expired.append(conn)
            elif len(self.active) < self.limit:
                self.waiting.popitem(last=False)
                self.active.add(conn)
                turns.admitted.append((conn, now - since))
            else:
                break
        return turns
