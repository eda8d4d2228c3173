"""What a shard's pure state asks its shell to do. The shell carries these out; nothing here does I/O."""

from __future__ import annotations

from dataclasses import dataclass, field

from .frames import Frame


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send one frame to some sockets of one edge. One payload for every recipient."""

    edge_id: str
    socket_ids: tuple[str, ...]
    frame: Frame


@dataclass(frozen=True, slots=True)
class Publish:
    """Send one `presence.changed` about `user_id` to every socket of one edge that watches it and
    sees its real status (`own`: the account's own sockets) or its visible one (its audience).
    The edge knows which sockets those are (edge/watch_index.py, kept by `_audience` notes);
    `watchers` is how many this shard counts there (for the figures)."""

    edge_id: str
    user_id: str
    own: bool
    watchers: int
    frame: Frame


@dataclass(frozen=True, slots=True)
class PersistChosen:
    """Save a chosen status made at `at`. The store keeps the newest choice (by `at`), so a late
    or replayed write never overrides a later one."""

    user_id: str
    status: str
    at: float


@dataclass(frozen=True, slots=True)
class PersistVisibility:
    """Save a last-seen visibility chosen at `at`; the store keeps the newest, like PersistChosen."""

    user_id: str
    visibility: str
    at: float


@dataclass(frozen=True, slots=True)
class OnlineCount:
    """The account started (present=True) or stopped being shown online in these servers."""

    user_id: str
    servers: frozenset[str]
    present: bool


@dataclass(frozen=True, slots=True)
class SocketCount:
    user_id: str
    socket_id: str
    alive: bool


@dataclass(frozen=True, slots=True)
class Activity:
    """For the active counts (`actors.core.activity`): the account has a live socket from `at` on
    (live=True: its score goes ahead of now) or its last socket went at `at` (live=False)."""

    user_id: str
    live: bool
    at: float


@dataclass(frozen=True, slots=True)
class HeldPlaces:
    """The account's held places changed (protocol.md "Drain and resume"): `held` is all of them
    now, each (closed_at, until, idle); none: the account holds nothing. The shell keeps them where
    the next incarnation of this shard finds them, should this one die during their window."""

    user_id: str
    held: tuple[tuple[float, float, bool], ...]


@dataclass(frozen=True, slots=True)
class EdgeForgotten:
    """Everything the edge registered here is gone (its lease ran out, its node died), though the
    edge may be alive and call again at once. Its mail starts over, under a name the edge takes
    for a restart of this shard: it then registers its sockets here again."""

    edge_id: str


Effect = (
    Deliver
    | Publish
    | PersistChosen
    | PersistVisibility
    | OnlineCount
    | SocketCount
    | Activity
    | HeldPlaces
    | EdgeForgotten
)


@dataclass
class Outbox:
    """Effects accumulated by state methods until the shell drains them."""

    effects: list[Effect] = field(default_factory=list)

    def add(self, effect: Effect) -> None:
        self.effects.append(effect)

    def deliver(self, recipients: dict[str, list[str]], frame: Frame) -> None:
        """Recipients grouped by edge (edge id → socket ids)."""
        for edge_id, sockets in recipients.items():
            if sockets:
                self.effects.append(Deliver(edge_id, tuple(sockets), frame))

    def publish(self, edge_id: str, user_id: str, own: bool, watchers: int, frame: Frame) -> None:
        self.effects.append(Publish(edge_id, user_id, own, watchers, frame))

    def drain(self) -> list[Effect]:
        out, self.effects = self.effects, []
        return out
