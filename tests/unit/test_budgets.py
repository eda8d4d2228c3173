"""Per-account budgets in the shard core (issue 14): status changes coalesced, spending buckets.

protocol.md, "Audience and privacy": one account's rapid status changes reach its watchers as at
most 5 `presence.changed` frames per second, and the last state always arrives; ids newly
watched or queried are charged to one per-account budget, refused whole past it. Project
decisions (docs/protocol.md, "Budgets"): the window is 1.05 s; `presence.self` is coalesced the
same way; a held-back change goes out as the account's current state once the window admits it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.audience import Relations
from actors.core.budgets import Allowance, Publications, Spending
from actors.core.contract import AccountRow
from actors.core.effects import Deliver, Effect
from actors.core.scan import SWEEP_AT_LEAST, SWEEP_CYCLE_S
from actors.core.shard import ShardState
from actors.core.slots import slot_of
from actors.core.status import visible_status

from .conftest import T0

# Deliveries as the edges make them: publications expanded per socket (tests/unit/edges_sim.py).
pytestmark = pytest.mark.usefixtures("edges")

WINDOW = 1.0  # the contract's second; the core's window (1.05 s) is a little longer


def rel(friends: Iterable[str] = (), servers: Iterable[str] = ()) -> Relations:
    return Relations(frozenset(friends), frozenset(servers), "everyone")


def changed_frames(effects: list[Effect], about: str) -> list[tuple[str, str]]:
    """(socket, status) of every presence.changed about one account, in order."""
    return [
        (sid, e.frame["status"])
        for e in effects
        if isinstance(e, Deliver) and e.frame["type"] == "presence.changed" and e.frame["userId"] == about
        for sid in e.socket_ids
    ]


def self_frames(effects: list[Effect]) -> list[tuple[str, str]]:
    return [
        (sid, e.frame["status"])
        for e in effects
        if isinstance(e, Deliver) and e.frame["type"] == "presence.self"
        for sid in e.socket_ids
    ]


def max_in_window(times: list[float], window: float = WINDOW) -> int:
    """The most of `times` (sorted) inside any half-open window [t, t + window)."""
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


# ---------------------------------------------------------------------------- Publications


class TestPublications:
    def test_five_at_once_then_held_until_the_window_admits(self) -> None:
        p = Publications(5, 1.0)
        seq = ["online", "dnd", "online", "dnd", "online", "dnd"]
        shown = [p.change("u", a, b, T0) for a, b in itertools.pairwise(seq)]
        assert shown == ["online", "dnd", "online", "dnd", "online"]  # what watchers believed
        assert p.change("u", "dnd", "idle", T0 + 0.1) is None
        assert p.change("u", "idle", "invisible", T0 + 0.2) is None
        assert p.pending == {"u"}
        assert p.next_due() == T0 + 1.0
        assert p.due(T0 + 0.99, lambda u: "invisible") == []
        assert p.due(T0 + 1.0, lambda u: "invisible") == [("u", "dnd", "invisible")]
        assert p.pending == set() and p.next_due() is None

    def test_a_change_when_the_window_has_room_tells_what_was_published_last(self) -> None:
        p = Publications(1, 1.0)
        assert p.change("u", "offline", "online", T0) == "offline"
        assert p.change("u", "online", "dnd", T0 + 0.5) is None
        # The next change comes after the window opened but before any tick: it goes out at
        # once, compared with what watchers were told (online), not with the held dnd.
        assert p.change("u", "dnd", "online", T0 + 1.2) == "online"
        assert p.pending == set()

    def test_accounts_are_independent_and_sweep_forgets_empty_windows(self) -> None:
        p = Publications(1, 1.0)
        p.change("a", "offline", "online", T0)
        assert p.change("b", "offline", "online", T0) == "offline"
        p.sweep(T0 + 0.5)
        assert set(p) == {"a", "b"}
        p.sweep(T0 + 1.0)
        assert set(p) == set()

    def test_many_windows_are_forgotten_a_slice_a_sweep_all_within_a_cycle(self) -> None:
        """50,000 accounts changed at once (a reconnect storm): a sweep that walked every window
        held the shard for 75-110 ms; the sweep a second now forgets a rolling slice."""
        p = Publications(1, 1.0)
        for i in range(SWEEP_AT_LEAST * 20):
            p.change(f"u{i}", "offline", "online", T0)
        p.sweep(T0 + 1.0)  # a sweep a second, as the shard's
        assert 0 < len(list(p)) < SWEEP_AT_LEAST * 20, "one sweep looked at a slice, not at all"
        for k in range(2, int(SWEEP_CYCLE_S) + 2):
            p.sweep(T0 + k)
        assert list(p) == [], "every spent window forgotten within a cycle"

    def test_export_and_restore_keep_the_window(self) -> None:
        p = Publications(1, 1.0)
        p.change("a", "offline", "online", T0)
        p.change("a", "online", "dnd", T0)
        moved = p.export(["a"])
        assert set(p) == set() and p.pending == set()
        q = Publications(1, 1.0)
        q.restore(moved)
        assert q.pending == {"a"}
        assert q.change("a", "dnd", "idle", T0 + 0.5) is None
        assert q.due(T0 + 1.0, lambda u: "idle") == [("a", "online", "idle")]

    def test_bad_budget(self) -> None:
        with pytest.raises(ValueError):
            Publications(0, 1.0)


# ---------------------------------------------------------------------------- the shard, coalescing


def world(**kwargs: Any) -> ShardState:
    """bob shares g1 with alice; alice watches herself from a1 too; carol is an outsider."""
    s = ShardState(**kwargs)
    relations = {"alice": rel(servers={"g1"}), "bob": rel(servers={"g1"}), "carol": rel(servers={"g9"})}
    for u, r in relations.items():
        s.set_relations(u, r, T0)
        s.load_account(u, AccountRow(), T0)
    return s


class TestCoalescing:
    def test_58_toggles_reach_a_watcher_as_a_few_frames_and_the_last_state(self) -> None:
        s = world()
        s.connect("alice", "a1", "e1", T0 - 5)
        s.watch("bob", "b1", "e2", ["alice"], T0)
        s.watch("alice", "a1", "e1", ["alice"], T0)
        s.outbox.drain()
        now = T0
        got: list[tuple[float, str]] = []
        for i in range(58):
            now += 0.01
            s.set_status("alice", "a1", "dnd" if i % 2 == 0 else "online", now)
            got += [(now, st) for sid, st in changed_frames(s.outbox.drain(), "alice") if sid == "b1"]
        assert len(got) == 5
        assert s.next_publication_due() == pytest.approx(T0 + 0.01 + 1.05)
        s.publish_due(T0 + 1.0)
        assert s.outbox.drain() == []
        s.publish_due(T0 + 1.07)
        effects = s.outbox.drain()
        # The 58th change chose online (the 5th published one was dnd): it arrives.
        assert changed_frames(effects, "alice") == [("b1", "online"), ("a1", "online")]
        assert self_frames(effects) == [("a1", "online")]

    def test_sweep_publishes_what_is_due(self) -> None:
        s = world(status_publications=1)
        s.connect("alice", "a1", "e1", T0)
        s.watch("bob", "b1", "e2", ["alice"], T0)
        s.outbox.drain()
        s.set_status("alice", "a1", "dnd", T0 + 0.1)
        assert changed_frames(s.outbox.drain(), "alice") == []
        s.sweep(T0 + 2)
        assert changed_frames(s.outbox.drain(), "alice") == [("b1", "dnd")]

    def test_hiding_while_held_never_shows_online(self) -> None:
        s = world(status_publications=1)
        s.watch("bob", "b1", "e2", ["alice"], T0)
        s.connect("alice", "a1", "e1", T0)
        assert changed_frames(s.outbox.drain(), "alice") == [("b1", "online")]
        s.set_status("alice", "a1", "dnd", T0 + 0.1)
        s.set_status("alice", "a1", "invisible", T0 + 0.2)
        s.publish_due(T0 + 2)
        assert changed_frames(s.outbox.drain(), "alice") == [("b1", "offline")]

    def test_a_subscriber_synced_while_held_is_told_the_final_state(self) -> None:
        s = world(status_publications=1)
        s.connect("alice", "a1", "e1", T0)
        s.outbox.drain()
        s.set_status("alice", "a1", "dnd", T0 + 0.1)  # held: nobody has been told dnd
        assert s.watch("bob", "b1", "e2", ["alice"], T0 + 0.2) == [("alice", "dnd")]
        s.set_status("alice", "a1", "online", T0 + 0.3)  # back to what the others last heard
        s.publish_due(T0 + 2)
        assert changed_frames(s.outbox.drain(), "alice") == [("b1", "online")]

    def test_budget_moves_with_the_account_on_resize(self) -> None:
        s = world(status_publications=1)
        s.connect("alice", "a1", "e1", T0)
        s.watch("bob", "b1", "e2", ["alice"], T0)
        s.set_status("alice", "a1", "dnd", T0)
        assert s.spend("alice", "lookups", 1_500, T0)
        export = s.export_slots({slot_of("alice")})
        d = world(status_publications=1)
        d.accounts.pop("alice")
        d.import_slots(export, T0 + 0.5)
        d.outbox.drain()
        assert not d.spend("alice", "lookups", 1_000, T0 + 0.5), "moving never refills a budget"
        d.publish_due(T0 + 1.1)
        assert ("b1", "dnd") in changed_frames(d.outbox.drain(), "alice")


STATUSES = ["online", "idle", "dnd", "invisible"]
status_step = st.tuples(st.just("status"), st.sampled_from(["a1", "a2"]), st.sampled_from(STATUSES))
step = st.one_of(
    status_step,
    status_step,
    status_step,
    status_step,
    st.tuples(st.just("connect"), st.sampled_from(["a1", "a2"]), st.just("")),
    st.tuples(st.just("disconnect"), st.sampled_from(["a1", "a2"]), st.just("")),
    st.tuples(st.just("watch"), st.sampled_from(["b1", "b2", "c1", "a3"]), st.just("")),
    st.tuples(st.just("tick"), st.just(""), st.just("")),
    st.tuples(st.just("wait"), st.just(""), st.sampled_from(["0", "0", "0.01", "0.01", "0.1", "0.3", "1.0"])),
)
WATCHER = {"b1": "bob", "b2": "bob", "c1": "carol", "a3": "alice"}


@given(steps=st.lists(step, max_size=120))
@settings(max_examples=300, deadline=None)
def test_any_changes_and_clock_steps_stay_in_budget_and_end_on_the_truth(
    steps: list[tuple[str, str, str]],
) -> None:
    """For any sequence of changes, subscriptions and clock steps:

    - no socket receives more than 5 `presence.changed` about alice (or `presence.self`) in any
      one-second window;
    - every frame carries the status at the moment it was sent: others the visible one (so
      `invisible` never leaves the account, nor `online` while she hides), her own sockets the
      real one;
    - no socket is told the same status twice in a row (a change undone while held is told to
      nobody);
    - once quiet, every watcher's view (its sync, then the frames) is alice's current status.
    """
    s = world()
    now = T0
    view: dict[str, str] = {}  # watcher socket → what it believes of alice
    sent: dict[str, list[float]] = {}
    self_sent: dict[str, list[float]] = {}
    own_view: dict[str, str] = {}  # alice's sockets → what they believe of her own status
    live: set[str] = set()
    steps = [("connect", "a1", ""), ("watch", "b1", ""), *steps]

    def collect() -> None:
        effects = s.outbox.drain()
        real = s.real_status_of("alice")
        for sid, status in changed_frames(effects, "alice"):
            expected = real if WATCHER.get(sid, "alice") == "alice" else visible_status(real)
            assert status == expected, (sid, status, real)
            assert sid != "c1", "an outsider hears nothing"
            assert view.get(sid) != status, f"{sid} told {status} twice in a row"
            view[sid] = status
            sent.setdefault(sid, []).append(now)
        for sid, status in self_frames(effects):
            assert status == real
            assert own_view.get(sid) != status, f"{sid} told its own {status} twice in a row"
            own_view[sid] = status
            self_sent.setdefault(sid, []).append(now)

    for kind, who, arg in steps:
        if kind == "status" and who in live:
            s.set_status("alice", who, arg, now)
        elif kind == "connect":
            own_view[who] = s.connect("alice", who, "e1", now)
            live.add(who)
        elif kind == "disconnect" and who in live:
            s.disconnect("alice", who, now)
            live.discard(who)
            own_view.pop(who, None)
        elif kind == "watch" and who not in view:
            for _target, status in s.watch(WATCHER[who], who, "e2", ["alice"], now):
                view[who] = status
            if who == "c1":
                view[who] = "(silence)"
        elif kind == "tick":
            s.publish_due(now)
        elif kind == "wait":
            now += float(arg)
        collect()
    now += 2.0
    s.publish_due(now)
    collect()
    for times in (*sent.values(), *self_sent.values()):
        assert max_in_window(times) <= 5, times
    real = s.real_status_of("alice")
    for sid, status in view.items():
        if sid == "c1":
            assert status == "(silence)"
        else:
            assert status == (real if WATCHER[sid] == "alice" else visible_status(real)), (sid, status, real)
    for sid in live:
        assert own_view[sid] == real


# ---------------------------------------------------------------------------- Spending


class TestSpending:
    def test_burst_then_refill(self) -> None:
        sp = Spending({"lookups": Allowance(per_min=600, burst=1_000)})
        assert sp.spend("u", "lookups", 1_000, T0)
        assert not sp.spend("u", "lookups", 1, T0)
        assert sp.spend("u", "lookups", 10, T0 + 1)  # 10 a second
        assert not sp.spend("u", "lookups", 1, T0 + 1)

    def test_refused_spend_costs_nothing_and_zero_always_passes(self) -> None:
        sp = Spending({"lookups": Allowance(per_min=60, burst=100)})
        assert sp.spend("u", "lookups", 90, T0)
        assert not sp.spend("u", "lookups", 20, T0)
        assert sp.level("u", "lookups", T0) == 10
        assert sp.spend("u", "lookups", 0, T0)

    def test_accounts_and_kinds_are_independent(self) -> None:
        sp = Spending({"lookups": Allowance(60, 10), "voice": Allowance(60, 1)})
        assert sp.spend("u", "voice", 1, T0)
        assert not sp.spend("u", "voice", 1, T0)
        assert sp.spend("u", "lookups", 10, T0)
        assert sp.spend("v", "voice", 1, T0)

    def test_unknown_kind_is_a_bug(self) -> None:
        with pytest.raises(KeyError):
            Spending().spend("u", "nope", 1, T0)

    def test_sweep_forgets_only_full_buckets(self) -> None:
        sp = Spending({"lookups": Allowance(per_min=60, burst=10)})
        sp.spend("u", "lookups", 10, T0)
        sp.spend("v", "lookups", 3, T0)
        sp.sweep(T0 + 1)
        assert set(sp.buckets) == {("u", "lookups"), ("v", "lookups")}
        sp.sweep(T0 + 5)
        assert set(sp.buckets) == {("u", "lookups")}
        sp.sweep(T0 + 10)
        assert sp.buckets == {}

    def test_many_buckets_are_forgotten_a_slice_a_sweep_all_within_a_cycle(self) -> None:
        sp = Spending({"lookups": Allowance(per_min=60, burst=10)})
        for i in range(SWEEP_AT_LEAST * 20):
            sp.spend(f"u{i}", "lookups", 1, T0)
        sp.sweep(T0 + 1.0)  # refilled, all of them
        assert 0 < len(sp.buckets) < SWEEP_AT_LEAST * 20, "one sweep looked at a slice, not at all"
        for k in range(2, int(SWEEP_CYCLE_S) + 2):
            sp.sweep(T0 + k)
        assert sp.buckets == {}, "every refilled bucket forgotten within a cycle"

    def test_default_lookup_budget_holds_a_full_subscription_cap(self) -> None:
        sp = Spending()
        assert sp.spend("u", "lookups", 1_000, T0)  # one full per-socket cap (contract)
        assert sp.spend("u", "lookups", 1_000, T0)

    @given(
        spends=st.lists(
            st.tuples(st.integers(0, 300), st.sampled_from([0.0, 0.01, 0.5, 1.0, 5.0])), max_size=80
        )
    )
    @settings(max_examples=200, deadline=None)
    def test_never_more_than_burst_plus_refill(self, spends: list[tuple[int, float]]) -> None:
        sp = Spending({"lookups": Allowance(per_min=600, burst=1_000)})
        now, spent = T0, 0
        for n, dt in spends:
            now += dt
            if sp.spend("u", "lookups", n, now):
                spent += n
            assert spent <= 1_000 + (now - T0) * 10 + 1e-6
