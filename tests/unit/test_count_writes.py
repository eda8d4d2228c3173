"""actors/core/count_writes.py: the coalesced commands leave Redis's sorted sets exactly as the
writes one by one would, checked against a model of ZADD, ZADD GT and ZREM."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.core.count_writes import Command, Write, coalesce, fold

Sets = dict[str, dict[str, float]]


def _write_one(sets: Sets, kind: str, key: str, member: str, score: float) -> None:
    """What Redis does with one command on one member."""
    members = sets.setdefault(key, {})
    if kind == "rem":
        members.pop(member, None)
    elif kind == "gt" and member in members:
        members[member] = max(members[member], score)
    else:
        members[member] = score


def _one_by_one(sets: Sets, writes: list[Write]) -> Sets:
    out = {k: dict(v) for k, v in sets.items()}
    for w in writes:
        _write_one(out, w.kind, w.key, w.member, w.score)
    return out


def _commands(sets: Sets, commands: list[Command]) -> Sets:
    out = {k: dict(v) for k, v in sets.items()}
    for c in commands:
        for member, score in c.members.items():
            _write_one(out, c.kind, c.key, member, score)
    return out


def _tidy(sets: Sets) -> Sets:
    return {k: v for k, v in sets.items() if v}


KEYS = st.sampled_from(["presence:accounts", "presence:sockets", "presence:active"])
MEMBERS = st.sampled_from(["u1", "u2", "u3"])
SCORES = st.integers(0, 5).map(float)
WRITES = st.builds(Write, st.sampled_from(["add", "gt", "rem"]), KEYS, MEMBERS, SCORES)
STATES = st.dictionaries(KEYS, st.dictionaries(MEMBERS, SCORES))


@given(STATES, st.lists(WRITES, max_size=30), st.integers(1, 4))
def test_the_commands_leave_every_set_as_the_writes_in_order_would(
    start: Sets, writes: list[Write], max_members: int
) -> None:
    commands = coalesce(writes, max_members)
    assert _tidy(_commands(start, commands)) == _tidy(_one_by_one(start, writes))
    assert all(0 < len(c.members) <= max_members for c in commands)


@given(st.lists(WRITES, max_size=30))
def test_at_most_one_command_per_key_and_kind_when_nothing_is_split(writes: list[Write]) -> None:
    commands = coalesce(writes)
    assert len({(c.kind, c.key) for c in commands}) == len(commands)


def test_a_storm_of_connects_is_three_commands() -> None:
    writes = []
    for i in range(500):
        writes += [
            Write("add", "presence:accounts", f"u{i}", 10.0),
            Write("add", "presence:sockets", f"u{i}:s{i}", 10.0),
            Write("add", "presence:active", f"u{i}", 99.0),
        ]
    commands = coalesce(writes)
    assert sorted((c.kind, c.key, len(c.members)) for c in commands) == [
        ("add", "presence:accounts", 500),
        ("add", "presence:active", 500),
        ("add", "presence:sockets", 500),
    ]


def test_a_member_that_came_and_went_is_removed_once() -> None:
    writes = [
        Write("add", "presence:sockets", "u1:s1", 1.0),
        Write("rem", "presence:sockets", "u1:s1", 2.0),
    ]
    assert coalesce(writes) == [Command("rem", "presence:sockets", {"u1:s1": 2.0})]


def test_fold_raises_what_was_set_and_adds_what_was_removed() -> None:
    add, gt, rem = (Write(kind, "k", "m", 0.0) for kind in ("add", "gt", "rem"))
    assert fold(add._replace(score=5.0), gt._replace(score=3.0)) == add._replace(score=5.0)
    assert fold(add._replace(score=2.0), gt._replace(score=3.0)) == add._replace(score=3.0)
    assert fold(rem, gt._replace(score=3.0)) == add._replace(score=3.0)
    assert fold(gt._replace(score=4.0), gt._replace(score=3.0)) == gt._replace(score=4.0)
    assert fold(gt, add._replace(score=1.0)) == add._replace(score=1.0)
    assert fold(add, rem) == rem


def test_a_large_key_is_split_and_nothing_is_lost() -> None:
    writes = [Write("gt", "presence:active", f"u{i}", float(i)) for i in range(25)]
    commands = coalesce(writes, max_members=10)
    assert [len(c.members) for c in commands] == [10, 10, 5]
    assert {m: s for c in commands for m, s in c.members.items()} == {f"u{i}": float(i) for i in range(25)}
