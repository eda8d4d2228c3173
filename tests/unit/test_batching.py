"""The router's batching rule (edge/batching.py `Lines`), pure: when a shard's line leaves, how
long its timer runs, and how calls in flight make the batches grow. The router's own tests
(tests/unit/test_router_batching.py) check the same through real timers and a fake pool."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from edge.batching import KEEP_TIMER, SEND_NOW, Lines

WINDOW, IDLE, CONNECT = 0.002, 0.0002, 0.05


def lines(max_ops: int = 500, max_in_flight: int = 2, connect_window: float = CONNECT) -> Lines[str]:
    # Items are strings; those starting with "c" are lazy (connects).
    return Lines(
        window_s=WINDOW,
        idle_window_s=IDLE,
        connect_window_s=connect_window,
        max_ops=max_ops,
        max_in_flight=max_in_flight,
        is_lazy=lambda item: item.startswith("c"),
    )


def test_an_idle_line_waits_only_the_idle_window_then_keeps_its_timer() -> None:
    b = lines()
    assert b.add(0, "op1") == IDLE
    assert b.add(0, "op2") == KEEP_TIMER
    assert b.take(0) == ["op1", "op2"]
    assert b.take(0) is None  # nothing waits


def test_a_busy_line_gathers_for_the_window() -> None:
    b = lines()
    b.add(0, "op1")
    b.take(0)
    assert b.add(0, "op2") == WINDOW


def test_a_full_line_leaves_at_once_in_batches_of_max_ops() -> None:
    b = lines(max_ops=3, max_in_flight=1)
    assert [b.add(0, f"op{i}") for i in range(3)] == [IDLE, KEEP_TIMER, SEND_NOW]
    for i in range(3, 8):
        b.add(0, f"op{i}")
    assert b.take(0) == ["op0", "op1", "op2"]
    assert b.take(0) is None  # one call in flight at most
    assert b.came_back(0)  # the rest waited for it: it leaves now
    assert b.take(0) == ["op3", "op4", "op5"]
    assert b.came_back(0)
    assert b.take(0) == ["op6", "op7"]
    assert not b.came_back(0)  # nothing left


def test_what_arrives_while_calls_are_out_leaves_as_one_batch_when_one_comes_back() -> None:
    b = lines(max_in_flight=1)
    b.add(0, "op1")
    assert b.take(0) == ["op1"]
    for i in range(2, 9):
        b.add(0, f"op{i}")
    assert b.take(0) is None  # the timer ran out, but the one call allowed is out
    assert b.came_back(0)
    assert b.take(0) == [f"op{i}" for i in range(2, 9)]


def test_up_to_max_in_flight_calls_go_out() -> None:
    b = lines(max_in_flight=2)
    b.add(0, "a1")
    assert b.take(0) == ["a1"]
    b.add(0, "a2")
    assert b.take(0) == ["a2"]
    b.add(0, "a3")
    assert b.take(0) is None
    assert b.in_flight(0) == 2


def test_lines_of_different_shards_are_apart() -> None:
    b = lines(max_in_flight=1)
    b.add(0, "op1")
    b.add(1, "op2")
    assert b.take(0) == ["op1"]
    assert b.take(1) == ["op2"]


def test_connects_on_a_busy_line_wait_their_window_not_the_call_coming_back() -> None:
    b = lines(max_in_flight=1)
    b.add(0, "op1")
    b.take(0)
    assert b.add(0, "c1") == CONNECT
    assert b.add(0, "c2") == KEEP_TIMER
    assert not b.came_back(0)  # the timer runs: the connects keep gathering
    assert b.take(0) == ["c1", "c2"]  # when it runs out


def test_anything_else_joining_a_line_of_connects_rearms_it_with_the_usual_window() -> None:
    b = lines(max_in_flight=2)
    b.add(0, "op1")
    b.take(0)
    assert b.add(0, "c1") == CONNECT
    assert b.add(0, "op2") == WINDOW  # re-armed, shorter
    assert b.add(0, "op3") == KEEP_TIMER
    assert b.take(0) == ["c1", "op2", "op3"]  # in order


def test_an_urgent_line_leaves_when_a_call_comes_back_even_with_its_timer_running() -> None:
    b = lines(max_in_flight=1)
    b.add(0, "op1")
    b.take(0)
    b.add(0, "op2")
    assert b.came_back(0)


def test_connects_on_an_idle_line_leave_after_the_idle_window() -> None:
    assert lines().add(0, "c1") == IDLE


def test_without_a_connect_window_connects_are_like_anything_else() -> None:
    b = Lines(
        window_s=WINDOW,
        idle_window_s=IDLE,
        connect_window_s=0.0,
        max_ops=500,
        max_in_flight=1,
        is_lazy=lambda _: False,
    )
    b.add(0, "op1")
    b.take(0)
    assert b.add(0, "c1") == WINDOW


def test_a_rest_of_connects_only_waits_for_its_timer() -> None:
    b = lines(max_ops=2, max_in_flight=1)
    b.add(0, "op1")
    b.add(0, "op2")  # full: sent
    assert b.take(0) == ["op1", "op2"]
    b.add(0, "c1")
    b.add(0, "c2")
    b.add(0, "c3")
    assert b.came_back(0) is False  # connects only, timer armed
    assert b.take(0) == ["c1", "c2"]


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.integers(0, 2), st.booleans()),
            st.tuples(st.just("take"), st.integers(0, 2), st.just(False)),
            st.tuples(st.just("back"), st.integers(0, 2), st.just(False)),
        ),
        max_size=80,
    )
)
def test_every_item_leaves_once_in_order_and_calls_stay_within_the_limit(
    steps: list[tuple[str, int, bool]],
) -> None:
    b = lines(max_ops=3, max_in_flight=2)
    added: dict[int, list[str]] = {0: [], 1: [], 2: []}
    sent: dict[int, list[str]] = {0: [], 1: [], 2: []}
    out = {0: 0, 1: 0, 2: 0}
    n = 0
    for kind, shard, lazy in steps:
        if kind == "add":
            n += 1
            item = f"{'c' if lazy else 'o'}{n}"
            added[shard].append(item)
            b.add(shard, item)
        elif kind == "take" or (kind == "back" and out[shard] and b.came_back(shard)):
            if kind == "back":
                out[shard] -= 1
            batch = b.take(shard)
            if batch is not None:
                assert 0 < len(batch) <= 3
                sent[shard] += batch
                out[shard] += 1
        elif kind == "back" and out[shard]:
            out[shard] -= 1
        assert all(0 <= b.in_flight(s) == out[s] <= 2 for s in out)
    for shard in added:
        while out[shard]:
            b.came_back(shard)
            out[shard] -= 1
        while (batch := b.take(shard)) is not None:
            sent[shard] += batch
            b.came_back(shard)
        assert sent[shard] == added[shard]
