"""What the edges and the shards share beyond the operations (`actors.core.ops`), in one place.

Pure and small, like `websockets`' `frames.py` shared by its protocol and connection: an edge
imports this without asyncpg or Ray, the shard without the edge. It holds the shard's special
answers, the size of a mail batch, the contract's time format, a shard's statistics, and the
durable row of an account. The frames themselves, client and internal, are `actors.core.frames`.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

# ---------------------------------------------------------------------------- the wire's version

# The version of what edges and shards send each other (the operations, the answers, the mail):
# raised whenever a release changes it. Two consecutive versions work together (a rolling upgrade
# runs edges and shards of both); peers further apart refuse each other with one clear log line
# (actors/lane.py's handshake carries it) instead of failing on an object they cannot unpickle.
WIRE_VERSION = 3
# Version 2: a status change reaches an edge as one publication per account, which the edge
# expands through its index kept by `_audience` notes; a version 1 edge cannot.
# Version 3: operations and publication addresses cross as plain tuples (`actors.core.ops.to_wire`,
# `publication` below) instead of NamedTuples, whose pickling looks their class up by name on
# both ends and rebuilds each in Python: ~17 µs a status change over edge and shard. A version 3
# edge reads a version 2 shard's `Watching` and sends it typed operations (it knows each shard's
# version from the lane's handshake or `wire_version`); a version 2 edge would take a plain
# address for two socket ids and deliver nothing, so a shard of this release refuses it. Upgrade
# edges first, then shards, as for version 2.
OLDEST_EDGE = 3


def wire_compatible(ours: int, theirs: int) -> bool:
    """Whether a peer speaking `theirs` may talk to us: the same release or an adjacent one."""
    return abs(ours - theirs) <= 1


def serves_edge(shard_version: int, edge_version: int) -> bool:
    """Whether a shard speaking `shard_version` serves an edge speaking `edge_version`."""
    return wire_compatible(shard_version, edge_version) and edge_version >= OLDEST_EDGE


def wire_mismatch(ours: int, theirs: int, peer: str) -> str:
    """The one log line a refused peer gets."""
    why = (
        "releases more than one version apart cannot work together: upgrade the older side first"
        if not wire_compatible(ours, theirs)
        else f"this release's shards serve edges of version {OLDEST_EDGE} or later: upgrade the edges first"
    )
    return f"internal wire version mismatch: {peer} speaks version {theirs}, this process {ours} ({why})"


# ---------------------------------------------------------------------------- special answers

# The answer to an operation on a slot this shard does not own (any more): the edge refreshes its
# slot map and sends the operation to the new owner. Nothing of the operation was applied.
MOVED = "__moved__"
# The answer to an operation whose account, relations or channel could not be loaded (the store
# is away): nothing of it was applied, and the edge tries again. Operations of the same batch on
# accounts already in memory are applied as usual, so presence keeps working during an outage.
UNAVAILABLE = "__unavailable__"

# The most mail items one pull (or one `apply`'s reply) hands out.
PULL_BATCH = 5_000

# Every edge registers with the slot directory this often (with the map version it routes by). A
# directory younger than this has not heard from every edge yet: `presence rollout` does not take
# its list of edges for the whole fleet until then.
EDGE_REGISTER_EVERY_S = 5.0


# Mail for an edge leaves a shard in chunks, each item once, whichever way it goes: in the reply of
# the edge's own `apply` (its batch's frames, no second call) or by its long-poll `pull` (frames
# caused by anybody else). A chunk is (prev, last, items): the items that follow sequence number
# `prev`, up to `last` (contiguous, ending at `last`; they start after `prev + 1` only where the
# shard dropped mail for an edge far behind). Replies can overtake each other, so the edge puts
# chunks back in order by `prev` (`edge.router.Inbox`); a call that failed, or a gap that lasts,
# makes its next pull ask for everything after what it acknowledged again (`resend`).
class Watching(NamedTuple):
    """A version 2 shard's address for a publication (`actors.core.effects.Publish`): every socket
    of the edge that watches `user_id` and sees its real status (`own`) or its visible one. A
    version 3 shard sends the same pair as a plain tuple; `publication` reads both."""

    user_id: str
    own: bool


# Where a mail item goes: some sockets of the edge by id, or the watchers of an account there,
# `(user_id, own)`. Socket ids are strings, so a bool last tells a publication apart.
Publication = tuple[str, bool]
Address = tuple[str, ...] | Publication


def publication(address: Address) -> Publication | None:
    """`(user_id, own)` if `address` is a publication's (version 3's plain pair, or a version 2
    shard's `Watching`), None if it names sockets."""
    if len(address) == 2 and address[1].__class__ is bool:
        return address
    return None


MailItem = tuple[Address, str]  # (who on the edge, the serialised frame)
MailChunk = tuple[int, int, list[MailItem]]
# A shard's reply to an edge's batch: (its incarnation, an answer per operation, the edge's mail).
ApplyReply = tuple[str, list[object], MailChunk]
# A shard's reply to a pull: (its incarnation, a chunk of the edge's mail).
Mail = tuple[str, MailChunk]


# ---------------------------------------------------------------------------- time


def iso_ms(ts: float) -> str:
    """Epoch seconds → `2026-12-02T08:47:00.123Z` (the contract's time format)."""
    d = _dt.datetime.fromtimestamp(round(ts, 3), tz=_dt.UTC)
    return d.strftime("%Y-%m-%dT%H:%M:%S.") + f"{d.microsecond // 1000:03d}Z"


# ---------------------------------------------------------------------------- a shard's figures


@dataclass(frozen=True, slots=True)
class ShardStats:
    """What `PresenceShard.stats()` answers: the operator page, `presence status`, the benches."""

    shard: int
    incarnation: str
    accounts: int  # in memory
    sockets: int
    online: int  # accounts shown online, idle or dnd
    edges: int  # edges holding a lease
    pending_last_seen: int  # departures not yet confirmed written
    watched: int  # accounts somebody watches
    channels: int
    slots: int | None  # slots served; None before the shard learnt them
    node_id: str | None  # the Ray node it runs on
    node_ip: str | None  # that node's address
    redis_ok: bool
    metrics: dict[str, Any]  # `actors.metrics.Metrics.snapshot()`

    def as_dict(self) -> dict[str, Any]:
        """The JSON form (`presence status --json`: docs/status.schema.json)."""
        return asdict(self)


# ---------------------------------------------------------------------------- the store's rows


@dataclass(frozen=True, slots=True)
class AccountRow:
    """What the store holds about an account: its chosen status, last-seen visibility and the
    last-seen time it has (epoch seconds; None: never seen)."""

    chosen_status: str = "online"
    last_seen_visibility: str = "everyone"
    last_seen_at: float | None = None
    # When the stored choices were made (None: stored before these times were, older than any
    # claim). The store keeps the newest choice, and an invisible account's last-seen frozen.
    chosen_at: float | None = None
    visibility_at: float | None = None
