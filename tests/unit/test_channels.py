"""Channel state: typing (lapse, repeats, stop), voice rosters, membership checks, clean-up.

protocol.md: typing lapses after 10 s unless repeated; `voice.roster` goes to subscribers after
subscribe and after each change; only members of the channel's server may subscribe, type or
join (`not_allowed` otherwise). Project decisions (docs/protocol.md): the typist's own sockets
get no `typing` frame; repeats re-broadcast only after 7 s, and `typing.stop` does not reset
that (a stop/start pair is a repeat); one roster entry per socket, one id per account on the wire.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from actors.core.audience import Relations
from actors.core.channels import ChannelState
from actors.core.effects import Deliver, Outbox
from actors.core.loaded import NotLoaded

from .conftest import T0, Clock


def member_of(*servers: str) -> Relations:
    return Relations(frozenset(), frozenset(servers), "everyone")


class Chan:
    """A channel shard with channel c1 (server g1) and c2 (server g2) loaded."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.outbox = Outbox()
        self.relations: dict[str, Relations] = {
            "ann": member_of("g1", "g2"),
            "ben": member_of("g1"),
            "cy": member_of("g1"),
            "out": member_of("g9"),
        }
        self.c = ChannelState(self.outbox, self.relations, typing_lapse_s=10.0)
        self.c.load_channel("c1", "g1")
        self.c.load_channel("c2", "g2")

    def frames(self) -> list[tuple[str, tuple[str, ...], dict[str, Any]]]:
        out = []
        for e in self.outbox.drain():
            assert isinstance(e, Deliver)
            out.append((e.edge_id, e.socket_ids, e.frame))
        return out

    def to(self, socket_id: str) -> list[dict[str, Any]]:
        return [f for _, sockets, f in self.frames() if socket_id in sockets]


def typing_frame(user: str, channel: str = "c1") -> dict[str, str]:
    return {"type": "typing", "channelId": channel, "userId": user}


def roster(users: list[str], channel: str = "c1") -> dict[str, Any]:
    return {"type": "voice.roster", "channelId": channel, "userIds": users}


@pytest.fixture
def ch(clock: Clock) -> Chan:
    return Chan(clock)


# ---------------------------------------------------------------------------- membership


