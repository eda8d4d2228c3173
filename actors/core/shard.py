"""The state of one presence shard: sockets, statuses, last-seen and watchers of the accounts it owns.

A plain object. No Ray, no asyncio, no I/O: the shell feeds it operations with the current time
(`now`, epoch seconds) and carries out the effects it leaves in `outbox`. Like Phoenix's
`tracker/state.ex`, it is a data structure that returns joins and leaves; the Ray actor around it
is only plumbing.

Liveness. Every socket belongs to an edge. An edge holds a lease on the shard which it refreshes
with every call (and at least every few seconds while idle); the edge itself closes sockets whose
client has been silent for 90 s. If the edge dies, its lease runs out after `socket_timeout_s`
and all its sockets go with it. So "a socket silent for 90 s is dead" holds whether the client or
the whole edge went silent.

Data the shell must load before calling: the account row (`load_account`) of every account that
connects or is queried, and the relations (`set_relations`) of every account that is a target, a
watcher or a reader. What was not loaded raises `NotLoaded` (`actors.core.loaded`): the store was
away, and the shell answers UNAVAILABLE. A `KeyError` is never that: it is a bug.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from . import frames
from .activity import RollingRefresh
from .audience import NO_RELATIONS, Relations, decided_by_target, in_audience
from .budgets import (
    STATUS_PUBLICATIONS,
    STATUS_WINDOW_S,
    Allowance,
    Bucket,
    Publications,
    PublicationState,
    Spending,
)
from .channels import Channel, ChannelState
from .contract import AccountRow
from .effects import (
    Activity,
    EdgeForgotten,
    HeldPlaces,
    OnlineCount,
    Outbox,
    PersistChosen,
    PersistVisibility,
    SocketCount,
)
from .loaded import Loaded, NotLoaded
from .scan import SWEEP_AT_LEAST, RollingScan
from .slots import channel_key, slot_of
from .status import (
    CHOSEN_STATUSES,
    VISIBILITIES,
    ChosenStatus,
    Status,
    as_chosen,
    is_visibly_present,
    real_status,
    visible_status,
)
from .visibility import last_seen_for_reader


@dataclass(slots=True)
class Socket:
    socket_id: str
    edge_id: str
    idle: bool = False
    focus: str | None = None
    connected_at: float = 0.0  # when it was registered here (shard clock)


@dataclass(frozen=True, slots=True)
class Held:
    """A socket the server closed for its own reasons (an edge draining: 1012; a shard out of
    reach: 1011), still counted in its account's status until `until`. A socket of the account
    that identifies by then takes its place (with its idle flag), and nobody is told anything;
    else the account departs as of `closed_at` (protocol.md, "Drain and resume")."""

    closed_at: float
    until: float
    idle: bool


@dataclass(slots=True)
class Account:
    user_id: str
    chosen: ChosenStatus = "online"
    # The shard's own last-seen: the later of the stored column (at load) and what happened since.
    # While the account is visibly present it is not maintained; the true value is "now".
    last_seen_at: float | None = None
    sockets: dict[str, Socket] = field(default_factory=dict)
    real: Status = "offline"
    touched_at: float = 0.0
    # When the chosen status and the last-seen visibility were last chosen here (shard clock);
    # 0.0 when they come from the database, whose value carries no time.
    chosen_at: float = 0.0
    visibility_at: float = 0.0
    # Sockets the server closed, kept in the status for a resume (see Held); oldest first.
    held: list[Held] = field(default_factory=list)

    def idle_flags(self) -> list[bool]:
        """One flag per socket the status counts: the live ones and the held ones."""
        flags = [s.idle for s in self.sockets.values()]
        if self.held:
            flags.extend(h.idle for h in self.held)
        return flags

    def last_held_close(self) -> float | None:
        return max((h.closed_at for h in self.held), default=None)


# What a watcher socket sees of the account it watches, decided when the watch is made and again
# when the relations of either account change (never per delivery): its real status (the
# account's own sockets), the visible one (its audience), or nothing (outside the audience).
OWN = "own"
AUDIENCE = "audience"
OUTSIDE = "outside"


@dataclass(frozen=True, slots=True)
class Watcher:
    edge_id: str
    user_id: str
    sees: str = AUDIENCE


def status_shown(real: Status, user_id: str, reader: str) -> Status:
    """The account's own sockets see its real status; everybody else the visible one."""
    return real if reader == user_id else visible_status(real)


class QueryAnswer(NamedTuple):
    """One target of a query the reader may see (a NamedTuple: a query makes up to a hundred,
    and a tuple is made in about half a frozen dataclass's time)."""

    user_id: str
    status: Status
    last_seen_at: float | None


@dataclass(frozen=True, slots=True)
class Claim:
    """An edge's latest knowledge of an account's choices, with the times they were made
    (0.0: unknown, never wins over anything)."""

    chosen: str | None = None
    chosen_at: float = 0.0
    visibility: str | None = None
    visibility_at: float = 0.0

    def newest(self, other: Claim) -> Claim:
        """Each choice from whichever of the two claims made it later."""
        chosen = self if self.chosen_at >= other.chosen_at else other
        visibility = self if self.visibility_at >= other.visibility_at else other
        return Claim(chosen.chosen, chosen.chosen_at, visibility.visibility, visibility.visibility_at)


