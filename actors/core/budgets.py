"""Per-account budgets of a shard: what one account may cost everybody else.

Pure, like the shard state that holds them (no Ray, no asyncio, no I/O, the time is passed in).
They live in the shard that owns the account, which sees every socket of it on every edge, so a
budget holds across reconnects and across edges. A shard restart forgets them (a full budget
is the same as a fresh one), which an outsider cannot cause at will.

- `Publications`: status changes of one account reach its watchers at most `limit` times per
  `window_s` (a sliding window). A change past it is held back, not lost: the account is marked
  pending, and the first moment the window admits another publication (`due`), the account's
  *current* state goes out. Intermediate states may be skipped; the last one always arrives.
  What was published last is remembered, so a change undone while held is told to nobody.
- `Spending`: token buckets per account and kind (`lookups`: ids named in `presence.query` or
  newly watched through `presence.subscribe`; `voice`: voice joins). A spend that would
  overdraw the bucket is refused whole and costs nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from .scan import SWEEP_AT_LEAST, SWEEP_CYCLE_S, RollingScan
from .status import Status

# One account's status changes reach its watchers at most this often (the contract: 5 a second).
STATUS_PUBLICATIONS = 5
# The window is a little longer than the contract's second, so that frames published exactly one
# window apart still arrive more than a second apart after unequal delivery delays.
STATUS_WINDOW_S = 1.05
# The sweeps forget spent windows and refilled buckets in rolling slices (actors/core/scan.py):
# after 50,000 accounts connected and subscribed at once, a sweep that walked them all held the
# shard for 75-110 ms.


@dataclass(slots=True)
class _Account:
    shown: Status  # the status last published: what every watcher was last told
    times: deque[float] = field(default_factory=deque)
    pending: bool = False


@dataclass(slots=True)
class PublicationState:
    """One account's window in transit between shards (see `export` / `restore`)."""

    shown: Status
    times: tuple[float, ...]
    pending: bool


class Publications:
    """At most `limit` publications of one account's status per `window_s`, sliding.

    It also remembers what was last published (`shown`), so that a publication tells each
    watcher only what changed since, and a change undone while held is not told at all."""

    def __init__(self, limit: int = STATUS_PUBLICATIONS, window_s: float = STATUS_WINDOW_S) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("a publication budget needs limit >= 1 and a positive window")
        self.limit = limit
        self.window_s = window_s
        self._accounts: dict[str, _Account] = {}
        self._pending: set[str] = set()
        self._scan: RollingScan[str] = RollingScan(SWEEP_CYCLE_S, SWEEP_AT_LEAST)

    def _trim(self, a: _Account, now: float) -> None:
        while a.times and now - a.times[0] >= self.window_s:
            a.times.popleft()

    def _room(self, a: _Account, now: float) -> bool:
        self._trim(a, now)
        return len(a.times) < self.limit

    def change(self, user_id: str, before: Status, after: Status, now: float) -> Status | None:
        """The account's status changed from `before` to `after` at `now`. None: held (the
        account is pending until `due` admits it). Else publish `after` now: the answer is the
        status published last (what its watchers believe), and `after` becomes it."""
        a = self._accounts.get(user_id)
        if a is None:  # nothing held, so everybody was told `before`
            a = self._accounts[user_id] = _Account(shown=before)
        if not self._room(a, now):
            a.pending = True
            self._pending.add(user_id)
            return None
        return self._published(user_id, a, after, now)

    def _published(self, user_id: str, a: _Account, status: Status, now: float) -> Status:
        shown, a.shown = a.shown, status
        a.times.append(now)
        a.pending = False
        self._pending.discard(user_id)
        return shown

    def due(self, now: float, current: Callable[[str], Status]) -> list[tuple[str, Status, Status]]:
        """Pending accounts the window admits at `now`: `(account, published last, current)` for
        each, the current status (`current(account)`) counting as published from now on."""
        out: list[tuple[str, Status, Status]] = []
        for user_id in sorted(self._pending):
            a = self._accounts[user_id]
            if self._room(a, now):
                status = current(user_id)
                out.append((user_id, self._published(user_id, a, status, now), status))
        return out

    def next_due(self) -> float | None:
        """The earliest moment a pending account may publish; None when none is pending."""
        times = [self._accounts[u].times for u in self._pending]
        return min((t[0] + self.window_s if len(t) >= self.limit else 0.0) for t in times) if times else None

    @property
    def pending(self) -> frozenset[str]:
        return frozenset(self._pending)

    @property
    def any_pending(self) -> bool:
        """Whether any change is held back (asked after every batch: no copy)."""
        return bool(self._pending)

    def is_pending(self, user_id: str) -> bool:
        return user_id in self._pending

    def sweep(self, now: float) -> None:
        """Drop the windows that hold nothing any more (a fresh window is the same), a rolling
        slice of them a call."""
        for user_id, a in self._scan.due_items(self._accounts, now):
            self._trim(a, now)
            if not a.times and not a.pending:
                del self._accounts[user_id]

    def export(self, user_ids: Iterable[str]) -> dict[str, PublicationState]:
        out: dict[str, PublicationState] = {}
        for user_id in user_ids:
            a = self._accounts.pop(user_id, None)
            if a is not None:
                self._pending.discard(user_id)
                out[user_id] = PublicationState(a.shown, tuple(a.times), a.pending)
        return out

    def restore(self, states: dict[str, PublicationState]) -> None:
        for user_id, st in states.items():
            self._accounts[user_id] = _Account(st.shown, deque(st.times), st.pending)
            if st.pending:
                self._pending.add(user_id)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._accounts))