class TestMembership:
    def test_outsiders_are_refused_everything(self, ch: Chan) -> None:
        assert ch.c.subscribe("c1", "out", "o1", "e1") is False
        assert ch.c.typing_start("c1", "out", T0) is False
        assert ch.c.voice_join("c1", "out", "o1", "e1") is False
        assert ch.frames() == []
        assert ch.c.roster("c1") == []
        assert ch.c.typing_users("c1", T0) == []

    def test_member_of_another_server_is_refused(self, ch: Chan) -> None:
        assert ch.c.subscribe("c2", "ben", "b1", "e1") is False

    def test_unknown_channel_and_serverless_channel_are_refused(self, ch: Chan) -> None:
        ch.c.load_channel("nope", None)  # what the shell loads for a channel the store does not know
        assert ch.c.subscribe("nope", "ann", "a1", "e1") is False
        ch.c.load_channel("dm", None)
        assert ch.c.subscribe("dm", "ann", "a1", "e1") is False
        assert ch.c.typing_start("dm", "ann", T0) is False
        assert ch.c.voice_join("dm", "ann", "a1", "e1") is False
        assert not ch.c.allowed("dm", "ann")

    def test_unknown_user_is_refused(self, ch: Chan) -> None:
        ch.relations["ghost"] = Relations()  # what the shell loads for an account the store does not know
        assert ch.c.subscribe("c1", "ghost", "g", "e1") is False

    def test_what_was_never_loaded_is_not_a_refusal(self, ch: Chan) -> None:
        """The store was away: membership cannot be told. Refused, a member would be told it is
        not one and its client would not try again; `NotLoaded` is answered UNAVAILABLE, tried
        again. Nothing happens meanwhile."""
        for attempt in (
            lambda: ch.c.subscribe("never", "ann", "a1", "e1"),
            lambda: ch.c.subscribe("c1", "never-loaded", "n1", "e1"),
            lambda: ch.c.typing_start("c1", "never-loaded", T0),
            lambda: ch.c.voice_join("c1", "never-loaded", "n1", "e1"),
        ):
            with pytest.raises(NotLoaded):
                attempt()
        assert not ch.c.channels["c1"].subscribers and not ch.c.channels["c1"].voice
        assert not ch.outbox.drain()

    def test_reloading_a_channel_moves_it(self, ch: Chan) -> None:
        assert ch.c.knows("c1")
        ch.c.load_channel("c1", "g2")
        assert not ch.c.allowed("c1", "ben")
        assert ch.c.allowed("c1", "ann")

    def test_removed_member_stops_receiving(self, ch: Chan) -> None:
        assert ch.c.subscribe("c1", "ben", "b1", "e1")
        assert ch.c.subscribe("c1", "cy", "c1s", "e1")
        ch.frames()
        ch.relations["ben"] = member_of()  # ben leaves g1 (the shard replaces relations in place)
        ch.c.typing_start("c1", "ann", T0)
        ch.c.voice_join("c1", "ann", "a1", "e1")
        frames = ch.frames()
        got_ben = [f for _, s, f in frames if "b1" in s]
        got_cy = [f for _, s, f in frames if "c1s" in s]
        assert got_ben == []
        assert got_cy == [typing_frame("ann"), roster(["ann"])]
        # And cannot type or join any more.
        assert ch.c.typing_start("c1", "ben", T0) is False
        assert ch.c.voice_join("c1", "ben", "b2", "e1") is False

    def test_a_member_who_leaves_the_server_leaves_its_rosters_and_typing(self, ch: Chan) -> None:
        """What a channel tells is only ever about members: a roster still naming an account
        removed from the server told its subscribers that the outsider exists, and when it went."""
        assert ch.c.subscribe("c1", "cy", "c1s", "e1")
        assert ch.c.voice_join("c1", "ann", "a1", "e1") and ch.c.voice_join("c1", "ben", "b1", "e2")
        assert ch.c.typing_start("c1", "ben", T0)
        ch.frames()
        ch.relations["ben"] = member_of()
        ch.c.member_left("ben")
        assert ch.to("c1s") == [roster(["ann"])]
        assert ch.c.roster("c1") == ["ann"] and ch.c.typing_users("c1", T0) == []
        # Its socket going later tells nobody anything.
        ch.c.drop_socket("b1", ["c1"])
        assert ch.frames() == []
        # Leaving a server whose channels it is in no roster of changes nothing.
        ch.relations["ann"] = member_of("g1")
        ch.c.member_left("ann")
        assert ch.frames() == [] and ch.c.roster("c1") == ["ann"]

    def test_a_channel_moved_to_another_server_keeps_only_its_members(self, ch: Chan) -> None:
        assert ch.c.subscribe("c1", "ann", "a1", "e1")
        assert ch.c.voice_join("c1", "ben", "b1", "e1") and ch.c.voice_join("c1", "ann", "a2", "e1")
        ch.frames()
        ch.c.load_channel("c1", "g2")  # ann is in g2, ben is not
        assert ch.to("a1") == [roster(["ann"])]
        ch.c.load_channel("c1", "g2")  # the same server again: nothing to tell
        assert ch.frames() == []

    def test_a_held_repeat_of_a_typist_who_left_is_not_re_broadcast(self, ch: Chan) -> None:
        assert ch.c.subscribe("c1", "cy", "c1s", "e1")
        assert ch.c.typing_start("c1", "ben", T0)
        assert ch.c.typing_start("c1", "ben", T0 + 1)  # held: too soon to re-broadcast
        ch.frames()
        ch.relations["ben"] = member_of()  # left, its relations replaced without the channels told
        ch.c.sweep(T0 + 8)  # the throttle allows the held repeat now
        assert ch.frames() == []


# ---------------------------------------------------------------------------- typing


