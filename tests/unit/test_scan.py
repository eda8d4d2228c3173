"""The rolling scan (actors/core/scan.py): small mappings whole, large ones a slice a call, every
key within a cycle."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.scan import RollingScan


def test_a_mapping_of_at_most_at_least_keys_is_handed_out_whole_every_call() -> None:
    scan: RollingScan[str] = RollingScan(cycle_s=30.0, at_least=3)
    keys = {"a": 1, "b": 2, "c": 3}
    assert scan.due(keys, 0.0) == ["a", "b", "c"]
    assert scan.due(keys, 0.0) == ["a", "b", "c"]
    assert scan.due(keys, 1.0) == ["a", "b", "c"]


def test_a_large_mapping_goes_in_slices_sized_by_the_time_since_the_last_call() -> None:
    scan: RollingScan[int] = RollingScan(cycle_s=10.0, at_least=2)
    keys = dict.fromkeys(range(100))
    assert scan.due(keys, 0.0) == [0, 1]  # the first call: no time elapsed, the minimum
    assert scan.due(keys, 1.0) == list(range(2, 12))  # a tenth of the cycle: a tenth of the keys
    assert scan.due(keys, 1.0) == [12, 13]  # no time: the minimum again
    assert scan.due(keys, 6.0) == list(range(14, 64))  # half a cycle
    assert scan.cycles == 1


def test_every_key_is_seen_once_per_cycle_at_a_steady_pace() -> None:
    scan: RollingScan[int] = RollingScan(cycle_s=30.0, at_least=10)
    keys = dict.fromkeys(range(3_000))
    seen: list[int] = []
    for second in range(31):
        out = scan.due(keys, float(second))
        assert len(out) <= 100, "a sweep a second looks at a thirtieth of the keys"
        seen.extend(out)
    assert set(range(3_000)) <= set(seen)


def test_a_long_gap_hands_out_the_rest_of_the_cycle_and_one_copy_at_most() -> None:
    scan: RollingScan[int] = RollingScan(cycle_s=10.0, at_least=2)
    keys = dict.fromkeys(range(20))
    assert scan.due(keys, 0.0) == [0, 1]
    out = scan.due(keys, 1_000.0)  # a thousand cycles' worth
    assert out == list(range(2, 20)) + list(range(20)), "the cycle's rest, then one fresh copy"
    assert scan.cycles == 2


def test_keys_removed_may_still_come_and_keys_added_come_next_cycle() -> None:
    scan: RollingScan[str] = RollingScan(cycle_s=10.0, at_least=1)
    keys = {f"k{i}": i for i in range(10)}
    assert scan.due(keys, 0.0) == ["k0"]
    del keys["k5"]
    keys["new"] = 99
    first_cycle = scan.due(keys, 100.0)
    assert "k5" in first_cycle[:9], "handed out from the cycle's copy: the caller checks it is there"
    assert first_cycle[9:] == list(keys), "the next cycle's copy has the new key, not the removed one"


def test_a_copy_taken_when_the_mapping_was_larger_still_ends_within_its_cycle() -> None:
    """The mapping shrinks from 1,000 keys to 20 after a cycle began: the slices are sized by
    the copy, so the 20 left are seen within the cycle, not after 1,000 / 20 cycles."""
    scan: RollingScan[int] = RollingScan(cycle_s=10.0, at_least=1)
    keys = dict.fromkeys(range(1_000))
    assert scan.due(keys, 0.0) == [0]
    for k in range(980):
        del keys[k]
    seen: set[int] = set()
    for second in range(1, 11):
        seen.update(scan.due(keys, float(second)))
    assert set(keys) <= seen


def test_a_scan_needs_a_cycle_and_a_minimum() -> None:
    with pytest.raises(ValueError):
        RollingScan(cycle_s=0.0, at_least=1)
    with pytest.raises(ValueError):
        RollingScan(cycle_s=1.0, at_least=0)


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(min_value=0, max_value=400),
    at_least=st.integers(min_value=1, max_value=50),
    cycle_s=st.floats(min_value=1.0, max_value=60.0),
    steps=st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=5.0), st.integers(min_value=-40, max_value=3)),
        min_size=1,
        max_size=200,
    ),
)
def test_no_key_present_throughout_waits_more_than_two_cycles(
    size: int, at_least: int, cycle_s: float, steps: list[tuple[float, int]]
) -> None:
    """Whatever the pace of the calls and the keys coming and going (the mapping shrinking
    too): a key present the whole time is handed out again within two cycles plus the gap
    between two calls, and no call hands out more than one copy beyond the rest of its cycle."""
    scan: RollingScan[int] = RollingScan(cycle_s=cycle_s, at_least=at_least)
    keys: dict[int, None] = dict.fromkeys(range(size))
    next_key = size
    now = 0.0
    last_seen: dict[int, float] = {}
    present_since: dict[int, float] = dict.fromkeys(keys, 0.0)
    largest = size
    for gap, churn in steps:
        now += gap
        for _ in range(max(0, churn)):
            keys[next_key] = None
            present_since[next_key] = now
            next_key += 1
        for k in list(keys)[: max(0, -churn)]:
            del keys[k]
            present_since.pop(k, None)
            last_seen.pop(k, None)
        out = scan.due(keys, now)
        assert len(out) <= max(at_least, largest + len(keys)), "more than a cycle's rest and one copy"
        largest = max(largest, len(keys))
        for k in out:
            last_seen[k] = now
        for k, since in present_since.items():
            waited = now - max(since, last_seen.get(k, since))
            assert waited <= 2 * cycle_s + 5.0 + 1e-6, f"key {k} waited {waited:.1f} s"


def test_due_items_pairs_the_due_keys_still_there_with_their_values() -> None:
    """What every sweep iterates: a key of the cycle's copy removed since is skipped, a value
    that is None is still a value, and the mapping may be changed while the pairs are read."""
    scan: RollingScan[int] = RollingScan(cycle_s=10.0, at_least=2)
    mapping: dict[int, str | None] = {i: str(i) for i in range(10)}
    mapping[3] = None
    assert list(scan.due_items(mapping, 0.0)) == [(0, "0"), (1, "1")]  # the cycle's copy is taken
    del mapping[2]
    pairs = list(scan.due_items(mapping, 5.0))  # half a cycle: keys 2-6 of the copy
    assert pairs == [(3, None), (4, "4"), (5, "5"), (6, "6")]
    for key, _ in pairs:
        del mapping[key]
    assert sorted(mapping) == [0, 1, 7, 8, 9]


def test_due_items_finds_a_key_deleted_at_its_first_turn_gone_at_its_second() -> None:
    """A call that ends one cycle's copy and hands out the whole next names keys twice; a sweep
    that deletes one at its first turn must not meet it again (a KeyError in the shard's sweep)."""

    def fresh() -> tuple[RollingScan[int], dict[int, str]]:
        scan: RollingScan[int] = RollingScan(cycle_s=10.0, at_least=2)
        mapping = dict.fromkeys(range(4), "v")
        assert [k for k, _ in scan.due_items(mapping, 0.0)] == [0, 1]
        return scan, mapping

    scan, mapping = fresh()
    assert scan.due(mapping, 15.0) == [2, 3, 0, 1, 2, 3], "the premise: keys twice in one call"
    scan, mapping = fresh()
    seen = []
    for key, _ in scan.due_items(mapping, 15.0):
        seen.append(key)
        del mapping[key]
    assert seen == [2, 3, 0, 1] and mapping == {}
