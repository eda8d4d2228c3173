"""The audience rule: who may learn anything at all about an account.

An account's audience is everybody who shares a server with it or has an accepted friendship with
it. Every frame that mentions an account (sync, change, query answer) is filtered through
`in_audience`; an id outside the audience is answered with silence.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Relations:
    """What the audience and visibility rules need to know about one account."""

    friends: frozenset[str] = field(default_factory=frozenset)
    servers: frozenset[str] = field(default_factory=frozenset)
    last_seen_visibility: str = "everyone"


NO_RELATIONS = Relations()


def in_audience(target: str, target_rel: Relations, reader: str, reader_rel: Relations) -> bool:
    """May `reader` learn anything about `target`? An account is always in its own audience."""
    if reader == target:
        return True
    if reader in target_rel.friends:
        return True
    return not target_rel.servers.isdisjoint(reader_rel.servers)


def decided_by_target(target: str, target_rel: Relations, reader: str) -> bool:
    """Whether `in_audience` holds for `reader` whatever the reader's own relations: another
    account that the target's relations name as a friend (friendship is mutual). A shard asked
    about such targets only need not load the reader's relations (`ShardState.query_reader`)."""
    return reader != target and reader in target_rel.friends