class TestTyping:
    def test_broadcast_to_subscribers_but_not_the_typist(self, ch: Chan) -> None:
        ch.c.subscribe("c1", "ann", "a1", "e1")
        ch.c.subscribe("c1", "ann", "a2", "e2")  # the typist's other device
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.c.subscribe("c1", "cy", "c1s", "e2")
        ch.frames()
        assert ch.c.typing_start("c1", "ann", T0) is True
        frames = ch.frames()
        recipients = sorted(s for _, sockets, f in frames if f == typing_frame("ann") for s in sockets)
        assert recipients == ["b1", "c1s"]
        # Grouped per edge.
        assert sorted((e, s) for e, s, _ in frames) == [("e1", ("b1",)), ("e2", ("c1s",))]

    def test_typing_needs_no_subscription(self, ch: Chan) -> None:
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.frames()
        assert ch.c.typing_start("c1", "ann", T0)
        assert ch.to("b1") == [typing_frame("ann")]

    def test_lapses_after_ten_seconds(self, ch: Chan, clock: Clock) -> None:
        ch.c.typing_start("c1", "ann", clock())
        assert ch.c.typing_users("c1", clock.advance(9.999)) == ["ann"]
        assert ch.c.typing_users("c1", clock.advance(0.001)) == []
        ch.c.sweep(clock())
        assert ch.c.typing_users("c1", clock()) == []

    def test_repeats_are_not_rebroadcast_until_seven_seconds(self, ch: Chan, clock: Clock) -> None:
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.frames()
        sent = []
        for t in [0, 1, 2, 3, 4, 5, 6, 6.9, 7.0, 8, 9, 13, 14, 14.5, 20, 21]:
            clock.now = T0 + t
            assert ch.c.typing_start("c1", "ann", clock())
            if ch.to("b1"):
                sent.append(t)
        assert sent == [0, 7.0, 14, 21]
        # Each repeat pushed the lapse on: still typing 9 s after the last repeat.
        assert ch.c.typing_users("c1", T0 + 30) == ["ann"]
        assert ch.c.typing_users("c1", T0 + 31) == []

    def test_start_after_lapse_broadcasts_at_once(self, ch: Chan, clock: Clock) -> None:
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.c.typing_start("c1", "ann", clock())
        ch.frames()
        ch.c.typing_start("c1", "ann", clock.advance(10))
        assert ch.to("b1") == [typing_frame("ann")]

    def test_stop_then_start_is_a_repeat(self, ch: Chan, clock: Clock) -> None:
        """Issue 14: `typing.stop` does not reset the throttle (watchers still show the last
        broadcast, which only lapses on their side), so a stop/start pair is a repeat."""
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.c.typing_start("c1", "ann", clock())
        ch.frames()
        ch.c.typing_stop("c1", "ann")
        assert ch.frames() == [], "the contract has no stop frame"
        assert ch.c.typing_users("c1", clock()) == []
        ch.c.typing_start("c1", "ann", clock.advance(1))
        assert ch.to("b1") == []
        assert ch.c.typing_users("c1", clock()) == ["ann"]
        ch.c.typing_stop("c1", "ann")
        ch.c.sweep(clock.advance(1))  # a sweep in between forgets nothing the throttle needs
        ch.c.typing_start("c1", "ann", clock.advance(1))
        assert ch.to("b1") == []
        ch.c.typing_stop("c1", "ann")
        ch.c.typing_start("c1", "ann", clock.advance(4.5))  # 7.5 s after the broadcast
        assert ch.to("b1") == [typing_frame("ann")]

    def test_a_held_repeat_is_re_broadcast_by_the_sweep_before_watchers_lapse(
        self, ch: Chan, clock: Clock
    ) -> None:
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.c.typing_start("c1", "ann", clock())
        ch.c.typing_start("c1", "ann", clock.advance(3))  # too soon: held
        ch.frames()
        ch.c.sweep(clock.advance(3))
        assert ch.to("b1") == []
        ch.c.sweep(clock.advance(1.5))  # 7.5 s after the broadcast, still typing
        assert ch.to("b1") == [typing_frame("ann")]
        ch.c.sweep(clock.advance(1))
        assert ch.to("b1") == [], "once"
        # A stop cancels a held repeat.
        ch.c.typing_start("c1", "ann", clock.advance(1))
        ch.c.typing_stop("c1", "ann")
        ch.c.sweep(clock.advance(8))
        assert ch.to("b1") == []

    @given(
        steps=st.lists(
            st.tuples(
                st.sampled_from(["start", "stop", "sweep"]), st.sampled_from([0.0, 0.1, 0.5, 1.0, 3.0, 11.0])
            ),
            max_size=60,
        )
    )
    @settings(max_examples=150, deadline=None)
    def test_no_stop_start_sequence_beats_the_throttle(self, steps: list[tuple[str, float]]) -> None:
        """Whatever mix of start, stop and sweeps: two `typing` broadcasts of one typist are at
        least the refresh interval (7 s) apart, and a start after that always broadcasts."""
        c = ChannelState(Outbox(), {"ann": member_of("g1"), "ben": member_of("g1")})
        c.load_channel("c1", "g1")
        c.subscribe("c1", "ben", "b1", "e1")
        c.outbox.drain()
        now, sent = T0, []
        for op, dt in steps:
            now += dt
            if op == "start":
                c.typing_start("c1", "ann", now)
                if c.outbox.drain():
                    sent.append(now)
                else:
                    assert sent and now - sent[-1] < c.typing_refresh_s
            elif op == "stop":
                c.typing_stop("c1", "ann")
            else:
                c.sweep(now)
                if c.outbox.drain():  # a held repeat re-broadcast once the throttle allows
                    sent.append(now)
        assert all(b - a >= c.typing_refresh_s for a, b in itertools.pairwise(sent))

    def test_stop_of_unknown_is_harmless(self, ch: Chan) -> None:
        ch.c.typing_stop("nope", "ann")
        ch.c.typing_stop("c1", "ann")
        assert ch.frames() == []

    def test_typists_are_independent(self, ch: Chan, clock: Clock) -> None:
        ch.c.subscribe("c1", "cy", "c1s", "e1")
        ch.frames()
        ch.c.typing_start("c1", "ann", clock())
        ch.c.typing_start("c1", "ben", clock.advance(1))
        assert ch.to("c1s") == [typing_frame("ann"), typing_frame("ben")]
        assert sorted(ch.c.typing_users("c1", clock())) == ["ann", "ben"]

    def test_typing_in_one_channel_is_not_heard_in_another(self, ch: Chan, clock: Clock) -> None:
        ch.c.subscribe("c2", "ann", "a1", "e1")
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.frames()
        ch.c.typing_start("c1", "cy", clock())
        frames = ch.frames()
        assert [s for _, s, _ in frames] == [("b1",)]

    def test_unsubscribed_socket_stops_hearing(self, ch: Chan, clock: Clock) -> None:
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.c.unsubscribe("c1", "b1")
        ch.c.unsubscribe("c1", "never")
        ch.c.unsubscribe("nope", "b1")
        ch.frames()
        ch.c.typing_start("c1", "ann", clock())
        assert ch.frames() == []


