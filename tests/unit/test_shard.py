"""The pure shard state: table tests for every operation, and a model-based state machine.

Everything here is checked against protocol.md, not against what the code happens to do:
statuses and their resolution, the audience rule on every frame, `invisible` never leaving the
account, last-seen (departures, freezing while invisible, never backwards, pending until the
FlushActor acknowledges), liveness through edge leases (a socket is dead 90 s after its edge last
refreshed), and presence.changed being sent exactly when the visible status changes.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections import Counter
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.core.effects import (
    Activity,
    Deliver,
    EdgeForgotten,
    Effect,
    OnlineCount,
    PersistChosen,
    PersistVisibility,
    SocketCount,
)
from actors.core.frames import INTERNAL_CHOSEN, INTERNAL_SETTINGS
from actors.core.loaded import NotLoaded
from actors.core.shard import QueryAnswer, ShardState
from actors.core.slots import channel_key, slot_of

from .conftest import T0

# Deliveries as the edges make them: publications expanded per socket (tests/unit/edges_sim.py).
pytestmark = pytest.mark.usefixtures("edges")

TIMEOUT = 90.0

# ---------------------------------------------------------------------------- helpers


def assert_watching_index(state: ShardState) -> None:
    """The index of watching accounts (for the relations sweep and a relations change) is exactly
    a count of the watchers per watching account and target."""
    counted: dict[str, Counter[str]] = {}
    for target, ws in state.watchers.items():
        for w in ws.values():
            counted.setdefault(w.user_id, Counter())[target] += 1
    assert state._watching == counted


def rel(friends: Iterable[str] = (), servers: Iterable[str] = (), vis: str = "everyone") -> Relations:
    return Relations(frozenset(friends), frozenset(servers), vis)


def delivers(effects: list[Effect]) -> list[Deliver]:
    return [e for e in effects if isinstance(e, Deliver)]


def frames_to(effects: list[Effect], socket_id: str) -> list[dict[str, Any]]:
    return [e.frame for e in delivers(effects) if socket_id in e.socket_ids]


def changed_to(effects: list[Effect], socket_id: str, about: str | None = None) -> list[str]:
    """The statuses of the presence.changed frames a socket received (about one account)."""
    return [
        f["status"]
        for f in frames_to(effects, socket_id)
        if f["type"] == "presence.changed" and (about is None or f["userId"] == about)
    ]


def self_to(effects: list[Effect], socket_id: str) -> list[str]:
    return [f["status"] for f in frames_to(effects, socket_id) if f["type"] == "presence.self"]


def of_type(effects: list[Effect], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


class World:
    """A shard with some accounts loaded, like the shell leaves it before an operation."""

    def __init__(
        self,
        relations: dict[str, Relations],
        *,
        rows: dict[str, AccountRow] | None = None,
        now: float = T0,
        **kwargs: Any,
    ) -> None:
        self.now = now
        self.s = ShardState(**kwargs)
        rows = rows or {}
        for user, r in relations.items():
            self.s.set_relations(user, r, now)
            self.s.load_account(user, rows.get(user, AccountRow()), now)
        assert self.s.outbox.drain() == []

    def at(self, dt: float) -> float:
        self.now += dt
        return self.now

    def drain(self) -> list[Effect]:
        return self.s.outbox.drain()


def pair_world(**kwargs: Any) -> World:
    """alice and bob share server g1; carol knows nobody; dave is alice's friend only."""
    return World(
        {
            "alice": rel(friends={"dave"}, servers={"g1"}),
            "bob": rel(servers={"g1"}),
            "carol": rel(servers={"g9"}),
            "dave": rel(friends={"alice"}),
        },
        **kwargs,
    )


# ---------------------------------------------------------------------------- connect / disconnect


