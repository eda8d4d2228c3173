"""edge/deadlines.py: keys come back when their time has come, earliest first, once per add."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge.deadlines import Deadlines


def test_nothing_is_due_before_its_time_and_everything_due_comes_earliest_first() -> None:
    d: Deadlines[str] = Deadlines()
    d.add("b", 20.0)
    d.add("a", 10.0)
    d.add("c", 30.0)
    assert list(d.due(9.99)) == []
    assert list(d.due(20.0)) == ["a", "b"]
    assert len(d) == 1
    assert list(d.due(100.0)) == ["c"]
    assert list(d.due(1000.0)) == []


def test_a_key_put_back_later_comes_back_then_and_not_before() -> None:
    d: Deadlines[str] = Deadlines()
    d.add("s", 10.0)
    for key in d.due(10.0):
        d.add(key, 40.0)  # not expired: its new deadline
    assert list(d.due(39.0)) == []
    assert list(d.due(40.0)) == ["s"]


def test_unorderable_keys_at_the_same_time_are_fine() -> None:
    d: Deadlines[object] = Deadlines()
    a, b = object(), object()
    d.add(a, 1.0)
    d.add(b, 1.0)
    assert list(d.due(1.0)) == [a, b]


@given(st.lists(st.tuples(st.integers(0, 50), st.floats(0, 100)), max_size=60), st.floats(0, 100))
def test_due_hands_out_exactly_the_adds_due(adds: list[tuple[int, float]], now: float) -> None:
    d: Deadlines[int] = Deadlines()
    for key, at in adds:
        d.add(key, at)
    out = list(d.due(now))
    assert sorted(out) == sorted(k for k, at in adds if at <= now)
    assert len(d) == sum(1 for _, at in adds if at > now)
    rest = list(d.due(float("inf")))
    assert sorted(out + rest) == sorted(k for k, _ in adds)
