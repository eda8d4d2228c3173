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


def test_a_key_added_again_is_handed_out_once_at_its_latest_time() -> None:
    d: Deadlines[str] = Deadlines()
    d.add("s", 10.0)  # at open: the identify timeout
    d.add("s", 90.0)  # identified: the liveness timeout
    d.add("t", 50.0)
    d.add("t", 5.0)  # rescheduled earlier
    assert list(d.due(60.0)) == ["t"]
    assert len(d) == 1
    assert list(d.due(1000.0)) == ["s"]
    assert list(d.due(2000.0)) == [] and len(d) == 0


@given(st.lists(st.tuples(st.integers(0, 20), st.floats(0, 100)), max_size=60), st.floats(0, 100))
def test_due_hands_out_exactly_the_keys_whose_latest_time_has_come(
    adds: list[tuple[int, float]], now: float
) -> None:
    d: Deadlines[int] = Deadlines()
    latest: dict[int, float] = {}
    for key, at in adds:
        d.add(key, at)
        latest[key] = at
    out = list(d.due(now))
    assert sorted(out) == sorted(k for k, at in latest.items() if at <= now)
    assert out == sorted(out, key=lambda k: latest[k])  # earliest first
    assert len(d) == sum(1 for at in latest.values() if at > now)
    rest = list(d.due(float("inf")))
    assert sorted(out + rest) == sorted(latest)
