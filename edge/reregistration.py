"""What an edge tells a shard that restarted empty: a pure function of its sockets, its journal of
departures and the slot map (docs/architecture.md, "Restarts").

The new incarnation knows nothing: every live socket of ours whose account it owns is registered
again (its idle flag and its claim of the account's choices in the same `connect`, so watchers
see no `online` in between, then its focus), with every watch on accounts it owns, channel
subscriptions and voice roster entries on channels it owns. Departures it may not have written
are reported again: those of sockets already lost whose handler has not caught up yet (with the
moment they went: registering them again would show them present after they left), and the
latest departure of each of its accounts in the edge's journal (the dead incarnation held their
last-seen in memory until the FlushActor committed it; the shard applies one only to an account
not present now, and last-seen never moves back, so reporting too much is harmless).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from actors.core import ops
from actors.core.shard import Claim
from actors.core.slots import SlotMap, channel_key


@dataclass(frozen=True, slots=True)
class Registered:
    """A socket registered upstream, as re-registration sees it (a snapshot of its session)."""

    user_id: str
    socket_id: str
    idle: bool = False
    claim: Claim = field(default_factory=Claim)
    focus: str | None = None
    subscriptions: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()
    voice_channel: str | None = None
    # When the connection went, if its handler has not caught up yet (it waits on this shard).
    gone_at: float | None = None


class Departure(NamedTuple):
    """An entry of the edge's journal: a socket of `user_id` went at `at`, knowing `claim` of the
    account's choices (acknowledged to it, perhaps never saved: the journal is the one place
    that survives the shard if the socket was the account's last)."""

    at: float
    user_id: str
    claim: Claim = Claim()


@dataclass(frozen=True, slots=True)
class Plan:
    """`register` is sent at once and awaited together; each of `replays` is retried in the
    background until it lands (the store may be away longer than the retry window)."""

    register: list[ops.Op]
    replays: list[ops.Departed]


def reregistration(
    shard: int, slot_map: SlotMap, sockets: Iterable[Registered], departures: Iterable[Departure]
) -> Plan:
    """What to tell `shard`, restarted empty, about `sockets` and the journal `departures`
    (oldest first)."""

    def owns(key: str) -> bool:
        return slot_map.shard_of(key) == shard

    sockets = list(sockets)
    replays = [
        ops.Departed(s.user_id, s.gone_at, s.claim)
        for s in sockets
        if s.gone_at is not None and owns(s.user_id)
    ]
    register: list[ops.Op] = []
    for s in sockets:
        if s.gone_at is not None:
            continue
        if owns(s.user_id):
            register.append(ops.Connect(s.user_id, s.socket_id, s.idle, s.claim))
            if s.focus is not None:
                register.append(ops.Focus(s.user_id, s.socket_id, s.focus))
        targets = tuple(t for t in s.subscriptions if owns(t))
        if targets:
            register.append(ops.Watch(s.user_id, s.socket_id, targets))
        register.extend(
            ops.ChannelSubscribe(c, s.user_id, s.socket_id) for c in s.channels if owns(channel_key(c))
        )
        if s.voice_channel is not None and owns(channel_key(s.voice_channel)):
            register.append(ops.VoiceJoin(s.voice_channel, s.user_id, s.socket_id))
    # The latest departure of each account, with the newest of its sockets' claims.
    latest: dict[str, ops.Departed] = {}
    for d in departures:
        if owns(d.user_id):
            known = latest.get(d.user_id)
            claim = d.claim if known is None or known.claim is None else known.claim.newest(d.claim)
            latest[d.user_id] = ops.Departed(d.user_id, d.at, claim)
    replays.extend(latest.values())
    return Plan(register, replays)
