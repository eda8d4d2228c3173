"""Slots: a stable hash (never Python's salted `hash()`), an even initial map, grouping by shard."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.slots import SLOT_COUNT, SlotMap, channel_key, moves, rebalance, slot_of

# CRC-32 of "123456789" is 0xCBF43926, the standard check value; 0xCBF43926 % 4096 == 0x926.
KNOWN = {"123456789": 0x926, "": 0, "u1": 3958, "alice": 3143, "#c1": 2549, "é": 3390}


@pytest.mark.parametrize(("key", "slot"), sorted(KNOWN.items()))
def test_known_slots(key: str, slot: int) -> None:
    assert slot_of(key) == slot


def test_slot_count() -> None:
    assert SLOT_COUNT == 4096


def test_stable_across_processes_with_different_hash_seeds() -> None:
    code = (
        "from actors.core.slots import slot_of; print([slot_of(k) for k in ('u1', 'alice', '#c1', 'x'*300)])"
    )
    outs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        outs.add(
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
    assert len(outs) == 1
    assert outs.pop().strip() == str([3958, 3143, 2549, slot_of("x" * 300)])


@given(st.text(max_size=200))
def test_slot_in_range_and_is_crc32(key: str) -> None:
    s = slot_of(key)
    assert 0 <= s < SLOT_COUNT
    assert s == zlib.crc32(key.encode("utf-8")) % SLOT_COUNT


def test_channel_keys_do_not_collide_with_accounts() -> None:
    assert channel_key("c1") == "#c1"
    assert channel_key("c1") != "c1"
    assert slot_of(channel_key("c1")) == 2549


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 16, 100, 4096])
def test_even_map(n: int) -> None:
    m = SlotMap.even(n)
    assert m.version == 1
    assert m.shard_count == n
    assert len(m.owners) == SLOT_COUNT
    counts = Counter(m.owners)
    assert set(counts) == set(range(n)), "every shard owns slots, and only shards that exist"
    assert max(counts.values()) - min(counts.values()) <= 1
    assert sum(len(m.slots_of(s)) for s in range(n)) == SLOT_COUNT
    assert m.slots_of(n) == []


def test_even_map_version_and_validation() -> None:
    assert SlotMap.even(4, version=7).version == 7
    with pytest.raises(ValueError):
        SlotMap.even(0)
    with pytest.raises(ValueError):
        SlotMap.even(-1)


def test_shard_of_follows_the_slot() -> None:
    m = SlotMap.even(4)
    for key in ("u1", "alice", "#c1"):
        assert m.shard_of(key) == m.owners[slot_of(key)]
    assert m.shard_of("u1") == 3958 % 4


def test_group_keeps_first_seen_order_per_shard() -> None:
    m = SlotMap.even(4)
    keys = [f"user-{i}" for i in range(50)]
    groups = m.group(keys)
    assert sorted(k for ks in groups.values() for k in ks) == sorted(keys)
    for shard, ks in groups.items():
        assert all(m.shard_of(k) == shard for k in ks)
        assert ks == [k for k in keys if m.shard_of(k) == shard]


def test_group_keeps_duplicates_and_empty() -> None:
    m = SlotMap.even(2)
    assert m.group([]) == {}
    assert m.group(["a", "a"]) == {m.shard_of("a"): ["a", "a"]}


def test_single_shard_owns_everything() -> None:
    m = SlotMap.even(1)
    assert m.group(["a", "b", "#c"]) == {0: ["a", "b", "#c"]}


# ---------------------------------------------------------------------------- resizing


def quotas(n: int) -> list[int]:
    base, extra = divmod(SLOT_COUNT, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def check_rebalance(old: tuple[int, ...], n: int) -> tuple[int, ...]:
    new = rebalance(old, n)
    assert len(new) == SLOT_COUNT
    counts = Counter(new)
    assert set(counts) <= set(range(n)), "no slot on a shard that does not exist"
    assert sorted(counts.values()) == sorted(q for q in quotas(n) if q), "balanced: floor or ceil each"
    # Minimal movement: every shard that stays keeps as many of its slots as its quota allows.
    old_counts = Counter(old)
    for shard in range(n):
        kept = sum(1 for a, b in zip(old, new, strict=True) if a == b == shard)
        assert kept == min(old_counts.get(shard, 0), quotas(n)[shard])
    return new


@pytest.mark.parametrize(
    ("before", "after"), [(1, 1), (4, 4), (2, 3), (3, 2), (2, 6), (6, 3), (1, 8), (8, 1), (5, 7)]
)
def test_rebalance_from_even(before: int, after: int) -> None:
    old = SlotMap.even(before).owners
    new = check_rebalance(old, after)
    moved = sum(1 for a, b in zip(old, new, strict=True) if a != b)
    if before == after:
        assert moved == 0
    if after > before:
        # Growing: only slots that the new shards need move, and only to them.
        assert all(b >= before for a, b in zip(old, new, strict=True) if a != b)
        assert moved == sum(quotas(after)[before:])
    if after < before:
        # Shrinking: the slots of the shards that go away move, and nothing else.
        assert all(a >= after for a, b in zip(old, new, strict=True) if a != b)
        assert moved == sum(1 for a in old if a >= after)


def test_rebalance_chain_stays_balanced() -> None:
    owners = SlotMap.even(2).owners
    for n in (6, 3, 5, 1, 4):
        owners = check_rebalance(owners, n)


@given(st.lists(st.integers(1, 12), min_size=1, max_size=5))
def test_rebalance_any_chain(sizes: list[int]) -> None:
    owners = SlotMap.even(sizes[0]).owners
    for n in sizes[1:]:
        owners = check_rebalance(owners, n)


def test_rebalance_needs_a_shard() -> None:
    with pytest.raises(ValueError):
        rebalance(SlotMap.even(2).owners, 0)


def test_moves_groups_changes_by_route() -> None:
    old = SlotMap.even(2).owners
    new = rebalance(old, 3)
    routes = moves(old, new)
    assert set(routes) == {(0, 2), (1, 2)}
    assert sorted(s for slots in routes.values() for s in slots) == [
        s for s in range(SLOT_COUNT) if old[s] != new[s]
    ]
    assert moves(old, old) == {}
    with pytest.raises(ValueError):
        moves(old, old[:-1])
