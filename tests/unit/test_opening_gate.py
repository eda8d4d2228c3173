"""The edge's opening gate (edge/opening.py): at most `limit` connections opening at once, the
rest wait in arrival order for a bounded time and number, and nothing is lost or counted twice."""

from __future__ import annotations

from edge.opening import Entry, OpeningGate


def gate(limit: int = 2, queue_max: int = 3, queue_s: float = 5.0) -> OpeningGate[str]:
    return OpeningGate(limit, queue_max, queue_s)


def test_within_the_limit_every_connection_opens_at_once() -> None:
    g = gate()
    assert g.enter("a", 0.0) is Entry.GO
    assert g.enter("b", 0.0) is Entry.GO
    assert g.active == {"a", "b"} and not g.waiting


def test_past_the_limit_they_wait_and_take_freed_places_first_come_first_served() -> None:
    g = gate()
    g.enter("a", 0.0)
    g.enter("b", 0.0)
    assert g.enter("c", 1.0) is Entry.WAIT
    assert g.enter("d", 2.0) is Entry.WAIT
    turns = g.leave("a", 3.0)
    assert turns.admitted == [("c", 2.0)] and not turns.expired
    assert g.active == {"b", "c"} and list(g.waiting) == ["d"]
    # A place that comes free while somebody waits is never taken by a newcomer.
    assert g.enter("e", 3.0) is Entry.WAIT
    assert [c for c, _ in g.leave("b", 4.0).admitted] == ["d"]


def test_a_full_queue_refuses_at_once() -> None:
    g = gate(limit=1, queue_max=2)
    g.enter("a", 0.0)
    assert [g.enter(c, 0.0) for c in "bcd"] == [Entry.WAIT, Entry.WAIT, Entry.REFUSE]
    assert "d" not in g.waiting


def test_those_that_waited_too_long_are_dropped_not_opened() -> None:
    g = gate(limit=1, queue_s=5.0)
    g.enter("a", 0.0)
    g.enter("old", 0.0)
    g.enter("new", 4.0)
    turns = g.leave("a", 6.0)
    assert turns.expired == ["old"] and turns.admitted == [("new", 2.0)]


def test_expire_drops_stale_waiters_even_when_no_place_comes_free() -> None:
    g = gate(limit=1, queue_s=5.0)
    g.enter("a", 0.0)
    g.enter("b", 0.0)
    g.enter("c", 3.0)
    turns = g.expire(5.5)
    assert turns.expired == ["b"] and not turns.admitted
    assert list(g.waiting) == ["c"] and g.active == {"a"}


def test_leaving_is_idempotent_and_a_waiter_that_goes_frees_its_spot() -> None:
    g = gate(limit=1)
    g.enter("a", 0.0)
    g.enter("b", 0.0)
    g.leave("b", 1.0)  # gone while waiting
    assert not g.waiting and g.active == {"a"}
    g.leave("a", 1.0)
    g.leave("a", 1.0)  # authenticated, then gone: counted once
    assert not g.active
    assert g.enter("c", 2.0) is Entry.GO


def test_drain_hands_over_every_waiter() -> None:
    g = gate(limit=1)
    g.enter("a", 0.0)
    g.enter("b", 0.0)
    g.enter("c", 0.0)
    assert g.drain() == ["b", "c"] and not g.waiting


def test_full_says_whether_a_newcomer_would_be_refused() -> None:
    g = gate(limit=1, queue_max=1)
    assert not g.full()
    g.enter("a", 0.0)
    assert not g.full()  # the line has room
    g.enter("b", 0.0)
    assert g.full() and g.enter("c", 0.0) is Entry.REFUSE
