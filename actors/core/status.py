"""Status resolution: what an account's status is, and what everybody else is told it is.

The client *chooses* `online`, `dnd` or `invisible` for the account; the server *knows* which
sockets are alive and which of them are idle. These two functions turn that into the real status
(shown to the account's own sockets) and the visible one (shown to everybody else).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

Status = Literal["online", "idle", "dnd", "invisible", "offline"]
ChosenStatus = Literal["online", "dnd", "invisible"]
LastSeenVisibility = Literal["everyone", "friends", "nobody"]

STATUSES: tuple[Status, ...] = ("online", "idle", "dnd", "invisible", "offline")
CHOSEN_STATUSES: frozenset[str] = frozenset({"online", "dnd", "invisible"})
VISIBILITIES: frozenset[str] = frozenset({"everyone", "friends", "nobody"})


def as_chosen(value: str) -> ChosenStatus:
    """A stored chosen status, read defensively: anything unknown counts as `online`."""
    if value == "dnd":
        return "dnd"
    if value == "invisible":
        return "invisible"
    return "online"


def real_status(chosen: ChosenStatus, idle_flags: Iterable[bool]) -> Status:
    """The account's own view. `idle_flags` has one entry per live socket."""
    flags = list(idle_flags)
    if not flags:
        return "offline"
    if chosen == "invisible":
        return "invisible"
    if chosen == "dnd":
        return "dnd"
    return "idle" if all(flags) else "online"


def visible_status(real: Status) -> Status:
    """What anybody but the account itself is told: invisible never leaves the shard."""
    return "offline" if real == "invisible" else real


def is_visibly_present(real: Status) -> bool:
    """Shown online, idle or dnd: last-seen moves and the account counts as online."""
    return real in ("online", "idle", "dnd")
