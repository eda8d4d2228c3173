"""The audience rule (protocol.md): everybody who shares a server with an account or has an
accepted friendship with it; an account is always in its own audience."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.audience import NO_RELATIONS, Relations, decided_by_target, in_audience


def r(friends: set[str] | None = None, servers: set[str] | None = None, vis: str = "everyone") -> Relations:
    return Relations(frozenset(friends or ()), frozenset(servers or ()), vis)


@pytest.mark.parametrize(
    ("target_rel", "reader_rel", "inside"),
    [
        (r(servers={"g1"}), r(servers={"g1"}), True),  # server in common
        (r(servers={"g1", "g2"}), r(servers={"g2", "g3"}), True),  # one of several in common
        (r(servers={"g1"}), r(servers={"g2"}), False),  # different servers
        (r(), r(), False),  # strangers
        (r(friends={"reader"}), r(friends={"target"}), True),  # accepted friendship
        (r(friends={"reader"}, servers={"g1"}), r(servers={"g2"}), True),  # friend, no server in common
        (
            r(friends={"someone-else"}),
            r(friends={"target"}),
            False,
        ),  # the reader's side alone is no friendship
        (r(servers={"g1"}), r(friends={"target"}), False),
    ],
)
def test_table(target_rel: Relations, reader_rel: Relations, inside: bool) -> None:
    assert in_audience("target", target_rel, "reader", reader_rel) is inside


def test_an_account_is_in_its_own_audience() -> None:
    assert in_audience("u", NO_RELATIONS, "u", NO_RELATIONS)


def test_last_seen_setting_does_not_narrow_the_audience() -> None:
    """The setting governs the timestamp, never whether an account's status is visible."""
    for vis in ("everyone", "friends", "nobody"):
        assert in_audience("t", r(servers={"g"}, vis=vis), "x", r(servers={"g"}, vis=vis))
        assert in_audience("t", r(friends={"x"}, vis=vis), "x", r(friends={"t"}, vis=vis))


def test_no_relations_is_empty() -> None:
    assert Relations(frozenset(), frozenset(), "everyone") == NO_RELATIONS


ids = st.sampled_from(["a", "b", "c", "d"])
servers = st.frozensets(st.sampled_from(["g1", "g2", "g3"]))


@given(
    friendships=st.sets(st.tuples(ids, ids)),
    members=st.fixed_dictionaries({u: servers for u in "abcd"}),
    t=ids,
    x=ids,
)
def test_symmetric_when_friendships_are_stored_both_ways(
    friendships: set[tuple[str, str]], members: dict[str, frozenset[str]], t: str, x: str
) -> None:
    """With friendships on both sides (as the database keeps them) the audience is symmetric and
    equals: same account, or friends, or a server in common."""

    def rel(u: str) -> Relations:
        friends = frozenset(b for a, b in friendships if a == u) | frozenset(
            a for a, b in friendships if b == u
        )
        return Relations(friends - {u}, members[u])

    inside = in_audience(t, rel(t), x, rel(x))
    assert inside == in_audience(x, rel(x), t, rel(t))
    is_pair = (t, x) in friendships or (x, t) in friendships
    assert inside == (t == x or (is_pair and t != x) or bool(members[t] & members[x]))


@given(
    target_rel=st.builds(Relations, st.frozensets(ids), servers),
    reader_rel=st.builds(Relations, st.frozensets(ids), servers),
    t=ids,
    x=ids,
)
def test_decided_by_target_holds_whatever_the_readers_relations(
    target_rel: Relations, reader_rel: Relations, t: str, x: str
) -> None:
    """What lets a shard answer a query without loading the reader's relations: when the target's
    own relations decide, the reader's (here any, or none at all) change nothing."""
    if decided_by_target(t, target_rel, x):
        assert in_audience(t, target_rel, x, reader_rel)
        assert in_audience(t, target_rel, x, NO_RELATIONS)


def test_decided_by_target_only_for_another_account_named_a_friend() -> None:
    assert decided_by_target("t", r(friends={"x"}), "x")
    assert not decided_by_target("t", r(servers={"g1"}), "x")  # a server: the reader's servers decide
    assert not decided_by_target("x", r(friends={"x"}), "x")  # oneself: these are the reader's own
