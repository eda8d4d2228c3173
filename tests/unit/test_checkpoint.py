"""The rolling checkpoint: every present account once a round, in slices, never a departed one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.core.shard import ShardState


def online(n: int, interval: float = 100.0) -> ShardState:
    s = ShardState(checkpoint_interval_s=interval, socket_timeout_s=10_000)
    for i in range(n):
        u = f"u{i}"
        s.set_relations(u, Relations(), 0.0)
        s.load_account(u, AccountRow(), 0.0)
        s.connect(u, f"s-{u}", "e", 0.0)
    return s


def test_the_first_round_begins_one_interval_after_start() -> None:
    s = online(10)
    assert [s.checkpoint_chunk(float(t)) for t in range(100)] == [[]] * 100
    assert s.checkpoint_rounds == 0
    s.checkpoint_chunk(100.0)
    assert s.checkpoint_rounds == 1


def test_a_round_is_handed_out_in_even_slices_over_most_of_the_interval() -> None:
    s = online(800)
    s.checkpoint_chunk(-100.0)  # started one interval ago: a round begins at 0
    sizes = [len(s.checkpoint_chunk(float(t))) for t in range(100)]
    assert sum(sizes) == 800
    assert sizes[0] == 0 and max(sizes) == 10  # 800 over 80 s
    assert sizes[81:] == [0] * 19  # nothing in the last 20 % of the interval
    assert s.checkpoint_rounds == 1
    assert len(s.checkpoint_chunk(100.0)) == 0 and s.checkpoint_rounds == 2  # the next round begins


def test_slices_carry_the_time_they_are_handed_out() -> None:
    s = online(10)
    s.checkpoint_chunk(-100.0)
    s.checkpoint_chunk(0.0)
    assert {ts for _, ts in s.checkpoint_chunk(40.0)} == {40.0}


@settings(max_examples=100, deadline=None)
@given(st.sets(st.integers(0, 49), max_size=50), st.lists(st.floats(0.5, 30.0), min_size=1, max_size=20))
def test_every_present_account_once_per_round_and_no_departed_one(
    leavers: set[int], steps: list[float]
) -> None:
    s = online(50)
    now, seen = 0.0, []
    s.checkpoint_chunk(-100.0)
    s.checkpoint_chunk(now)
    for k, dt in enumerate(steps):
        now = min(now + dt, 99.0)
        for i in sorted(leavers):
            if i % len(steps) == k:
                s.disconnect(f"u{i}", f"s-u{i}", now)
        for user, ts in s.checkpoint_chunk(now):
            seen.append(user)
            departed = s.pending_last_seen.get(user)
            assert departed is None, f"{user} left at {departed} but was checkpointed at {ts}"
    assert len(seen) == len(set(seen)), "an account twice in one round"
    if now >= 80.0:  # the round is over: everybody who stayed was checkpointed
        assert {f"u{i}" for i in range(50) if i not in leavers} <= set(seen)
