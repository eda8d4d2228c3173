"""Who may run a lane handshake now: a limit per source address, a line for the rest.

A shard's lane (actors/lane.py) answers a handshake only while few are in progress, because each
holds a connection and a timer. With one limit shared by every source, a process holding the
maximum of silent connections kept every real edge out (issue 29: 7 of 8 edge handshakes failed).
Here each source address may run at most `per_source` handshakes at once and all together at most
`total`; a handshake over either limit waits its turn instead of being refused, at most
`waiting_per_source` per source and `waiting_total` in all (past those it is refused). When a
place comes free the next in line is taken from the sources in turn, so a source with a long line
delays the others by at most one handshake each.

Plain bookkeeping, no I/O and no clock: the lane's shell carries out the answers and drops a
waiting handshake that waited too long (`withdraw`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Hashable
from enum import Enum
from typing import Generic, TypeVar

Ticket = TypeVar("Ticket", bound=Hashable)


class Entry(Enum):
    GO = "go"  # run the handshake now; call `leave` once it is over
    WAIT = "wait"  # wait for `leave` to hand this ticket its turn (or `withdraw` it)
    REFUSE = "refuse"  # the line is full: drop the connection


class HandshakeGate(Generic[Ticket]):
    def __init__(self, total: int, per_source: int, waiting_per_source: int, waiting_total: int) -> None:
        if min(total, per_source) < 1 or min(waiting_per_source, waiting_total) < 0:
            raise ValueError("handshake limits must be positive")
        self.total = total
        self.per_source = per_source
        self.waiting_per_source = waiting_per_source
        self.waiting_total = waiting_total
        self.running: dict[str, int] = {}
        # Waiting tickets by source; the order of the sources is the order they are served in.
        self.lines: OrderedDict[str, deque[Ticket]] = OrderedDict()
        self.waiting = 0

    @property
    def in_progress(self) -> int:
        return sum(self.running.values())

    def _has_room(self, source: str) -> bool:
        return self.in_progress < self.total and self.running.get(source, 0) < self.per_source

    def enter(self, source: str, ticket: Ticket) -> Entry:
        """A connection from `source` wants to handshake."""
        if self._has_room(source) and source not in self.lines:
            self.running[source] = self.running.get(source, 0) + 1
            return Entry.GO
        line = self.lines.get(source)
        if self.waiting >= self.waiting_total or (len(line) if line else 0) >= self.waiting_per_source:
            return Entry.REFUSE
        if line is None:
            line = self.lines[source] = deque()
        line.append(ticket)
        self.waiting += 1
        return Entry.WAIT

    def leave(self, source: str) -> list[tuple[str, Ticket]]:
        """A handshake of `source` that was running is over (passed, failed or timed out); the
        waiting ones that may run now, each with its source (they count as running)."""
        left = self.running.get(source, 0) - 1
        if left < 0:
            raise ValueError(f"no handshake of {source} is running")
        if left:
            self.running[source] = left
        else:
            del self.running[source]
        return self._admit()

    def withdraw(self, source: str, ticket: Ticket) -> None:
        """A waiting ticket gave up (its connection closed, or it waited too long)."""
        line = self.lines.get(source)
        if line is None or ticket not in line:
            return
        line.remove(ticket)
        self.waiting -= 1
        if not line:
            del self.lines[source]

    def _admit(self) -> list[tuple[str, Ticket]]:
        admitted: list[tuple[str, Ticket]] = []
        progress = True
        while progress and self.lines and self.in_progress < self.total:
            progress = False
            for source in list(self.lines):
                if not self._has_room(source):
                    continue
                line = self.lines[source]
                admitted.append((source, line.popleft()))
                self.waiting -= 1
                self.running[source] = self.running.get(source, 0) + 1
                del self.lines[source]
                if line:
                    self.lines[source] = line  # to the back: the sources take turns
                progress = True
                break
        return admitted
