"""Moving slots between shards: the plan (rebalance) and the move (export/import) in the pure core."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.core.effects import Activity, Deliver
from actors.core.shard import ShardState
from actors.core.slots import SLOT_COUNT, SlotMap, moves, rebalance, slot_of

# Deliveries as the edges make them: publications expanded per socket (tests/unit/edges_sim.py).
pytestmark = pytest.mark.usefixtures("edges")


@given(st.integers(1, 12), st.integers(1, 12))
def test_rebalance_is_balanced_total_and_minimal(before: int, after: int) -> None:
    old = SlotMap.even(before).owners
    new = rebalance(old, after)
    counts = Counter(new)
    assert set(counts) == set(range(after))
    assert max(counts.values()) - min(counts.values()) <= 1
    # Minimal: exactly the slots above each surviving shard's quota, plus those of removed shards.
    base, extra = divmod(SLOT_COUNT, after)
    quota = [base + (1 if i < extra else 0) for i in range(after)]
    old_counts = Counter(old)
    must_move = sum(c for s, c in old_counts.items() if s >= after)
    must_move += sum(max(0, old_counts[s] - quota[s]) for s in range(after))
    assert sum(len(v) for v in moves(old, new).values()) == must_move


def test_rebalance_of_a_balanced_map_moves_nothing() -> None:
    old = SlotMap.even(4).owners
    assert rebalance(old, 4) == old


def _state_with(users: list[str], watchers: list[tuple[str, str]], now: float) -> ShardState:
    s = ShardState()
    everyone = Relations(frozenset(), frozenset({"g"}))
    for u in {*users, *(w for w, _ in watchers), *(t for _, t in watchers)}:
        s.set_relations(u, everyone, now)
    for i, u in enumerate(users):
        s.load_account(u, AccountRow(), now)
        s.connect(u, f"s-{u}", "e1", now)
        if i % 3 == 1:
            s.set_status(u, f"s-{u}", "dnd", now)
        if i % 3 == 2:
            s.set_status(u, f"s-{u}", "idle", now)
    for w, t in watchers:
        s.watch(w, f"w-{w}", "e1", [t], now)
    s.outbox.drain()
    return s


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.sampled_from([f"u{i}" for i in range(40)]), min_size=1, max_size=20, unique=True),
    st.sets(st.integers(0, SLOT_COUNT - 1), max_size=4000),
)
def test_export_then_import_changes_nothing_but_the_address(users: list[str], slots: set[int]) -> None:
    now = 100.0
    watchers = [(users[0], t) for t in users]
    src = _state_with(users, watchers, now)
    statuses = {u: src.real_status_of(u) for u in users}
    dst = ShardState()
    for u, rel in src.relations.items():
        dst.set_relations(u, rel, now)
    export = src.export_slots(slots)
    dst.import_slots(export, now + 1)
    # Nothing is told to anybody; only the active counts hear the moved live accounts again
    # (their scores' lead may run out before the new owner's refresh round reaches them).
    assert src.outbox.drain() == []
    assert all(isinstance(e, Activity) and e.live for e in dst.outbox.drain()), "a move emits nothing else"
    for u in users:
        owner = dst if slot_of(u) in slots else src
        other = src if owner is dst else dst
        assert owner.real_status_of(u) == statuses[u]
        assert u not in other.accounts
    # Changes after the move reach the same watchers from the new owner.
    for u in users:
        owner = dst if slot_of(u) in slots else src
        owner.set_status(u, f"s-{u}", "invisible", now + 2)
        sent = [
            e
            for e in owner.outbox.drain()
            if isinstance(e, Deliver) and e.frame.get("type") == "presence.changed"
        ]
        if statuses[u] != "offline":
            # The watcher watching itself sees its real status; everybody else sees offline.
            expected = "invisible" if u == users[0] else "offline"
            assert [(e.socket_ids, e.frame["status"]) for e in sent] == [((f"w-{users[0]}",), expected)]


def test_unflushed_last_seen_moves_with_its_account() -> None:
    now = 10.0
    s = _state_with(["a"], [], now)
    s.disconnect("a", "s-a", now + 5)
    assert s.pending_last_seen == {"a": now + 5}
    export = s.export_slots({slot_of("a")})
    assert s.pending_last_seen == {}
    d = ShardState()
    d.import_slots(export, now + 6)
    assert d.last_seen_to_flush() == [("a", now + 5)]


def test_a_dead_edges_sockets_still_age_out_after_the_move() -> None:
    now = 0.0
    s = _state_with(["a"], [], now)
    export = s.export_slots({slot_of("a")})
    d = ShardState(socket_timeout_s=90)
    d.set_relations("a", Relations(), now)
    d.import_slots(export, now + 10)
    assert d.real_status_of("a") == "online"
    d.sweep(now + 91)  # the edge's lease came from the old owner and was never renewed here
    assert d.real_status_of("a") == "offline"