class TestConnect:
    def test_first_socket_brings_account_online(self) -> None:
        w = pair_world()
        assert w.s.connect("alice", "a1", "e1", w.now) == "online"
        assert w.s.real_status_of("alice") == "online"
        assert w.s.visible_status_of("alice") == "online"
        effects = w.drain()
        assert SocketCount("alice", "a1", True) in effects
        assert OnlineCount("alice", frozenset({"g1"}), True) in effects
        # The connecting socket learns its status from `ready`, not from presence.self.
        assert self_to(effects, "a1") == []

    def test_second_socket_changes_nothing_visible(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        assert w.s.connect("alice", "a2", "e2", w.at(1)) == "online"
        effects = w.drain()
        assert effects == [SocketCount("alice", "a2", True)]

    def test_reconnecting_same_socket_is_idempotent(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.drain()
        assert w.s.connect("alice", "a1", "e1", w.at(1)) == "online"
        assert w.drain() == []
        assert w.s.live_sockets() == [("alice", "a1")]

    def test_other_sockets_get_presence_self(self) -> None:
        w = pair_world()
        w.s.set_status("alice", "-", "dnd", w.now)
        w.drain()
        # Chosen dnd while offline: the first socket comes up dnd.
        assert w.s.connect("alice", "a1", "e1", w.now) == "dnd"
        w.s.set_status("alice", "a1", "online", w.now)
        effects = w.drain()
        assert self_to(effects, "a1") == ["online"]

    def test_unloaded_account_is_not_loaded(self) -> None:
        w = pair_world()
        with pytest.raises(NotLoaded):
            w.s.connect("nobody-loaded", "x", "e1", w.now)

    def test_durable_invisible_never_shows_online(self) -> None:
        """An account that chose invisible days ago reconnects: not one frame says online."""
        w = pair_world(rows={"alice": AccountRow(chosen_status="invisible", last_seen_at=T0 - 86_400 * 3)})
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        assert w.s.connect("alice", "a1", "e1", w.now) == "invisible"
        w.s.connect("alice", "a2", "e1", w.now)
        effects = w.drain()
        assert changed_to(effects, "b1") == []
        assert of_type(effects, OnlineCount) == []
        assert w.s.visible_status_of("alice") == "offline"
        assert w.s.present_accounts() == []  # nor is it checkpointed
        # The other socket of the account sees the real status.
        assert self_to(effects, "a1") == []  # nothing changed for it: it was already invisible

    @pytest.mark.parametrize("stored", ["idle", "offline", "bogus", ""])
    def test_stored_status_that_cannot_be_chosen_loads_as_online(self, stored: str) -> None:
        w = World({"u": rel()}, rows={"u": AccountRow(chosen_status=stored)})
        assert w.s.connect("u", "s", "e", w.now) == "online"

    def test_load_account_does_not_overwrite_memory(self) -> None:
        w = pair_world()
        w.s.set_status("alice", "-", "invisible", w.now)
        w.s.load_account("alice", AccountRow(chosen_status="online"), w.now)
        assert w.s.connect("alice", "a1", "e1", w.now) == "invisible"


class TestDisconnect:
    def test_last_socket_going_is_a_departure(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e1", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        w.s.disconnect("alice", "a1", w.at(5))
        effects = w.drain()
        assert changed_to(effects, "b1") == []
        assert "alice" not in w.s.pending_last_seen
        w.s.disconnect("alice", "a2", w.at(5))
        effects = w.drain()
        assert changed_to(effects, "b1") == ["offline"]
        assert w.s.pending_last_seen == {"alice": T0 + 10}
        assert w.s.last_seen_to_flush() == [("alice", T0 + 10)]
        assert OnlineCount("alice", frozenset({"g1"}), False) in effects
        assert SocketCount("alice", "a2", False) in effects
        assert w.s.real_status_of("alice") == "offline"
        assert w.s.last_seen_of("alice", w.at(100)) == T0 + 10

    def test_unknown_socket_or_account_is_ignored(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.drain()
        w.s.disconnect("alice", "zzz", w.now)
        w.s.disconnect("ghost", "zzz", w.now)
        assert w.drain() == []
        assert w.s.real_status_of("alice") == "online"

    def test_a_late_removal_never_moves_the_departure_back(self) -> None:
        # a1's handler waited on a restarting shard: a2 and a3 came and went meanwhile, and a1's
        # removal (stamped with its earlier close) ends the account's presence last.
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e2", w.now)
        w.s.disconnect("alice", "a2", w.at(20), at=T0 + 15)
        w.s.disconnect("alice", "a1", w.at(1), at=T0 + 5)
        assert w.s.real_status_of("alice") == "offline"
        assert w.s.pending_last_seen == {"alice": T0 + 15}
        assert w.s.last_seen_of("alice", w.at(100)) == T0 + 15

    def test_an_invisible_accounts_removals_keep_the_frozen_time(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e1", w.now)
        w.s.set_status("alice", "a1", "invisible", w.at(1))
        w.s.disconnect("alice", "a2", w.at(10))
        w.s.disconnect("alice", "a1", w.at(10))
        assert w.s.last_seen_of("alice", w.at(100)) == T0 + 1

    def test_registered_again_with_its_idle_flag_in_one_step(self) -> None:
        w = pair_world()
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        assert w.s.connect("alice", "a1", "e1", w.now, idle=True) == "idle"
        assert changed_to(w.drain(), "b1") == ["idle"]  # never `online` in between

    def test_remaining_sockets_hear_the_status_change(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e2", w.now)
        w.s.set_status("alice", "a1", "idle", w.now)
        w.drain()
        # a2 (awake) goes; the account is now all idle.
        w.s.disconnect("alice", "a2", w.at(1))
        effects = w.drain()
        assert self_to(effects, "a1") == ["idle"]


# ---------------------------------------------------------------------------- statuses


class TestSetStatus:
    def test_idle_only_when_every_live_socket_is_idle(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e1", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        assert w.s.set_status("alice", "a1", "idle", w.now) == "online"
        assert changed_to(w.drain(), "b1") == []
        assert w.s.set_status("alice", "a2", "idle", w.now) == "idle"
        effects = w.drain()
        assert changed_to(effects, "b1") == ["idle"]
        assert self_to(effects, "a1") == ["idle"]
        assert self_to(effects, "a2") == ["idle"]
        # `online` from one socket wakes that socket (and so the account).
        assert w.s.set_status("alice", "a2", "online", w.now) == "online"
        assert changed_to(w.drain(), "b1") == ["online"]

    def test_idle_does_not_persist_or_change_chosen(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.drain()
        w.s.set_status("alice", "a1", "idle", w.now)
        assert of_type(w.drain(), PersistChosen) == []

    def test_idle_is_hidden_under_dnd_and_invisible(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.set_status("alice", "a1", "idle", w.now)
        assert w.s.set_status("alice", "a1", "dnd", w.now) == "dnd"
        assert w.s.set_status("alice", "a1", "invisible", w.now) == "invisible"
        # Back to online with the socket still idle: idle (the socket never woke up).
        assert w.s.set_status("alice", "zzz", "online", w.now) == "idle"

    def test_new_awake_socket_ends_idle(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.set_status("alice", "a1", "idle", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        assert w.s.connect("alice", "a2", "e1", w.at(1)) == "online"
        assert changed_to(w.drain(), "b1") == ["online"]

    def test_idle_from_unknown_socket_is_ignored(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        assert w.s.set_status("alice", "nope", "idle", w.now) == "online"

    def test_chosen_status_is_per_account_and_persisted(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e1", w.now)
        w.drain()
        assert w.s.set_status("alice", "a1", "dnd", w.now) == "dnd"
        effects = w.drain()
        assert of_type(effects, PersistChosen) == [PersistChosen("alice", "dnd", w.now)]
        assert self_to(effects, "a1") == ["dnd"] and self_to(effects, "a2") == ["dnd"]
        # Same again: nothing to persist, nothing to say.
        w.s.set_status("alice", "a2", "dnd", w.now)
        assert w.drain() == []

    def test_chosen_while_offline_applies_on_connect(self) -> None:
        w = pair_world()
        assert w.s.set_status("alice", "-", "invisible", w.now) == "offline"
        assert w.drain() == [PersistChosen("alice", "invisible", w.now)]
        assert w.s.connect("alice", "a1", "e1", w.now) == "invisible"

    @pytest.mark.parametrize("bad", ["offline", "away", "", "ONLINE"])
    def test_unknown_status_raises(self, bad: str) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.drain()
        with pytest.raises(ValueError):
            w.s.set_status("alice", "a1", bad, w.now)
        assert w.drain() == []

    @pytest.mark.parametrize(
        ("before", "after", "told"),
        [
            ("online", "dnd", ["dnd"]),
            ("online", "invisible", ["offline"]),
            ("dnd", "invisible", ["offline"]),
            ("invisible", "online", ["online"]),
            ("invisible", "dnd", ["dnd"]),
            ("dnd", "online", ["online"]),
        ],
    )
    def test_watchers_see_visible_status_self_sees_real(
        self, before: str, after: str, told: list[str]
    ) -> None:
        w = pair_world()
        w.s.set_status("alice", "-", before, w.now)
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e1", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        assert w.s.set_status("alice", "a1", after, w.now) == after
        effects = w.drain()
        assert changed_to(effects, "b1") == told
        assert self_to(effects, "a1") == [after]
        assert self_to(effects, "a2") == [after]
        for d in delivers(effects):
            if d.frame["type"] == "presence.changed":
                assert d.frame["status"] != "invisible"
                assert "lastSeenAt" not in d.frame


class TestInvisibleAndLastSeen:
    def test_going_invisible_is_a_departure_and_freezes_last_seen(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.drain()
        assert w.s.last_seen_of("alice", w.at(30)) == T0 + 30  # present: "now"
        w.s.set_status("alice", "a1", "invisible", w.now)
        assert w.s.pending_last_seen == {"alice": T0 + 30}
        effects = w.drain()
        assert OnlineCount("alice", frozenset({"g1"}), False) in effects
        # Frozen while invisible, however long, and through the last socket going.
        assert w.s.last_seen_of("alice", w.at(3600)) == T0 + 30
        w.s.disconnect("alice", "a1", w.at(60))
        assert w.s.last_seen_of("alice", w.now) == T0 + 30
        assert w.s.pending_last_seen == {"alice": T0 + 30}
        w.drain()
        # Reconnecting invisible moves nothing either.
        w.s.connect("alice", "a2", "e1", w.at(60))
        w.s.disconnect("alice", "a2", w.at(60))
        assert w.s.last_seen_of("alice", w.now) == T0 + 30

    def test_last_seen_thaws_when_a_visible_status_is_chosen(self) -> None:
        w = pair_world()
        w.s.set_status("alice", "-", "invisible", w.now)
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.refresh_edge("e1", w.at(60))
        w.s.set_status("alice", "a1", "dnd", w.at(20))
        assert w.s.pending_last_seen == {}
        assert w.s.last_seen_of("alice", w.at(5)) == T0 + 85
        w.s.disconnect("alice", "a1", w.at(5))
        assert w.s.last_seen_of("alice", w.at(5)) == T0 + 90
        assert w.s.pending_last_seen == {"alice": T0 + 90}

    def test_last_seen_never_moves_backwards_past_stored_value(self) -> None:
        # The stored column is later than this shard's clock (another writer, a skewed node).
        w = pair_world(rows={"alice": AccountRow(last_seen_at=T0 + 500)})
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.disconnect("alice", "a1", w.at(10))
        assert w.s.last_seen_of("alice", w.now) == T0 + 500
        assert w.s.pending_last_seen["alice"] == T0 + 500

    def test_invisible_never_reaches_anybody_else(self) -> None:
        w = pair_world()
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.set_status("alice", "a1", "invisible", w.now)
        w.s.connect("alice", "a2", "e1", w.now)
        w.s.set_status("alice", "a2", "idle", w.now)
        w.s.disconnect("alice", "a1", w.now)
        w.s.disconnect("alice", "a2", w.now)
        for d in delivers(w.drain()):
            if d.frame["status"] == "invisible":
                assert d.frame["type"] in ("presence.self", INTERNAL_CHOSEN)  # _chosen: never forwarded
                assert set(d.socket_ids) <= {"a1", "a2"}
        assert w.s.watch("bob", "b1", "e2", ["alice"], w.now) == [("alice", "offline")]


# ---------------------------------------------------------------------------- liveness


class TestEdgeLeases:
    def test_sockets_die_with_their_edges_lease(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        w.s.refresh_edge("e2", w.at(60))
        w.s.sweep(w.at(30))  # 90 s exactly since e1 last refreshed: still alive
        assert w.s.real_status_of("alice") == "online"
        w.s.refresh_edge("e2", w.now)
        w.s.sweep(w.at(0.5))
        assert w.s.real_status_of("alice") == "offline"
        assert w.s.live_sockets() == []
        assert "e1" not in w.s.edges
        effects = w.drain()
        assert changed_to(effects, "b1") == ["offline"]
        assert SocketCount("alice", "a1", False) in effects

    def test_an_edge_back_after_its_lease_ran_out_is_forgotten_first(self) -> None:
        """The call that renews a lease already run out drops what the edge registered, and says
        so before anything else (`EdgeForgotten`: the shell starts the edge's mail over under a
        new name, and the edge registers again), though the edge holds a lease again after it."""
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.drain()
        w.s.refresh_edge("e1", w.at(91))
        assert w.s.edges == {"e1": w.now}
        assert w.s.live_sockets() == []
        effects = w.drain()
        assert effects[0] == EdgeForgotten("e1")
        assert effects.count(EdgeForgotten("e1")) == 1
        w.s.refresh_edge("e1", w.at(1))
        assert EdgeForgotten("e1") not in w.drain()  # renewed in time: nothing forgotten

    def test_refresh_keeps_sockets_alive(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        for _ in range(20):
            w.s.refresh_edge("e1", w.at(80))
        w.s.sweep(w.now)
        assert w.s.real_status_of("alice") == "online"

    def test_departure_time_is_when_the_lease_ran_out(self) -> None:
        """A clock jump far past the timeout: last-seen is when the socket died, not when noticed."""
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.drain()
        w.s.sweep(w.at(10_000))
        assert w.s.real_status_of("alice") == "offline"
        assert w.s.pending_last_seen == {"alice": T0 + TIMEOUT}
        assert w.s.last_seen_of("alice", w.now) == T0 + TIMEOUT

    def test_departure_is_the_last_socket_to_die(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e2", w.now)  # e2 first in insertion order ...
        w.s.connect("alice", "a2", "e1", w.at(10))  # ... and e1 refreshed later
        w.s.refresh_edge("e2", w.at(20))  # e2 now the later lease: T0 + 30
        w.drain()
        w.s.sweep(w.at(10_000))
        assert w.s.pending_last_seen == {"alice": T0 + 30 + TIMEOUT}

    @pytest.mark.parametrize(
        "op", ["connect", "disconnect", "set_status", "watch", "query", "refresh_edge", "is_focused"]
    )
    def test_every_timed_operation_expires_dead_edges_first(self, op: str) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("bob", "b1", "e2", w.now)
        w.drain()
        now = w.at(TIMEOUT + 1)
        w.s.refresh_edge("e2", now) if op != "refresh_edge" else None
        {
            "connect": lambda: w.s.connect("bob", "b2", "e2", now),
            "disconnect": lambda: w.s.disconnect("bob", "b1", now),
            "set_status": lambda: w.s.set_status("bob", "b1", "dnd", now),
            "watch": lambda: w.s.watch("bob", "b1", "e2", ["alice"], now),
            "query": lambda: w.s.query("bob", None, ["alice"], now),
            "refresh_edge": lambda: w.s.refresh_edge("e2", now),
            "is_focused": lambda: w.s.is_focused("alice", "c", now),
        }[op]()
        assert w.s.real_status_of("alice") == "offline"
        assert w.s.pending_last_seen["alice"] == T0 + TIMEOUT

    def test_checkpoint_chunk_does_not_count_sockets_of_dead_edges(self) -> None:
        w = pair_world(checkpoint_interval_s=200.0)
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("bob", "b1", "e2", w.now)
        w.s.checkpoint_chunk(w.now - 200.0)  # the shard started one interval ago
        w.s.checkpoint_chunk(w.now)  # the round starts with both present
        w.s.refresh_edge("e2", w.at(80))
        rows = w.s.checkpoint_chunk(w.at(20))  # the whole round is due; e1 died at T0 + 90
        assert rows == [("bob", T0 + 100)]
        assert w.s.pending_last_seen == {"alice": T0 + TIMEOUT}

    def test_late_refresh_does_not_resurrect_sockets(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.refresh_edge("e1", w.at(TIMEOUT + 5))
        assert w.s.real_status_of("alice") == "offline"
        assert w.s.edges == {"e1": T0 + TIMEOUT + 5}

    def test_dead_edge_takes_its_watches_and_channel_state(self) -> None:
        w = pair_world()
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.s.channels.load_channel("c1", "g1")
        assert w.s.channels.subscribe("c1", "bob", "b1", "e2")
        assert w.s.channels.voice_join("c1", "bob", "b1", "e2")
        w.s.connect("alice", "a1", "e1", w.at(TIMEOUT + 1))
        assert w.s.watchers == {}
        assert w.s.channels.roster("c1") == []
        assert changed_to(w.drain(), "b1") == []

    def test_drop_edge_is_like_closing_every_socket(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e2", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        w.s.drop_edge("e1", w.at(3))
        assert w.s.real_status_of("alice") == "online"
        w.s.drop_edge("e2", w.at(3))
        assert w.s.real_status_of("alice") == "offline"
        assert w.s.pending_last_seen == {"alice": T0 + 6}
        # bob's watch was on e2 too: gone before alice's departure was announced.
        assert changed_to(w.drain(), "b1") == []

    def test_an_edge_whose_node_died_departs_at_once_stamped_when_last_heard(self) -> None:
        """Issue 25: Ray declared the edge's node dead 60 s after the edge was last heard; its
        accounts go now (not at the lease's end, 30 s later), last seen when it was last heard."""
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.s.refresh_edge("e1", w.at(5))
        w.drain()
        w.s.refresh_edge("e2", w.at(60))
        assert w.s.edge_died("e1", w.now)
        assert w.s.real_status_of("alice") == "offline"
        assert w.s.pending_last_seen == {"alice": T0 + 5}
        assert changed_to(w.drain(), "b1") == ["offline"]
        assert "e1" not in w.s.edges
        assert not w.s.edge_died("e1", w.now)  # once
        assert not w.s.edge_died("never-seen", w.now)


class TestSweepEviction:
    def test_idle_offline_accounts_are_evicted_after_flush(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.disconnect("alice", "a1", w.at(1))
        w.s.sweep(w.at(10_000))
        assert w.s.has_account("alice"), "an unflushed departure must keep the account in memory"
        w.s.last_seen_flushed(w.s.last_seen_to_flush())
        w.s.sweep(w.now)
        assert not w.s.has_account("alice")
        assert not w.s.has_account("bob")  # loaded, never used
        assert w.s.last_seen_of("alice", w.now) is None

    def test_accounts_with_sockets_are_never_evicted(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        for _ in range(20):
            w.s.refresh_edge("e1", w.at(60))
            w.s.sweep(w.now)
        assert w.s.has_account("alice")

    def test_recent_accounts_are_kept(self) -> None:
        w = pair_world()
        w.s.sweep(w.at(599))
        assert w.s.has_account("bob")

    def test_a_large_shard_looks_for_idle_accounts_a_slice_a_sweep(self) -> None:
        """Past `scan_at_least` accounts a sweep looks at a rolling slice (a sweep a
        second no longer walks every account): the idle ones all go within one scan cycle
        after they became evictable, not all in the first sweep that may, never one with a
        socket."""
        users = [f"u{i:03}" for i in range(300)]
        w = World(
            {u: rel(servers={"g1"}) for u in users},
            evict_scan_cycle_s=30.0,
            scan_at_least=10,
        )
        w.s.connect("u000", "s0", "e1", w.now)
        for _ in range(601):  # a sweep a second, as the shell does
            w.s.refresh_edge("e1", w.at(1))
            w.s.sweep(w.now)
        left = len(w.s.accounts)  # every other account idle past account_idle_evict_s now
        assert 1 < left < 300, "the first sweep past the idle time looks at a slice, not at all"
        for _ in range(31):
            w.s.refresh_edge("e1", w.at(1))
            w.s.sweep(w.now)
        assert list(w.s.accounts) == ["u000"], "every idle account went within a cycle"

    def test_relations_and_channels_in_use_survive_the_relations_round(self) -> None:
        """What a batch waiting on a load will apply with (the shell says so: `keep`,
        `keep_channels`) is not swept, referenced here or not; the rest unreferenced goes."""
        w = World({})
        w.s.sweep(w.now)  # the relations' first round, over nothing
        for user in ("carol", "erin"):
            w.s.set_relations(user, rel(servers={"g1"}), w.now)  # referenced by nothing here
        w.s.channels.load_channel("c1", "g1")
        w.s.sweep(w.at(1))  # c1 empty: forgotten at the next sweep, unless in use
        w.s.sweep(w.at(w.s.relations_sweep_s), keep={"carol"}, keep_channels={"c1"})
        assert w.s.missing_relations(["carol", "erin"]) == ["erin"]
        assert w.s.channels.subscribe("c1", "carol", "s1", "e1"), "swept while in use"

    def test_a_channel_subscriber_keeps_its_relations_and_the_channels_are_walked_only_if_needed(
        self,
    ) -> None:
        """A subscriber of a channel here, its account elsewhere: its relations survive the
        round. A round whose candidates are all referenced otherwise never walks the channels'
        subscribers (50 slices a minute would walk them 50 times)."""
        w = World({})
        w.s.sweep(w.now)  # the relations' first round, over nothing
        w.s.set_relations("carol", rel(servers={"g1"}), w.now)  # no account, no watch here
        w.s.channels.load_channel("c1", "g1")
        assert w.s.channels.subscribe("c1", "carol", "s1", "e1")
        w.s.refresh_edge("e1", w.now)
        w.s.sweep(w.at(w.s.relations_sweep_s))
        assert w.s.missing_relations(["carol"]) == [], "a channel subscriber's relations went"

        class Untouchable(dict[str, object]):
            def values(self) -> Any:
                raise AssertionError("the channels were walked for nothing")

        w.s.channels.channels = Untouchable(w.s.channels.channels)  # type: ignore[assignment]
        w.s.refresh_edge("e1", w.now)
        w.s.sweep(w.at(w.s.relations_sweep_s), keep={"carol"})  # kept by the shell: no candidate left
        assert w.s.missing_relations(["carol"]) == []

    def test_a_large_relations_round_goes_in_slices_over_the_next_sweeps(self) -> None:
        """Past `scan_at_least` cached relations a round looks at them in slices over the next
        `relations_round_slices` sweeps (a million members' relations held a shard 0.3 s in one
        sweep): the unreferenced go within the round, a reader read lately survives the round
        after its read and goes at the next, what is referenced stays."""
        w = World({"bob": rel(servers={"g1"})}, scan_at_least=10, relations_round_slices=5)
        w.s.sweep(w.now)  # the first round, over bob alone
        users = [f"r{i:03}" for i in range(100)]
        for u in users:
            w.s.set_relations(u, rel(servers={"g1"}), w.now)  # referenced by nothing here
        w.s.query("r000", None, ["bob"], w.at(1))  # a reader, read in this period
        w.s.sweep(w.at(w.s.relations_sweep_s))  # a round begins: its first slice only
        assert 0 < len(w.s.missing_relations(users)) < 99, "one sweep looked at a slice, not at all"
        for _ in range(5):
            w.s.sweep(w.at(1))
        assert w.s.missing_relations(users) == users[1:], "the unreferenced all went within the round"
        assert w.s.missing_relations(["bob"]) == [], "an account here is referenced"
        w.s.sweep(w.at(w.s.relations_sweep_s))  # the next round: no read since the last
        for _ in range(5):
            w.s.sweep(w.at(1))
        assert w.s.missing_relations(["r000", "bob"]) == ["r000"]

    def test_a_readers_relations_stay_while_it_queries_and_go_a_round_after(self) -> None:
        """A reader referenced by nothing here (its account on another shard): its relations
        survive the round after a query read them, and go at the first round without one."""
        w = pair_world()
        w.s.sweep(w.now)  # the relations' first round
        w.s.set_relations("zed", rel(servers={"g1"}), w.now)  # a reader, no account here
        w.s.query("zed", None, ["bob"], w.at(1))
        w.s.sweep(w.at(w.s.relations_sweep_s))
        assert w.s.missing_relations(["zed"]) == [], "read by a query since the last round"
        w.s.sweep(w.at(w.s.relations_sweep_s))
        assert w.s.missing_relations(["zed"]) == ["zed"], "no query for a whole round"


# ---------------------------------------------------------------------------- watching and audience


class TestWatch:
    def test_sync_answers_only_the_audience(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.drain()
        ans = w.s.watch("bob", "b1", "e2", ["alice", "carol", "dave", "alice"], w.now)
        assert ans == [("alice", "online")]  # server in common; carol and dave are outsiders
        ans = w.s.watch("dave", "d1", "e2", ["alice", "bob"], w.now)
        assert ans == [("alice", "online")]  # friend; bob is nothing to dave
        assert w.drain() == []

    def test_sync_reports_invisible_as_offline(self) -> None:
        w = pair_world()
        w.s.set_status("alice", "-", "invisible", w.now)
        w.s.connect("alice", "a1", "e1", w.now)
        assert w.s.watch("bob", "b1", "e2", ["alice"], w.now) == [("alice", "offline")]

    def test_sync_of_unloaded_target_is_offline(self) -> None:
        w = World({"a": rel(servers={"g"}), "b": rel(servers={"g"})})
        w.s.sweep(w.at(10_000))  # evicts both accounts
        assert w.s.watch("a", "s", "e", ["b"], w.now) == [("b", "offline")]

    def test_outsiders_hear_nothing_and_every_socket_of_insiders_hears(self) -> None:
        w = pair_world()
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.s.watch("bob", "b2", "e3", ["alice"], w.now)
        w.s.watch("carol", "c1", "e2", ["alice"], w.now)
        w.s.connect("alice", "a1", "e1", w.now)
        effects = w.drain()
        assert changed_to(effects, "b1") == ["online"]
        assert changed_to(effects, "b2") == ["online"]
        assert changed_to(effects, "c1") == []
        # One Deliver per edge, the frame without lastSeenAt.
        ds = [d for d in delivers(effects) if d.frame["type"] == "presence.changed"]
        assert sorted(d.edge_id for d in ds) == ["e2", "e3"]
        assert all(d.frame == {"type": "presence.changed", "userId": "alice", "status": "online"} for d in ds)

    def test_unwatch_stops_changes(self) -> None:
        w = pair_world()
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.s.unwatch("b1", "e2", ["alice", "never-watched"])
        w.s.connect("alice", "a1", "e1", w.now)
        assert changed_to(w.drain(), "b1") == []
        assert w.s.watchers == {}

    def test_unwatch_from_another_edge_is_ignored(self) -> None:
        w = pair_world()
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.s.unwatch("b1", "e9", ["alice"])
        w.s.connect("alice", "a1", "e1", w.now)
        assert changed_to(w.drain(), "b1") == ["online"]

    def test_watch_registers_outsiders_so_a_later_friendship_takes_effect(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        assert w.s.watch("carol", "c1", "e2", ["alice"], w.now) == []
        w.drain()
        w.s.set_relations("alice", rel(friends={"dave", "carol"}, servers={"g1"}), w.now)
        w.s.set_relations("carol", rel(friends={"alice"}, servers={"g9"}), w.now)
        effects = w.drain()
        assert changed_to(effects, "c1") == ["online"]  # told the status once it may know it
        w.s.set_status("alice", "a1", "dnd", w.now)
        assert changed_to(w.drain(), "c1") == ["dnd"]

    def test_new_audience_of_offline_account_is_told_offline(self) -> None:
        # Decision (docs/protocol.md): the current status, offline included, so that a view
        # from before an earlier narrowing of the audience cannot stay stale.
        w = pair_world()
        w.s.watch("carol", "c1", "e2", ["alice"], w.now)
        w.s.set_relations("carol", rel(servers={"g9", "g1"}), w.now)
        assert changed_to(w.drain(), "c1") == ["offline"]

    def test_leaving_the_audience_is_silent_and_stops_changes(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        w.s.set_relations("bob", rel(servers=set()), w.now)
        assert changed_to(w.drain(), "b1") == []
        w.s.set_status("alice", "a1", "dnd", w.now)
        w.s.disconnect("alice", "a1", w.now)
        assert changed_to(w.drain(), "b1") == []

    def test_target_leaving_the_server_stops_changes(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.s.watch("dave", "d1", "e2", ["alice"], w.now)
        w.drain()
        w.s.set_relations("alice", rel(friends={"dave"}, servers={"g2"}), w.now)
        effects = w.drain()
        assert OnlineCount("alice", frozenset({"g1"}), False) in effects
        assert OnlineCount("alice", frozenset({"g2"}), True) in effects
        w.s.set_status("alice", "a1", "dnd", w.now)
        effects = w.drain()
        assert changed_to(effects, "b1") == []
        assert changed_to(effects, "d1") == ["dnd"]  # still a friend

    def test_friendship_is_read_from_the_target_side(self) -> None:
        """Friendships are stored on both sides; the shard asks the target's own friend set."""
        w = World({"t": rel(friends={"r"}), "r": rel()})
        assert w.s.audience_of_query("r", ["t"]) == ["t"]
        assert w.s.audience_of_query("t", ["r"]) == []

    def test_relations_change_after_a_dead_edge_counts_under_the_old_servers(self) -> None:
        """The socket died before the account left g1: g1's count must lose it."""
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.drain()
        w.s.set_relations("alice", rel(friends={"dave"}, servers={"g2"}), w.at(TIMEOUT + 1))
        counts = of_type(w.drain(), OnlineCount)
        assert counts == [OnlineCount("alice", frozenset({"g1"}), False)]

    def test_unchanged_relations_do_nothing(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        w.s.set_relations("alice", rel(friends={"dave"}, servers={"g1"}), w.now)
        assert w.drain() == []

    def test_a_relations_change_reads_only_the_watchers_of_what_the_account_watches(self) -> None:
        """A member joining or leaving a big server changes its relations: the shard decides
        again the targets that account watches (and its own watchers), never walking the watchers
        of every other target (issue 28 item 3: O(watchers in the shard) per change before)."""
        members = {f"m{i}": rel(servers={"big"}) for i in range(300)}
        w = World({**members, "joiner": rel(servers={"small"})})
        for i in range(300):  # a member list on screen: each member watches the next ten
            w.s.watch(f"m{i}", f"s{i}", "e1", [f"m{(i + k) % 300}" for k in range(1, 11)], w.now)
        w.s.watch("joiner", "j1", "e2", ["m0", "m1"], w.now)
        w.drain()
        read: list[str] = []

        class Reads(dict[str, dict[str, Any]]):
            def __getitem__(self, target: str) -> dict[str, Any]:
                read.append(target)
                return super().__getitem__(target)

            def get(self, target: str, default: Any = None) -> Any:
                read.append(target)
                return super().get(target, default)

            def items(self) -> Any:
                read.append("*")
                return super().items()

            def values(self) -> Any:
                read.append("*")
                return super().values()

        w.s.watchers = Reads(w.s.watchers)
        w.s.set_relations("joiner", rel(servers={"small", "big"}), w.now)
        assert sorted(set(read)) == ["joiner", "m0", "m1"]  # its own watchers, and its targets'
        assert changed_to(w.drain(), "j1") == ["offline", "offline"]  # came into their audience
        assert_watching_index(w.s)

    def test_missing_relations(self) -> None:
        w = pair_world()
        assert w.s.missing_relations(["zed", "alice", "zed", "yan"]) == ["zed", "yan"]


# ---------------------------------------------------------------------------- queries


class TestQuery:
    def test_online_answer_has_no_timestamp(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        assert w.s.query("bob", None, ["alice"], w.at(5)) == [QueryAnswer("alice", "online", None)]

    def test_offline_answer_truncated_to_the_minute(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.disconnect("alice", "a1", w.at(83.5))
        (a,) = w.s.query("bob", None, ["alice"], w.at(1))
        assert a.status == "offline"
        assert a.last_seen_at == math.floor((T0 + 83.5) / 60) * 60
        assert a.last_seen_at is not None and a.last_seen_at % 60 == 0

    def test_configured_precision(self) -> None:
        w = pair_world(last_seen_precision_s=1)
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.disconnect("alice", "a1", w.at(83.25))
        (a,) = w.s.query("bob", None, ["alice"], w.now)
        assert a.last_seen_at == T0 + 83.25

    def test_invisible_answers_offline_with_frozen_time(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.refresh_edge("e1", w.at(60))
        w.s.set_status("alice", "a1", "invisible", w.at(60))
        (a,) = w.s.query("bob", None, ["alice"], w.at(1))
        assert a == QueryAnswer("alice", "offline", T0 + 120)
        # Still frozen once the socket is long gone.
        (a,) = w.s.query("bob", None, ["alice"], w.at(600))
        assert a == QueryAnswer("alice", "offline", T0 + 120)

    def test_outsiders_are_left_out_not_refused(self) -> None:
        w = pair_world()
        assert w.s.query("carol", None, ["alice", "bob", "dave"], w.now) == []
        assert w.s.audience_of_query("carol", ["alice", "bob", "dave"]) == []

    def test_answers_in_order_without_duplicates(self) -> None:
        w = pair_world()
        got = w.s.query("alice", None, ["bob", "dave", "bob", "carol"], w.now)
        assert [a.user_id for a in got] == ["bob", "dave"]

    def test_never_seen_has_no_timestamp(self) -> None:
        w = pair_world()
        assert w.s.query("bob", None, ["alice"], w.now) == [QueryAnswer("alice", "offline", None)]

    def test_stored_last_seen_is_used(self) -> None:
        w = pair_world(rows={"alice": AccountRow(last_seen_at=T0 - 3600 + 7)})
        assert w.s.query("bob", None, ["alice"], w.now) == [QueryAnswer("alice", "offline", T0 - 3600)]

    @pytest.mark.parametrize(
        ("setting", "bob_sees", "dave_sees"),
        [("everyone", True, True), ("friends", False, True), ("nobody", False, False)],
    )
    def test_target_setting(self, setting: str, bob_sees: bool, dave_sees: bool) -> None:
        w = pair_world(rows={"alice": AccountRow(last_seen_at=T0 - 120)})
        w.s.set_visibility("alice", setting, w.now)
        (for_bob,) = w.s.query("bob", None, ["alice"], w.now)
        (for_dave,) = w.s.query("dave", None, ["alice"], w.now)
        assert (for_bob.last_seen_at is not None) is bob_sees
        assert (for_dave.last_seen_at is not None) is dave_sees
        assert for_bob.status == for_dave.status == "offline"  # the status is never withheld

    def test_nobody_is_reciprocal_and_session_setting_wins(self) -> None:
        w = pair_world(rows={"alice": AccountRow(last_seen_at=T0 - 120)})
        (a,) = w.s.query("bob", "nobody", ["alice"], w.now)
        assert a.last_seen_at is None
        w.s.set_visibility("bob", "nobody", w.now)
        (a,) = w.s.query("bob", None, ["alice"], w.now)
        assert a.last_seen_at is None
        # The session knows better (a settings.update not yet reloaded): effective at once.
        (a,) = w.s.query("bob", "everyone", ["alice"], w.now)
        assert a.last_seen_at == T0 - 120
        (a,) = w.s.query("bob", "friends", ["alice"], w.now)
        assert a.last_seen_at == T0 - 120  # narrowing to friends costs nothing

    def test_query_of_account_not_loaded_is_not_loaded(self) -> None:
        w = World({"a": rel(servers={"g"}), "b": rel(servers={"g"})})
        w.s.sweep(w.at(10_000))
        with pytest.raises(NotLoaded):
            w.s.query("a", None, ["b"], w.now)

    @pytest.mark.parametrize("reader_setting", ["everyone", "friends", "nobody"])
    @pytest.mark.parametrize("target_setting", ["everyone", "friends", "nobody"])
    def test_friends_are_answered_without_the_readers_relations_as_with_them(
        self, reader_setting: str, target_setting: str
    ) -> None:
        """dave's relations are not loaded on this shard (it does not own him); alice names him a
        friend, so her answer is the one his relations would give, for every pair of settings."""
        rows = {"alice": AccountRow(last_seen_at=T0 - 120)}
        without = pair_world(rows=rows)
        with_them = pair_world(rows=rows)
        for w in (without, with_them):
            w.s.set_visibility("alice", target_setting, w.now)
            w.s.set_visibility("dave", reader_setting, w.now)
        del without.s.relations["dave"]
        assert not without.s.query_needs_reader("dave", ["alice"])
        assert without.s.audience_of_query("dave", ["alice"]) == ["alice"]
        got = without.s.query("dave", reader_setting, ["alice"], without.now)
        assert got == with_them.s.query("dave", reader_setting, ["alice"], with_them.now)
        shown = reader_setting != "nobody" and target_setting != "nobody"
        assert (got[0].last_seen_at is not None) is shown
        assert "dave" not in without.s.relations  # nothing was made up and kept

    def test_the_readers_relations_are_needed_for_anyone_but_a_friend(self) -> None:
        w = pair_world()
        del w.s.relations["bob"], w.s.relations["dave"]
        assert w.s.query_needs_reader("bob", ["alice"])  # a server in common: bob's servers decide
        assert w.s.query_needs_reader("dave", ["alice", "carol"])  # carol is no friend of his
        assert w.s.query_needs_reader("dave", ["dave"])  # himself: his own relations
        assert w.s.query_needs_reader("dave", ["alice", "bob"])  # bob's relations are not loaded
        assert not w.s.query_needs_reader("alice", ["bob", "carol"])  # loaded: nothing to load
        for reader, targets in [("bob", ["alice"]), ("dave", ["alice", "carol"]), ("dave", ["dave"])]:
            with pytest.raises(NotLoaded):
                w.s.query(reader, "everyone", targets, w.now)
            with pytest.raises(NotLoaded):
                w.s.audience_of_query(reader, targets)
        # Without the reader's own setting (the shell always sends it), nothing stands in for it.
        with pytest.raises(NotLoaded):
            w.s.query("dave", None, ["alice"], w.now)


_Q_USERS = ["a", "b", "c", "d"]
_Q_SETTINGS = st.sampled_from(["everyone", "friends", "nobody"])
_Q_STATUSES = st.sampled_from([None, "online", "dnd", "invisible"])  # None: no socket


@given(
    friendships=st.sets(st.tuples(st.sampled_from(_Q_USERS), st.sampled_from(_Q_USERS))),
    members=st.fixed_dictionaries({u: st.frozensets(st.sampled_from(["g1", "g2"])) for u in _Q_USERS}),
    settings_of=st.fixed_dictionaries({u: _Q_SETTINGS for u in _Q_USERS}),
    seen=st.fixed_dictionaries({u: st.none() | st.sampled_from([T0 - 3600, T0 - 61]) for u in _Q_USERS}),
    statuses=st.fixed_dictionaries({u: _Q_STATUSES for u in _Q_USERS}),
    reader=st.sampled_from(_Q_USERS),
    reader_setting=_Q_SETTINGS,
    targets=st.lists(st.sampled_from(_Q_USERS), max_size=5),
)
@settings(max_examples=300, deadline=None)
def test_a_query_spared_the_readers_relations_answers_as_with_them(
    friendships: set[tuple[str, str]],
    members: dict[str, frozenset[str]],
    settings_of: dict[str, str],
    seen: dict[str, float | None],
    statuses: dict[str, str | None],
    reader: str,
    reader_setting: str,
    targets: list[str],
) -> None:
    """A shard that does not own the reader (its relations not loaded there): whenever
    `query_needs_reader` spares them, the answers are exactly those its relations would give; when
    it does not, the query refuses (`NotLoaded`) instead of guessing."""

    def relations(u: str) -> Relations:
        friends = {b for a, b in friendships if a == u} | {a for a, b in friendships if b == u}
        return Relations(frozenset(friends - {u}), members[u], settings_of[u])

    def world() -> World:
        rows = {u: AccountRow(last_seen_at=seen[u]) for u in _Q_USERS}
        w = World({u: relations(u) for u in _Q_USERS}, rows=rows)
        for i, u in enumerate(_Q_USERS):
            status = statuses[u]
            if status is not None:
                w.s.connect(u, f"s{i}", "e1", w.now)
                if status != "online":
                    w.s.set_status(u, f"s{i}", status, w.now)
        w.drain()
        return w

    loaded, spared = world(), world()
    del spared.s.relations[reader]
    expected = loaded.s.query(reader, reader_setting, targets, loaded.now)
    if spared.s.query_needs_reader(reader, targets):
        with pytest.raises(NotLoaded):
            spared.s.query(reader, reader_setting, targets, spared.now)
    else:
        assert spared.s.audience_of_query(reader, targets) == loaded.s.audience_of_query(reader, targets)
        assert spared.s.query(reader, reader_setting, targets, spared.now) == expected
        # Spared exactly when every target is another account that names the reader a friend.
        pairs = friendships | {(b, a) for a, b in friendships}
        assert all(t != reader and (t, reader) in pairs for t in targets)


class TestSettingsAndFocus:
    def test_set_visibility_persists_once(self) -> None:
        w = pair_world()
        w.s.set_visibility("alice", "friends", w.now)
        w.s.set_visibility("alice", "friends", w.now)
        assert w.drain() == [PersistVisibility("alice", "friends", w.now)]  # no socket to tell
        r = w.s.relations["alice"]
        assert (r.friends, r.servers, r.last_seen_visibility) == (
            frozenset({"dave"}),
            frozenset({"g1"}),
            "friends",
        )

    def test_set_visibility_tells_only_the_accounts_own_sockets(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e2", w.now)
        w.s.connect("bob", "b1", "e1", w.now)
        w.s.watch("bob", "b1", "e1", ["alice"], w.now)
        w.drain()
        w.s.set_visibility("alice", "nobody", w.now)
        effects = w.drain()
        internal = [d for d in delivers(effects) if d.frame["type"] == INTERNAL_SETTINGS]
        assert sorted(s for d in internal for s in d.socket_ids) == ["a1", "a2"]
        assert all(
            d.frame == {"type": INTERNAL_SETTINGS, "lastSeenVisibility": "nobody", "at": w.now}
            for d in internal
        )
        assert INTERNAL_SETTINGS.startswith("_"), "the edge forwards no frame whose type starts with _"
        assert frames_to(effects, "b1") == []

    def test_a_setting_changed_outside_the_websocket_is_told_to_the_accounts_sockets(self) -> None:
        """The host application's UPDATE (or `presence load`) reaches the shard as reloaded
        relations: the account's sockets are told, as after a `settings.update`, since their
        queries carry the reader's own setting (the reciprocal `nobody` rule). Untold, a socket
        open before the change read everybody's last-seen while its own was hidden. Nothing is
        persisted: the database said so."""
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.drain()
        w.s.set_relations("alice", rel(friends={"dave"}, servers={"g1"}, vis="nobody"), w.at(5))
        effects = w.drain()
        told = {"type": INTERNAL_SETTINGS, "lastSeenVisibility": "nobody", "at": w.now}
        assert frames_to(effects, "a1") == [told]
        assert of_type(effects, PersistVisibility) == []
        # The same relations again, or an account not connected here: nothing.
        w.s.set_relations("alice", rel(friends={"dave"}, servers={"g1"}, vis="nobody"), w.at(1))
        w.s.set_relations("bob", rel(servers={"g1"}, vis="nobody"), w.now)
        assert w.drain() == []

    def test_leaving_a_server_leaves_the_voice_rosters_of_its_channels(self) -> None:
        w = pair_world()
        w.s.channels.load_channel("c1", "g1")
        assert w.s.channels.subscribe("c1", "alice", "a1", "e1")
        assert w.s.channels.voice_join("c1", "bob", "b1", "e1")
        w.drain()
        w.s.set_relations("bob", rel(servers=set()), w.at(1))
        assert frames_to(w.drain(), "a1") == [{"type": "voice.roster", "channelId": "c1", "userIds": []}]
        assert w.s.channels.roster("c1") == []

    @pytest.mark.parametrize("bad", ["", "all", "Friends", "public"])
    def test_unknown_visibility_raises(self, bad: str) -> None:
        w = pair_world()
        with pytest.raises(ValueError):
            w.s.set_visibility("alice", bad, w.now)

    def test_focus_of_any_live_socket(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e2", w.now)
        w.s.set_focus("alice", "a1", "c1")
        w.s.set_focus("alice", "ghost", "c2")
        assert w.s.is_focused("alice", "c1", w.now)
        assert not w.s.is_focused("alice", "c2", w.now)
        assert not w.s.is_focused("bob", "c1", w.now)
        w.s.set_focus("alice", "a1", None)
        assert not w.s.is_focused("alice", "c1", w.now)
        w.s.set_focus("alice", "a2", "c1")
        w.s.refresh_edge("e1", w.at(TIMEOUT + 1))
        assert not w.s.is_focused("alice", "c1", w.now), "a2's edge died: its focus went with it"


class TestLastSeenDurability:
    def test_flushed_keeps_newer_pending_value(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.disconnect("alice", "a1", w.at(1))
        batch = w.s.last_seen_to_flush()
        assert batch == [("alice", T0 + 1)]
        # Back and gone again while the batch is being written.
        w.s.connect("alice", "a2", "e1", w.at(1))
        w.s.disconnect("alice", "a2", w.at(1))
        w.s.last_seen_flushed(batch)
        assert w.s.last_seen_to_flush() == [("alice", T0 + 3)]
        w.s.last_seen_flushed([("alice", T0 + 3)])
        assert w.s.last_seen_to_flush() == []

    def test_flushed_ignores_unknown_and_replays(self) -> None:
        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.disconnect("alice", "a1", w.at(1))
        w.s.last_seen_flushed([("bob", T0), ("alice", T0)])  # older than pending: kept
        assert w.s.last_seen_to_flush() == [("alice", T0 + 1)]
        w.s.last_seen_flushed([("alice", T0 + 1)])
        w.s.last_seen_flushed([("alice", T0 + 1)])
        assert w.s.last_seen_to_flush() == []

    def test_to_flush_is_sorted_and_one_per_account(self) -> None:
        w = pair_world()
        for user, sock in (("dave", "d"), ("alice", "a"), ("bob", "b")):
            w.s.connect(user, sock, "e1", w.now)
        for user, sock in (("bob", "b"), ("dave", "d"), ("alice", "a")):
            w.s.disconnect(user, sock, w.at(1))
        w.s.connect("bob", "b2", "e1", w.now)
        w.s.disconnect("bob", "b2", w.at(1))
        assert w.s.last_seen_to_flush() == [("alice", T0 + 3), ("bob", T0 + 4), ("dave", T0 + 2)]

    def test_checkpoint_lists_visibly_present_accounts(self) -> None:
        w = pair_world()
        w.s.connect("bob", "b1", "e1", w.now)
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.set_status("alice", "a1", "idle", w.now)
        w.s.connect("dave", "d1", "e1", w.now)
        w.s.set_status("dave", "d1", "invisible", w.now)
        w.s.connect("carol", "c1", "e1", w.now)
        w.s.set_status("carol", "c1", "dnd", w.now)
        assert sorted(w.s.present_accounts()) == [
            ("alice", frozenset({"g1"})),
            ("bob", frozenset({"g1"})),
            ("carol", frozenset({"g9"})),
        ]
        assert w.s.socket_count() == 4


# ---------------------------------------------------------------------------- self-view


def test_query_about_oneself_reports_real_status() -> None:
    w = pair_world()
    w.s.set_status("alice", "-", "invisible", w.now)
    w.s.connect("alice", "a1", "e1", w.now)
    (a,) = w.s.query("alice", None, ["alice"], w.now)
    assert a.status == "invisible"


def test_sync_about_oneself_reports_real_status() -> None:
    w = pair_world()
    w.s.set_status("alice", "-", "invisible", w.now)
    w.s.connect("alice", "a1", "e1", w.now)
    assert w.s.watch("alice", "a1", "e1", ["alice"], w.now) == [("alice", "invisible")]


def test_changes_to_a_socket_watching_its_own_account_carry_the_real_status() -> None:
    w = pair_world()
    w.s.connect("alice", "a1", "e1", w.now)
    w.s.connect("alice", "a2", "e1", w.now)
    assert w.s.watch("alice", "a1", "e1", ["alice"], w.now) == [("alice", "online")]
    w.s.watch("bob", "b1", "e2", ["alice"], w.now)
    w.drain()
    w.s.set_status("alice", "a2", "invisible", w.now)
    effects = w.drain()
    assert changed_to(effects, "a1", about="alice") == ["invisible"]
    assert changed_to(effects, "b1", about="alice") == ["offline"]
    # One socket of an invisible account goes: nothing changes for anybody.
    w.s.disconnect("alice", "a2", w.now)
    assert frames_to(w.drain(), "b1") == []
    w.s.set_status("alice", "a1", "online", w.now)
    effects = w.drain()
    assert changed_to(effects, "a1", about="alice") == ["online"]
    assert changed_to(effects, "b1", about="alice") == ["online"]


# ---------------------------------------------------------------------------- audience re-entry


def _reentry_world() -> World:
    w = pair_world()
    w.s.connect("alice", "a1", "e1", w.now)
    assert w.s.watch("bob", "b1", "e2", ["alice"], w.now) == [("alice", "online")]
    w.s.set_relations("bob", rel(servers=set()), w.now)  # bob leaves g1: out of alice's audience
    w.drain()
    return w


def test_watcher_back_in_audience_learns_account_went_offline() -> None:
    w = _reentry_world()
    w.s.disconnect("alice", "a1", w.at(10))
    w.drain()
    w.s.set_relations("bob", rel(servers={"g1"}), w.now)
    assert changed_to(w.drain(), "b1", about="alice") == ["offline"]


def test_watcher_back_in_audience_is_told_the_current_status() -> None:
    """Decision (docs/protocol.md): a widened audience receives one presence.changed with the current
    status, even if this watcher had been told the same status before it left."""
    w = _reentry_world()
    w.s.set_relations("bob", rel(servers={"g1"}), w.now)
    assert changed_to(w.drain(), "b1", about="alice") == ["online"]


# ---------------------------------------------------------------------------- the state machine

USERS = ("u0", "u1", "u2")
SERVERS = ("g0", "g1")
EDGES = ("e0", "e1")
PAIRS = tuple(frozenset((a, b)) for i, a in enumerate(USERS) for b in USERS[i + 1 :])
SOCKETS = {f"{u}/s{k}": (u, EDGES[k]) for u in USERS for k in range(2)}  # s0 on e0, s1 on e1
OWNER = {s: u for s, (u, _) in SOCKETS.items()}
EDGE_OF = {s: e for s, (_, e) in SOCKETS.items()}
UNKNOWN = "?"  # what a watcher knows after it left the audience (it was told nothing)
VISIBILITY = ("everyone", "friends", "nobody")

# Mostly no time passes, sometimes a little; big jumps (either side of the 90 s socket timeout,
# past the 600 s eviction of idle accounts) are a rule of their own, so that sockets live long
# enough in most runs to see frames flow.
dts = st.sampled_from([0.0] * 10 + [0.5, 1.0, 5.0, 10.0, 30.0])
jumps = st.sampled_from([45.0, 60.0, 89.0, 89.5, 90.0, 90.5, 91.0, 120.0, 150.0, 600.0, 700.0, 10_000.0])
users = st.sampled_from(USERS)
# A socket, as (prefer a live one?, index): half the time an operation targets a socket that is
# connected, which idle flags, closes and focus need in order to matter.
sockets = st.tuples(st.booleans(), st.integers(0, len(SOCKETS) - 1))
chosen_st = st.sampled_from(["online", "dnd", "invisible"])


class ShardMachine(RuleBasedStateMachine):
    """A model of the contract beside the real state; every operation is applied to both.

    The model is written from protocol.md: a socket is live while its edge's lease is under 90 s
    old; the real status follows from the chosen status and the live sockets' idle flags; a
    departure (visibly present → not) happens at the moment the last socket died or the account
    hid, and stamps last-seen. The shell is emulated too: every operation from an edge starts with
    that edge refreshing its lease (or with the operation itself, which expires dead edges
    first), accounts evicted from memory are reloaded from the "database" before use.
    """

    def __init__(self) -> None:
        super().__init__()
        # Changes are published at once here (the model has no coalescing; test_budgets has it).
        self.state = ShardState(socket_timeout_s=TIMEOUT, status_publications=10**9)
        self.now = T0
        self.lease: dict[str, float] = {}
        self.conn: dict[str, bool] = {}  # live socket → idle flag
        self.focus: dict[str, str] = {}
        self.chosen: dict[str, str] = {}
        self.db_chosen: dict[str, str] = {}
        self.db_vis: dict[str, str] = {}
        self.rel: dict[str, Relations] = {}  # what the shard has been told, in lock-step
        self.watches: set[tuple[str, str]] = set()  # (socket, target)
        self.told: dict[tuple[str, str], str] = {}  # what each watch was last told
        self.self_told: dict[str, str] = {}  # what each live socket was last told of its own status
        self.expected_ls: dict[str, float | None] = {}
        self.db_ls: dict[str, float | None] = {}
        self.pending: dict[str, float] = {}
        self.inflight: list[tuple[str, float]] = []
        self.online: dict[str, set[str]] = {g: set() for g in SERVERS}
        self.counted_sockets: set[tuple[str, str]] = set()
        self.last_reading: dict[str, float] = {}
        self.stale = False  # time jumped and nothing has run since: the shard has not looked yet
        self._sub_start()

    # ---------------------------------------------------------------- the model

    def real(self, u: str) -> str:
        flags = [idle for s, idle in self.conn.items() if OWNER[s] == u]
        if not flags:
            return "offline"
        if self.chosen[u] in ("invisible", "dnd"):
            return self.chosen[u]
        return "idle" if all(flags) else "online"

    def visible(self, u: str) -> str:
        r = self.real(u)
        return "offline" if r == "invisible" else r

    def present(self, u: str) -> bool:
        return self.real(u) in ("online", "idle", "dnd")

    def status_for(self, target: str, reader: str) -> str:
        """protocol.md: the account's own sockets see its real status, everybody else the visible one."""
        return self.real(target) if target == reader else self.visible(target)

    def aud(self, target: str, reader: str, rels: dict[str, Relations] | None = None) -> bool:
        """protocol.md: shares a server or has an accepted friendship (as the shard knows it)."""
        if target == reader:
            return True
        rels = self.rel if rels is None else rels
        t, r = rels[target], rels[reader]
        return reader in t.friends or bool(set(t.servers) & set(r.servers))

    def event(self, t: float, mutate: Any) -> None:
        """Apply a change that happens at time `t`, recording departures and visible statuses."""
        before = {u: self.present(u) for u in USERS}
        mutate()
        for u in USERS:
            if before[u] and not self.present(u):
                seen = self.expected_ls[u]
                self.expected_ls[u] = t if seen is None else max(seen, t)
                self.pending[u] = max(self.pending.get(u, -math.inf), self.expected_ls[u])  # type: ignore[arg-type]
            v = self.visible(u)
            if self.history[u][-1] != v:
                self.history[u].append(v)
            r = self.real(u)
            if self.real_history[u][-1] != r:
                self.real_history[u].append(r)

    def model_expire(self) -> None:
        """Edges whose lease ran out die, in the order they died, at the moment they died."""
        for edge, refreshed in sorted(self.lease.items(), key=lambda kv: kv[1]):
            if self.now - refreshed <= TIMEOUT:
                continue

            def drop(edge: str = edge) -> None:
                for s, target in list(self.watches):
                    if EDGE_OF[s] == edge:
                        self.watches.discard((s, target))
                        self.told.pop((s, target), None)
                for s in [s for s in self.conn if EDGE_OF[s] == edge]:
                    del self.conn[s]
                    self.focus.pop(s, None)
                    self.self_told.pop(s, None)
                del self.lease[edge]

            self.event(refreshed + TIMEOUT, drop)

    def need(self, *users: str) -> None:
        """What the shell does before an operation: load the relations the shard no longer caches."""
        for u in self.state.missing_relations(users):
            self.state.set_relations(u, self.rel[u], self.now)

    def load(self, u: str) -> None:
        """What the shell does before an operation that needs the account in memory."""
        if not self.state.has_account(u):
            assert self.db_ls[u] == self.expected_ls[u], "evicted with a last-seen the database does not have"
            row = AccountRow(self.db_chosen[u], self.db_vis[u], self.db_ls[u])
            self.state.load_account(u, row, self.now)

    def sock(self, pick: tuple[bool, int] | str) -> str:
        if isinstance(pick, str):
            return pick
        live, i = pick
        if live and self.conn:
            live_ones = sorted(self.conn)
            return live_ones[i % len(live_ones)]
        return sorted(SOCKETS)[i]

    def begin(self, dt: float) -> None:
        self.now += dt
        self.stale = False

    def _sub_start(self) -> None:
        self.watches_at_start = set(self.watches)
        self.conn_at_start = set(self.conn)
        self.history: dict[str, list[str]] = {u: [self.visible(u)] for u in USERS} if self.chosen else {}
        self.real_history: dict[str, list[str]] = {u: [self.real(u)] for u in USERS} if self.chosen else {}

    def drain_check(self, audience_changed: bool = False, before: dict[str, Relations] | None = None) -> None:
        """Check every effect of the last operation against the model, then start a new sub-step.

        `before`: the relations before an audience change made in this sub-step. Sockets that died
        before the change are reported under the relations of that moment, so a frame may be
        right under either.
        """
        per_watch: Counter[tuple[str, str]] = Counter()
        for e in self.state.outbox.drain():
            if isinstance(e, Deliver):
                assert e.socket_ids, "a Deliver without recipients"
                assert len(set(e.socket_ids)) == len(e.socket_ids)
                for s in e.socket_ids:
                    assert EDGE_OF[s] == e.edge_id, f"{s} addressed through the wrong edge"
                kind = e.frame["type"]
                if kind == "presence.changed":
                    assert set(e.frame) == {"type", "userId", "status"}, (
                        "a broadcast never carries lastSeenAt"
                    )
                    target, status = e.frame["userId"], e.frame["status"]
                    for s in e.socket_ids:
                        watcher = OWNER[s]
                        if watcher != target:
                            assert status in ("online", "idle", "dnd", "offline"), (
                                "invisible reached a watcher"
                            )
                        assert (s, target) in self.watches_at_start, f"{s} does not watch {target}"
                        assert self.aud(target, watcher) or (
                            before is not None and self.aud(target, watcher, before)
                        ), f"{target} told to {watcher}, outside its audience"
                        prev = self.told.get((s, target))
                        if prev not in (None, UNKNOWN):
                            assert status != prev, f"duplicate presence.changed {status} of {target} to {s}"
                        self.told[(s, target)] = status
                        per_watch[(s, target)] += 1
                elif kind == "presence.self":
                    assert set(e.frame) == {"type", "status"}
                    for s in e.socket_ids:
                        assert s in self.conn_at_start or s in self.conn, (
                            "presence.self to a socket not connected"
                        )
                        self.self_told[s] = e.frame["status"]
                elif kind == INTERNAL_SETTINGS:
                    # Internal (never forwarded by the edge): the account's own sockets learn its setting.
                    assert set(e.frame) == {"type", "lastSeenVisibility", "at"}
                    for s in e.socket_ids:
                        assert s in self.conn, "internal settings frame to a socket not connected"
                        assert e.frame["lastSeenVisibility"] == self.rel[OWNER[s]].last_seen_visibility
                elif kind == INTERNAL_CHOSEN:
                    # Internal too: the account's own sockets learn its choice (claimed after a restart).
                    assert set(e.frame) == {"type", "status", "at"}
                    for s in e.socket_ids:
                        assert s in self.conn, "internal chosen frame to a socket not connected"
                else:
                    raise AssertionError(f"unexpected frame {e.frame}")
            elif isinstance(e, PersistChosen):
                assert e.status in ("online", "dnd", "invisible")
                self.db_chosen[e.user_id] = e.status
            elif isinstance(e, PersistVisibility):
                self.db_vis[e.user_id] = e.visibility
            elif isinstance(e, OnlineCount):
                for g in e.servers:
                    if e.present:
                        assert e.user_id not in self.online[g], "counted online twice"
                        self.online[g].add(e.user_id)
                    else:
                        assert e.user_id in self.online[g], "uncounted while not counted"
                        self.online[g].discard(e.user_id)
            elif isinstance(e, SocketCount):
                key = (e.user_id, e.socket_id)
                if e.alive:
                    assert key not in self.counted_sockets
                    self.counted_sockets.add(key)
                else:
                    assert key in self.counted_sockets
                    self.counted_sockets.discard(key)
        # (7) No more frames than the visible status changed (+1 for a new audience's first word).
        for (s, target), n in per_watch.items():
            history = self.real_history if OWNER[s] == target else self.history
            changes = len(history[target]) - 1
            assert n <= changes + int(audience_changed), (
                f"{n} frames for {changes} changes of {target} to {s}"
            )
        # A watcher outside the audience is told nothing, so afterwards it knows nothing for sure.
        for s, target in self.watches:
            if not self.aud(target, OWNER[s]):
                self.told[(s, target)] = UNKNOWN
        self._sub_start()

    # ---------------------------------------------------------------- set-up

    @initialize(
        # Dense on purpose (each friendship and membership a coin flip): frames only flow
        # inside audiences, and sparse relations would leave most runs silent.
        friendships=st.fixed_dictionaries({p: st.booleans() for p in PAIRS}).map(
            lambda d: {p for p, on in d.items() if on}
        ),
        members=st.fixed_dictionaries(
            {
                u: st.fixed_dictionaries({g: st.booleans() for g in SERVERS}).map(
                    lambda d: {g for g, on in d.items() if on}
                )
                for u in USERS
            }
        ),
        vis=st.fixed_dictionaries({u: st.sampled_from(VISIBILITY) for u in USERS}),
        chosen=st.fixed_dictionaries({u: chosen_st for u in USERS}),
        seen=st.fixed_dictionaries({u: st.none() | st.floats(T0 - 10**6, T0) for u in USERS}),
        watching=st.fixed_dictionaries({s: st.sets(users) for s in sorted(SOCKETS)}),
        connected=st.sets(sockets),
    )
    def setup(
        self,
        friendships: set[frozenset[str]],
        members: dict[str, set[str]],
        vis: dict[str, str],
        chosen: dict[str, str],
        seen: dict[str, float | None],
        watching: dict[str, set[str]],
        connected: set[str],
    ) -> None:
        for u in USERS:
            friends = {v for pair in friendships if u in pair for v in pair if v != u}
            self.rel[u] = rel(friends, members[u], vis[u])
            self.state.set_relations(u, self.rel[u], self.now)
        self.chosen, self.db_chosen, self.db_vis = dict(chosen), dict(chosen), dict(vis)
        self.expected_ls, self.db_ls = dict(seen), dict(seen)
        self._sub_start()
        for s, targets in watching.items():
            watcher, edge = SOCKETS[s]
            targets = sorted(targets)
            answer = self.state.watch(watcher, s, edge, targets, self.now)
            self.lease[edge] = self.now
            assert answer == [(t, "offline") for t in targets if self.aud(t, watcher)]
            self.watches.update((s, t) for t in targets)
            self.told.update(((s, t), "offline") for t, _ in answer)
        self.drain_check()
        for s in sorted(connected):
            self.connect(0.0, s, refresh=False)

    # ---------------------------------------------------------------- sockets

    @rule(dt=dts, s=sockets, refresh=st.booleans())
    def connect(self, dt: float, s: Any, refresh: bool) -> None:
        self.begin(dt)
        s = self.sock(s)
        u, edge = SOCKETS[s]
        if refresh:
            self.state.refresh_edge(edge, self.now)
        self.model_expire()
        self.need(u)
        self.load(u)
        status = self.state.connect(u, s, edge, self.now)
        self.lease[edge] = self.now

        def add() -> None:
            if s not in self.conn:
                self.conn[s] = False
                self.focus.pop(s, None)

        self.event(self.now, add)
        assert status == self.real(u)
        self.drain_check()
        self.self_told[s] = status  # `ready`

    @rule(dt=dts, s=sockets, refresh=st.booleans(), close=st.booleans())
    def disconnect(self, dt: float, s: Any, refresh: bool, close: bool) -> None:
        """A socket closes; with `close` the edge also unwatches everything it watched."""
        self.begin(dt)
        s = self.sock(s)
        u, edge = SOCKETS[s]
        if refresh:
            self.state.refresh_edge(edge, self.now)
        self.model_expire()
        if refresh:
            self.lease[edge] = self.now
        self.state.disconnect(u, s, self.now)

        def remove() -> None:
            self.conn.pop(s, None)
            self.focus.pop(s, None)
            self.self_told.pop(s, None)

        self.event(self.now, remove)
        if close:
            targets = sorted(t for w, t in self.watches if w == s)
            self.state.unwatch(s, edge, targets)
            for t in targets:
                self.watches.discard((s, t))
                self.told.pop((s, t), None)
        self.drain_check()

    @rule(
        dt=dts,
        s=sockets,
        status=st.sampled_from(["online", "idle", "dnd", "invisible"]),
        refresh=st.booleans(),
    )
    def set_status(self, dt: float, s: Any, status: str, refresh: bool) -> None:
        self.begin(dt)
        s = self.sock(s)
        u, edge = SOCKETS[s]
        if refresh:
            self.state.refresh_edge(edge, self.now)
        self.model_expire()
        if refresh:
            self.lease[edge] = self.now
        self.need(u)
        self.load(u)
        got = self.state.set_status(u, s, status, self.now)

        def change() -> None:
            if status == "idle":
                if s in self.conn:
                    self.conn[s] = True
            else:
                if status == "online" and s in self.conn:
                    self.conn[s] = False
                self.chosen[u] = status

        self.event(self.now, change)
        assert got == self.real(u)
        self.drain_check()

    # The operations that change statuses twice as likely as the others.
    connect_again = rule(dt=dts, s=sockets, refresh=st.booleans())(
        lambda self, dt, s, refresh: self.connect(dt, s, refresh)
    )
    set_status_again = rule(
        dt=dts,
        s=sockets,
        status=st.sampled_from(["online", "idle", "dnd", "invisible"]),
        refresh=st.booleans(),
    )(lambda self, dt, s, status, refresh: self.set_status(dt, s, status, refresh))

    @rule(dt=dts, e=st.sampled_from(EDGES))
    def refresh_edge(self, dt: float, e: str) -> None:
        self.begin(dt)
        self.state.refresh_edge(e, self.now)
        self.model_expire()
        self.lease[e] = self.now
        self.drain_check()

    @rule(dt=jumps)
    def jump(self, dt: float) -> None:
        """Time passes with nothing happening; whatever runs next must notice dead edges itself."""
        self.now += dt
        self.stale = True

    @rule(dt=dts)
    def sweep(self, dt: float) -> None:
        self.begin(dt)
        self.state.sweep(self.now)
        self.model_expire()
        self.drain_check()

    @rule(dt=dts, s=sockets, channel=st.none() | st.sampled_from(["c1", "c2"]))
    def focus_and_ask(self, dt: float, s: Any, channel: str | None) -> None:
        self.begin(dt)
        s = self.sock(s)
        u, edge = SOCKETS[s]
        self.state.refresh_edge(edge, self.now)
        self.model_expire()
        self.lease[edge] = self.now
        self.state.set_focus(u, s, channel)
        if s in self.conn and channel is not None:
            self.focus[s] = channel
        else:
            self.focus.pop(s, None)
        for c in ("c1", "c2"):
            expected = any(self.focus.get(x) == c for x in self.conn if OWNER[x] == u)
            assert self.state.is_focused(u, c, self.now) == expected
        self.drain_check()

    # ---------------------------------------------------------------- watching and querying

    @rule(dt=dts, s=sockets, ids=st.lists(users, min_size=1, max_size=4), refresh=st.booleans())
    def watch(self, dt: float, s: Any, ids: list[str], refresh: bool) -> None:
        self.begin(dt)
        s = self.sock(s)
        watcher, edge = SOCKETS[s]
        targets = list(ids)  # oneself included: own sockets see the real status
        if refresh:
            self.state.refresh_edge(edge, self.now)
        self.model_expire()
        self.need(watcher, *targets)
        answer = self.state.watch(watcher, s, edge, targets, self.now)
        self.lease[edge] = self.now
        expected = [(t, self.status_for(t, watcher)) for t in dict.fromkeys(targets) if self.aud(t, watcher)]
        assert answer == expected
        # Frames the watch caused (dead edges it expired first) went to the existing watches before
        # the answer was made; the sync then tells this socket the current status.
        self.drain_check()
        for t in targets:
            self.watches.add((s, t))
        for t, status in answer:
            self.told[(s, t)] = status
        self._sub_start()

    @rule(dt=dts, s=sockets, ids=st.lists(users, max_size=4))
    def unwatch(self, dt: float, s: Any, ids: list[str]) -> None:
        targets = ids
        self.begin(dt)
        s = self.sock(s)
        edge = EDGE_OF[s]
        self.state.refresh_edge(edge, self.now)
        self.model_expire()
        self.lease[edge] = self.now
        self.state.unwatch(s, edge, targets)
        for t in targets:
            self.watches.discard((s, t))
            self.told.pop((s, t), None)
        self.drain_check()

    @rule(
        dt=dts,
        s=sockets,
        ids=st.lists(users, max_size=5),
        override=st.none() | st.sampled_from(VISIBILITY),
        refresh=st.booleans(),
    )
    def query(self, dt: float, s: Any, ids: list[str], override: str | None, refresh: bool) -> None:
        self.begin(dt)
        s = self.sock(s)
        reader, edge = SOCKETS[s]
        targets = list(ids)
        if refresh:
            self.state.refresh_edge(edge, self.now)
        # As the shell: the reader's relations only if an answer may depend on them (and the
        # query carries the reader's setting, as the edge's always do).
        self.need(*targets)
        if override is None or self.state.query_needs_reader(reader, targets):
            self.need(reader)
        in_aud = self.state.audience_of_query(reader, targets)
        assert in_aud == [t for t in dict.fromkeys(targets) if self.aud(t, reader)]
        # What the shell loads first: exactly the audience's accounts not in memory.
        to_load = self.state.accounts_to_load_for_query(reader, targets)
        assert to_load == [t for t in in_aud if not self.state.has_account(t)]
        for t in in_aud:
            self.load(t)
        answers = self.state.query(reader, override, targets, self.now)
        self.model_expire()
        if refresh:
            self.lease[edge] = self.now
        reader_vis = override or self.rel[reader].last_seen_visibility
        expected = []
        for t in in_aud:
            seen = None
            ls = self.expected_ls[t]
            trel = self.rel[t]
            if t == reader:
                # Decision (visibility.py): an account reads its own time whatever its setting.
                if not self.present(t) and ls is not None:
                    seen = math.floor(ls / 60) * 60.0
            elif (
                not self.present(t)
                and ls is not None
                and reader_vis != "nobody"
                and trel.last_seen_visibility != "nobody"
                and (trel.last_seen_visibility == "everyone" or reader in trel.friends)
            ):
                seen = math.floor(ls / 60) * 60.0
            expected.append(QueryAnswer(t, self.status_for(t, reader), seen))
        assert answers == expected
        self.drain_check()

    @rule(dt=dts, s=sockets, vis=st.sampled_from(VISIBILITY))
    def settings_update(self, dt: float, s: Any, vis: str) -> None:
        self.begin(dt)
        s = self.sock(s)
        u, edge = SOCKETS[s]
        self.state.refresh_edge(edge, self.now)
        self.model_expire()
        self.lease[edge] = self.now
        self.need(u)
        self.state.set_visibility(u, vis, self.now)
        r = self.rel[u]
        self.rel[u] = Relations(r.friends, r.servers, vis)
        self.drain_check()
        assert self.db_vis[u] == vis

    # ---------------------------------------------------------------- audience changes

    def _set_rel(self, u: str, new: Relations) -> None:
        """The database changed; like the shell's reload loop, only a shard caching the account
        reloads it (one that does not loads the new row when it next needs it)."""
        cached = not self.state.missing_relations([u])
        before = dict(self.rel)
        self.rel[u] = new
        if cached:
            self.state.set_relations(u, new, self.now)
        self.drain_check(audience_changed=True, before=before)

    @rule(dt=dts | jumps, pair=st.sampled_from(PAIRS), flip=st.booleans(), sweep_first=st.booleans())
    def toggle_friendship(self, dt: float, pair: frozenset[str], flip: bool, sweep_first: bool) -> None:
        self.begin(dt)
        a, b = sorted(pair, reverse=flip)
        sweep_first = sweep_first or bool(self.state.missing_relations([a]))  # else nothing expires
        if sweep_first:
            self.state.sweep(self.now)
        self.model_expire()
        if sweep_first:
            self.drain_check()
        adding = b not in self.rel[a].friends
        for x, y in ((a, b), (b, a)):
            r = self.rel[x]
            friends = r.friends | {y} if adding else r.friends - {y}
            self._set_rel(x, Relations(friends, r.servers, r.last_seen_visibility))

    @rule(dt=dts | jumps, u=users, g=st.sampled_from(SERVERS), sweep_first=st.booleans())
    def toggle_membership(self, dt: float, u: str, g: str, sweep_first: bool) -> None:
        self.begin(dt)
        sweep_first = sweep_first or bool(self.state.missing_relations([u]))  # else nothing expires
        if sweep_first:
            self.state.sweep(self.now)
        self.model_expire()
        if sweep_first:
            self.drain_check()
        r = self.rel[u]
        servers = r.servers - {g} if g in r.servers else r.servers | {g}
        self._set_rel(u, Relations(r.friends, servers, r.last_seen_visibility))

    # ---------------------------------------------------------------- durability

    @rule()
    def flush_begin(self) -> None:
        entries = self.state.last_seen_to_flush()
        assert entries == sorted(self.pending.items())
        self.inflight = entries  # a batch still in flight is forgotten: as if its write failed

    @precondition(lambda self: bool(self.inflight))
    @rule()
    def flush_ack(self) -> None:
        self.state.last_seen_flushed(self.inflight)
        for u, ts in self.inflight:
            self.db_ls[u] = ts if self.db_ls[u] is None else max(self.db_ls[u], ts)  # type: ignore[type-var]
            if self.pending.get(u, math.inf) <= ts:
                del self.pending[u]
        self.inflight = []

    @rule(dt=dts)
    def checkpoint(self, dt: float) -> None:
        self.begin(dt)
        entries = self.state.checkpoint_chunk(self.now)
        self.model_expire()
        present = sorted(u for u in USERS if self.present(u))
        assert sorted(u for u, _ in self.state.present_accounts()) == present
        # A slice of the round: only accounts visibly present now, at now.
        assert all(u in present and ts == self.now for u, ts in entries)
        for u, ts in entries:
            self.db_ls[u] = ts if self.db_ls[u] is None else max(self.db_ls[u], ts)  # type: ignore[type-var]
        self.drain_check()

    # ---------------------------------------------------------------- invariants

    @invariant()
    def watching_index_counts_the_watchers(self) -> None:
        assert_watching_index(self.state)

    @invariant()
    def statuses_follow_live_sockets(self) -> None:
        if not self.chosen or self.stale:
            return
        # (1) offline iff no live socket; a socket is live iff its edge's lease is fresh.
        assert sorted(self.state.live_sockets()) == sorted((OWNER[s], s) for s in self.conn)
        assert self.state.edges == self.lease
        for s in self.conn:
            assert self.now - self.lease[EDGE_OF[s]] <= TIMEOUT
        for u in USERS:
            real = self.state.real_status_of(u)
            assert real == self.real(u), f"{u}: shard says {real}, contract says {self.real(u)}"
            assert (real == "offline") == (not any(OWNER[s] == u for s in self.conn))
            # (5) idle only when every live socket is idle and the chosen status is online.
            if real == "idle":
                assert self.chosen[u] == "online"
                assert all(idle for s, idle in self.conn.items() if OWNER[s] == u)
            if self.state.has_account(u):
                assert self.state.accounts[u].chosen == self.chosen[u]
        # The durable copy follows every choice.
        assert self.db_chosen == self.chosen

    @invariant()
    def last_seen(self) -> None:
        if not self.chosen or self.stale:
            return
        # (6) pending holds every departure not yet acknowledged, with its time.
        assert self.state.pending_last_seen == self.pending
        for u in USERS:
            memory = self.state.last_seen_of(u, self.now)
            if self.present(u):
                assert memory == self.now
                reading = self.now
            else:
                values = [v for v in (memory, self.db_ls[u]) if v is not None]
                reading = max(values) if values else None
                assert reading == self.expected_ls[u], (
                    f"{u}: last-seen {reading}, expected {self.expected_ls[u]}"
                )
            if reading is not None:
                assert reading >= self.last_reading.get(u, -math.inf), "last-seen moved backwards"
                self.last_reading[u] = reading

    @invariant()
    def counts(self) -> None:
        if not self.chosen or self.stale:
            return
        for g in SERVERS:
            assert self.online[g] == {u for u in USERS if self.present(u) and g in self.rel[u].servers}
        assert self.counted_sockets == {(OWNER[s], s) for s in self.conn}

    @invariant()
    def watchers_are_up_to_date(self) -> None:
        """(7) A watcher in the audience knows the current status (never a stale one): the visible
        status, or the real one for the account's own sockets."""
        if self.stale:
            return
        for s, target in self.watches:
            if not self.aud(target, OWNER[s]):
                continue
            known = self.told.get((s, target))
            assert known == self.status_for(target, OWNER[s]), f"{s} thinks {target} is {known}"
        for s in self.conn:
            assert self.self_told.get(s) == self.real(OWNER[s]), f"{s} was not told its own status"


ShardMachine.TestCase.settings = settings(
    max_examples=200,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestShardMachine = ShardMachine.TestCase


def test_state_is_copyable() -> None:
    """The resize path exports state; a deep copy must be an independent, equal shard."""
    w = pair_world()
    w.s.connect("alice", "a1", "e1", w.now)
    clone = copy.deepcopy(w.s)
    clone.disconnect("alice", "a1", w.now)
    assert w.s.real_status_of("alice") == "online"
    assert clone.real_status_of("alice") == "offline"


# ---------------------------------------------------------------------------- resize: export / import


def test_export_takes_everything_of_the_slots_and_nothing_else() -> None:
    w = World({"u0": rel(servers={"g"}), "u4": rel(servers={"g"}), "u1": rel(servers={"g"})})
    w.s.connect("u0", "a", "e1", w.now)
    w.s.connect("u4", "b", "e2", w.now)
    w.s.connect("u1", "c", "e1", w.now)
    w.s.disconnect("u1", "c", w.at(1))  # u1 departs: pending
    w.s.watch("u4", "b", "e2", ["u0", "u1"], w.now)
    w.s.channels.load_channel("ca", "g")
    w.s.channels.subscribe("ca", "u4", "b", "e2")
    w.s.channels.voice_join("ca", "u0", "a", "e1")
    w.drain()
    slots = {slot_of("u0"), slot_of("u1"), slot_of(channel_key("ca"))}
    export = w.s.export_slots(slots)
    assert w.drain() == [], "an export changes nobody's view: nothing is emitted"
    assert sorted(a.user_id for a in export.accounts) == ["u0", "u1"]
    assert export.pending_last_seen == {"u1": T0 + 1}
    assert set(export.watchers) == {"u0", "u1"}
    assert [c.channel_id for c in export.channels] == ["ca"]
    assert export.edges == {"e1": T0, "e2": T0 + 1}  # each lease as last renewed (the watch renewed e2)
    assert w.s.users_of_export(export) == {"u0", "u1", "u4"}
    # The source keeps nothing of those slots ...
    assert not w.s.has_account("u0") and not w.s.has_account("u1")
    assert w.s.pending_last_seen == {}
    assert set(w.s.watchers) == set()
    assert not w.s.channels.knows("ca")
    assert w.s.live_sockets() == [("u4", "b")]
    # ... and its other accounts go on as before.
    w.s.disconnect("u4", "b", w.at(1))
    assert w.s.pending_last_seen == {"u4": T0 + 2}


def test_import_restores_everything_silently() -> None:
    src = World({"u0": rel(servers={"g"}), "u4": rel(servers={"g"})})
    src.s.connect("u0", "a", "e1", src.now)
    src.s.set_status("u0", "a", "dnd", src.now)
    src.s.watch("u4", "b", "e2", ["u0"], src.now)
    src.drain()
    export = src.s.export_slots({slot_of("u0")})
    dst = World({"u0": rel(servers={"g"}), "u4": rel(servers={"g"})})
    dst.s.sweep(dst.at(700))  # the destination has nothing in memory for them
    dst.s.refresh_edge("e2", dst.now - 650)  # an older lease of its own: the fresher one wins
    dst.s.import_slots(export, src.at(10))
    # No frame and no count change; only the active counts hear again of the live account.
    assert dst.drain() == [Activity("u0", True, src.now)]
    assert dst.s.real_status_of("u0") == "dnd"
    assert dst.s.edges == {"e1": T0, "e2": T0 + 50}
    # The watcher hears the next change from the new owner; the lease still runs from its last renewal.
    dst.s.disconnect("u0", "a", T0 + 20)
    effects = dst.drain()
    assert changed_to(effects, "b") == ["offline"]
    assert dst.s.pending_last_seen == {"u0": T0 + 20}
    assert dst.s.present_accounts() == []


def test_import_keeps_the_later_pending_value_and_expires_dead_edges() -> None:
    src = World({"u0": rel()})
    src.s.connect("u0", "a", "e1", src.now)
    src.s.disconnect("u0", "a", src.at(5))
    src.s.connect("u0", "a2", "e1", src.now)
    export = src.s.export_slots({slot_of("u0")})
    dst = World({"u0": rel()})
    dst.s.pending_last_seen["u0"] = T0 + 1  # an older value (a replayed departure)
    dst.s.import_slots(export, T0 + 5 + TIMEOUT + 1)  # e1's lease ran out while the slot moved
    assert dst.s.real_status_of("u0") == "offline"
    assert dst.s.pending_last_seen == {"u0": T0 + 5 + TIMEOUT}


OPS_USERS = ("u0", "u1", "u4", "u5")  # two in even slots, two in odd ones
OPS_CHANNELS = ("c4", "ca")
OPS_SOCKETS = {f"{u}-{k}": (u, f"e{k}") for u in OPS_USERS for k in (1, 2)}

op = st.one_of(
    st.tuples(st.just("connect"), st.sampled_from(sorted(OPS_SOCKETS))),
    st.tuples(st.just("disconnect"), st.sampled_from(sorted(OPS_SOCKETS))),
    st.tuples(
        st.just("status"),
        st.sampled_from(sorted(OPS_SOCKETS)),
        st.sampled_from(["online", "idle", "dnd", "invisible"]),
    ),
    st.tuples(
        st.just("watch"),
        st.sampled_from(sorted(OPS_SOCKETS)),
        st.lists(st.sampled_from(OPS_USERS), max_size=4),
    ),
    st.tuples(
        st.just("unwatch"),
        st.sampled_from(sorted(OPS_SOCKETS)),
        st.lists(st.sampled_from(OPS_USERS), max_size=4),
    ),
    st.tuples(
        st.just("query"),
        st.sampled_from(sorted(OPS_SOCKETS)),
        st.lists(st.sampled_from(OPS_USERS), max_size=4),
        st.sampled_from(VISIBILITY),
    ),
    st.tuples(st.just("settings"), st.sampled_from(OPS_USERS), st.sampled_from(VISIBILITY)),
    st.tuples(st.just("member"), st.sampled_from(OPS_USERS), st.sampled_from(["g1", "g2"])),
    st.tuples(st.just("subscribe"), st.sampled_from(OPS_CHANNELS), st.sampled_from(sorted(OPS_SOCKETS))),
    st.tuples(st.just("typing"), st.sampled_from(OPS_CHANNELS), st.sampled_from(sorted(OPS_SOCKETS))),
    st.tuples(st.just("voice"), st.sampled_from(OPS_CHANNELS), st.sampled_from(sorted(OPS_SOCKETS))),
    st.tuples(st.just("tick"), st.sampled_from([1.0, 5.0, 30.0, 89.0, 91.0, 700.0])),
    st.tuples(st.just("flush")),
    st.tuples(st.just("resize"), st.integers(0, 1), st.sets(st.sampled_from([*OPS_USERS, *OPS_CHANNELS]))),
)


class Cluster:
    """One shard, or two that own slots by a map; the same operations routed as the edges route them."""

    def __init__(self, shards: int) -> None:
        self.shards = [ShardState(socket_timeout_s=TIMEOUT) for _ in range(shards)]
        self.owner = {s: s % shards for s in range(4096)}
        self.vis = dict.fromkeys(OPS_USERS, "everyone")
        self.servers = {u: {"g1"} for u in OPS_USERS}
        for sh in self.shards:
            for u in OPS_USERS:
                sh.set_relations(u, rel(servers=self.servers[u]), T0)
                sh.load_account(u, AccountRow(), T0)

    def of(self, key: str) -> ShardState:
        return self.shards[self.owner[slot_of(key)]]

    def of_channel(self, channel: str, user: str | None = None, now: float = T0) -> ShardState:
        sh = self.of(channel_key(channel))
        if user is not None:
            self.need(sh, [user], now)
        if not sh.channels.knows(channel):
            sh.channels.load_channel(channel, "g1")
        return sh

    def by_owner(self, keys: list[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for k in keys:
            out.setdefault(self.owner[slot_of(k)], []).append(k)
        return out

    def need(self, sh: ShardState, users: list[str], now: float) -> None:
        for u in sh.missing_relations(users):
            sh.set_relations(u, rel(servers=self.servers[u], vis=self.vis[u]), now)

    def load(self, user: str, now: float) -> None:
        sh = self.of(user)
        self.need(sh, [user], now)
        if not sh.has_account(user):
            sh.load_account(user, AccountRow(last_seen_at=self.stored.get(user)), now)

    stored: dict[str, float] = {}

    def apply(self, op: tuple[Any, ...], now: float) -> Any:
        kind = op[0]
        for sh in self.shards:  # the shell sweeps every second
            sh.sweep(now)
        if kind in ("connect", "disconnect", "status", "watch", "unwatch", "query", "subscribe", "voice"):
            edge = OPS_SOCKETS[op[1] if kind not in ("subscribe", "voice") else op[2]][1]
            for sh in self.shards:  # every edge renews its lease on every shard
                sh.refresh_edge(edge, now)
        if kind == "connect":
            user, edge = OPS_SOCKETS[op[1]]
            self.load(user, now)
            return self.of(user).connect(user, op[1], edge, now)
        if kind == "disconnect":
            user, edge = OPS_SOCKETS[op[1]]
            self.of(user).disconnect(user, op[1], now)
            for sh in self.shards:
                sh.unwatch(op[1], edge, OPS_USERS)
            for c in OPS_CHANNELS:
                self.of_channel(c).channels.drop_socket(op[1], [c])
            return None
        if kind == "status":
            user = OPS_SOCKETS[op[1]][0]
            self.load(user, now)
            return self.of(user).set_status(user, op[1], op[2], now)
        if kind == "watch":
            user, edge = OPS_SOCKETS[op[1]]
            answers: dict[str, str] = {}
            for i, targets in self.by_owner(op[2]).items():
                self.need(self.shards[i], [user, *targets], now)
                answers.update(self.shards[i].watch(user, op[1], edge, targets, now))
            return [(t, answers[t]) for t in dict.fromkeys(op[2]) if t in answers]
        if kind == "unwatch":
            user, edge = OPS_SOCKETS[op[1]]
            for i, targets in self.by_owner(op[2]).items():
                self.shards[i].unwatch(op[1], edge, targets)
            return None
        if kind == "query":
            reader = OPS_SOCKETS[op[1]][0]
            found: dict[str, QueryAnswer] = {}
            for i, targets in self.by_owner(op[2]).items():
                self.need(self.shards[i], [reader, *targets], now)
                for t in self.shards[i].audience_of_query(reader, targets):
                    self.load(t, now)
                found.update((a.user_id, a) for a in self.shards[i].query(reader, op[3], targets, now))
            return [found[t] for t in dict.fromkeys(op[2]) if t in found]
        if kind == "settings":
            self.load(op[1], now)
            self.of(op[1]).set_visibility(op[1], op[2], now)
            self.vis[op[1]] = op[2]
            for sh in self.shards:  # the database announces the change to every shard caching it
                if not sh.missing_relations([op[1]]):
                    sh.set_relations(op[1], rel(servers=self.servers[op[1]], vis=op[2]), now)
            return None
        if kind == "member":
            self.servers[op[1]] ^= {op[2]}
            for sh in self.shards:  # every shard that caches the account reloads it
                if not sh.missing_relations([op[1]]):
                    sh.set_relations(op[1], rel(servers=self.servers[op[1]], vis=self.vis[op[1]]), now)
            return None
        if kind == "subscribe":
            user, edge = OPS_SOCKETS[op[2]]
            return self.of_channel(op[1], user, now).channels.subscribe(op[1], user, op[2], edge)
        if kind == "typing":
            user = OPS_SOCKETS[op[2]][0]
            return self.of_channel(op[1], user, now).channels.typing_start(op[1], user, now)
        if kind == "voice":
            user, edge = OPS_SOCKETS[op[2]]
            return self.of_channel(op[1], user, now).channels.voice_join(op[1], user, op[2], edge)
        if kind == "flush":
            for sh in self.shards:
                entries = sh.last_seen_to_flush()
                for u, ts in entries:
                    self.stored[u] = max(ts, self.stored.get(u, ts))
                sh.last_seen_flushed(entries)
            return None
        if kind == "resize":
            if len(self.shards) == 1:
                return None
            src, dst = self.shards[op[1]], self.shards[1 - op[1]]
            keys = [k if k in OPS_USERS else channel_key(k) for k in op[2]]
            slots = {slot_of(k) for k in keys if self.owner[slot_of(k)] == op[1]}
            export = src.export_slots(slots)
            self.need(dst, sorted(dst.users_of_export(export)), now)  # as the shell's import_slots does
            dst.import_slots(export, now)
            for s in slots:
                self.owner[s] = 1 - op[1]
            return None
        raise AssertionError(kind)

    def effects(self) -> Counter[tuple[Any, ...]]:
        out: Counter[tuple[Any, ...]] = Counter()
        for sh in self.shards:
            for e in sh.outbox.drain():
                if isinstance(e, Deliver):
                    for s in e.socket_ids:
                        out[("deliver", e.edge_id, s, repr(sorted(e.frame.items())))] += 1
                elif isinstance(e, EdgeForgotten):
                    out[("EdgeForgotten", e.edge_id)] = 1  # each shard that held the edge forgets it
                else:
                    out[(type(e).__name__, repr(e))] += 1
        return out

    def view(self, now: float) -> dict[str, Any]:
        pending: dict[str, float] = {}
        for sh in self.shards:
            assert_watching_index(sh)
            assert not set(pending) & set(sh.pending_last_seen), "a departure pending on two shards"
            pending.update(sh.pending_last_seen)
        return {
            "status": {u: self.of(u).real_status_of(u) for u in OPS_USERS},
            "seen": {u: self.of(u).last_seen_of(u, now) for u in OPS_USERS},
            "pending": pending,
            "sockets": sorted(x for sh in self.shards for x in sh.live_sockets()),
            "rosters": {c: self.of(channel_key(c)).channels.roster(c) for c in OPS_CHANNELS},
            "focus": {u: self.of(u).is_focused(u, "none", now) for u in OPS_USERS},
        }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40))
def test_moving_slots_loses_nothing(ops: list[tuple[Any, ...]]) -> None:
    """Two shards that move slots between them at any moment behave exactly like one shard:
    the same answers, the same frames to the same sockets, the same statuses, last-seen values,
    pending departures, sockets and rosters. (design.md: no socket, status, watcher or unflushed
    last-seen may be lost by a resize.)"""
    one, two = Cluster(1), Cluster(2)
    one.stored, two.stored = {}, {}
    now = T0
    for o in ops:
        if o[0] == "tick":
            now += o[1]
            continue
        assert one.apply(o, now) == two.apply(o, now), o
        mine, theirs = one.effects(), two.effects()
        if o[0] == "resize":
            # The importing shard tells the active counts again of each live account it took
            # over (an idempotent rewrite of its score); nothing else may differ.
            again = [k for k in theirs if k[0] == "Activity" and "live=True" in k[1]]
            for k in again:
                del theirs[k]
        assert mine == theirs, o
        assert one.view(now) == two.view(now), o


# ---------------------------------------------------------------------------- claims after a restart


class TestClaim:
    def test_an_acknowledged_choice_comes_back_before_the_socket(self) -> None:
        # The dead incarnation acknowledged `invisible`; PostgreSQL still says `online`.
        from actors.core.shard import Claim

        w = pair_world()
        w.s.watch("bob", "b1", "e2", ["alice"], w.now)
        w.drain()
        w.s.claim("alice", Claim("invisible", T0 - 5, "nobody", T0 - 5), w.now)
        assert w.s.connect("alice", "a1", "e1", w.now) == "invisible"
        effects = w.drain()
        assert changed_to(effects, "b1") == []  # never `online` to anybody
        assert PersistChosen("alice", "invisible", T0 - 5) in effects  # with the time it was chosen
        assert PersistVisibility("alice", "nobody", T0 - 5) in effects
        assert w.s.relations["alice"].last_seen_visibility == "nobody"

    def test_the_newest_choice_wins_and_unknown_times_never_do(self) -> None:
        from actors.core.shard import Claim

        w = pair_world()
        w.s.claim("alice", Claim("dnd", T0 - 5), w.now)
        w.s.claim("alice", Claim("invisible", T0 - 9), w.now)  # older: ignored
        w.s.claim("bob", Claim("dnd", 0.0), w.now)  # unknown time: the database's value stays
        assert w.s.connect("alice", "a1", "e1", w.now) == "dnd"
        assert w.s.connect("bob", "b1", "e1", w.now) == "online"
        w.s.set_status("alice", "a1", "online", w.at(1))  # chosen here later: newer than the claim
        w.s.claim("alice", Claim("dnd", T0 - 5), w.now)
        assert w.s.real_status_of("alice") == "online"

    def test_choices_are_told_to_every_socket_with_their_time(self) -> None:
        from actors.core.frames import INTERNAL_CHOSEN

        w = pair_world()
        w.s.connect("alice", "a1", "e1", w.now)
        w.s.connect("alice", "a2", "e2", w.now)
        w.drain()
        w.s.set_status("alice", "a1", "dnd", w.at(1))
        w.s.set_visibility("alice", "friends", w.at(1))
        effects = w.drain()
        for sid in ("a1", "a2"):
            frames = frames_to(effects, sid)
            assert {"type": INTERNAL_CHOSEN, "status": "dnd", "at": T0 + 1} in frames
            assert {"type": INTERNAL_SETTINGS, "lastSeenVisibility": "friends", "at": T0 + 2} in frames

    def test_the_moment_it_hid_comes_back_as_its_last_seen(self) -> None:
        from actors.core.shard import Claim

        w = pair_world(rows={"alice": AccountRow(last_seen_at=T0 - 100)})
        w.s.claim("alice", Claim("invisible", T0 - 5), w.now)
        w.s.connect("alice", "a1", "e1", w.now)
        assert w.s.pending_last_seen == {"alice": T0 - 5}
        assert w.s.last_seen_of("alice", w.at(50)) == T0 - 5

    def test_unsaved_accounts_are_not_evicted(self) -> None:
        w = pair_world(account_idle_evict_s=10.0)
        w.s.sweep(w.at(100), keep={"alice"})
        assert w.s.has_account("alice")
        assert not w.s.has_account("bob")


def test_what_was_not_loaded_raises_not_loaded_not_key_error() -> None:
    """The shell answers UNAVAILABLE to `NotLoaded` only; it is no KeyError, so a KeyError stays
    a bug (tests/unit/test_shard_shell.py)."""
    state = ShardState()
    with pytest.raises(NotLoaded) as unloaded:
        state.connect("nobody", "s1", "edge-a", T0)
    assert not isinstance(unloaded.value, KeyError)
    assert unloaded.value.key == "nobody"
    state.load_account("alice", AccountRow(), T0)
    state.set_relations("alice", rel(), T0)
    with pytest.raises(NotLoaded, match="relations 'carol'"):
        state.watch("alice", "s1", "edge-a", ("carol",), T0)
    with pytest.raises(NotLoaded, match="channel 'c1'"):
        state.channels.channels["c1"]


def test_loaded_data_pickles_with_what_it_holds() -> None:
    state = ShardState()
    state.load_account("alice", AccountRow(), T0)
    copy = pickle.loads(pickle.dumps(state.accounts))
    assert copy.keys() == {"alice"}
    with pytest.raises(NotLoaded):
        copy["bob"]
