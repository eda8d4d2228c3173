"""The edge's opening gate (edge/opening.py): at most `limit` connections opening at once, the
rest wait in arrival order for a bounded time and number, and nothing is lost or counted twice."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from edge.opening import Entry, OpeningGate, OpeningPace, Turns


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


# ---------------------------------------------------------------------------- shares per address


def shared(limit: int = 4, share: int = 1, evict_after_s: float = 2.0) -> OpeningGate[str]:
    return OpeningGate(limit, 100, 5.0, share=share, evict_after_s=evict_after_s)


def test_an_address_over_its_share_gives_up_an_idle_place_to_one_that_waits() -> None:
    """Four addresses' idle connections (sent nothing, or no identify) used to hold every place
    and keep every other client out."""
    g = shared()
    for conn in ("x1", "x2", "x3", "x4"):
        assert g.enter(conn, 0.0, "attacker") is Entry.GO  # nobody else waits: it may take them all
    assert g.enter("me", 1.0, "client") is Entry.WAIT
    assert g.make_room(1.0, "client") == [], "held idle for less than evict_after_s"
    assert g.make_room(2.5) == ["x1"]  # the oldest idle place, one for the one waiting
    turns = g.leave("x1", 2.5)  # the edge dropped it
    assert turns.admitted == [("me", 1.5)] and "me" in g.active


def test_freed_places_go_to_addresses_under_their_share_first() -> None:
    g = shared(limit=2)
    g.enter("x1", 0.0, "heavy")
    g.enter("x2", 0.0, "heavy")
    g.enter("x3", 1.0, "heavy")  # waits, first in line
    g.enter("me", 2.0, "light")  # waits, second in line but under its share
    assert [c for c, _ in g.leave("x2", 3.0).admitted] == ["me"]
    assert [c for c, _ in g.leave("x1", 3.0).admitted] == ["x3"], "nobody under its share waits"


def test_a_connection_that_identified_is_never_dropped_for_another() -> None:
    g = shared(limit=2)
    g.enter("x1", 0.0, "heavy")
    g.enter("x2", 0.0, "heavy")
    g.progressed("x1")
    g.progressed("x2")
    g.enter("me", 1.0, "light")
    assert g.make_room(60.0) == []


def test_addresses_within_their_share_still_give_idle_places_to_one_holding_fewer() -> None:
    """Eight addresses holding their 16 idle places each (every place of 128) kept every other
    client of an edge out: nobody was over its share, so nothing was ever given up (against
    `presence up`: twelve loopback addresses, no token, refused a real client 6 times in 8)."""
    g = shared(limit=4, share=2)
    for conn, source in (("a1", "a"), ("a2", "a"), ("b1", "b"), ("b2", "b")):
        assert g.enter(conn, 0.0, source) is Entry.GO  # both within their share
    assert g.enter("me", 1.0, "client") is Entry.WAIT
    assert g.make_room(1.0, "client") == [], "held idle for less than evict_after_s"
    assert g.make_room(2.5) == ["a1"]  # the oldest idle place of an address holding the most
    assert [c for c, _ in g.leave("a1", 2.5).admitted] == ["me"]


def test_no_room_is_made_by_an_address_holding_no_more_than_the_one_waiting() -> None:
    g = shared(limit=3, share=2)
    g.enter("a1", 0.0, "a")
    g.enter("b1", 0.0, "b")
    g.enter("c1", 0.0, "c")
    g.enter("b2", 1.0, "b")  # b holds 1, as every other address does
    assert g.make_room(9.0) == []
    g.enter("a2", 1.0, "a")
    assert g.make_room(9.0) == []
    g.enter("d1", 1.0, "d")  # d holds none: one of the others gives a place up
    assert g.make_room(9.0, "d") == ["a1"]


def test_no_room_is_made_for_an_address_at_its_share() -> None:
    g = shared(limit=3, share=2)
    g.enter("a1", 0.0, "a")
    g.enter("a2", 0.0, "a")
    g.enter("a3", 0.0, "a")  # over its share while nobody waits
    g.enter("a4", 1.0, "a")
    assert g.make_room(9.0) == [], "a waits for itself"


def test_without_a_share_nothing_is_ever_dropped() -> None:
    g = OpeningGate[str](1, 10, 5.0)
    g.enter("x", 0.0, "a")
    g.enter("y", 0.0, "b")
    assert g.make_room(60.0) == []


def test_a_place_given_up_is_not_picked_twice() -> None:
    g = shared(limit=2)
    g.enter("x1", 0.0, "heavy")
    g.enter("x2", 0.0, "heavy")
    g.enter("me", 5.0, "light")
    g.enter("you", 5.0, "other")
    assert g.make_room(5.0, "light") == ["x1"]
    assert g.make_room(5.0) == ["x2"], "x1 is not picked again; heavy keeps one, other none"
    assert g.make_room(5.0) == [], "heavy keeps none now"


SOURCES = ["a", "b", "c"]


class GateMachine(RuleBasedStateMachine):
    """Entries, leaves, identifies and evictions from three addresses in any order: the gate never
    holds more than its limit, counts every place once, and only ever gives up idle places of
    an address holding more than one that waits under its share."""

    def __init__(self) -> None:
        super().__init__()
        self.g: OpeningGate[int] = OpeningGate(4, 6, 5.0, share=1, evict_after_s=2.0)
        self.now = 0.0
        self.next_id = 0
        self.where: dict[int, str] = {}  # every connection still in the gate, by address
        self.working: set[int] = set()

    @rule(source=st.sampled_from(SOURCES), dt=st.sampled_from([0.0, 0.5, 3.0]))
    def arrive(self, source: str, dt: float) -> None:
        self.now += dt
        conn, self.next_id = self.next_id, self.next_id + 1
        held_before = sum(1 for c in self.g.active if self.where[c] == source)
        entry = self.g.enter(conn, self.now, source)
        if entry is Entry.GO:
            assert len(self.g.active) <= self.g.limit, "opened past the limit"
        if entry is not Entry.REFUSE:
            self.where[conn] = source
        if entry is Entry.WAIT:
            self._make_room(self.g.make_room(self.now, source), source if held_before < 1 else None)

    @rule()
    def housekeeping(self) -> None:
        self._make_room(self.g.make_room(self.now), None)

    def _make_room(self, victims: list[int], claimant: str | None) -> None:
        held = Counter(self.where[c] for c in self.g.active)
        waiting = {self.where[c] for c in self.g.waiting if held[self.where[c]] < 1}
        for victim in victims:
            donor = self.where[victim]
            assert waiting - {donor}, "given up only for an address under its share that waits"
            assert held[donor] > min(held[w] for w in waiting - {donor}), "by one holding more"
            assert donor != claimant and victim not in self.working and victim in self.g.active
            held[donor] -= 1
        for victim in victims:
            self._gone(victim)

    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        if self.where:
            self._gone(data.draw(st.sampled_from(sorted(self.where))))

    @rule(data=st.data())
    def identify(self, data: st.DataObject) -> None:
        active = sorted(self.g.active)
        if active:
            conn = data.draw(st.sampled_from(active))
            self.g.progressed(conn)
            self.working.add(conn)

    @rule()
    def tick(self) -> None:
        self.now += 1.0
        self._turns(self.g.expire(self.now))

    @rule(limit=st.integers(1, 5))
    def pace(self, limit: int) -> None:
        """`OpeningPace` moved the places (the edge's `_set_opening_limit`): fewer leave the
        ones open where they are, more let the line move at once."""
        self.g.limit = limit
        self._turns(self.g.expire(self.now))

    def _turns(self, turns: Turns[int]) -> None:
        if turns.admitted:
            assert len(self.g.active) <= self.g.limit, "admitted past the limit"
        for conn in turns.expired:
            del self.where[conn]

    def _gone(self, conn: int) -> None:
        turns = self.g.leave(conn, self.now)
        del self.where[conn]
        self.working.discard(conn)
        self._turns(turns)

    @invariant()
    def places_are_counted_once(self) -> None:
        g = self.g
        assert not (g.active & set(g.waiting))
        assert g.active | set(g.waiting) == set(self.where)
        assert g._held == Counter(self.where[c] for c in g.active)
        assert sum(len(line) for line in g._lines.values()) == len(g.waiting)
        if len(g.active) < g.limit:
            assert not g.waiting, "a free place while somebody waits"


GateMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestGateMachine = GateMachine.TestCase


# ---------------------------------------------------------------------------- the pace


def pace(floor: int = 16, ceiling: int = 128) -> OpeningPace:
    return OpeningPace(floor, ceiling, lag_limit_s=0.020)


def full(p: OpeningPace) -> OpeningPace:
    for _ in range(30):
        p.observe(0.0, waited=True, busiest=p.limit)
    assert p.limit == p.ceiling
    return p


def test_the_places_start_at_the_floor_and_double_while_connections_wait_and_the_loop_keeps_time() -> None:
    p = pace()
    assert p.limit == 16
    assert [p.observe(0.001, waited=True, busiest=p.limit) for _ in range(4)] == [32, 64, 128, 128]


def test_after_the_loop_first_ran_late_they_grow_by_a_quarter() -> None:
    p = pace()
    p.observe(0.0, waited=True, busiest=16)  # 32
    assert p.observe(0.05, waited=True, busiest=32) == 16
    assert [p.observe(0.0, waited=True, busiest=p.limit) for _ in range(4)] == [20, 25, 31, 38]


def test_they_reach_the_ceiling_and_stay_there_while_the_loop_keeps_time() -> None:
    p = full(pace())
    assert p.observe(0.0, waited=True, busiest=128) == 128


def test_a_late_loop_halves_them_whether_or_not_anybody_waits() -> None:
    p = full(pace())
    assert p.observe(0.021, waited=True, busiest=128) == 64
    assert p.observe(0.5, waited=False, busiest=128) == 32
    assert p.observe(0.5, waited=True, busiest=40) == 16
    assert p.observe(0.5, waited=True, busiest=16) == 16  # never under the floor


def test_lateness_at_the_limit_is_not_late() -> None:
    assert pace().observe(0.020, waited=True, busiest=16) == 32


def test_an_interval_nobody_waited_in_keeps_at_most_twice_the_most_opening_at_once() -> None:
    p = full(pace())
    assert p.observe(0.0, waited=False, busiest=100) == 128  # a storm in full swing keeps them
    assert p.observe(0.0, waited=False, busiest=30) == 60
    assert p.observe(0.0, waited=False, busiest=40) == 60  # never grown without a wait
    assert p.observe(0.0, waited=False, busiest=2) == 16  # openings trickle: the floor


def test_rest_starts_the_next_storm_from_the_floor_in_slow_start() -> None:
    p = full(pace())
    p.observe(0.05, waited=True, busiest=128)
    assert p.rest() == 16 and p.limit == 16
    assert p.observe(0.0, waited=True, busiest=16) == 32


def test_a_small_floor_still_grows() -> None:
    p = pace(floor=1, ceiling=5)
    assert [p.observe(0.0, waited=True, busiest=p.limit) for _ in range(4)] == [2, 4, 5, 5]
    p.observe(0.05, waited=True, busiest=5)  # 2, out of slow start
    assert [p.observe(0.0, waited=True, busiest=p.limit) for _ in range(3)] == [3, 4, 5]


@pytest.mark.parametrize(("floor", "ceiling"), [(0, 4), (5, 4)])
def test_a_floor_outside_one_to_the_ceiling_is_refused(floor: int, ceiling: int) -> None:
    with pytest.raises(ValueError, match="floor"):
        OpeningPace(floor, ceiling, lag_limit_s=0.02)


@given(
    floor=st.integers(1, 64),
    extra=st.integers(0, 200),
    steps=st.lists(st.tuples(st.floats(0, 0.2), st.booleans(), st.integers(0, 300)), max_size=60),
)
def test_the_places_stay_between_floor_and_ceiling_and_only_a_wait_on_time_adds_any(
    floor: int, extra: int, steps: list[tuple[float, bool, int]]
) -> None:
    p = OpeningPace(floor, floor + extra, lag_limit_s=0.02)
    for lag, waited, busiest in steps:
        before = p.limit
        after = p.observe(lag, waited, busiest)
        assert floor <= after <= floor + extra
        if lag > 0.02:
            assert after == max(floor, before // 2)
        elif waited:
            assert after >= before
        else:
            assert after == max(floor, min(before, 2 * busiest))
