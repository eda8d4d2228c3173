"""The operations an edge sends a shard, defined once.

An edge's session builds them (`edge.session`), the router carries them in batches to the shard
(`PresenceShard.apply`), and the core applies them with `match` (`actors.core.apply`). Each one
knows the slot keys it touches (`slot_keys`: accounts by id, channels by `#id`), which decide
the owning shard and are checked against the slots the shard serves, what the shell must load
from the store before the pure state may apply it (`needs`: see the "Data the shell must load"
rule in `actors.core.shard`), and how its answer reads (`read`: `actors.core.answers`). Pure: no
I/O, nothing but the standard library and the core.

`KIND[type(op)]` names the operation in the metrics (`shard_ops_total{op=...}`); the names are the ones the
project's dashboards and tests already read.

They are NamedTuples, not frozen dataclasses: an edge sends hundreds per Ray call, and building,
pickling and unpickling a NamedTuple costs about half as much as a slotted frozen dataclass
(measured for issue 12: 1.3 µs against 2.4 µs per operation; plain tuples 0.5 µs). Equality is
a tuple's (an operation is never compared with one of another kind).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar, cast

from .answers import (
    Connected,
    Found,
    Shown,
    Verdict,
    read_bool,
    read_connected,
    read_found,
    read_nothing,
    read_shown,
    read_status,
    read_verdict,
)
from .shard import Claim
from .slots import channel_key
from .status import Status

# What the shell loads before applying an operation: (relations of these accounts (friends,
# servers, visibility), rows of these accounts (chosen status, last-seen), these channels (their
# server)). A plain tuple: `needs()` is asked of every operation of every batch.
Needs = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]


NOTHING: Needs = ((), (), ())

A_co = TypeVar("A_co", covariant=True)


class Operation(Protocol[A_co]):
    """Any operation, as its sender handles it: where it goes (`slot_keys`), what the shard loads
    for it (`needs`), and how its answer reads (`read`: the answer's plain wire form into its
    typed answer, `actors.core.answers`). The router is written against this; the shard matches
    on the kinds (`Op`)."""

    def slot_keys(self) -> tuple[str, ...]: ...

    def needs(self) -> Needs: ...

    def read(self, raw: object) -> A_co: ...


# ---------------------------------------------------------------------------- accounts


class Connect(NamedTuple):
    """A socket of `user_id` opened on the calling edge. Answer: `Connected`.

    A socket registered again after a shard restart brings its idle flag and what its edge knows
    of the account's choices (`claim`: acknowledged, perhaps never saved)."""

    user_id: str
    socket_id: str
    idle: bool = False
    claim: Claim | None = None

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        return ((self.user_id,), (self.user_id,), ())

    def read(self, raw: object) -> Connected:
        return read_connected(raw)


class Disconnect(NamedTuple):
    """A socket went; `at` is when (None: now). `resume_s`: the server closed it for its own
    reasons (1012, 1011), so its account keeps its presence that long from `at` (0: departs at
    once; ShardState.disconnect). Answer: None."""

    user_id: str
    socket_id: str
    at: float | None = None
    resume_s: float = 0.0

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        # A disconnect finds its account in memory, or (after a restart) it is a departure the
        # state records without the row (ShardState.departed): nothing to load, so no outage of
        # the store can hold a departure back.
        return NOTHING

    def read(self, raw: object) -> None:
        return read_nothing(raw)


class Departed(NamedTuple):
    """A departure at `at` that a restarted shard may not have recorded (an edge's journal),
    with what the departed socket knew of the account's choices (`claim`). Answer: None."""

    user_id: str
    at: float
    claim: Claim | None = None

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        return NOTHING  # recorded without the row: see Disconnect

    def read(self, raw: object) -> None:
        return read_nothing(raw)


class SetStatus(NamedTuple):
    """A socket chose a status (or reported idle). Answer: the account's real status."""

    user_id: str
    socket_id: str
    status: str

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        return ((self.user_id,), (self.user_id,), ())

    def read(self, raw: object) -> Status:
        return read_status(raw)


class Settings(NamedTuple):
    """The account's last-seen visibility. Answer: None."""

    user_id: str
    visibility: str

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        return ((self.user_id,), (self.user_id,), ())

    def read(self, raw: object) -> None:
        return read_nothing(raw)


