"""Departures that a shard learns late or loses (issue 7, found by tests/integration/
test_faults_history.py): a disconnect keeps the time the socket went, and an edge's report of a
departure that a restarted shard lost is applied only where it cannot mislead."""

from __future__ import annotations

from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.core.shard import ShardState

from .conftest import T0


def state(user: str = "u1", chosen: str = "online", last_seen: float | None = None) -> ShardState:
    s = ShardState(socket_timeout_s=90)
    s.load_account(user, AccountRow(chosen_status=chosen, last_seen_at=last_seen), T0)
    s.set_relations(user, Relations(frozenset(), frozenset({"g"}), "everyone"), T0)
    return s


def test_disconnect_reported_late_keeps_the_time_it_happened() -> None:
    s = state()
    s.connect("u1", "s1", "e1", T0)
    s.disconnect("u1", "s1", T0 + 5, at=T0 + 2)  # the edge waited 3 s for the shard
    assert s.pending_last_seen == {"u1": T0 + 2}
    assert s.last_seen_of("u1", T0 + 5) == T0 + 2


def test_disconnect_time_never_in_the_future() -> None:
    s = state()
    s.connect("u1", "s1", "e1", T0)
    s.disconnect("u1", "s1", T0 + 1, at=T0 + 60)
    assert s.pending_last_seen == {"u1": T0 + 1}


def test_disconnect_without_a_time_is_now() -> None:
    s = state()
    s.connect("u1", "s1", "e1", T0)
    s.disconnect("u1", "s1", T0 + 1)
    assert s.pending_last_seen == {"u1": T0 + 1}


def test_departed_restores_a_lost_departure() -> None:
    s = state(last_seen=T0 - 100)  # a restarted shard: the column has an older value
    s.departed("u1", T0 + 3, T0 + 5)
    assert s.pending_last_seen == {"u1": T0 + 3}
    assert s.last_seen_of("u1", T0 + 5) == T0 + 3


def test_departed_never_moves_last_seen_back_nor_past_now() -> None:
    s = state(last_seen=T0 + 4)
    s.departed("u1", T0 + 3, T0 + 5)
    assert s.pending_last_seen == {}
    s.departed("u1", T0 + 50, T0 + 6)
    assert s.pending_last_seen == {"u1": T0 + 6}


def test_departed_ignored_while_the_account_is_present() -> None:
    s = state(last_seen=T0 - 100)
    s.connect("u1", "s1", "e1", T0)  # it came back (re-registered or reconnected)
    s.departed("u1", T0 + 3, T0 + 5)
    assert s.pending_last_seen == {}
    assert s.real_status_of("u1") == "online"


def test_departed_ignored_for_an_invisible_account() -> None:
    s = state(chosen="invisible", last_seen=T0 - 100)
    s.departed("u1", T0 + 3, T0 + 5)
    assert s.pending_last_seen == {}
    assert s.last_seen_of("u1", T0 + 5) == T0 - 100, "an invisible account's last-seen is frozen"


def test_departed_emits_no_frame() -> None:
    s = state(last_seen=T0 - 100)
    s.departed("u1", T0 + 3, T0 + 5)
    assert s.outbox.drain() == []
