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

The places are shared fairly between client addresses. Each address has a `share` of them; it
may hold more while nobody else waits (one address behind a NAT reconnecting after a drain). But
once a connection from an address under its share waits, an address holding more places than it
gives up one it holds *idle*: a connection that has sent no identify (nor a token in its upgrade)
for `evict_after_s` is dropped, and the waiting one takes the place. Places that come free go to
addresses under their share first. Before, a few addresses holding idle connections (400 from 4
addresses, each under its own cap of 100) kept every other client of the edge from connecting.
A connection that has identified is never dropped for another: it is waiting on its shard.

How many places there are is not fixed: `OpeningPace` (below) moves the gate's `limit` between a
floor and `max_opening` from how late the edge's event loop runs.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
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
    # Places one address may hold while another waits (0: no such rule), and how long a place
    # must have been held idle before it is given up for a waiting address.
    share: int = 0
    evict_after_s: float = 2.0
    active: set[T] = field(default_factory=set)
    # Waiting connections, oldest first, with the time each arrived (expiry reads this order).
    waiting: OrderedDict[T, float] = field(default_factory=OrderedDict)
    # The address of each connection in the gate, the places each address holds, its waiting
    # connections in arrival order (the addresses in the order they are served), and the places
    # held idle (no identify yet), oldest first per address.
    _source: dict[T, str] = field(default_factory=dict)
    _held: Counter[str] = field(default_factory=Counter)
    _lines: OrderedDict[str, deque[T]] = field(default_factory=OrderedDict)
    _idle: dict[str, OrderedDict[T, float]] = field(default_factory=dict)
    # Places given up by `make_room` whose `leave` has not come yet: not counted as held.
    _giving_up: set[T] = field(default_factory=set)

    def enter(self, conn: T, now: float, source: str = "") -> Entry:
        """A connection from `source` (its client address) was accepted."""
        if len(self.active) < self.limit:  # then nobody waits: a place that comes free is taken
            self._open(conn, source, now)
            return Entry.GO
        if len(self.waiting) >= self.queue_max:
            return Entry.REFUSE
        self.waiting[conn] = now
        self._source[conn] = source
        line = self._lines.get(source)
        if line is None:
            line = self._lines[source] = deque()
        line.append(conn)
        return Entry.WAIT

    def progressed(self, conn: T) -> None:
        """`conn` sent its identify (or a token with its upgrade): it is working, not idle, and is
        never dropped to make room."""
        source = self._source.get(conn)
        if source is not None and conn in self.active:
            idle = self._idle.get(source)
            if idle is not None:
                idle.pop(conn, None)

    def make_room(self, now: float, source: str | None = None) -> list[T]:
        """Idle places to drop so that addresses under their share get theirs: for each
        connection waiting from such an address (from `source` only, when given: the one that
        just arrived), the oldest place held idle for `evict_after_s` by the address holding the
        most places, if that is more than the waiting address holds. The caller drops them; their
        `leave` admits the waiting ones. Called at each arrival that waits and once a second (a
        place becomes old enough meanwhile).

        Only addresses over their share used to give places up: eight addresses holding their
        16 idle places each (128, every place) kept every other client out, each within its
        share. Now an address holding more gives up an idle place to one holding fewer: the
        places even out between the addresses that want them, as far as idle ones allow."""
        if not self.share or not self.waiting:
            return []
        # Places each address keeps (those given up and not yet gone do not count), and the ones
        # each could give up: held idle long enough, oldest first.
        leaving = Counter(self._source[c] for c in self._giving_up)
        keeps = {other: held - leaving[other] for other, held in self._held.items()}
        old: dict[str, list[T]] = {}
        for other, idle in self._idle.items():
            conns = [c for c, since in idle.items() if now - since >= self.evict_after_s]
            if conns:
                old[other] = conns
        if not old:
            return []
        # The claimants in turn, no more of them than there are places to give (a storm's line
        # may hold thousands).
        room = sum(len(conns) for conns in old.values())
        wanting: list[str] = []
        for waiting_source, line in self._lines.items():
            if len(wanting) >= room:
                break
            if (source is None or waiting_source == source) and self._held[waiting_source] < self.share:
                wanting.extend([waiting_source] * min(len(line), room - len(wanting)))
        victims: list[T] = []
        given: Counter[str] = Counter()
        taken: Counter[str] = Counter()
        for claimant in wanting:
            mine = keeps.get(claimant, 0) + taken[claimant]
            if mine >= self.share:
                continue
            donors = [
                o
                for o, conns in old.items()
                if o != claimant and given[o] < len(conns) and keeps[o] - given[o] > mine
            ]
            if not donors:
                continue
            donor = max(donors, key=lambda o: keeps[o] - given[o])
            victims.append(old[donor][given[donor]])
            given[donor] += 1
            taken[claimant] += 1
        for conn in victims:
            self.progressed(conn)  # given up once: not picked again before its `leave`
            self._giving_up.add(conn)
        return victims

    def has_place(self) -> bool:
        """A connection arriving now would open at once."""
        return len(self.active) < self.limit

    def full(self) -> bool:
        """A connection arriving now would be refused (the edge drops it before building it)."""
        return len(self.active) >= self.limit and len(self.waiting) >= self.queue_max

    def leave(self, conn: T, now: float) -> Turns[T]:
        """`conn` is open (authenticated) or gone; harmless to repeat. The next in line get its
        place, those that waited too long are dropped."""
        if conn in self.active:
            self.active.discard(conn)
            self._giving_up.discard(conn)
            source = self._source.pop(conn)
            self._held[source] -= 1
            if not self._held[source]:
                del self._held[source]
            idle = self._idle.get(source)
            if idle is not None:
                idle.pop(conn, None)
                if not idle:
                    del self._idle[source]
        elif conn in self.waiting:
            del self.waiting[conn]
            self._unline(conn, self._source.pop(conn))
        return self._admit(now)

    def expire(self, now: float) -> Turns[T]:
        """Drop those that waited too long even if no place came free (all of them slow)."""
        return self._admit(now)

    def drain(self) -> list[T]:
        """Everything waiting, taken out (the edge is stopping: drop them)."""
        out = list(self.waiting)
        self.waiting.clear()
        self._lines.clear()
        for conn in out:
            del self._source[conn]
        return out

    def _open(self, conn: T, source: str, now: float) -> None:
        self.active.add(conn)
        self._source[conn] = source
        self._held[source] += 1
        self._idle.setdefault(source, OrderedDict())[conn] = now

    def _unline(self, conn: T, source: str) -> None:
        line = self._lines[source]
        if line[0] == conn:
            line.popleft()
        else:
            line.remove(conn)
        if not line:
            del self._lines[source]

    def _next_source(self) -> str:
        """Whose waiting connection takes a place: the first address in turn under its share,
        else the first in turn."""
        for source in self._lines:
            if not self.share or self._held[source] < self.share:
                return source
        return next(iter(self._lines))

    def _admit(self, now: float) -> Turns[T]:
        turns: Turns[T] = Turns()
        horizon = now - self.queue_s
        while self.waiting:
            conn, since = next(iter(self.waiting.items()))
            if since >= horizon:
                break
            self.waiting.popitem(last=False)
            self._unline(conn, self._source.pop(conn))
            turns.expired.append(conn)
        while self.waiting and len(self.active) < self.limit:
            source = self._next_source()
            line = self._lines[source]
            conn = line.popleft()
            del self._lines[source]
            if line:
                self._lines[source] = line  # to the back: the addresses take turns
            since = self.waiting.pop(conn)
            del self._source[conn]
            self._open(conn, source, now)
            turns.admitted.append((conn, now - since))
        return turns