@dataclass(slots=True)
class Bucket:
    """A token bucket: `burst` tokens at most, refilled at `rate_per_s`."""

    rate_per_s: float
    burst: float
    tokens: float
    at: float

    def level(self, now: float) -> float:
        return min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate_per_s)

    def take(self, now: float, n: float = 1.0) -> bool:
        self.tokens = self.level(now)
        self.at = max(self.at, now)
        if self.tokens >= n:
            self.tokens -= n
            return True
        return False


@dataclass(frozen=True, slots=True)
class Allowance:
    """One kind of spending: a bucket of `burst`, refilled at `per_min` a minute."""

    per_min: float
    burst: float

    def __post_init__(self) -> None:
        if self.per_min < 0 or self.burst < 0:
            raise ValueError("an allowance cannot be negative")


# Ids looked up for an account (queried, or newly watched): 1,200 a minute, 2,000 at once (two
# full subscriptions of the per-socket cap). Voice joins: 30 a minute, 10 at once.
DEFAULT_ALLOWANCES: dict[str, Allowance] = {
    "lookups": Allowance(per_min=1_200.0, burst=2_000.0),
    "voice": Allowance(per_min=30.0, burst=10.0),
}


class Spending:
    """Per account and kind, a token bucket; spends past it are refused whole."""

    def __init__(self, allowances: dict[str, Allowance] | None = None) -> None:
        self.allowances = dict(DEFAULT_ALLOWANCES if allowances is None else allowances)
        self.buckets: dict[tuple[str, str], Bucket] = {}
        self._scan: RollingScan[tuple[str, str]] = RollingScan(SWEEP_CYCLE_S, SWEEP_AT_LEAST)

    def spend(self, user_id: str, kind: str, n: int, now: float) -> bool:
        """Take `n` from the account's `kind` budget; False (nothing taken) if it has not got them.
        An unknown kind is a bug in the caller (KeyError); `n` <= 0 always passes."""
        allowance = self.allowances[kind]
        if n <= 0:
            return True
        bucket = self.buckets.get((user_id, kind))
        if bucket is None:
            bucket = Bucket(allowance.per_min / 60.0, allowance.burst, allowance.burst, now)
            self.buckets[(user_id, kind)] = bucket
        return bucket.take(now, n)

    def refill(self, user_id: str, kind: str) -> None:
        """The account's `kind` budget full again (a bucket that is not kept is a full one)."""
        self.buckets.pop((user_id, kind), None)

    def level(self, user_id: str, kind: str, now: float) -> float:
        bucket = self.buckets.get((user_id, kind))
        return self.allowances[kind].burst if bucket is None else bucket.level(now)

    def sweep(self, now: float) -> None:
        """Forget the buckets that have refilled (a full bucket is the same as none), a rolling
        slice of them a call."""
        for key, bucket in self._scan.due_items(self.buckets, now):
            if bucket.level(now) >= bucket.burst:
                del self.buckets[key]

    def export(self, user_ids: Iterable[str]) -> dict[tuple[str, str], Bucket]:
        wanted = set(user_ids)
        out = {k: b for k, b in self.buckets.items() if k[0] in wanted}
        for k in out:
            del self.buckets[k]
        return out

    def restore(self, buckets: dict[tuple[str, str], Bucket]) -> None:
        for key, bucket in buckets.items():
            mine = self.buckets.get(key)
            # Two copies (never expected): the emptier one wins, so moving never refills.
            if mine is None or bucket.tokens < mine.tokens:
                self.buckets[key] = bucket
