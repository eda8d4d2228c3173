"""Every frame the service sends, built in one place: the client frames of the contract and the
internal frames a shard sends an edge for itself.

Pure (orjson only): the shard's core builds its frames here, the edge its replies, and both
read a payload back here (`changed_about`, `internal_note`), so what a frame looks like is
decided once. A frame is a dict whose keys are in wire order, serialised by `text` (orjson keeps
insertion order): the bytes are the contract's, compared byte for byte by the conformance kit.
`edge/protocol.py` holds the same frames as pydantic models for the docs;
`tests/unit/test_frames.py` checks every builder against its model and every model has a builder.

Internal frames travel through the same mail as client frames, but their type starts with `_`:
the edge keeps them for itself and never forwards them to a client.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

Frame = dict[str, Any]

# ---------------------------------------------------------------------------- client frames


def ready(user_id: str, socket_id: str, status: str, heartbeat_interval_ms: int) -> Frame:
    return {
        "type": "ready",
        "userId": user_id,
        "socketId": socket_id,
        "status": status,
        "heartbeatIntervalMs": heartbeat_interval_ms,
    }


def heartbeat_ack() -> Frame:
    return {"type": "heartbeat.ack"}


def sync(users: Iterable[tuple[str, str]]) -> Frame:
    """`presence.sync`: (account, status) in the order given."""
    return {"type": "presence.sync", "users": [{"userId": u, "status": s} for u, s in users]}


def changed(user_id: str, status: str, last_seen_at: str | None = None) -> Frame:
    """`presence.changed`; `last_seen_at` only in a query's answers (the visibility rule)."""
    frame: Frame = {"type": "presence.changed", "userId": user_id, "status": status}
    if last_seen_at is not None:
        frame["lastSeenAt"] = last_seen_at
    return frame


def self_status(status: str) -> Frame:
    """`presence.self`: the account's real status, to its own sockets."""
    return {"type": "presence.self", "status": status}


def typing(channel_id: str, user_id: str) -> Frame:
    return {"type": "typing", "channelId": channel_id, "userId": user_id}


def voice_roster(channel_id: str, user_ids: list[str]) -> Frame:
    return {"type": "voice.roster", "channelId": channel_id, "userIds": user_ids}


def error(code: str, message: str) -> Frame:
    return {"type": "error", "code": code, "message": message}


# What each client frame's `type` is built by (the test checks edge/protocol.py against it).
CLIENT_BUILDERS = {
    "ready": ready,
    "heartbeat.ack": heartbeat_ack,
    "presence.sync": sync,
    "presence.changed": changed,
    "presence.self": self_status,
    "typing": typing,
    "voice.roster": voice_roster,
    "error": error,
}


def text(frame: Frame) -> str:
    """A frame as it goes on the wire (and into an edge's mail: serialised once for everybody)."""
    return orjson.dumps(frame).decode()


HEARTBEAT_ACK_TEXT = text(heartbeat_ack())

# How a serialised `presence.changed` begins (the type is always first): the edge reads the
# account and status of the frames it delivers, to keep each socket's view.
_CHANGED_PREFIX = text({"type": "presence.changed"})[:-1]


# How orjson spells the start of any frame's payload (the type comes first), up to the type.
_TYPE_PREFIX = text({"type": ""})[:-2]


def type_of(payload: str) -> str:
    """The type of a serialised frame (orjson writes it first), "" if it has none."""
    if not payload.startswith(_TYPE_PREFIX):
        return ""
    end = payload.find('"', len(_TYPE_PREFIX))
    return payload[len(_TYPE_PREFIX) : end] if end > 0 else ""


def changed_about(payload: str) -> tuple[str, str] | None:
    """(account, status) of a serialised `presence.changed`, else None."""
    if not payload.startswith(_CHANGED_PREFIX):
        return None
    frame = orjson.loads(payload)
    return frame["userId"], frame["status"]


# ---------------------------------------------------------------------------- internal frames

# `_settings`: the account's last-seen visibility changed (the edge keeps each socket's own
# setting: the reader's side of the reciprocal `nobody` rule, and what it claims after a restart).
INTERNAL_SETTINGS = "_settings"
# `_chosen`: the account's chosen status changed; the edges keep the latest choice per socket and
# claim it when they register the socket again after a restart.
INTERNAL_CHOSEN = "_chosen"

# How orjson spells the start of an internal frame's payload (the type comes first): the one test
# the edge runs on every payload, so it must stay a prefix check.
_INTERNAL_PREFIX = text({"type": "_"})[:-2]


def settings_note(visibility: str, at: float) -> Frame:
    """The `_settings` frame: the account's last-seen visibility became `visibility` at `at`."""
    return {"type": INTERNAL_SETTINGS, "lastSeenVisibility": visibility, "at": at}


def chosen_note(status: str, at: float) -> Frame:
    """The `_chosen` frame: the account's chosen status became `status` at `at`."""
    return {"type": INTERNAL_CHOSEN, "status": status, "at": at}


# `_audience`: what a socket sees of the accounts it watches, decided by their shard when the watch
# is made and when relations change: `in` (its audience, or its own account), or `out` (nothing).
# The edge's index of watchers (edge/watch_index.py) follows it; publications about an account
# reach the sockets the index lists.
INTERNAL_AUDIENCE = "_audience"


def audience_note(inside: Iterable[str], outside: Iterable[str]) -> Frame:
    """The `_audience` frame: the socket now sees the accounts `inside`, and not those `outside`."""
    return {"type": INTERNAL_AUDIENCE, "in": list(inside), "out": list(outside)}


INTERNAL_BUILDERS = {
    INTERNAL_SETTINGS: settings_note,
    INTERNAL_CHOSEN: chosen_note,
    INTERNAL_AUDIENCE: audience_note,
}


@dataclass(frozen=True, slots=True)
class SettingsNote:
    """An `_settings` frame read back."""

    visibility: str
    at: float


@dataclass(frozen=True, slots=True)
class ChosenNote:
    """A `_chosen` frame read back."""

    status: str
    at: float


@dataclass(frozen=True, slots=True)
class AudienceNote:
    """An `_audience` frame read back."""

    inside: tuple[str, ...]
    outside: tuple[str, ...]


InternalNote = SettingsNote | ChosenNote | AudienceNote


def is_internal(payload: str) -> bool:
    """Whether a serialised mail payload is an internal frame (never forwarded to a client)."""
    return payload.startswith(_INTERNAL_PREFIX)


def internal_note(payload: str) -> InternalNote | None:
    """The internal frame a mail payload carries; None for a frame meant for clients, and for an
    internal frame of a kind this edge does not know (a newer shard's: dropped, never forwarded)."""
    if not is_internal(payload):
        return None
    frame = orjson.loads(payload)
    kind = frame.get("type")
    if kind == INTERNAL_SETTINGS:
        return SettingsNote(frame["lastSeenVisibility"], float(frame.get("at", 0.0)))
    if kind == INTERNAL_CHOSEN:
        return ChosenNote(frame["status"], float(frame["at"]))
    if kind == INTERNAL_AUDIENCE:
        return AudienceNote(tuple(frame["in"]), tuple(frame["out"]))
    return None
