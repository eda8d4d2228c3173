"""The operations an edge sends a shard, defined once.

An edge builds them (`edge.server`), Ray carries them in batches (`PresenceShard.apply`), and the
shard shell dispatches them with `match` (`actors.presence`). Each one knows the slot keys it
touches (`slot_keys`: accounts by id, channels by `#id`), which decide the owning shard and are
checked against the slots the shard serves, and what the shell must load from the store before
the pure state may apply it (`needs`: see the "Data the shell must load" rule in
`actors.core.shard`). Pure: no I/O, nothing but the standard library and the core.

`KIND` names the operation in the metrics (`shard_ops_total{op=...}`); the names are the ones the
project's dashboards and tests already read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar

from .shard import Claim
from .slots import channel_key


@dataclass(frozen=True, slots=True)
class Needs:
    """What the shell loads before applying an operation: relations of accounts (friends,
    servers, visibility), account rows (chosen status, last-seen), channels (their server)."""

    relations: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    channels: tuple[str, ...] = ()


NOTHING = Needs()


class _Op:
    """What every operation answers; the defaults fit an operation on nothing loaded."""

    __slots__ = ()
    KIND: ClassVar[str]
    __match_args__: ClassVar[tuple[str, ...]]

    def slot_keys(self) -> tuple[str, ...]:
        return ()

    def needs(self) -> Needs:
        return NOTHING

    def __reduce__(self) -> tuple[type[_Op], tuple[object, ...]]:
        # Pickled as the class and its fields, rebuilt by calling the class: an edge sends
        # hundreds per Ray call, and the default form of a slotted frozen dataclass (state
        # restored field by field through `__setstate__`) costs about four times as much.
        return type(self), _fields_of(self)


_FIELDS: dict[type[_Op], Callable[[_Op], tuple[object, ...]]] = {}


def _fields_of(op: _Op) -> tuple[object, ...]:
    cls = type(op)
    get = _FIELDS.get(cls)
    if get is None:
        names = cls.__match_args__
        if not names:
            get = _FIELDS[cls] = lambda _: ()
        elif len(names) == 1:
            one = attrgetter(names[0])
            get = _FIELDS[cls] = lambda o: (one(o),)
        else:
            get = _FIELDS[cls] = attrgetter(*names)
    return get(op)


# ---------------------------------------------------------------------------- accounts


@dataclass(frozen=True, slots=True)
class Connect(_Op):
    """A socket of `user_id` opened on the calling edge. Answer: (real status, visibility).

    A socket registered again after a shard restart brings its idle flag and what its edge knows
    of the account's choices (`claim`: acknowledged, perhaps never saved)."""

    KIND: ClassVar[str] = "connect"
    user_id: str
    socket_id: str
    idle: bool = False
    claim: Claim | None = None

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        return Needs(relations=(self.user_id,), accounts=(self.user_id,))


@dataclass(frozen=True, slots=True)
class Disconnect(_Op):
    """A socket went; `at` is when (None: now). Answer: None."""

    KIND: ClassVar[str] = "disconnect"
    user_id: str
    socket_id: str
    at: float | None = None

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        # A disconnect normally finds its account in memory; after a restart it may not, and a
        # stamped one is then a departure this incarnation must still record.
        return Needs(accounts=(self.user_id,)) if self.at is not None else NOTHING


@dataclass(frozen=True, slots=True)
class Departed(_Op):
    """A departure at `at` that a restarted shard may not have recorded (an edge's journal).
    Answer: None."""

    KIND: ClassVar[str] = "departed"
    user_id: str
    at: float

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        return Needs(accounts=(self.user_id,))


@dataclass(frozen=True, slots=True)
class SetStatus(_Op):
    """A socket chose a status (or reported idle). Answer: the account's real status."""

    KIND: ClassVar[str] = "status"
    user_id: str
    socket_id: str
    status: str

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        return Needs(relations=(self.user_id,), accounts=(self.user_id,))


@dataclass(frozen=True, slots=True)
class Settings(_Op):
    """The account's last-seen visibility. Answer: None."""

    KIND: ClassVar[str] = "settings"
    user_id: str
    visibility: str

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        return Needs(relations=(self.user_id,), accounts=(self.user_id,))


@dataclass(frozen=True, slots=True)
class Focus(_Op):
    """The channel a socket looks at (None: none). Answer: None."""

    KIND: ClassVar[str] = "focus"
    user_id: str
    socket_id: str
    channel_id: str | None

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)


@dataclass(frozen=True, slots=True)
class Spend(_Op):
    """Charge `n` to one of the account's budgets (`budget`: "lookups"). Answer: bool, False
    when refused (nothing charged)."""

    KIND: ClassVar[str] = "spend"
    user_id: str
    budget: str
    n: int

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)


