"""What a shard answers each operation, typed and defined once.

The core builds them (`actors.core.apply`), the shells read them by name: `Connected.status`,
`Shown.user_id`, `Verdict.RATE_LIMITED`, never `answer[0]`. Each operation of `actors.core.ops`
names its answer in `read`:

| operation | answer |
| --- | --- |
| `Connect` | `Connected` (the account's real status, its last-seen visibility) |
| `SetStatus` | the account's real status (`Status`) |
| `Spend` | `bool` (False: refused, nothing charged) |
| `Watch` | `list[Shown]`: the targets the watcher may see, with their status |
| `Query` | `list[Found]`: the targets the reader may see, with status and last-seen |
| `ChannelSubscribe`, `TypingStart`, `VoiceJoin` | `Verdict` |
| every other | `None` |

**On the wire they travel in their plain form** (`wire`: tuples, lists, booleans, strings), the
form the internal wire has had since version 1, and each operation reads its answer back
(`Op.read`). So an edge and a shard of the previous release still understand each other (the
wire promise of `actors.core.contract.WIRE_VERSION`: a pickled class of this module would be
unknown to it), and pickling stays a tuple's price, about half a slotted dataclass's (the
measurement that chose NamedTuples for the operations, issue 12). Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from .status import STATUSES, Status


@dataclass(frozen=True, slots=True)
class Connected:
    """`Connect`: the socket is registered; the account's real status and last-seen visibility."""

    status: Status
    visibility: str


@dataclass(frozen=True, slots=True)
class Shown:
    """One target of a `Watch` that the watcher may see, and the status it is shown."""

    user_id: str
    status: Status


class Found(NamedTuple):
    """One target of a `Query` that the reader may see: its status and, where the visibility rule
    allows, its last-seen (the contract's ISO string, `contract.iso_ms`), else None. A NamedTuple,
    not a frozen dataclass like the others: a query makes up to a hundred at each end, each in
    about half the time."""

    user_id: str
    status: Status
    last_seen_at: str | None


class Verdict(Enum):
    """A channel operation's answer (`ChannelSubscribe`, `TypingStart`, `VoiceJoin`). Each value
    is its wire form."""

    ALLOWED = True
    NOT_ALLOWED = False  # not a member of the channel's server (or no such channel)
    RATE_LIMITED = "rate_limited"  # the account's voice budget is spent


Answer = Connected | list[Shown] | list[Found] | Verdict | Status | bool | None


def wire(answer: Answer) -> object:
    """The plain form an answer crosses the internal wire in (read back by `Op.read`)."""
    if answer is None or isinstance(answer, (str, bool)):
        return answer
    if isinstance(answer, Verdict):
        return answer.value
    if isinstance(answer, Connected):
        return (answer.status, answer.visibility)
    return [
        (a.user_id, a.status) if isinstance(a, Shown) else (a.user_id, a.status, a.last_seen_at)
        for a in answer
    ]


_STATUS_OF: dict[str, Status] = {status: status for status in STATUSES}


def read_status(raw: object) -> Status:
    status = _STATUS_OF.get(raw) if isinstance(raw, str) else None
    if status is None:
        raise ValueError(f"not a status: {raw!r}")
    return status


def read_connected(raw: object) -> Connected:
    assert isinstance(raw, (tuple, list))
    status, visibility = raw
    return Connected(read_status(status), str(visibility))


def read_shown(raw: object) -> list[Shown]:
    assert isinstance(raw, list)
    return [Shown(str(user_id), read_status(status)) for user_id, status in raw]


def read_found(raw: object) -> list[Found]:
    assert isinstance(raw, list)
    return [
        Found(str(user_id), read_status(status), None if seen is None else str(seen))
        for user_id, status, seen in raw
    ]


def read_verdict(raw: object) -> Verdict:
    return Verdict(raw)


def read_bool(raw: object) -> bool:
    assert isinstance(raw, bool)
    return raw


def read_nothing(raw: object) -> None:
    return None