class Focus(NamedTuple):
    """The channel a socket looks at (None: none). Answer: None."""

    user_id: str
    socket_id: str
    channel_id: str | None

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        return NOTHING

    def read(self, raw: object) -> None:
        return read_nothing(raw)


class Spend(NamedTuple):
    """Charge `n` to one of the account's budgets (`budget`: "lookups"). Answer: bool, False
    when refused (nothing charged)."""

    user_id: str
    budget: str
    n: int

    def slot_keys(self) -> tuple[str, ...]:
        return (self.user_id,)

    def needs(self) -> Needs:
        return NOTHING

    def read(self, raw: object) -> bool:
        return read_bool(raw)


class Watch(NamedTuple):
    """A socket of `user_id` watches `targets` (the ones this shard owns). Answer: a `Shown`
    per target it may see."""

    user_id: str
    socket_id: str
    targets: tuple[str, ...]

    def slot_keys(self) -> tuple[str, ...]:
        return self.targets

    def needs(self) -> Needs:
        return ((self.user_id, *self.targets), (), ())

    def read(self, raw: object) -> list[Shown]:
        return read_shown(raw)


class Unwatch(NamedTuple):
    """A socket stops watching `targets`. Answer: None."""

    socket_id: str
    targets: tuple[str, ...]

    def slot_keys(self) -> tuple[str, ...]:
        return self.targets

    def needs(self) -> Needs:
        return NOTHING

    def read(self, raw: object) -> None:
        return read_nothing(raw)


class Query(NamedTuple):
    """One-off lookup of `targets` by `reader` (whose own visibility is `reader_visibility`).
    Answer: a `Found` per target the reader may see.

    Beyond `needs`, the shell loads the rows of the targets the reader may see, which it knows
    once the relations are loaded (`ShardState.audience_of_query`)."""

    reader: str
    reader_visibility: str
    targets: tuple[str, ...]

    def slot_keys(self) -> tuple[str, ...]:
        return self.targets

    def needs(self) -> Needs:
        return ((self.reader, *self.targets), (), ())

    def read(self, raw: object) -> list[Found]:
        return read_found(raw)


# ---------------------------------------------------------------------------- channels


class ChannelSubscribe(NamedTuple):
    """Answer: `Verdict` (NOT_ALLOWED also for a channel the store does not know)."""

    channel_id: str
    user_id: str
    socket_id: str

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)

    def needs(self) -> Needs:
        return ((self.user_id,), (), (self.channel_id,))

    def read(self, raw: object) -> Verdict:
        return read_verdict(raw)


class ChannelUnsubscribe(NamedTuple):
    """Answer: None."""

    channel_id: str
    socket_id: str

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)

    def needs(self) -> Needs:
        return NOTHING

    def read(self, raw: object) -> None:
        return read_nothing(raw)


class TypingStart(NamedTuple):
    """Answer: `Verdict`."""

    channel_id: str
    user_id: str

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)

    def needs(self) -> Needs:
        return ((self.user_id,), (), (self.channel_id,))

    def read(self, raw: object) -> Verdict:
        return read_verdict(raw)


class TypingStop(NamedTuple):
    """Answer: None."""

    channel_id: str
    user_id: str

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)

    def needs(self) -> Needs:
        return NOTHING

    def read(self, raw: object) -> None:
        return read_nothing(raw)


class VoiceJoin(NamedTuple):
    """Answer: `Verdict` (RATE_LIMITED: the account's voice budget is spent).

    `own`: a client's own join, charged to the account's voice budget; a join registered again
    after a shard restart is not (it was charged when it happened)."""

    channel_id: str
    user_id: str
    socket_id: str
    own: bool = False

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)

    def needs(self) -> Needs:
        return ((self.user_id,), (), (self.channel_id,))

    def read(self, raw: object) -> Verdict:
        return read_verdict(raw)


class VoiceLeave(NamedTuple):
    """Answer: None."""

    channel_id: str
    socket_id: str

    def slot_keys(self) -> tuple[str, ...]:
        return (channel_key(self.channel_id),)

    def needs(self) -> Needs:
        return NOTHING

    def read(self, raw: object) -> None:
        return read_nothing(raw)


class DropSocket(NamedTuple):
    """A socket went: leave every channel state it had in `channel_ids`. Answer: None."""

    socket_id: str
    channel_ids: tuple[str, ...]

    def slot_keys(self) -> tuple[str, ...]:
        return tuple(channel_key(c) for c in self.channel_ids)

    def needs(self) -> Needs:
        return NOTHING

    def read(self, raw: object) -> None:
        return read_nothing(raw)