# ---------------------------------------------------------------------------- voice


class TestVoice:
    def test_roster_after_subscribe_even_when_empty(self, ch: Chan) -> None:
        assert ch.c.subscribe("c1", "ben", "b1", "e1")
        assert ch.frames() == [("e1", ("b1",), roster([]))]
        ch.c.voice_join("c1", "ann", "a1", "e2")
        ch.frames()
        assert ch.c.subscribe("c1", "cy", "c1s", "e1")
        assert ch.frames() == [("e1", ("c1s",), roster(["ann"]))]  # only to the new subscriber

    def test_roster_after_each_change_to_every_subscriber(self, ch: Chan) -> None:
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.c.subscribe("c1", "cy", "c1s", "e2")
        ch.frames()
        assert ch.c.voice_join("c1", "ann", "a1", "e1")
        assert sorted(ch.frames(), key=lambda f: f[0]) == [
            ("e1", ("b1",), roster(["ann"])),
            ("e2", ("c1s",), roster(["ann"])),
        ]
        assert ch.c.voice_join("c1", "ben", "b1", "e1")
        assert ch.to("c1s") == [roster(["ann", "ben"])]
        ch.c.voice_leave("c1", "a1")
        assert ch.to("c1s") == [roster(["ben"])]
        ch.c.voice_leave("c1", "a1")  # not in it any more: no change, no frame
        ch.c.voice_leave("nope", "a1")
        assert ch.frames() == []

    def test_joining_twice_is_no_change(self, ch: Chan) -> None:
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.c.voice_join("c1", "ann", "a1", "e1")
        ch.frames()
        assert ch.c.voice_join("c1", "ann", "a1", "e1") is True
        assert ch.frames() == []

    def test_one_entry_per_socket_one_id_per_account(self, ch: Chan) -> None:
        ch.c.subscribe("c1", "cy", "c1s", "e1")
        ch.c.voice_join("c1", "ann", "a1", "e1")
        ch.c.voice_join("c1", "ben", "b1", "e1")
        ch.c.voice_join("c1", "ann", "a2", "e2")
        assert ch.c.roster("c1") == ["ann", "ben"]  # in order of first join
        ch.c.voice_leave("c1", "a1")
        assert ch.c.roster("c1") == ["ben", "ann"]  # ann stays, through her other socket
        ch.c.voice_leave("c1", "a2")
        assert ch.c.roster("c1") == ["ben"]
        rosters = [f["userIds"] for f in ch.to("c1s") if f["type"] == "voice.roster"]
        assert rosters[-1] == ["ben"]
        assert all(len(r) == len(set(r)) for r in rosters), "an account appears once on the wire"

    def test_voice_needs_no_subscription(self, ch: Chan) -> None:
        assert ch.c.voice_join("c1", "ann", "a1", "e1")
        assert ch.frames() == []  # nobody subscribed
        assert ch.c.roster("c1") == ["ann"]

    def test_drop_socket_removes_subscription_and_voice(self, ch: Chan) -> None:
        ch.c.subscribe("c1", "ann", "a1", "e1")
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.c.voice_join("c1", "ann", "a1", "e1")
        ch.c.subscribe("c2", "ann", "a1", "e1")
        ch.frames()
        ch.c.drop_socket("a1", ["c1", "c2", "nope"])
        frames = ch.frames()
        assert frames == [("e1", ("b1",), roster([]))]  # the dropped socket hears nothing
        assert ch.c.roster("c1") == []
        ch.c.typing_start("c1", "ben", T0)
        ch.c.typing_start("c2", "ann", T0)
        assert ch.frames() == []

    def test_drop_edge_removes_its_entries(self, ch: Chan) -> None:
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.c.subscribe("c1", "cy", "c1s", "e2")
        ch.c.voice_join("c1", "ann", "a1", "e2")
        ch.c.voice_join("c1", "ann", "a2", "e1")
        ch.c.voice_join("c1", "cy", "c1s", "e2")
        ch.frames()
        ch.c.drop_edge("e2")
        assert ch.c.roster("c1") == ["ann"]  # a2 on e1 keeps ann in
        assert ch.frames() == [("e1", ("b1",), roster(["ann"]))]
        ch.c.drop_edge("e2")
        assert ch.frames() == []
        ch.c.drop_edge("e1")
        assert ch.c.roster("c1") == []

    def test_drop_edge_without_voice_sends_nothing(self, ch: Chan) -> None:
        ch.c.subscribe("c1", "ben", "b1", "e1")
        ch.c.subscribe("c1", "cy", "c1s", "e2")
        ch.frames()
        ch.c.drop_edge("e2")
        assert ch.frames() == []
        ch.c.typing_start("c1", "ann", T0)
        assert [s for _, s, _ in ch.frames()] == [("b1",)]