@dataclass
class OpeningPace:
    """The opening gate's number of places, from how late the edge's event loop runs.

    Why: what an opening costs the loop comes in bursts. At a storm's start every place takes a
    connection in the same instant, so their upgrades, then their identifies, each run in one
    turn of the loop: 128 places x ~0.5 ms of the edge's core, stretched by a machine that the
    storm's own clients share, held every delivery to the sockets already open 100-160 ms at a
    time (a 10 ms timer of edge B woke 158 ms late; the deliveries' p99 in that second reached
    0.1-1.4 s, bench/profiles/README.md "The opening gate's pace"). A fixed 32 kept that tail
    down but made the storm 1.4x as long where the edge had time to spare. So, like TCP's
    congestion window:

    - the places start at `floor` and, while connections wait for one and the loop keeps time (at
      most `lag_limit_s` late), double every interval until the loop first runs late (slow
      start: from 16 to 128 in three intervals on an edge with time to spare, in bursts that
      grow instead of one burst of them all), then grow by a quarter;
    - an interval in which the loop ran later halves them;
    - an interval in which nobody waited leaves at most twice the most that were opening at once
      in it (RFC 7661's rule for a window its sender does not fill): a storm that starts on an
      edge whose openings trickled begins small, one in full swing keeps its places;
    - nothing opening at all (`rest`): back to the floor.

    The edge measures; this decides.
    """

    floor: int
    ceiling: int
    lag_limit_s: float
    limit: int = field(init=False)
    slow_start: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        if not 1 <= self.floor <= self.ceiling:
            raise ValueError(f"need 1 <= floor <= ceiling, got {self.floor} and {self.ceiling}")
        self.limit = self.floor

    def observe(self, lag_s: float, waited: bool, busiest: int) -> int:
        """One interval: the loop's worst lateness in it, whether a connection waited for a place,
        and the most connections opening at once; the new number of places."""
        if lag_s > self.lag_limit_s:
            self.limit = max(self.floor, self.limit // 2)
            self.slow_start = False
        elif waited:
            step = self.limit if self.slow_start else max(1, self.limit // 4)
            self.limit = min(self.ceiling, self.limit + step)
        else:
            self.limit = max(self.floor, min(self.limit, 2 * busiest))
        return self.limit

    def rest(self) -> int:
        """Nothing is opening: the next storm starts from the floor, in slow start."""
        self.limit = self.floor
        self.slow_start = True
        return self.limit
