"""What a client knows, without I/O: the watched accounts' statuses and last-seen times, who is
typing where, voice rosters; and the rules that keep it right (reconciling a fresh
`presence.sync`, merging query answers, lapsing typists). The asyncio shell is
`presence_client.client`; these functions and classes are what its tests pin down.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "MAX_QUERY_IDS",
    "PRESENT",
    "TYPING_LAPSE_S",
    "Change",
    "Entry",
    "Picture",
    "PresenceError",
    "QueryAnswer",
    "Typing",
    "chunk_ids",
    "malformed",
    "merge_query",
]

PRESENT = frozenset({"online", "idle", "dnd"})
TYPING_LAPSE_S = 10.0  # the contract: typing lapses after 10 s unless repeated
MAX_QUERY_IDS = 100  # the contract's limit per presence.query
MAX_FRAME_BYTES = 12 * 1024  # well under the edge's 16 KiB frame limit, whatever the ids hold
REFUSALS = frozenset({"rate_limited", "too_many_ids"})

Frame = dict[str, Any]


class PresenceError(Exception):
    """An error frame from the service, or a request that could not be answered: `code` is one
    of bad_frame, too_many_ids, rate_limited, not_allowed (the contract's), or not_connected,
    disconnected, unauthorized, token, malformed_frame (the client's: a server frame that could
    not be applied, dropped), queue_full (the client's: its outgoing queue is at
    MAX_QUEUED_FRAMES, and the call queued nothing)."""

    def __init__(self, code: str, message: str = "") -> None:
        super().__init__(f"{code}: {message}" if message else code)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Entry:
    """A watched account as this client sees it. `last_seen_known` is False until a query
    answered (then `last_seen_at` None means: none, or withheld)."""

    status: str
    last_seen_at: str | None = None
    last_seen_known: bool = False


@dataclass(frozen=True)
class Change:
    user_id: str
    entry: Entry | None  # None: gone from the picture (unwatched, or outside the audience)
    previous: Entry | None


@dataclass(frozen=True)
class QueryAnswer:
    status: str
    last_seen_at: str | None


def chunk_ids(
    ids: Iterable[str], max_ids: int = MAX_QUERY_IDS, max_bytes: int = MAX_FRAME_BYTES
) -> list[list[str]]:
    """Ids without duplicates, in order, in lists of at most `max_ids` whose JSON stays under
    `max_bytes`: the shape of presence.subscribe and presence.query frames."""
    chunks: list[list[str]] = []
    current: list[str] = []
    size = 0
    for user_id in dict.fromkeys(ids):
        n = len(json.dumps(user_id, ensure_ascii=False).encode()) + 1
        if current and (len(current) >= max_ids or size + n > max_bytes):
            chunks.append(current)
            current, size = [], 0
        current.append(user_id)
        size += n
    if current:
        chunks.append(current)
    return chunks


def malformed(frame: Frame) -> str | None:
    """Why a server frame of a known type cannot be applied, or None. The client drops such a
    frame whole (the JavaScript client's `malformedFrame` has the same rules)."""

    def strings(*names: str) -> bool:
        return all(isinstance(frame.get(name), str) for name in names)

    kind = frame.get("type")
    if kind == "presence.sync":
        users = frame.get("users")
        if not isinstance(users, list):
            return "users is not a list"
        if not all(
            isinstance(u, dict) and isinstance(u.get("userId"), str) and isinstance(u.get("status"), str)
            for u in users
        ):
            return "a user without a string userId and status"
    elif kind == "presence.changed":
        return None if strings("userId", "status") else "userId or status not a string"
    elif kind == "presence.self":
        return None if strings("status") else "status not a string"
    elif kind == "typing":
        return None if strings("channelId", "userId") else "channelId or userId not a string"
    elif kind == "voice.roster":
        if not strings("channelId"):
            return "channelId not a string"
        user_ids = frame.get("userIds")
        if not (isinstance(user_ids, list) and all(isinstance(u, str) for u in user_ids)):
            return "userIds not a list of strings"
    return None


def refusal(received: Sequence[Frame]) -> Frame | None:
    """The error frame that refused a request (its window's `rate_limited` / `too_many_ids`)."""
    return next((f for f in received if f.get("type") == "error" and f.get("code") in REFUSALS), None)


def merge_query(
    chunks: Sequence[Sequence[str]], windows: Sequence[Sequence[Frame]]
) -> dict[str, QueryAnswer]:
    """The answers to presence.query frames (one window of received frames per chunk), in the
    order asked, without the ids outside the audience. A broadcast in a window is as current as
    the answer it follows; a last-seen time holds only while the account is shown away."""
    found: dict[str, QueryAnswer] = {}
    for chunk, received in zip(chunks, windows, strict=True):
        refused = refusal(received)
        if refused is not None:
            raise PresenceError(str(refused.get("code")), str(refused.get("message", "")))
        asked = set(chunk)
        for f in received:
            user_id = f.get("userId")
            if f.get("type") != "presence.changed" or user_id not in asked:
                continue
            status = str(f.get("status"))
            seen = f.get("lastSeenAt")
            before = found.get(user_id)
            last_seen = seen if isinstance(seen, str) else (before.last_seen_at if before else None)
            found[user_id] = QueryAnswer(status, None if status in PRESENT else last_seen)
    return {u: found[u] for chunk in chunks for u in chunk if u in found}


class Picture:
    """The watched accounts (remembered across reconnects) and what is known of them."""

    def __init__(self) -> None:
        self.watched: dict[str, None] = {}  # insertion-ordered set
        self.entries: dict[str, Entry] = {}

    def watch(self, user_ids: Iterable[str]) -> list[str]:
        fresh = [u for u in dict.fromkeys(user_ids) if u not in self.watched]
        for u in fresh:
            self.watched[u] = None
        return fresh

    def unwatch(self, user_ids: Iterable[str]) -> tuple[list[str], list[Change]]:
        gone = [u for u in dict.fromkeys(user_ids) if u in self.watched]
        changes = []
        for u in gone:
            del self.watched[u]
            change = self.forget(u)
            if change is not None:
                changes.append(change)
        return gone, changes

    def forget(self, user_id: str) -> Change | None:
        previous = self.entries.pop(user_id, None)
        return None if previous is None else Change(user_id, None, previous)

    def set(
        self, user_id: str, status: str, last_seen_at: str | None = None, *, last_seen_known: bool = False
    ) -> Change | None:
        """Apply a status from a frame (a last-seen time when the frame carried or settled one)."""
        if user_id not in self.watched:
            return None
        previous = self.entries.get(user_id)
        if last_seen_known:
            entry = Entry(status, last_seen_at, True)
        elif previous is not None and previous.status == status:
            entry = replace(previous, status=status)
        else:
            entry = Entry(status)
        if status in PRESENT:
            entry = Entry(status)
        if entry == previous:
            return None
        self.entries[user_id] = entry
        return Change(user_id, entry, previous)

    def apply(self, frame: Frame) -> list[Change]:
        """A presence.sync or presence.changed frame, as it arrives."""
        changes: list[Change | None] = []
        if frame.get("type") == "presence.sync":
            for u in frame.get("users", []):
                changes.append(self.set(str(u.get("userId")), str(u.get("status"))))
        elif frame.get("type") == "presence.changed":
            seen = frame.get("lastSeenAt")
            if isinstance(seen, str):
                changes.append(
                    self.set(str(frame.get("userId")), str(frame.get("status")), seen, last_seen_known=True)
                )
            else:
                changes.append(self.set(str(frame.get("userId")), str(frame.get("status"))))
        return [c for c in changes if c is not None]

    def reconcile(self, chunk: Sequence[str], received: Sequence[Frame]) -> list[Change]:
        """After a subscribe chunk's window: an id its fresh presence.sync left out (and no later
        frame named) is outside the audience now, or unconfirmed, and leaves the picture. So no
        ghost from before a reconnect survives it. A window without a sync (refused) forgets the
        whole chunk."""
        named: set[str] = set()
        after_sync = False
        for f in received:
            if f.get("type") == "presence.sync" and not after_sync:
                after_sync = True
                named.update(str(u.get("userId")) for u in f.get("users", []))
            elif after_sync and f.get("type") == "presence.changed":
                named.add(str(f.get("userId")))
        changes = []
        for u in chunk:
            if u not in named:
                change = self.forget(u)
                if change is not None:
                    changes.append(change)
        return changes

    def settle_answers(self, answers: dict[str, QueryAnswer]) -> list[Change]:
        """Query answers settle the last-seen time of watched accounts still in that status."""
        changes = []
        for u, a in answers.items():
            mine = self.entries.get(u)
            if mine is not None and mine.status == a.status:
                change = self.set(u, a.status, a.last_seen_at, last_seen_known=True)
                if change is not None:
                    changes.append(change)
        return changes


class Typing:
    """Who is typing where, each lapsing `TYPING_LAPSE_S` after their last typing frame."""

    def __init__(self) -> None:
        self.until: dict[str, dict[str, float]] = {}

    def typing(self, channel_id: str, user_id: str, now: float) -> None:
        self.until.setdefault(channel_id, {})[user_id] = now + TYPING_LAPSE_S

    def typers(self, channel_id: str, now: float) -> list[str]:
        return sorted(u for u, t in self.until.get(channel_id, {}).items() if t > now)

    def next_lapse(self) -> float | None:
        return min((t for here in self.until.values() for t in here.values()), default=None)

    def expire(self, now: float) -> list[str]:
        """Forget the lapsed; the channels whose typists changed."""
        changed = []
        for channel_id, here in list(self.until.items()):
            lapsed = [u for u, t in here.items() if t <= now]
            for u in lapsed:
                del here[u]
            if not here:
                del self.until[channel_id]
            if lapsed:
                changed.append(channel_id)
        return changed

    def forget_channel(self, channel_id: str) -> None:
        self.until.pop(channel_id, None)