class TestSweep:
    def test_empty_channels_are_forgotten_busy_ones_kept(self, ch: Chan, clock: Clock) -> None:
        ch.c.subscribe("c2", "ann", "a1", "e1")
        ch.c.typing_start("c1", "ben", clock())
        ch.c.sweep(clock.advance(5))
        assert ch.c.knows("c1") and ch.c.knows("c2")
        ch.c.sweep(clock.advance(5))  # ben's typing lapsed: c1 is empty, kept for one more sweep
        assert ch.c.knows("c1")  # (the shell may have loaded it for an operation in flight)
        ch.c.sweep(clock.advance(1))  # still empty: forgotten
        assert not ch.c.knows("c1")
        assert ch.c.knows("c2")
        assert ch.c.roster("c1") == [] and ch.c.typing_users("c1", clock()) == []

    def test_a_channel_loaded_just_before_a_sweep_survives_it(self, ch: Chan, clock: Clock) -> None:
        ch.c.load_channel("c9", "g1")  # loaded by the shell for an operation about to run
        ch.c.sweep(clock.advance(1))
        assert ch.c.subscribe("c9", "ann", "a1", "e1"), "swept between loading and applying"

    def test_a_channel_in_use_survives_however_long_it_was_empty(self, ch: Chan, clock: Clock) -> None:
        """An operation waiting on a load (the account's relations) found the channel in memory,
        empty since before the last sweep: kept while the shell says it is in use (`keep`), and
        forgotten as usual after."""
        ch.c.sweep(clock.advance(1))  # c1 and c2 empty: forgotten at the next sweep
        ch.c.sweep(clock.advance(1), keep={"c1"})
        assert ch.c.knows("c1") and not ch.c.knows("c2")
        assert ch.c.subscribe("c1", "ann", "a1", "e1"), "swept between finding it and applying"
        ch.c.unsubscribe("c1", "a1")
        ch.c.sweep(clock.advance(1))
        ch.c.sweep(clock.advance(1))
        assert not ch.c.knows("c1")