@dataclass(frozen=True, slots=True)
class Watch(_Op):
    """A socket of `user_id` watches `targets` (the ones this shard owns). Answer: a list of
    (target, status) for the targets it may see."""

    KIND: ClassVar[str] = "watch"
    user_id: str
    socket_id: str
    targets: tuple[str, ...]

    def slot_keys(self) -> tuple[str, ...]:
        return self.targets

    def needs(self) -> Needs:
        return Needs(relations=(self.user_id, *self.targets))


@dataclass(frozen=True, slots=True)
class Unwatch(_Op):
    """A socket stops watching `targets`. Answer: None."""

    KIND: ClassVar[str] = "unwatch"
    socket_id: str
    targets: tuple[str, ...]

    def slot_keys(self) -> tuple[str, ...]:
        return self.targets


@dataclass(frozen=True, slots=True)
class Query(_Op):
    """One-off lookup of `targets` by `reader` (whose own visibility is `reader_visibility`).
    Answer: a list of (target, status, lastSeenAt as the contract's ISO string or None).

    Beyond `needs`, the shell loads the rows of the targets the reader may see, which it knows
    once the relations are loaded (`ShardState.audience_of_query`)."""

    KIND: ClassVar[str] = "query"
    reader: str
    reader_visibility: str
    targets: tuple[str, ...]

    def slot_keys(self) -> tuple[str, ...]:
        return self.targets

    def needs(self) -> Needs:
        return Needs(relations=(self.reader, *self.targets))


# ---------------------------------------------------------------------------- channels


@dataclass(frozen=True, slots=True)
class ChannelSubscribe(_Op):
    """Answer: True, or False for a channel the store does not know."""

    KIND: ClassVar[str] = "ch_sub"
    channel_id: str
    user_id: str
    socket_id: str

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)

    def needs(self) -> Needs:
        return Needs(relations=(self.user_id,), channels=(self.channel_id,))


@dataclass(frozen=True, slots=True)
class ChannelUnsubscribe(_Op):
    """Answer: None."""

    KIND: ClassVar[str] = "ch_unsub"
    channel_id: str
    socket_id: str

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)


@dataclass(frozen=True, slots=True)
class TypingStart(_Op):
    """Answer: True, False (not allowed there) or "rate_limited"."""

    KIND: ClassVar[str] = "typing_start"
    channel_id: str
    user_id: str

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)

    def needs(self) -> Needs:
        return Needs(relations=(self.user_id,), channels=(self.channel_id,))


@dataclass(frozen=True, slots=True)
class TypingStop(_Op):
    """Answer: None."""

    KIND: ClassVar[str] = "typing_stop"
    channel_id: str
    user_id: str

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)


@dataclass(frozen=True, slots=True)
class VoiceJoin(_Op):
    """Answer: True, False (not allowed there) or "rate_limited".

    `own`: a client's own join, charged to the account's voice budget; a join registered again
    after a shard restart is not (it was charged when it happened)."""

    KIND: ClassVar[str] = "voice_join"
    channel_id: str
    user_id: str
    socket_id: str
    own: bool = False

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)

    def needs(self) -> Needs:
        return Needs(relations=(self.user_id,), channels=(self.channel_id,))


@dataclass(frozen=True, slots=True)
class VoiceLeave(_Op):
    """Answer: None."""

    KIND: ClassVar[str] = "voice_leave"
    channel_id: str
    socket_id: str

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)


@dataclass(frozen=True, slots=True)
class DropSocket(_Op):
    """A socket went: leave every channel state it had in `channel_ids`. Answer: None."""

    KIND: ClassVar[str] = "drop_socket"
    socket_id: str
    channel_ids: tuple[str, ...]

    def slot_keys(self) -> tuple[str, ...]:
        return tuple(channel_key(c) for c in self.channel_ids)


# ---------------------------------------------------------------------------- the edge's lease


@dataclass(frozen=True, slots=True)
class Ping(_Op):
    """Nothing but the call itself, which renews the edge's lease and tells it the shard's
    incarnation. Answer: None."""

    KIND: ClassVar[str] = "ping"


PING = Ping()

Op = (
    Connect
    | Disconnect
    | Departed
    | SetStatus
    | Settings
    | Focus
    | Spend
    | Watch
    | Unwatch
    | Query
    | ChannelSubscribe
    | ChannelUnsubscribe
    | TypingStart
    | TypingStop
    | VoiceJoin
    | VoiceLeave
    | DropSocket
    | Ping
)
