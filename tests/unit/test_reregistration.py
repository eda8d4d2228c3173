"""Re-registration after a shard restart (edge/reregistration.py): which operations an edge sends
the new incarnation, and which departures it reports again."""

from __future__ import annotations

import itertools

from actors.core import ops
from actors.core.shard import Claim
from actors.core.slots import SlotMap, channel_key
from edge.reregistration import Departure, Registered, reregistration

MAP = SlotMap.even(2)


def on(shard: int, prefix: str, n: int, channel: bool = False) -> list[str]:
    """`n` ids starting with `prefix` whose slot (as an account, or as a channel) `shard` owns."""
    ids = (f"{prefix}{i}" for i in itertools.count())
    return list(
        itertools.islice((k for k in ids if MAP.shard_of(channel_key(k) if channel else k) == shard), n)
    )


A0, B0, C0 = on(0, "u", 3)
A1, B1 = on(1, "u", 2)
CH0 = on(0, "c", 1, channel=True)[0]
CH1 = on(1, "c", 1, channel=True)[0]
CLAIM = Claim("dnd", 100.0, "friends", 90.0)


def test_a_socket_of_an_account_it_owns_comes_back_idle_with_its_claim_and_focus() -> None:
    s = Registered(A0, "s1", idle=True, claim=CLAIM, focus=CH1)
    plan = reregistration(0, MAP, [s], [])
    assert plan.register == [ops.Connect(A0, "s1", True, CLAIM), ops.Focus(A0, "s1", CH1)]
    assert plan.replays == []
    assert reregistration(1, MAP, [s], []).register == []  # not its account: nothing


def test_watches_channels_and_voice_follow_what_they_are_about() -> None:
    """A socket whose account lives elsewhere still has its watches of this shard's accounts,
    its channel subscriptions and its roster entry here registered again."""
    s = Registered(A1, "s1", subscriptions=(A0, B1, B0), channels=(CH0, CH1), voice_channel=CH0)
    plan = reregistration(0, MAP, [s], [])
    assert plan.register == [
        ops.Watch(A1, "s1", (A0, B0)),
        ops.ChannelSubscribe(CH0, A1, "s1"),
        ops.VoiceJoin(CH0, A1, "s1"),  # own=False: not charged, it is not the client's own join
    ]
    assert reregistration(1, MAP, [s], []).register == [
        ops.Connect(A1, "s1", False, Claim()),
        ops.Watch(A1, "s1", (B1,)),
        ops.ChannelSubscribe(CH1, A1, "s1"),
    ]


def test_a_socket_already_gone_is_reported_departed_never_registered() -> None:
    """Its handler waits on this very shard: registering it would show it present after it went;
    its departure goes instead, with the time it happened."""
    gone = Registered(A0, "s1", subscriptions=(B0,), channels=(CH0,), gone_at=123.0)
    plan = reregistration(0, MAP, [gone], [])
    assert plan.register == []
    assert plan.replays == [ops.Departed(A0, 123.0, Claim())]
    assert reregistration(1, MAP, [gone], []).replays == []


def test_the_journal_replays_the_latest_departure_of_each_account_it_owns() -> None:
    journal = [Departure(10.0, A0), Departure(11.0, A1), Departure(12.0, B0), Departure(13.0, A0)]
    plan = reregistration(0, MAP, [], journal)
    assert plan.replays == [ops.Departed(A0, 13.0, Claim()), ops.Departed(B0, 12.0, Claim())]
    assert reregistration(1, MAP, [], journal).replays == [ops.Departed(A1, 11.0, Claim())]


def test_replays_carry_the_newest_claims_of_the_accounts_sockets() -> None:
    """A choice acknowledged to a socket that then closed may never have been saved (PostgreSQL
    away) when the shard died: the journal's claim brings it back with the departure (an
    `invisible` one also freezes the departure at the moment the account hid)."""
    journal = [
        Departure(10.0, A0, Claim("invisible", 4.0, "friends", 2.0)),
        Departure(13.0, A0, Claim("dnd", 3.0, "nobody", 5.0)),  # another socket, older status
    ]
    assert reregistration(0, MAP, [], journal).replays == [
        ops.Departed(A0, 13.0, Claim("invisible", 4.0, "nobody", 5.0))
    ]
    gone = Registered(A0, "s1", claim=Claim("invisible", 4.0), gone_at=9.0)
    assert reregistration(0, MAP, [gone], []).replays == [ops.Departed(A0, 9.0, Claim("invisible", 4.0))]


def test_several_sockets() -> None:
    sockets = [
        Registered(A0, "a1"),
        Registered(A0, "a2", idle=True),
        Registered(B0, "b1", gone_at=50.0),
        Registered(C0, "c1", subscriptions=(A0,)),
    ]
    plan = reregistration(0, MAP, sockets, [Departure(40.0, C0)])
    assert plan.register == [
        ops.Connect(A0, "a1", False, Claim()),
        ops.Connect(A0, "a2", True, Claim()),
        ops.Connect(C0, "c1", False, Claim()),
        ops.Watch(C0, "c1", (A0,)),
    ]
    assert plan.replays == [ops.Departed(B0, 50.0, Claim()), ops.Departed(C0, 40.0, Claim())]
