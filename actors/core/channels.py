"""Channel state of one shard: subscribers, typing and voice rosters of the channels it owns.

Pure, like the account state beside it. Only members of a channel's server may subscribe, type
or join its voice roster; membership is re-checked on every delivery too, so somebody removed
from a server stops receiving its channels' events without re-subscribing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from . import frames
from .audience import Relations
from .budgets import Spending
from .effects import Outbox
from .loaded import Loaded, NotLoaded


@dataclass(frozen=True, slots=True)
class Member:
    edge_id: str
    user_id: str


@dataclass(slots=True)
class Typing:
    expires_at: float
    broadcast_at: float
    # A repeat arrived too soon to be re-broadcast: the sweep re-broadcasts once the throttle
    # allows (if still typing), so watchers never lapse while the typist goes on.
    held: bool = False


@dataclass(slots=True)
class Channel:
    channel_id: str
    server_id: str | None
    subscribers: dict[str, Member] = field(default_factory=dict)  # socket id → member
    typing: dict[str, Typing] = field(default_factory=dict)  # user id → typing
    voice: dict[str, Member] = field(default_factory=dict)  # socket id → member, in join order


class ChannelState:
    def __init__(
        self,
        outbox: Outbox,
        relations: dict[str, Relations],
        *,
        typing_lapse_s: float = 10.0,
        spending: Spending | None = None,
    ) -> None:
        self.outbox = outbox
        # Voice joins are charged to the joining account's `voice` budget, kept here by the shard
        # that owns the channel: every edge's joins to its rosters pass through it.
        self.spending = spending
        self.relations = relations
        self.typing_lapse_s = typing_lapse_s
        # A repeat of typing.start re-broadcasts only once the client's own lapse is near, so a
        # client typing for a minute causes about six frames per watcher, not one per keystroke.
        self.typing_refresh_s = typing_lapse_s * 0.7
        self.channels: Loaded[str, Channel] = Loaded("channel")
        self._empty_at_last_sweep: set[str] = set()

    # ------------------------------------------------------------------ loading

    def knows(self, channel_id: str) -> bool:
        return channel_id in self.channels

    def load_channel(self, channel_id: str, server_id: str | None) -> None:
        ch = self.channels.get(channel_id)
        if ch is None:
            self.channels[channel_id] = Channel(channel_id, server_id)
        elif ch.server_id != server_id:
            ch.server_id = server_id  # the channel moved to another server (or its server went)
            self._keep_members_only(ch)

    def member_left(self, user_id: str) -> None:
        """`user_id` left some server (its relations were replaced): out of the voice rosters and
        the typing of channels whose server it is no longer a member of."""
        for ch in self.channels.values():
            if user_id in ch.typing or any(m.user_id == user_id for m in ch.voice.values()):
                self._keep_members_only(ch)

    def _keep_members_only(self, ch: Channel) -> None:
        """Membership is re-checked for what a channel says about others, not only for who hears
        it: a roster or a typing frame naming an account outside the server would tell its
        subscribers about an outsider (that it exists, when it goes). Before, an account removed
        from the server stayed in the roster, and its departure was announced by it."""
        gone = [s for s, m in ch.voice.items() if not self._member(ch, m.user_id)]
        for socket_id in gone:
            del ch.voice[socket_id]
        for user_id in [u for u in ch.typing if not self._member(ch, u)]:
            del ch.typing[user_id]
        if gone:
            self._to_subscribers(ch, self._roster_frame(ch))

    def _member(self, ch: Channel, user_id: str) -> bool:
        """Whether `user_id` is a member of the channel's server; an account whose relations are
        not loaded counts as none (what a channel tells is only ever about known members)."""
        if ch.server_id is None:
            return False
        rel = self.relations.get(user_id)
        return rel is not None and ch.server_id in rel.servers

    def allowed(self, channel_id: str, user_id: str) -> bool:
        """Whether `user_id` is a member of the channel's server (False for a channel the store
        does not know). Raises `NotLoaded` for a channel or an account's relations never loaded:
        the store was away, and membership cannot be told; a refusal would tell a member it is
        not one (and its client would not try again), where `UNAVAILABLE` is tried again."""
        ch = self.channels[channel_id]
        if ch.server_id is not None and user_id not in self.relations:
            raise NotLoaded("relations", user_id)
        return self._member(ch, user_id)

    # ------------------------------------------------------------------ operations

    def subscribe(self, channel_id: str, user_id: str, socket_id: str, edge_id: str) -> bool:
        if not self.allowed(channel_id, user_id):
            return False
        ch = self.channels[channel_id]
        ch.subscribers[socket_id] = Member(edge_id, user_id)
        self.outbox.deliver({edge_id: [socket_id]}, self._roster_frame(ch))
        return True

    def unsubscribe(self, channel_id: str, socket_id: str) -> None:
        ch = self.channels.get(channel_id)
        if ch is not None:
            ch.subscribers.pop(socket_id, None)

    def typing_start(self, channel_id: str, user_id: str, now: float) -> bool:
        if not self.allowed(channel_id, user_id):
            return False
        ch = self.channels[channel_id]
        t = ch.typing.get(user_id)
        if t is not None and now - t.broadcast_at < self.typing_refresh_s:
            # Watchers still show the last broadcast (it lapses on their side only), stopped in
            # between or not: the contract has no "stopped" frame to undo it.
            t.expires_at = now + self.typing_lapse_s
            t.held = True
            return True
        ch.typing[user_id] = Typing(expires_at=now + self.typing_lapse_s, broadcast_at=now)
        self._to_subscribers(ch, frames.typing(channel_id, user_id), exclude_user=user_id)
        return True

    def typing_stop(self, channel_id: str, user_id: str) -> None:
        # The contract has no "stopped" frame: clients lapse on their own. The account stops
        # being listed as typing, but the time of the last broadcast stays: a stop/start pair is
        # a repeat like any other, so it cannot buy a fresh broadcast before the throttle allows.
        ch = self.channels.get(channel_id)
        t = ch.typing.get(user_id) if ch is not None else None
        if t is not None:
            t.expires_at = min(t.expires_at, t.broadcast_at)
            t.held = False

    def voice_join(
        self, channel_id: str, user_id: str, socket_id: str, edge_id: str, charge_at: float | None = None
    ) -> bool | str:
        """Join the roster: False for a non-member (`not_allowed`). With `charge_at` (a client's
        own join, not an edge registering its sockets again), a join that changes the roster is
        charged to the account's voice budget; past it the answer is "rate_limited" and the
        roster is left as it was. Leaving is never charged, so a roster is always right."""
        if not self.allowed(channel_id, user_id):
            return False
        ch = self.channels[channel_id]
        if socket_id in ch.voice:
            return True
        if (
            charge_at is not None
            and self.spending is not None
            and not self.spending.spend(user_id, "voice", 1, charge_at)
        ):
            return "rate_limited"
        ch.voice[socket_id] = Member(edge_id, user_id)
        self._to_subscribers(ch, self._roster_frame(ch))
        return True

    def voice_leave(self, channel_id: str, socket_id: str) -> None:
        ch = self.channels.get(channel_id)
        if ch is not None and ch.voice.pop(socket_id, None) is not None:
            self._to_subscribers(ch, self._roster_frame(ch))

    def drop_socket(self, socket_id: str, channel_ids: Iterable[str]) -> None:
        for channel_id in channel_ids:
            self.unsubscribe(channel_id, socket_id)
            self.voice_leave(channel_id, socket_id)

    def drop_edge(self, edge_id: str) -> None:
        for ch in self.channels.values():
            for socket_id in [s for s, m in ch.subscribers.items() if m.edge_id == edge_id]:
                del ch.subscribers[socket_id]
            gone = [s for s, m in ch.voice.items() if m.edge_id == edge_id]
            for socket_id in gone:
                del ch.voice[socket_id]
            if gone:
                self._to_subscribers(ch, self._roster_frame(ch))

    def sweep(self, now: float, keep: Iterable[str] = ()) -> None:
        # A channel is forgotten only when it was already empty at the previous sweep: one the
        # shell has just loaded for an operation about to be applied is never swept under it.
        # `keep`: channels a batch waiting on a load will apply with (found in memory, perhaps
        # empty for a while already); they count as in use.
        kept = set(keep)
        empty: set[str] = set()
        for channel_id, ch in list(self.channels.items()):
            for user_id, t in ch.typing.items():
                if t.held and now < t.expires_at and now - t.broadcast_at >= self.typing_refresh_s:
                    t.broadcast_at, t.held = now, False
                    if not self._member(ch, user_id):
                        continue  # no longer a member: its typing is not re-broadcast
                    frame = frames.typing(channel_id, user_id)
                    self._to_subscribers(ch, frame, exclude_user=user_id)
            for user_id in [
                u
                for u, t in ch.typing.items()
                if now >= t.expires_at and now - t.broadcast_at >= self.typing_refresh_s
            ]:
                del ch.typing[user_id]
            if not ch.subscribers and not ch.voice and not ch.typing and channel_id not in kept:
                if channel_id in self._empty_at_last_sweep:
                    del self.channels[channel_id]
                else:
                    empty.add(channel_id)
        self._empty_at_last_sweep = empty

    # ------------------------------------------------------------------ reading

    def roster(self, channel_id: str) -> list[str]:
        ch = self.channels.get(channel_id)
        return self._roster_users(ch) if ch is not None else []

    def typing_users(self, channel_id: str, now: float) -> list[str]:
        ch = self.channels.get(channel_id)
        if ch is None:
            return []
        return [u for u, t in ch.typing.items() if now < t.expires_at]

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _roster_users(ch: Channel) -> list[str]:
        # One entry per socket inside; on the wire one id per account, in order of first join.
        return list(dict.fromkeys(m.user_id for m in ch.voice.values()))

    def _roster_frame(self, ch: Channel) -> frames.Frame:
        return frames.voice_roster(ch.channel_id, self._roster_users(ch))

    def _to_subscribers(self, ch: Channel, frame: frames.Frame, exclude_user: str | None = None) -> None:
        recipients: dict[str, list[str]] = {}
        for socket_id, m in ch.subscribers.items():
            if m.user_id == exclude_user or not self._member(ch, m.user_id):
                continue
            recipients.setdefault(m.edge_id, []).append(socket_id)
        self.outbox.deliver(recipients, frame)