# ---------------------------------------------------------------------------- the edge's lease


class Ping(NamedTuple):
    """Nothing but the call itself, which renews the edge's lease and tells it the shard's
    incarnation. Answer: None."""

    def slot_keys(self) -> tuple[str, ...]:
        return ()

    def needs(self) -> Needs:
        return NOTHING

    def read(self, raw: object) -> None:
        return read_nothing(raw)


PING = Ping()

# The operations of a socket's channel frames, each routed by its channel (`channel_id`).
ChannelOp = ChannelSubscribe | ChannelUnsubscribe | TypingStart | TypingStop | VoiceJoin | VoiceLeave

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


# The name of each kind in the metrics (`shard_ops_total{op=...}`).
KIND: dict[type[Operation[object]], str] = {
    Connect: "connect",
    Disconnect: "disconnect",
    Departed: "departed",
    SetStatus: "status",
    Settings: "settings",
    Focus: "focus",
    Spend: "spend",
    Watch: "watch",
    Unwatch: "unwatch",
    Query: "query",
    ChannelSubscribe: "ch_sub",
    ChannelUnsubscribe: "ch_unsub",
    TypingStart: "typing_start",
    TypingStop: "typing_stop",
    VoiceJoin: "voice_join",
    VoiceLeave: "voice_leave",
    DropSocket: "drop_socket",
    Ping: "ping",
}


def _reduce(op: tuple[object, ...]) -> tuple[type, tuple[object, ...]]:
    # Pickled as the class and its fields, rebuilt by calling the class: the default form of a
    # NamedTuple goes through `__getnewargs__`, a slower road to the same thing. (Wire version 2,
    # and anything pickled outside a batch: a batch to a version 3 shard crosses as `to_wire`.)
    return type(op), tuple(op)


for _kind in KIND:
    setattr(_kind, "__reduce__", _reduce)  # noqa: B010 (mypy refuses assigning to a method)


# ---------------------------------------------------------------------------- the wire form

# Internal wire version 3 (actors/core/contract.py) sends a batch's operations as plain tuples, the
# kind's code first: `(code, *fields)`. A NamedTuple's pickle names its class, which both ends look
# up by module and name for every batch, and the shard rebuilds each by calling the class in
# Python; a tuple of strings costs a third of that (measured for wire version 3: a one-change
# batch 4.6 + 4.8 µs to pickle and unpickle, 1.4 + 1.7 as tuples). The codes are part of the
# wire: a kind keeps its code for good, a new kind takes the next one (test_ops pins them).
WIRE_KINDS: tuple[type[Operation[object]], ...] = (
    Connect,
    Disconnect,
    Departed,
    SetStatus,
    Settings,
    Focus,
    Spend,
    Watch,
    Unwatch,
    Query,
    ChannelSubscribe,
    ChannelUnsubscribe,
    TypingStart,
    TypingStop,
    VoiceJoin,
    VoiceLeave,
    DropSocket,
    Ping,
)
_CODE: dict[type[Operation[object]], int] = {kind: code for code, kind in enumerate(WIRE_KINDS)}
# A NamedTuple class's own `_make` (tuple's constructor plus a length check), by code.
_MAKE: tuple[Callable[[Iterable[object]], Operation[object]], ...] = tuple(
    cast("type[Any]", kind)._make for kind in WIRE_KINDS
)

WireOp = tuple[object, ...]
# What a shard's entry points take: a batch typed, or in its wire form, or both mixed.
Batch = Sequence[Operation[object] | WireOp]


def to_wire(ops: Sequence[Operation[object]]) -> list[WireOp]:
    """A batch in its wire version 3 form, for a shard of version 3 or later."""
    code = _CODE
    return [(code[op.__class__], *cast("tuple[object, ...]", op)) for op in ops]


def from_wire(ops: Batch) -> list[Operation[object]]:
    """A batch as the shard applies it: each plain tuple (`to_wire`) made its operation again; an
    operation already typed (a version 2 edge's, or a caller's in the same process) as it is."""
    make = _MAKE
    return [
        make[cast("int", op[0])](op[1:]) if op.__class__ is tuple else cast("Operation[object]", op)
        for op in cast("Sequence[tuple[object, ...]]", ops)
    ]
