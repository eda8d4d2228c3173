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


# ---- issue 13: departures recorded without the account's row, with the socket's claim


def unloaded() -> ShardState:
    s = ShardState(socket_timeout_s=90)
    return s


def test_departure_of_an_account_not_in_memory_is_recorded_unread() -> None:
    # After a restart the row may be unreadable (PostgreSQL away): the account has no socket
    # here, so it is not present, and GREATEST in the store makes the blind write safe.
    s = unloaded()
    s.departed("u1", T0 + 3, T0 + 5)
    assert s.pending_last_seen == {"u1": T0 + 3}
    assert "u1" not in s.accounts
    s.departed("u1", T0 + 50, T0 + 6)  # never past now
    assert s.pending_last_seen == {"u1": T0 + 6}
    s.departed("u1", T0 + 1, T0 + 7)  # never back
    assert s.pending_last_seen == {"u1": T0 + 6}


def test_unread_disconnect_of_an_unknown_socket_is_a_departure() -> None:
    s = unloaded()
    s.disconnect("u1", "s1", T0 + 5, at=T0 + 2)
    assert s.pending_last_seen == {"u1": T0 + 2}
    s2 = unloaded()
    s2.disconnect("u1", "s1", T0 + 5)  # no time: nothing known happened
    assert s2.pending_last_seen == {}


def test_unread_departure_carries_the_sockets_unsaved_choices_newest_wins() -> None:
    from actors.core.effects import PersistChosen, PersistVisibility
    from actors.core.shard import Claim

    s = unloaded()
    s.departed("u1", T0 + 10, T0 + 12, Claim("dnd", T0 + 4, "nobody", T0 + 6))
    effects = s.outbox.drain()
    assert PersistChosen("u1", "dnd", T0 + 4) in effects
    assert PersistVisibility("u1", "nobody", T0 + 6) in effects
    assert s.pending_last_seen == {"u1": T0 + 10}


def test_unread_departure_of_an_account_that_hid_is_frozen_at_the_hide() -> None:
    # `invisible` acknowledged at T0+4 (maybe never saved), the socket left at T0+10: its
    # last-seen is the moment it hid, never the departure.
    from actors.core.effects import PersistChosen
    from actors.core.shard import Claim

    s = unloaded()
    s.departed("u1", T0 + 10, T0 + 12, Claim("invisible", T0 + 4))
    assert s.pending_last_seen == {"u1": T0 + 4}
    assert s.outbox.drain() == [PersistChosen("u1", "invisible", T0 + 4)]


def test_claims_without_a_time_persist_nothing() -> None:
    from actors.core.shard import Claim

    s = unloaded()
    s.departed("u1", T0 + 10, T0 + 12, Claim("invisible", 0.0, "nobody", 0.0))
    assert s.outbox.drain() == []
    assert s.pending_last_seen == {"u1": T0 + 10}


def test_loaded_after_an_unread_departure_sees_it_and_the_stored_freeze() -> None:
    s = unloaded()
    s.departed("u1", T0 + 10, T0 + 12)
    s.load_account("u1", AccountRow(last_seen_at=T0 - 100), T0 + 13)
    assert s.last_seen_of("u1", T0 + 13) == T0 + 10
    # Stored invisible since T0+4: the store's write freezes the departure there, and so does
    # the value read back into memory.
    s2 = unloaded()
    s2.departed("u1", T0 + 10, T0 + 12)
    s2.load_account("u1", AccountRow("invisible", last_seen_at=T0 + 4, chosen_at=T0 + 4), T0 + 13)
    assert s2.last_seen_of("u1", T0 + 13) == T0 + 4
    # Invisible since an unknown moment (stored before the time columns, or by a host
    # application): the store does not write it at all, and nor does memory show it.
    s3 = unloaded()
    s3.departed("u1", T0 + 10, T0 + 12)
    s3.load_account("u1", AccountRow("invisible", last_seen_at=None), T0 + 13)
    assert s3.last_seen_of("u1", T0 + 13) is None


def test_loaded_choice_times_decide_against_older_claims() -> None:
    from actors.core.shard import Claim

    s = unloaded()
    s.load_account("u1", AccountRow("dnd", chosen_at=T0 + 8), T0 + 9)
    s.set_relations("u1", Relations(frozenset(), frozenset(), "everyone"), T0 + 9)
    s.claim("u1", Claim("invisible", T0 + 4), T0 + 9)  # older than what is stored: loses
    assert s.accounts["u1"].chosen == "dnd"
    assert s.outbox.drain() == []


def test_a_departure_before_the_shard_registered_the_socket_keeps_its_time() -> None:
    # The client left while its connect was still on its way (waiting in a batch, or for a
    # restarting shard): the account was gone at `at`, not when the shard heard of the socket.
    s = state(last_seen=T0 - 500)
    s.connect("u1", "s1", "e1", T0 + 4)
    s.disconnect("u1", "s1", T0 + 5, at=T0 + 1)
    assert s.pending_last_seen == {"u1": T0 + 1}


def test_unread_departures_move_with_their_slots() -> None:
    from actors.core.slots import slot_of

    s = unloaded()
    s.departed("u1", T0 + 3, T0 + 5)
    export = s.export_slots({slot_of("u1")})
    assert export.pending_last_seen == {"u1": T0 + 3} and s.pending_last_seen == {}
    other = unloaded()
    other.import_slots(export, T0 + 6)
    assert other.pending_last_seen == {"u1": T0 + 3}


def test_the_newest_of_two_claims_is_taken_choice_by_choice() -> None:
    from actors.core.shard import Claim

    a, b = Claim("invisible", 4.0, "friends", 9.0), Claim("dnd", 6.0, "nobody", 2.0)
    assert a.newest(b) == b.newest(a) == Claim("dnd", 6.0, "friends", 9.0)
    assert a.newest(Claim()) == a
