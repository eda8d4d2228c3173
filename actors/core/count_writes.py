"""The online counts' queued writes, coalesced into as few Redis commands as say the same thing.

A shard queues one write per membership change (actors/counts.py): a connect alone queues three
or more (the account in `presence:accounts` and in each of its servers' sets, its socket in
`presence:sockets`, its activity score), and
each was sent as its own ZADD, packed by redis-py one command at a time. Under a storm of
connects those commands were a sixth of the shard's samples, more than applying the connects
(bench/profiles/README.md, "The online counts' writes"). Every write names a sorted set and one
member, and what a member ends up as after a run of writes depends only on that run, so the
queue folds into one final write per member (`fold`), and the members of one key and kind go
out together: one ZADD for every addition to a key, one ZADD GT for every raise, one ZREM.

Exact, not approximate: applying `coalesce(writes)` to any sorted sets leaves them as applying
`writes` one by one would (tests/unit/test_count_writes.py checks it against a model for any
run of writes and any starting state). Members of different keys, or different members, are
independent, so the order of the commands does not matter.

Pure: no Redis, no asyncio, no clock (every write carries its score).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Literal, NamedTuple

# "add": ZADD (set the score, adding the member if absent); "gt": ZADD GT (raise the score only,
# adding the member if absent); "rem": ZREM.
Kind = Literal["add", "gt", "rem"]


class Write(NamedTuple):
    kind: Kind
    key: str
    member: str
    score: float  # unused by "rem"


class Command(NamedTuple):
    kind: Kind
    key: str
    # member -> score ("rem": the scores mean nothing)
    members: dict[str, float]


def fold(before: Write | None, after: Write) -> Write:
    """One write that leaves a member as `before` then `after` would, whatever it was first."""
    if before is None or after.kind != "gt":
        return after  # a ZADD or a ZREM decides the member alone
    if before.kind == "rem":  # absent, then raised: added with that score
        return after._replace(kind="add")
    # present with `before.score` (add), or raised to at least it (gt): raised again
    return before._replace(score=max(before.score, after.score))


def coalesce(writes: Iterable[Write], max_members: int = 10_000) -> list[Command]:
    """The commands that do what `writes` do in order, at most `max_members` members each."""
    final: dict[tuple[str, str], Write] = {}
    for w in writes:
        where = (w.key, w.member)
        final[where] = fold(final.get(where), w)
    grouped: dict[tuple[Kind, str], dict[str, float]] = {}
    for w in final.values():
        members = grouped.get((w.kind, w.key))
        if members is None:
            members = grouped[(w.kind, w.key)] = {}
        members[w.member] = w.score
    return [
        Command(kind, key, part)
        for (kind, key), members in grouped.items()
        for part in _parts(members, max_members)
    ]


def _parts(members: dict[str, float], size: int) -> Iterator[dict[str, float]]:
    if len(members) <= size:
        yield members
        return
    items = list(members.items())
    for i in range(0, len(items), size):
        yield dict(items[i : i + size])
