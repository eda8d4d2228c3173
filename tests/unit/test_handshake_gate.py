"""actors/core/handshake_gate.py: lane handshakes limited per source and queued, not refused."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.handshake_gate import Entry, HandshakeGate


def gate(
    total: int = 4, per_source: int = 2, waiting_per_source: int = 3, waiting_total: int = 5
) -> HandshakeGate[int]:
    return HandshakeGate(total, per_source, waiting_per_source, waiting_total)


def test_one_source_holding_its_maximum_keeps_nobody_else_out() -> None:
    g = gate()
    assert [g.enter("attacker", i) for i in range(2)] == [Entry.GO, Entry.GO]
    assert [g.enter("attacker", i) for i in range(2, 5)] == [Entry.WAIT] * 3
    assert g.enter("attacker", 5) is Entry.REFUSE  # its line is full
    assert g.enter("edge", 100) is Entry.GO  # a real edge passes at once
    assert g.enter("edge", 101) is Entry.GO


def test_waiting_ones_go_in_order_when_a_place_frees() -> None:
    g = gate()
    g.enter("a", 1), g.enter("a", 2)
    assert g.enter("a", 3) is Entry.WAIT and g.enter("a", 4) is Entry.WAIT
    assert g.leave("a") == [("a", 3)]
    assert g.leave("a") == [("a", 4)]
    assert g.leave("a") == [] and g.leave("a") == [] and g.in_progress == 0


def test_past_the_total_sources_take_turns() -> None:
    g = gate(total=2, per_source=2, waiting_per_source=5, waiting_total=10)
    g.enter("a", 1), g.enter("a", 2)
    for t in (3, 4, 5):
        assert g.enter("a", t) is Entry.WAIT
    assert g.enter("b", 10) is Entry.WAIT and g.enter("b", 11) is Entry.WAIT
    assert g.leave("a") == [("a", 3)]  # a's line was first
    assert g.leave("a") == [("b", 10)]  # then b's, though a has more waiting
    assert g.leave("a") == [("a", 4)]
    assert g.leave("b") == [("b", 11)]


def test_withdrawn_tickets_leave_the_line() -> None:
    g = gate()
    g.enter("a", 1), g.enter("a", 2), g.enter("a", 3)
    g.withdraw("a", 3)
    g.withdraw("a", 99)  # unknown: nothing
    assert g.waiting == 0 and g.leave("a") == []


def test_the_total_waiting_is_bounded() -> None:
    g = gate(total=1, per_source=1, waiting_per_source=5, waiting_total=2)
    assert g.enter("a", 1) is Entry.GO
    assert g.enter("b", 2) is Entry.WAIT and g.enter("c", 3) is Entry.WAIT
    assert g.enter("d", 4) is Entry.REFUSE


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["enter", "leave", "withdraw"]), st.sampled_from("abc"), st.integers(0, 30))
    )
)
def test_limits_always_hold(steps: list[tuple[str, str, int]]) -> None:
    g = gate(total=3, per_source=2, waiting_per_source=2, waiting_total=4)
    running: dict[str, int] = {}
    waiting: dict[str, list[int]] = {}
    for op, source, ticket in steps:
        admitted: list[tuple[str, int]] = []
        if op == "enter":
            entry = g.enter(source, ticket)
            if entry is Entry.GO:
                running[source] = running.get(source, 0) + 1
            elif entry is Entry.WAIT:
                waiting.setdefault(source, []).append(ticket)
        elif op == "leave" and running.get(source):
            running[source] -= 1
            admitted = g.leave(source)
        elif op == "withdraw" and ticket in waiting.get(source, []):
            waiting[source].remove(ticket)
            g.withdraw(source, ticket)
        for s, t in admitted:
            assert waiting[s][0] == t  # first in line of its source
            waiting[s].pop(0)
            running[s] = running.get(s, 0) + 1
        assert all(n <= 2 for n in running.values())
        assert sum(running.values()) <= 3 == g.total
        assert sum(len(w) for w in waiting.values()) == g.waiting <= 4
        # Nobody waits while there is room for it.
        for s, w in waiting.items():
            if w:
                assert sum(running.values()) == 3 or running.get(s, 0) == 2