class ShardState:
    def __init__(
        self,
        *,
        socket_timeout_s: float = 90.0,
        last_seen_precision_s: int = 60,
        typing_lapse_s: float = 10.0,
        account_idle_evict_s: float = 600.0,
        checkpoint_interval_s: float = 600.0,
        status_publications: int = STATUS_PUBLICATIONS,
        status_window_s: float = STATUS_WINDOW_S,
        allowances: dict[str, Allowance] | None = None,
        evict_scan_cycle_s: float = 30.0,
        scan_at_least: int = SWEEP_AT_LEAST,
        relations_round_slices: int = 50,
    ) -> None:
        self.socket_timeout_s = socket_timeout_s
        # (until, account) for every account with held sockets: when to look at it again. Lazy:
        # an entry whose account resumed, left or moved away is skipped when it comes up.
        self._holds: list[tuple[float, str]] = []
        self.precision_s = last_seen_precision_s
        self.account_idle_evict_s = account_idle_evict_s
        # The sweep looks for idle accounts in a rolling slice, each account about once per
        # cycle (actors/core/scan.py): an eviction comes up to a cycle late, a sweep no longer
        # walks every account every second.
        self._evict_scan: RollingScan[str] = RollingScan(evict_scan_cycle_s, scan_at_least)
        self.outbox = Outbox()
        self.accounts: Loaded[str, Account] = Loaded("account")
        self.relations: Loaded[str, Relations] = Loaded("relations")
        # target → watcher socket id → watcher; only `_set_watcher` / `_drop_watcher` change it.
        self.watchers: dict[str, dict[str, Watcher]] = {}
        # target → edge → [sockets there that see its real status, sockets that see the visible
        # one]: a change is published once per edge and kind of watcher, and each edge expands it
        # to its own sockets (edge/watch_index.py), so a change costs this shard work per edge
        # watching, not per watcher. Kept with `watchers` by `_set_watcher` / `_drop_watcher`.
        self._fan: dict[str, dict[str, list[int]]] = {}
        # watcher account → target → how many entries of `watchers[target]` are its sockets: the
        # relations sweep asks "does anybody watch from this account?" and a relations change asks
        # "which targets does this account watch?" without walking every watcher (at 10,000
        # accounts x 50 watchers the sweep's walk held the shard for ~90 ms a minute; in a server
        # of a million members a walk per member joining or leaving cost the shard O(watchers)
        # per change, issue 28 item 3).
        self._watching: dict[str, Counter[str]] = {}
        # edge id → time of its last lease refresh
        self.edges: dict[str, float] = {}
        # edge id → {(user, socket)} owned here, and {(target, socket)} watched here: for expiry.
        self.edge_sockets: dict[str, set[tuple[str, str]]] = {}
        self.edge_watches: dict[str, set[tuple[str, str]]] = {}
        # Last-seen values waiting for the FlushActor's acknowledgement, latest per account.
        self.pending_last_seen: dict[str, float] = {}
        # Per-account budgets (actors/core/budgets.py): how often an account's status changes
        # reach its watchers, and what it may spend on lookups and voice joins.
        self.publications = Publications(status_publications, status_window_s)
        # While an account's change is held: what a sync told each new watcher socket, and what
        # `ready` told each new socket of the account (the next publication tells them too).
        self._held_told: dict[str, dict[str, Status]] = {}
        self._held_ready: dict[str, dict[str, Status]] = {}
        self.spending = Spending(allowances)
        self.channels = ChannelState(
            self.outbox, self.relations, typing_lapse_s=typing_lapse_s, spending=self.spending
        )
        # The rolling checkpoint of accounts that stay online (see checkpoint_chunk): the same
        # round in slices as the active counts' refresh below.
        self._checkpoints = RollingRefresh(checkpoint_interval_s)
        # The active counts' rolling refresh of accounts with a live socket (actors/core/activity.py).
        self.activity = RollingRefresh(checkpoint_interval_s)
        # Relations are loaded for readers and watchers too; unreferenced ones are dropped by a
        # round this often. A round looks at the relations cached when it began, in slices over
        # the next `relations_round_slices` sweeps, within the minute (all at once up to
        # `scan_at_least`): a shard holding ~500,000 members' relations (bench bigserver) held its
        # loop 0.3 s for a whole round, 34-56 ms at most in 50 slices.
        self.relations_sweep_s = 60.0
        self._relations_swept_at = 0.0
        self.relations_round_slices = relations_round_slices
        self.scan_at_least = scan_at_least
        self._relations_round: list[str] = []
        self._relations_round_next = 0
        # Readers whose relations a query read since the last round began (`_relations_read`) or
        # in the period before it (`_relations_read_before`): kept through the round after their
        # read. A reader on another shard is referenced by nothing here, so its relations went at
        # every round and its next query waited on PostgreSQL (under bench query, 4 % of a shard's
        # samples were these reloads): a load per active reader per shard per minute.
        self._relations_read: set[str] = set()
        self._relations_read_before: set[str] = set()

    # ------------------------------------------------------------------ loading (shell → state)

    def has_account(self, user_id: str) -> bool:
        return user_id in self.accounts

    def load_account(self, user_id: str, row: AccountRow, now: float) -> None:
        """Install an account read from the database; a no-op if it is already in memory."""
        if user_id in self.accounts:
            return
        last_seen = row.last_seen_at
        pending = self.pending_last_seen.get(user_id)  # a departure recorded unread, not written yet
        if pending is not None and row.chosen_status == "invisible":
            # What the store's write will make of it: frozen at the hide, or not written at all
            # when the hide moment is unknown.
            pending = min(pending, row.chosen_at) if row.chosen_at is not None else None
        if pending is not None:
            last_seen = pending if last_seen is None else max(last_seen, pending)
        self.accounts[user_id] = Account(
            user_id,
            chosen=as_chosen(row.chosen_status),
            last_seen_at=last_seen,
            touched_at=now,
            chosen_at=row.chosen_at or 0.0,
            visibility_at=row.visibility_at or 0.0,
        )

    def missing_relations(self, user_ids: Iterable[str]) -> list[str]:
        return [u for u in dict.fromkeys(user_ids) if u not in self.relations]

    def set_relations(self, user_id: str, rel: Relations, now: float) -> None:
        """Install or replace what the database says about an account's friends, servers, setting.

        A replacement can widen or narrow audiences: watchers who just came into the audience of
        an account are told its status (they could not be told before); watchers who just left
        it are told nothing, since any frame would tell an outsider something.
        """
        old = self.relations.get(user_id)
        if old is not None and old != rel:
            # Sockets that died before this change die under the relations they had then.
            self._expire(now)
        self.relations[user_id] = rel
        if old is None or old == rel:
            return
        # Accounts owned here whose audience may have changed: the account itself, and every
        # account it watches (their audience test involves its servers and their friend sets).
        affected = [user_id] if user_id in self.watchers or user_id in self.accounts else []
        affected += [t for t in self._watching.get(user_id, ()) if t != user_id]
        for target in affected:
            self._reclassify(target, changed_user=user_id)
        acc = self.accounts.get(user_id)
        if acc is not None and is_visibly_present(acc.real) and old.servers != rel.servers:
            if old.servers - rel.servers:
                self.outbox.add(OnlineCount(user_id, old.servers - rel.servers, False))
            if rel.servers - old.servers:
                self.outbox.add(OnlineCount(user_id, rel.servers - old.servers, True))
        if acc is not None and old.last_seen_visibility != rel.last_seen_visibility:
            # Changed outside the websocket (the host application's UPDATE, `presence load`):
            # the account's sockets keep their own setting for the reader's side of the
            # reciprocal `nobody` rule (their queries carry it), so they are told, as after a
            # `settings.update`. Untold, a socket open before the change kept reading everybody's
            # last-seen while its own was hidden.
            acc.visibility_at = max(acc.visibility_at, now)
            self._tell_self(acc, frames.settings_note(rel.last_seen_visibility, now))
        if old.servers - rel.servers:
            self.channels.member_left(user_id)

    def _reclassify(self, target: str, changed_user: str | None) -> None:
        """Decide again what the target's watchers see, after the relations of `changed_user` (of
        everybody: None) changed. Each socket whose kind changed is told by an internal
        `_audience` note (its edge's index follows it); those who came into the audience are then
        told the account's visible status, offline too (they could not be told before, and a
        watcher told "online" before it left would otherwise keep that stale view); those who
        left it are told nothing a client sees, since any frame would tell an outsider something."""
        ws = self.watchers.get(target)
        if not ws:
            return
        target_rel = self.relations.get(target, NO_RELATIONS)
        entered: dict[str, list[str]] = {}
        left: dict[str, list[str]] = {}
        for socket_id, w in list(ws.items()):
            if w.sees == OWN or (changed_user is not None and changed_user not in (target, w.user_id)):
                continue
            now_in = in_audience(target, target_rel, w.user_id, self.relations.get(w.user_id, NO_RELATIONS))
            sees = AUDIENCE if now_in else OUTSIDE
            if sees != w.sees:
                self._set_watcher(target, socket_id, Watcher(w.edge_id, w.user_id, sees))
                (entered if now_in else left).setdefault(w.edge_id, []).append(socket_id)
        self.outbox.deliver(left, frames.audience_note((), (target,)))
        self.outbox.deliver(entered, frames.audience_note((target,), ()))
        self.outbox.deliver(entered, frames.changed(target, self.visible_status_of(target)))

    # ------------------------------------------------------------------ edges and liveness

    def refresh_edge(self, edge_id: str, now: float) -> None:
        self._expire(now)
        self.edges[edge_id] = now

    def _set_watcher(self, target: str, socket_id: str, w: Watcher) -> None:
        ws = self.watchers.setdefault(target, {})
        old = ws.get(socket_id)
        ws[socket_id] = w
        if old is not None:
            self._unref_watching(old.user_id, target)
            self._count_fan(target, old, -1)
        self._watching.setdefault(w.user_id, Counter())[target] += 1
        self._count_fan(target, w, 1)

    def _drop_watcher(self, target: str, socket_id: str) -> None:
        ws = self.watchers[target]
        w = ws.pop(socket_id)
        self._unref_watching(w.user_id, target)
        self._count_fan(target, w, -1)
        if not ws:
            del self.watchers[target]

    def _count_fan(self, target: str, w: Watcher, n: int) -> None:
        if w.sees == OUTSIDE:
            return
        edges = self._fan.setdefault(target, {})
        counts = edges.setdefault(w.edge_id, [0, 0])
        counts[w.sees == AUDIENCE] += n
        if not any(counts):
            del edges[w.edge_id]
            if not edges:
                del self._fan[target]

    def _unref_watching(self, user_id: str, target: str) -> None:
        targets = self._watching[user_id]
        targets[target] -= 1
        if not targets[target]:
            del targets[target]
            if not targets:
                del self._watching[user_id]

    def _relations_round_slice(self, now: float) -> list[str]:
        """The cached relations this sweep's part of the relations' round looks at (a round
        begins every `relations_sweep_s`; see __init__)."""
        if now - self._relations_swept_at >= self.relations_sweep_s:
            self._relations_swept_at = now
            self._relations_round, self._relations_round_next = list(self.relations), 0
            self._relations_read_before, self._relations_read = self._relations_read, set()
        left = len(self._relations_round) - self._relations_round_next
        if left <= 0:
            return []
        size = max(self.scan_at_least, math.ceil(len(self._relations_round) / self.relations_round_slices))
        start = self._relations_round_next
        self._relations_round_next = start + size
        return self._relations_round[start : start + size]

    def _unreferenced_relations(self, candidates: list[str], kept: set[str]) -> list[str]:
        """Those of `candidates` cached and referred to by nothing here: no account, no watch of
        it or from it, no channel membership, not kept by the shell, not read by a query lately.
        Tested key by key rather than by building the union of everything referenced; the
        channels' members are gathered only when some candidate is left to test against them
        (a round's 50 slices would otherwise walk every subscriber 50 times a minute)."""
        relations, accounts, watchers, watching = self.relations, self.accounts, self.watchers, self._watching
        read, read_before = self._relations_read, self._relations_read_before
        left = [
            u
            for u in candidates
            if u in relations
            and u not in accounts
            and u not in watchers
            and u not in watching
            and u not in kept
            and u not in read
            and u not in read_before
        ]
        if not left:
            return []
        in_channels: set[str] = set()
        for ch in self.channels.channels.values():
            in_channels.update(m.user_id for m in (*ch.subscribers.values(), *ch.voice.values()))
        return [u for u in left if u not in in_channels]

    def _expire(self, now: float) -> None:
        """Drop every socket and watch of edges whose lease has run out.

        Each edge goes at the moment its lease ran out (not when this call noticed), in that
        order, so that a departure is stamped with the time the account's last socket died.
        """
        edges = self.edges
        # Called for every operation: sort only when the stalest edge's lease has run out.
        if edges and now - min(edges.values()) > self.socket_timeout_s:
            for edge_id, refreshed in sorted(edges.items(), key=lambda kv: kv[1]):
                if now - refreshed > self.socket_timeout_s:
                    self.drop_edge(edge_id, refreshed + self.socket_timeout_s)
        while self._holds and self._holds[0][0] <= now:
            _, user_id = heapq.heappop(self._holds)
            self._end_holds(user_id, now)

    def _end_holds(self, user_id: str, now: float) -> None:
        """The held sockets of the account whose window ran out by `now` go: nobody resumed them.
        If the account has nothing left it departs, as of the moment its last one was closed."""
        acc = self.accounts.get(user_id)
        if acc is None:
            return  # moved away with its slot (the new owner looks after it), or never was here
        expired = [h for h in acc.held if h.until <= now]
        if not expired:
            return
        acc.held = [h for h in acc.held if h.until > now]
        self._watch_holds(acc)
        self._held_changed(acc)
        at = max(h.closed_at for h in expired)
        if not acc.sockets and not acc.held:
            self.outbox.add(Activity(user_id, False, at))
        self._settle(acc, now, seen_at=at)

    def _watch_holds(self, acc: Account) -> None:
        if acc.held:
            heapq.heappush(self._holds, (min(h.until for h in acc.held), acc.user_id))

    def _held_changed(self, acc: Account) -> None:
        self.outbox.add(HeldPlaces(acc.user_id, tuple((h.closed_at, h.until, h.idle) for h in acc.held)))

    def restore_holds(self, user_id: str, held: Iterable[tuple[float, float, bool]], now: float) -> None:
        """Held places an earlier incarnation of this shard kept when it died (each (closed_at,
        until, idle), as `HeldPlaces` saved them): back in the account's status, so that a resume
        still tells nobody anything and an account not back departs as of its close. Places whose
        window ran out meanwhile are a departure at their close (its last-seen; the watchers of
        this new incarnation already see the account offline). The account must be loaded."""
        acc = self.accounts[user_id]
        places = [Held(closed_at, until, idle) for closed_at, until, idle in held]
        live = [h for h in places if h.until > now and h not in acc.held]
        ended = [h.closed_at for h in places if h.until <= now]
        if live:
            acc.held = sorted([*acc.held, *live], key=lambda h: h.closed_at)
            acc.touched_at = now
            self._watch_holds(acc)
            self._settle(acc, now)
        elif ended and not acc.sockets and not acc.held:
            self.departed(user_id, max(ended), now)

    def edge_died(self, edge_id: str, now: float) -> bool:
        """The edge's node is dead (Ray said so): everything it registered goes now, each socket
        departing at the moment this shard last heard from the edge (its lease's last renewal:
        the edge renews at least every few seconds), not at the lease's end. False if the edge
        held nothing here (unknown, or its lease already ran out)."""
        heard = self.edges.get(edge_id)
        if heard is None:
            return False
        self.drop_edge(edge_id, min(heard, now))
        return True

    def drop_edge(self, edge_id: str, now: float) -> None:
        """Everything an edge registered goes, as if each of its sockets had closed."""
        self.edges.pop(edge_id, None)
        self.outbox.add(EdgeForgotten(edge_id))
        for target, socket_id in self.edge_watches.pop(edge_id, set()):
            self._unwatch_one(target, socket_id, edge_id)
        for user_id, socket_id in sorted(self.edge_sockets.pop(edge_id, set())):
            self._remove_socket(user_id, socket_id, now)
        self.channels.drop_edge(edge_id)

    def sweep(self, now: float, keep: Iterable[str] = (), keep_channels: Iterable[str] = ()) -> None:
        """Periodic housekeeping: expired edges, lapsed typing, idle offline accounts, and
        cached relations nothing refers to any more.

        `keep`: accounts whose row and relations stay whatever this state refers to: those whose
        chosen status or setting the shell has not saved yet (evicted, they would be read back
        from the database with the older value), and those a batch waiting on a load will apply
        with, found in memory or just loaded (dropped meanwhile, the batch would apply without
        them: a member's relations read as no servers, its subscribe refused). `keep_channels`:
        the channels such a batch will apply with."""
        kept = set(keep)
        self._expire(now)
        self.channels.sweep(now, keep=keep_channels)
        self.publish_due(now)
        self.publications.sweep(now)
        self.spending.sweep(now)
        for user_id in self._unreferenced_relations(self._relations_round_slice(now), kept):
            del self.relations[user_id]
        for user_id, acc in self._evict_scan.due_items(self.accounts, now):
            if (
                not acc.sockets
                and not acc.held
                and user_id not in self.pending_last_seen
                and user_id not in kept
                and now - acc.touched_at > self.account_idle_evict_s
            ):
                # Evicting means the next read goes back to the stored column, which is how a
                # value written by another writer (a previous owner, the host app) becomes visible.
                del self.accounts[user_id]

    # ------------------------------------------------------------------ sockets and statuses

    def connect(self, user_id: str, socket_id: str, edge_id: str, now: float, idle: bool = False) -> Status:
        """A socket of `user_id` authenticated on `edge_id` (or is registered again after a
        restart, then with its idle flag). Returns the account's real status."""
        self._expire(now)
        self.edges[edge_id] = now
        acc = self.accounts[user_id]
        acc.touched_at = now
        if socket_id not in acc.sockets:
            if acc.held:
                # A resume: the socket takes the place of one the server closed, idle flag and
                # all, so the account's status is what it was and nobody hears of either. An
                # awake one first: the status is then the same whichever of them come back.
                taken = next((h for h in acc.held if not h.idle), acc.held[0])
                acc.held.remove(taken)
                idle = idle or taken.idle
                # It watches its ids again first: a drain the server started must not cost the
                # client its lookups (two tabs of 1,000 subscriptions each, moved by a deploy,
                # were refused theirs until the budget refilled). Only a server's close holds a
                # place, so no client can refill its budget this way.
                self.spending.refill(user_id, "lookups")
                self._watch_holds(acc)
                self._held_changed(acc)
            acc.sockets[socket_id] = Socket(socket_id, edge_id, idle=idle, connected_at=now)
            self.edge_sockets.setdefault(edge_id, set()).add((user_id, socket_id))
            self.outbox.add(SocketCount(user_id, socket_id, True))
            if len(acc.sockets) == 1:
                self.outbox.add(Activity(user_id, True, now))
        self._settle(acc, now, skip_self=socket_id)
        if self.publications.is_pending(user_id):
            self._held_ready.setdefault(user_id, {})[socket_id] = acc.real
        return acc.real

    def disconnect(
        self, user_id: str, socket_id: str, now: float, at: float | None = None, resume_s: float = 0.0
    ) -> None:
        """The socket closed at `at` (default `now`): the edge may report it late, e.g. after
        waiting for this shard to restart, and the departure keeps the time it happened.

        `resume_s`: the server closed it for its own reasons (a drain, a shard out of reach), so
        it is held in the account's status for that long from `at` (see Held; the edge says how
        long, its `resume_s` setting). A client that closed its socket, or one that went silent,
        departs at once (0)."""
        self._expire(now)
        acc = self.accounts.get(user_id)
        sock = acc.sockets.get(socket_id) if acc is not None else None
        if sock is None:
            if at is not None:
                # A socket this incarnation never knew (it closed while the shard restarted,
                # before its edge could register it again): still a departure of the account.
                self.departed(user_id, at, now)
            return
        # Never after now. Not clamped from below: a client may leave while its connect is still
        # on the way, so a departure before the shard registered the socket is real.
        when = now if at is None else min(at, now)
        # A socket of the account registered since this one closed is its resume already (its
        # client came back before the departure got here): a place held beside it would keep
        # the account awake, whatever that socket says, for the whole window.
        assert acc is not None  # it has the socket
        back = any(s.connected_at >= when for s in acc.sockets.values() if s.socket_id != socket_id)
        if when + resume_s > now and not back:
            self._hold_socket(user_id, socket_id, when, when + resume_s, now)
        else:
            self._remove_socket(user_id, socket_id, when)

    def _hold_socket(self, user_id: str, socket_id: str, closed_at: float, until: float, now: float) -> None:
        """The socket is gone but its place in the status is kept until `until`:
        the status is computed over the same idle flags as before, so nothing is told to anybody
        and no count moves (but the socket count: the socket itself is gone)."""
        acc = self.accounts[user_id]
        sock = acc.sockets.pop(socket_id)
        self.edge_sockets.get(sock.edge_id, set()).discard((user_id, socket_id))
        self.outbox.add(SocketCount(user_id, socket_id, False))
        acc.held.append(Held(closed_at, until, sock.idle))
        acc.touched_at = now
        self._watch_holds(acc)
        self._held_changed(acc)
        if is_visibly_present(acc.real) and not acc.sockets:
            # Written at once, like a checkpoint of a present account: should this shard die
            # during the window, the stored last-seen is already the moment the socket closed,
            # and should the account resume, later writes move it on (never back).
            self.pending_last_seen[user_id] = max(closed_at, self.pending_last_seen.get(user_id, 0.0))

    def departed(self, user_id: str, at: float, now: float, claim: Claim | None = None) -> None:
        """An edge reports again a departure that an earlier incarnation of this shard may have
        lost (it died before the value was written): a socket of the account went away at `at`,
        and `claim` is what that socket knew of the account's choices (perhaps never saved).

        Applied only to an account that is not visibly present now and whose chosen status is
        visible (an invisible account's last-seen is frozen); last-seen never moves back, nor
        past `now`. The flush writes it with GREATEST, so a value that did survive is untouched.
        An account not in memory has no socket here, so it is not present: the departure is
        recorded without reading its row (see `_departed_unread`).
        """
        self._expire(now)
        acc = self.accounts.get(user_id)
        if acc is None:
            self._departed_unread(user_id, min(at, now), claim)
            return
        if claim is not None:
            self.claim(user_id, claim, now)
        if acc.sockets or is_visibly_present(acc.real) or acc.chosen == "invisible":
            return
        at = min(at, now)
        if acc.last_seen_at is not None and acc.last_seen_at >= at:
            return
        acc.last_seen_at = at
        self.pending_last_seen[user_id] = max(at, self.pending_last_seen.get(user_id, 0.0))

    def _departed_unread(self, user_id: str, at: float, claim: Claim | None) -> None:
        """A departure of an account whose row is not loaded (PostgreSQL may be away): written
        blind. The store keeps the newest choice and never lets an invisible account's last-seen
        pass the moment it hid (SQL: actors.flush.UPDATE_SQL), so the row need not be read first;
        what the socket knew of the choices goes along, newest-wins too."""
        if claim is not None:
            if claim.chosen in CHOSEN_STATUSES and claim.chosen_at > 0:
                self.outbox.add(PersistChosen(user_id, claim.chosen, claim.chosen_at))
                if claim.chosen == "invisible":
                    at = min(at, claim.chosen_at)  # hidden since then: frozen at that moment
            if claim.visibility in VISIBILITIES and claim.visibility_at > 0:
                self.outbox.add(PersistVisibility(user_id, claim.visibility, claim.visibility_at))
        self.pending_last_seen[user_id] = max(at, self.pending_last_seen.get(user_id, 0.0))

    def _remove_socket(self, user_id: str, socket_id: str, now: float) -> None:
        acc = self.accounts.get(user_id)
        if acc is None or socket_id not in acc.sockets:
            return
        sock = acc.sockets.pop(socket_id)
        self.edge_sockets.get(sock.edge_id, set()).discard((user_id, socket_id))
        self.outbox.add(SocketCount(user_id, socket_id, False))
        if not acc.sockets and not acc.held:
            self.outbox.add(Activity(user_id, False, now))
        acc.touched_at = now
        if is_visibly_present(acc.real):
            # The account was present at least until this socket went. Removals can arrive out
            # of order (a socket whose handler waited on a restarting shard is removed after
            # later sockets of the account came and went): the departure, whichever removal ends
            # it, is the latest of these moments, never an earlier one.
            acc.last_seen_at = max(now, acc.last_seen_at or now)
        self._settle(acc, now)

    def set_status(self, user_id: str, socket_id: str, status: str, now: float) -> Status:
        """`presence.update` from one socket. `idle` is per socket; the others are per account."""
        self._expire(now)
        acc = self.accounts[user_id]
        sock = acc.sockets.get(socket_id)
        if status == "idle":
            if sock is not None:
                sock.idle = True
        elif status in CHOSEN_STATUSES:
            if status == "online" and sock is not None:
                sock.idle = False  # `online` also wakes this socket
            if acc.chosen != status:
                acc.chosen = as_chosen(status)
                acc.chosen_at = now
                self.outbox.add(PersistChosen(user_id, status, now))
                self._tell_self(acc, frames.chosen_note(status, now))
        else:
            raise ValueError(f"not a status a client may choose: {status!r}")
        acc.touched_at = now
        self._settle(acc, now)
        return acc.real

    def set_visibility(self, user_id: str, visibility: str, now: float) -> None:
        if visibility not in VISIBILITIES:
            raise ValueError(f"not a last-seen visibility: {visibility!r}")
        rel = self.relations.get(user_id, NO_RELATIONS)
        if rel.last_seen_visibility != visibility:
            self.relations[user_id] = Relations(rel.friends, rel.servers, visibility)
            self.outbox.add(PersistVisibility(user_id, visibility, now))
            acc = self.accounts.get(user_id)
            if acc is not None:
                acc.visibility_at = now
                # Internal frame: the edges keep each socket's own setting (the reader's side of
                # the reciprocal `nobody` rule) and never forward frames whose type starts with _.
                self._tell_self(acc, frames.settings_note(visibility, now))

    def claim(self, user_id: str, claim: Claim, now: float) -> None:
        """What an edge knew of the account's choices when it registers a socket again after a
        restart: a chosen status or visibility acknowledged by the dead incarnation may not have
        reached PostgreSQL. A claim newer than what this state holds wins (the database's value
        counts as oldest) and is persisted again; an older one changes nothing. Call it before
        `connect`, so that the socket comes back with the chosen status and never shows another.
        """
        acc = self.accounts[user_id]
        if claim.chosen in CHOSEN_STATUSES and claim.chosen_at > acc.chosen_at:
            acc.chosen_at = claim.chosen_at
            if acc.chosen != claim.chosen:
                acc.chosen = as_chosen(claim.chosen)
                self.outbox.add(PersistChosen(user_id, claim.chosen, claim.chosen_at))
                if claim.chosen == "invisible" and not acc.sockets and not acc.held:
                    # The moment it hid (its socket was connected then): its frozen last-seen,
                    # which the dead incarnation may not have written. Never moved back.
                    hid = min(claim.chosen_at, now)
                    if acc.last_seen_at is None or acc.last_seen_at < hid:
                        acc.last_seen_at = hid
                        self.pending_last_seen[user_id] = max(hid, self.pending_last_seen.get(user_id, 0.0))
                self._settle(acc, now)
        if claim.visibility in VISIBILITIES and claim.visibility_at > acc.visibility_at:
            rel = self.relations.get(user_id, NO_RELATIONS)
            acc.visibility_at = claim.visibility_at
            if rel.last_seen_visibility != claim.visibility:
                self.relations[user_id] = Relations(rel.friends, rel.servers, claim.visibility)
                self.outbox.add(PersistVisibility(user_id, claim.visibility, claim.visibility_at))

    def set_focus(self, user_id: str, socket_id: str, channel_id: str | None) -> None:
        acc = self.accounts.get(user_id)
        if acc is not None and socket_id in acc.sockets:
            acc.sockets[socket_id].focus = channel_id

    def is_focused(self, user_id: str, channel_id: str, now: float) -> bool:
        self._expire(now)
        acc = self.accounts.get(user_id)
        return acc is not None and any(s.focus == channel_id for s in acc.sockets.values())

    def _settle(
        self, acc: Account, now: float, skip_self: str | None = None, seen_at: float | None = None
    ) -> None:
        """Recompute the account's status and emit whatever its change means. `seen_at`: when
        the account was last present, if it departs now and that was earlier (a hold ran out)."""
        before = acc.real
        after = real_status(acc.chosen, acc.idle_flags())
        if after == before:
            return
        acc.real = after
        was_present, is_present = is_visibly_present(before), is_visibly_present(after)
        if was_present and not is_present:
            # The moment last-seen stops moving: the last socket went, or the account hid.
            seen = now if seen_at is None else seen_at
            acc.last_seen_at = max(seen, acc.last_seen_at or seen)
            self.pending_last_seen[acc.user_id] = max(
                acc.last_seen_at, self.pending_last_seen.get(acc.user_id, 0.0)
            )
        if was_present != is_present:
            servers = self.relations.get(acc.user_id, NO_RELATIONS).servers
            self.outbox.add(OnlineCount(acc.user_id, servers, is_present))
        # Watchers and the account's own sockets hear of it at most `status_publications` times
        # per window; a change past that is published once the window admits it (publish_due).
        shown = self.publications.change(acc.user_id, before, after, now)
        if shown is not None:
            self._publish(acc, shown, skip_self=skip_self)

    def _publish(self, acc: Account, shown: Status, skip_self: str | None = None) -> None:
        """Tell the account's watchers and its own sockets its current status, each only if it
        differs from what that socket was last told: `shown` (the status published last), or
        what a sync or `ready` told it while a change was held."""
        told = self._held_told.pop(acc.user_id, {})
        ready = self._held_ready.pop(acc.user_id, {})
        self._broadcast(acc.user_id, shown, acc.real, told)
        recipients: dict[str, list[str]] = {}
        for s in acc.sockets.values():
            if s.socket_id != skip_self and ready.get(s.socket_id, shown) != acc.real:
                recipients.setdefault(s.edge_id, []).append(s.socket_id)
        self.outbox.deliver(recipients, frames.self_status(acc.real))

    def publish_due(self, now: float) -> None:
        """Publish the current status of accounts whose changes were held back and whose window
        now admits it. The shell calls this often (see `next_publication_due`); `sweep` too."""
        for user_id, shown, _ in self.publications.due(now, self.real_status_of):
            acc = self.accounts.get(user_id)
            if acc is not None:
                self._publish(acc, shown)
            else:
                self._held_told.pop(user_id, None)
                self._held_ready.pop(user_id, None)

    def next_publication_due(self) -> float | None:
        """When the earliest held-back change may go out; None when nothing is held back."""
        return self.publications.next_due()

    def _tell_self(self, acc: Account, frame: frames.Frame, skip: str | None = None) -> None:
        recipients: dict[str, list[str]] = {}
        for s in acc.sockets.values():
            if s.socket_id != skip:
                recipients.setdefault(s.edge_id, []).append(s.socket_id)
        self.outbox.deliver(recipients, frame)

    def _broadcast(self, target: str, shown: Status, real: Status, told: dict[str, Status]) -> None:
        """Tell the target's watchers its status: the account's own sockets (subscribed to
        themselves) the real one, its audience the visible one, as one publication per edge and
        kind (the edge expands it to its sockets and drops it where a socket already shows it).
        A kind is told when its status differs from the one published last (`shown`) or from what
        a sync told some socket while the change was held (`told`)."""
        fan = self._fan.get(target)
        if not fan:
            return
        visible = visible_status(real)
        # `told` is empty unless a change was held back: no generator for the common case.
        tell_own = real != shown or (bool(told) and any(s != real for s in told.values()))
        tell_audience = visible != visible_status(shown) or (
            bool(told) and any(s != visible for s in told.values())
        )
        if not (tell_own or tell_audience):
            return
        own_frame = frames.changed(target, real) if tell_own else None
        audience_frame = frames.changed(target, visible) if tell_audience else None
        publish = self.outbox.publish
        for edge_id, (own, audience) in fan.items():
            if own and own_frame is not None:
                publish(edge_id, target, True, own, own_frame)
            if audience and audience_frame is not None:
                publish(edge_id, target, False, audience, audience_frame)

    # ------------------------------------------------------------------ reading statuses

    def real_status_of(self, user_id: str) -> Status:
        acc = self.accounts.get(user_id)
        return acc.real if acc is not None else "offline"

    def status_for(self, user_id: str, reader: str) -> Status:
        return status_shown(self.real_status_of(user_id), user_id, reader)

    def visible_status_of(self, user_id: str) -> Status:
        return visible_status(self.real_status_of(user_id))

    def last_seen_of(self, user_id: str, now: float) -> float | None:
        """The real last-seen (operator view): now while visibly present, else the frozen value."""
        acc = self.accounts.get(user_id)
        if acc is None:
            return None
        if is_visibly_present(acc.real):
            held = acc.last_held_close() if not acc.sockets else None
            # Held only: when its socket closed, which is its last-seen unless it resumes.
            return now if held is None else held
        return acc.last_seen_at

    # ------------------------------------------------------------------ watching

    def watch(
        self, watcher: str, socket_id: str, edge_id: str, targets: Iterable[str], now: float
    ) -> list[tuple[str, Status]]:
        """Register a socket's interest; answer the visible status of the targets in its audience.

        Every target is registered, in the audience or not, with what the socket sees of it (the
        audience rule, decided here and again when relations change, never per delivery): a
        friendship accepted later takes effect without the client re-subscribing. The socket's
        edge is told the same in an internal `_audience` note, in its mail before any change
        published after this watch, so that its index of watchers (edge/watch_index.py) expands
        each publication exactly to the sockets this state counts.
        """
        self._expire(now)
        self.edges[edge_id] = now
        watcher_rel = self.relations[watcher]
        answer: list[tuple[str, Status]] = []
        outside: list[str] = []
        for target in dict.fromkeys(targets):
            if target == watcher:
                sees = OWN
            elif in_audience(target, self.relations[target], watcher, watcher_rel):
                sees = AUDIENCE
            else:
                sees = OUTSIDE
            self._set_watcher(target, socket_id, Watcher(edge_id, watcher, sees))
            self.edge_watches.setdefault(edge_id, set()).add((target, socket_id))
            if sees == OUTSIDE:
                outside.append(target)
                continue
            status = self.status_for(target, watcher)
            answer.append((target, status))
            if self.publications.is_pending(target):
                self._held_told.setdefault(target, {})[socket_id] = status
        if answer or outside:
            note = frames.audience_note([t for t, _ in answer], outside)
            self.outbox.deliver({edge_id: [socket_id]}, note)
        return answer

    def unwatch(self, socket_id: str, edge_id: str, targets: Iterable[str]) -> None:
        for target in targets:
            self._unwatch_one(target, socket_id, edge_id)
            self.edge_watches.get(edge_id, set()).discard((target, socket_id))

    def _unwatch_one(self, target: str, socket_id: str, edge_id: str) -> None:
        ws = self.watchers.get(target)
        if ws is not None and socket_id in ws and ws[socket_id].edge_id == edge_id:
            self._drop_watcher(target, socket_id)

    # ------------------------------------------------------------------ querying

    def query(
        self, reader: str, reader_visibility: str | None, targets: Iterable[str], now: float
    ) -> list[QueryAnswer]:
        """`presence.query`: status and, where the visibility rule allows, last-seen.

        Targets outside the reader's audience are left out (silence). Accounts of targets in the
        audience must be loaded; the shell loads those `accounts_to_load_for_query` names.
        `reader_visibility` is the reader's own setting as its session knows it, so that a
        `settings.update` takes effect for the reader's very next query.
        """
        self._expire(now)
        targets = list(dict.fromkeys(targets))
        reader_rel = self.query_reader(reader, targets, reader_visibility)
        if reader_visibility is not None and reader_visibility != reader_rel.last_seen_visibility:
            reader_rel = Relations(reader_rel.friends, reader_rel.servers, reader_visibility)
        out: list[QueryAnswer] = []
        for target in targets:
            target_rel = self.relations[target]
            if not in_audience(target, target_rel, reader, reader_rel):
                continue
            acc = self.accounts[target]
            acc.touched_at = now
            seen = last_seen_for_reader(
                target=target,
                target_rel=target_rel,
                target_status=acc.real,
                last_seen_at=acc.last_seen_at,
                reader=reader,
                reader_rel=reader_rel,
                precision_s=self.precision_s,
            )
            out.append(QueryAnswer(target, status_shown(acc.real, target, reader), seen))
        return out

    def audience_of_query(self, reader: str, targets: Iterable[str]) -> list[str]:
        """Which targets are in the reader's audience (relations must be loaded: the targets',
        and the reader's unless `query_needs_reader` says no answer depends on them)."""
        targets = list(dict.fromkeys(targets))
        # Any setting will do for a stand-in here: the audience never reads it.
        reader_rel = self.query_reader(reader, targets, NO_RELATIONS.last_seen_visibility)
        return [t for t in targets if in_audience(t, self.relations[t], reader, reader_rel)]

    def query_needs_reader(self, reader: str, targets: Iterable[str]) -> bool:
        """Whether a query needs the reader's relations loaded first. Not when they are, nor when
        every target is a friend of the reader by its own relations, loaded here
        (`decided_by_target`): every target is then in the audience whatever the reader's servers,
        and the reader's own setting, the only other thing of the reader's the visibility rule
        reads, comes with the query (`Query.reader_visibility`). A reader's first query of its
        friends on a shard that does not own it then waits for no PostgreSQL round trip (a third
        of `bench query`'s batches did: bench/profiles/README.md, "Query: where the milliseconds
        go")."""
        if reader in self.relations:
            return False
        relations = self.relations
        for t in targets:
            rel = relations.get(t)
            if rel is None or not decided_by_target(t, rel, reader):
                return True
        return False

    def query_reader(self, reader: str, targets: Iterable[str], reader_visibility: str | None) -> Relations:
        """The reader's relations for a query of `targets`: the loaded ones (kept a while for the
        next query), else, when `query_needs_reader` says no answer depends on them and the
        query carries the reader's setting, a stand-in naming no friend and no server, which the
        audience rule then never reaches (`decided_by_target`). Else `NotLoaded`."""
        rel = self.relations.get(reader)
        if rel is not None:
            self._relations_read.add(reader)
            return rel
        if reader_visibility is None or self.query_needs_reader(reader, targets):
            raise NotLoaded("relations", reader)
        return Relations(last_seen_visibility=reader_visibility)

    def accounts_to_load_for_query(self, reader: str, targets: Iterable[str]) -> list[str]:
        """The accounts a query must have loaded before `query` (relations must be): its targets
        in the reader's audience that are not in memory. The audience is tested only for those:
        most queries find every target loaded and test nothing here."""
        absent = [t for t in dict.fromkeys(targets) if t not in self.accounts]
        return self.audience_of_query(reader, absent) if absent else []

    # ------------------------------------------------------------------ budgets

    def spend(self, user_id: str, kind: str, n: int, now: float) -> bool:
        """Charge `n` to the account's `kind` budget (`lookups`: ids queried or newly watched;
        `voice`: voice joins). False: refused whole, nothing charged; the edge answers
        `rate_limited` and sends nothing else of the frame upstream."""
        return self.spending.spend(user_id, kind, n, now)

    # ------------------------------------------------------------------ last-seen durability

    def last_seen_to_flush(self) -> list[tuple[str, float]]:
        return sorted(self.pending_last_seen.items())

    def last_seen_flushed(self, entries: Iterable[tuple[str, float]]) -> None:
        """The FlushActor committed these; keep any newer value that arrived meanwhile."""
        for user_id, ts in entries:
            if self.pending_last_seen.get(user_id, float("inf")) <= ts:
                del self.pending_last_seen[user_id]

    @property
    def checkpoint_interval_s(self) -> float:
        return self._checkpoints.interval_s

    @checkpoint_interval_s.setter
    def checkpoint_interval_s(self, interval_s: float) -> None:
        self._checkpoints.interval_s = interval_s

    @property
    def checkpoint_rounds(self) -> int:
        return self._checkpoints.rounds

    def checkpoint_chunk(self, now: float) -> list[tuple[str, float]]:
        """The slice of the rolling checkpoint due by `now`, to be called about once a second.

        Every `checkpoint_interval_s` a round takes the accounts then visibly present and hands
        them out in even slices over most of the interval (`RollingRefresh`). Trickled like
        this, the rows ride along in the FlushActor's once-a-second batches with the departures
        instead of adding statements of their own (400,000 accounts every 10 minutes are ~830
        rows a second, under the 1,000-row batch). The first round begins one interval after
        the shard starts: what is online then was connected moments ago and has nothing a crash
        could lose yet. An account that left since the round began is skipped: its departure
        already holds the right time, and `now` would be later than it.
        """
        self._expire(now)  # an account whose edge died is no longer present, swept yet or not
        due = self._checkpoints.chunk((u for u, acc in self.accounts.items() if _checkpointed(acc)), now)
        return [(u, now) for u in due if u in self.accounts and _checkpointed(self.accounts[u])]

    # ------------------------------------------------------------------ counts (Redis refresh)

    def present_accounts(self) -> list[tuple[str, frozenset[str]]]:
        return [
            (u, self.relations.get(u, NO_RELATIONS).servers)
            for u, acc in self.accounts.items()
            if is_visibly_present(acc.real)
        ]

    def live_sockets(self) -> list[tuple[str, str]]:
        return [(u, s) for u, acc in self.accounts.items() for s in acc.sockets]

    def live_accounts(self) -> list[str]:
        """Accounts with a live socket, whatever their chosen status (the active counts)."""
        return [u for u, acc in self.accounts.items() if acc.sockets]

    def activity_chunk(self, now: float) -> list[str]:
        """The accounts whose active score is due for a refresh by `now` (about once a second):
        a rolling round over the accounts live when it began, skipping those gone since (their
        departure wrote the right time)."""
        self._expire(now)
        due = self.activity.chunk((u for u, acc in self.accounts.items() if acc.sockets), now)
        return [u for u in due if u in self.accounts and self.accounts[u].sockets]

    def socket_count(self) -> int:
        return sum(len(a.sockets) for a in self.accounts.values())

    # ------------------------------------------------------------------ export / import (resize)

    def export_slots(self, slots: set[int]) -> SlotExport:
        """Take everything keyed by these slots out of this state, for another shard to import.

        Accounts with their sockets, statuses and unflushed last-seen; the watchers of those
        accounts; the channels in those slots. Nothing is emitted: to everybody outside, the
        state only changes address.
        """
        out = SlotExport(slots=frozenset(slots))
        for user_id in [u for u in self.accounts if slot_of(u) in slots]:
            acc = self.accounts.pop(user_id)
            out.accounts.append(acc)
            for sock in acc.sockets.values():
                self.edge_sockets.get(sock.edge_id, set()).discard((user_id, sock.socket_id))
                out.edges.setdefault(sock.edge_id, self.edges.get(sock.edge_id, 0.0))
        # Every unwritten last-seen of these slots, of accounts in memory or not (blind departures).
        for user_id in [u for u in self.pending_last_seen if slot_of(u) in slots]:
            out.pending_last_seen[user_id] = self.pending_last_seen.pop(user_id)
        for target in [t for t in self.watchers if slot_of(t) in slots]:
            watchers = self.watchers.pop(target)
            self._fan.pop(target, None)
            out.watchers[target] = watchers
            for socket_id, w in watchers.items():
                self._unref_watching(w.user_id, target)
                self.edge_watches.get(w.edge_id, set()).discard((target, socket_id))
                out.edges.setdefault(w.edge_id, self.edges.get(w.edge_id, 0.0))
        out.publications = self.publications.export([u for u in self.publications if slot_of(u) in slots])
        for user_id in out.publications:
            out.held[user_id] = (self._held_told.pop(user_id, {}), self._held_ready.pop(user_id, {}))
        out.spending = self.spending.export({u for u, _ in self.spending.buckets if slot_of(u) in slots})
        for channel_id in [c for c in self.channels.channels if slot_of(channel_key(c)) in slots]:
            ch = self.channels.channels.pop(channel_id)
            out.channels.append(ch)
            for m in (*ch.subscribers.values(), *ch.voice.values()):
                out.edges.setdefault(m.edge_id, self.edges.get(m.edge_id, 0.0))
        return out

    def users_of_export(self, export: SlotExport) -> set[str]:
        """Every account whose relations the importing shard needs before `import_slots`."""
        users = {acc.user_id for acc in export.accounts}
        users.update(export.watchers)
        users.update(w.user_id for ws in export.watchers.values() for w in ws.values())
        for ch in export.channels:
            users.update(m.user_id for m in (*ch.subscribers.values(), *ch.voice.values()))
        return users

    def import_slots(self, export: SlotExport, now: float) -> None:
        """Install an export. Emits no frame a client sees (but where this shard's relations decide
        an audience differently: `_reclassify`): statuses, watchers and rosters arrive as they were
        (only the active counts are told the live accounts again, see `activity_chunk`)."""
        for edge_id, refreshed in export.edges.items():
            # An edge's lease is as fresh as its best renewal anywhere; never shorten it here.
            self.edges[edge_id] = max(self.edges.get(edge_id, 0.0), refreshed)
        for acc in export.accounts:
            self.accounts[acc.user_id] = acc
            for sock in acc.sockets.values():
                self.edge_sockets.setdefault(sock.edge_id, set()).add((acc.user_id, sock.socket_id))
            self._watch_holds(acc)  # held sockets move with their account, windows unchanged
        for user_id, ts in export.pending_last_seen.items():
            self.pending_last_seen[user_id] = max(ts, self.pending_last_seen.get(user_id, 0.0))
        for target, watchers in export.watchers.items():
            for socket_id, w in watchers.items():
                self._set_watcher(target, socket_id, w)
                self.edge_watches.setdefault(w.edge_id, set()).add((target, socket_id))
            # Decided by the old owner under its relations; this one's may be newer.
            self._reclassify(target, changed_user=None)
        for ch in export.channels:
            self.channels.channels[ch.channel_id] = ch
        self.publications.restore(export.publications)
        for user_id, (told, ready) in export.held.items():
            self._held_told.setdefault(user_id, {}).update(told)
            self._held_ready.setdefault(user_id, {}).update(ready)
        self.spending.restore(export.spending)
        self._expire(now)
        # This shard's refresh round may not reach them before their scores' lead runs out.
        for acc in export.accounts:
            if acc.sockets and acc.user_id in self.accounts:
                self.outbox.add(Activity(acc.user_id, True, now))


def _checkpointed(acc: Account) -> bool:
    """Present with a live socket: an account present only through held sockets is not written
    `now`, or a hold that runs out could not take its last-seen back to the moment it closed."""
    return bool(acc.sockets) and is_visibly_present(acc.real)


@dataclass
class SlotExport:
    """The state of some slots in transit between two shards (pickled by Ray on the way)."""

    slots: frozenset[int]
    accounts: list[Account] = field(default_factory=list)
    pending_last_seen: dict[str, float] = field(default_factory=dict)
    watchers: dict[str, dict[str, Watcher]] = field(default_factory=dict)
    channels: list[Channel] = field(default_factory=list)
    edges: dict[str, float] = field(default_factory=dict)
    # Budgets move with their accounts, so resizing the pool never refills them.
    publications: dict[str, PublicationState] = field(default_factory=dict)
    held: dict[str, tuple[dict[str, Status], dict[str, Status]]] = field(default_factory=dict)
    spending: dict[tuple[str, str], Bucket] = field(default_factory=dict)