# ---------------------------------------------------------------------------- rosters, as a model

SOCKS = {f"{u}{k}": (u, f"e{k}") for u in ("ann", "ben", "cy") for k in (1, 2)}


class RosterMachine(RuleBasedStateMachine):
    """Joins, leaves, drops and membership changes in any order: the roster is always the model's,
    and every subscriber that is a member has been sent the current roster."""

    def __init__(self) -> None:
        super().__init__()
        self.outbox = Outbox()
        self.relations = {u: member_of("g1") for u in ("ann", "ben", "cy")}
        self.c = ChannelState(self.outbox, self.relations)
        self.c.load_channel("c1", "g1")
        self.voice: list[str] = []  # sockets in join order
        self.subs: set[str] = set()
        self.last: dict[str, list[str]] = {}

    def _drain(self) -> None:
        for e in self.outbox.drain():
            assert isinstance(e, Deliver)
            assert e.frame["type"] == "voice.roster" and e.frame["channelId"] == "c1"
            for s in e.socket_ids:
                assert SOCKS[s][1] == e.edge_id
                assert s in self.subs, "roster to a socket that is not subscribed"
                assert "g1" in self.relations[SOCKS[s][0]].servers, "roster to a non-member"
                self.last[s] = e.frame["userIds"]

    def expected(self) -> list[str]:
        return list(dict.fromkeys(SOCKS[s][0] for s in self.voice))

    @rule(s=st.sampled_from(sorted(SOCKS)))
    def subscribe(self, s: str) -> None:
        user, edge = SOCKS[s]
        ok = self.c.subscribe("c1", user, s, edge)
        assert ok == ("g1" in self.relations[user].servers)
        if ok:
            self.subs.add(s)
        self._drain()

    @rule(s=st.sampled_from(sorted(SOCKS)))
    def unsubscribe(self, s: str) -> None:
        self.c.unsubscribe("c1", s)
        self.subs.discard(s)
        self.last.pop(s, None)
        self._drain()

    @rule(s=st.sampled_from(sorted(SOCKS)))
    def join(self, s: str) -> None:
        user, edge = SOCKS[s]
        ok = self.c.voice_join("c1", user, s, edge)
        assert ok == ("g1" in self.relations[user].servers)
        if ok and s not in self.voice:
            self.voice.append(s)
        self._drain()

    @rule(s=st.sampled_from(sorted(SOCKS)))
    def leave(self, s: str) -> None:
        self.c.voice_leave("c1", s)
        if s in self.voice:
            self.voice.remove(s)
        self._drain()

    @rule(s=st.sampled_from(sorted(SOCKS)))
    def drop_socket(self, s: str) -> None:
        self.c.drop_socket(s, ["c1"])
        self.subs.discard(s)
        self.last.pop(s, None)
        if s in self.voice:
            self.voice.remove(s)
        self._drain()

    @rule(edge=st.sampled_from(["e1", "e2"]))
    def drop_edge(self, edge: str) -> None:
        self.c.drop_edge(edge)
        gone = {s for s, (_, e) in SOCKS.items() if e == edge}
        self.subs -= gone
        for s in gone:
            self.last.pop(s, None)
        self.voice = [s for s in self.voice if s not in gone]
        self._drain()

    @rule(user=st.sampled_from(["ann", "ben", "cy"]))
    def toggle_membership(self, user: str) -> None:
        servers = self.relations[user].servers ^ {"g1"}
        self.relations[user] = member_of(*servers)
        if "g1" not in servers:
            self.c.member_left(user)  # as the shard does when it replaces relations
            for s, (u, _) in SOCKS.items():
                if u == user:
                    self.last.pop(s, None)  # it hears nothing more; what it knew is stale
            self.voice = [s for s in self.voice if SOCKS[s][0] != user]  # out of the roster
        self._drain()

    @invariant()
    def the_roster_names_members_only(self) -> None:
        assert all("g1" in self.relations[u].servers for u in self.c.roster("c1"))

    @invariant()
    def roster_is_the_models(self) -> None:
        assert self.c.roster("c1") == self.expected()

    @invariant()
    def members_subscribed_hold_the_current_roster(self) -> None:
        for s in self.subs:
            if "g1" in self.relations[SOCKS[s][0]].servers and s in self.last:
                assert self.last[s] == self.expected()


RosterMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestRosterMachine = RosterMachine.TestCase
