"""The edge's index of watchers (edge/watch_index.py): a publication about an account reaches
exactly the sockets the shard's last note put on its side (own sockets for the real status, the
audience for the visible one), never one outside the audience, an unsubscribed or a closed socket,
nor one listed by a shard that has since restarted."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge.watch_index import WatchIndex

USERS = ["a", "b", "c"]
SOCKETS = {"a1": "a", "a2": "a", "b1": "b", "c1": "c"}


def test_a_note_lists_the_socket_on_its_side() -> None:
    ix = WatchIndex()
    ix.see("b1", "b", ["a", "b"], ["c"])
    ix.see("a1", "a", ["a"], [])
    assert set(ix.watchers("a", own=False)) == {"b1"}
    assert set(ix.watchers("a", own=True)) == {"a1"}
    assert set(ix.watchers("b", own=True)) == {"b1"}
    assert set(ix.watchers("c", own=False)) == set()
    assert ix.listed("b1") == {"a", "b"}


def test_leaving_the_audience_unlists() -> None:
    ix = WatchIndex()
    ix.see("b1", "b", ["a"], [])
    ix.see("b1", "b", [], ["a"])
    assert not ix.watchers("a", own=False)
    assert len(ix) == 0


def test_unwatch_and_close() -> None:
    ix = WatchIndex()
    ix.see("b1", "b", ["a", "c"], [])
    ix.see("c1", "c", ["a"], [])
    ix.unwatch("b1", ["a"])
    assert set(ix.watchers("a", own=False)) == {"c1"}
    ix.drop("c1")
    ix.drop("c1")  # twice: harmless
    assert not ix.watchers("a", own=False)
    assert set(ix.watchers("c", own=False)) == {"b1"}


def test_a_restarted_shard_is_forgotten() -> None:
    ix = WatchIndex()
    ix.see("b1", "b", ["a", "c", "b"], [])
    ix.forget(lambda user: user in ("a", "b"))
    assert not ix.watchers("a", own=False) and not ix.watchers("b", own=True)
    assert set(ix.watchers("c", own=False)) == {"b1"}
    assert ix.listed("b1") == {"c"}


step = st.one_of(
    st.tuples(
        st.just("see"),
        st.sampled_from(sorted(SOCKETS)),
        st.sets(st.sampled_from(USERS)),
        st.sets(st.sampled_from(USERS)),
    ),
    st.tuples(st.just("unwatch"), st.sampled_from(sorted(SOCKETS)), st.sets(st.sampled_from(USERS))),
    st.tuples(st.just("drop"), st.sampled_from(sorted(SOCKETS))),
    st.tuples(st.just("forget"), st.sets(st.sampled_from(USERS))),
)


@given(st.lists(step, max_size=40))
def test_the_index_is_the_last_word_per_socket_and_account(steps: list[tuple[object, ...]]) -> None:
    """Against a plain model, a set of (socket, account): the sockets a publication reaches are
    exactly those whose last note put the account inside, not unwatched, closed or forgotten
    since; own sockets and the audience never mix."""
    ix = WatchIndex()
    model: set[tuple[str, str]] = set()
    for s in steps:
        match s:
            case ("see", str(sid), set(inside), set(outside)):
                inside = inside - outside  # one note never says both
                ix.see(sid, SOCKETS[sid], sorted(inside), sorted(outside))
                model |= {(sid, t) for t in inside}
                model -= {(sid, t) for t in outside}
            case ("unwatch", str(sid), set(targets)):
                ix.unwatch(sid, sorted(targets))
                model -= {(sid, t) for t in targets}
            case ("drop", str(sid)):
                ix.drop(sid)
                model = {(x, t) for x, t in model if x != sid}
            case ("forget", set(users)):
                ix.forget(lambda u, users=users: u in users)  # type: ignore[misc]
                model = {(x, t) for x, t in model if t not in users}
        for u in USERS:
            own = {x for x, t in model if t == u and SOCKETS[x] == u}
            others = {x for x, t in model if t == u and SOCKETS[x] != u}
            assert set(ix.watchers(u, own=True)) == own
            assert set(ix.watchers(u, own=False)) == others
        for sid in SOCKETS:
            assert ix.listed(sid) == {t for x, t in model if x == sid}
        assert len(ix) == len({x for x, _ in model})
