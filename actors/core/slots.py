"""Accounts and channels map to a fixed number of slots; a versioned map assigns slots to shards.

The hash must be stable across processes and machines (Python's `hash()` is salted per process),
so it is CRC-32 of the UTF-8 key. Resizing the pool moves slots, never individual accounts.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass

SLOT_COUNT = 4096


def slot_of(key: str) -> int:
    return zlib.crc32(key.encode("utf-8")) % SLOT_COUNT


def channel_key(channel_id: str) -> str:
    # Channels share the slot space with accounts but must not collide with an account id.
    return "#" + channel_id


@dataclass(frozen=True, slots=True)
class SlotMap:
    """Slot → shard index, with a version that grows on every change."""

    version: int
    owners: tuple[int, ...]
    shard_count: int

    @staticmethod
    def even(shard_count: int, version: int = 1) -> SlotMap:
        if shard_count < 1:
            raise ValueError("a pool needs at least one shard")
        return SlotMap(version, tuple(s % shard_count for s in range(SLOT_COUNT)), shard_count)

    def shard_of(self, key: str) -> int:
        return self.owners[slot_of(key)]

    def slots_of(self, shard: int) -> list[int]:
        return [s for s, owner in enumerate(self.owners) if owner == shard]

    def group(self, keys: Iterable[str]) -> dict[int, list[str]]:
        """Keys grouped by owning shard, each group in first-seen order."""
        out: dict[int, list[str]] = {}
        for key in keys:
            out.setdefault(self.shard_of(key), []).append(key)
        return out


def rebalance(owners: tuple[int, ...], shard_count: int) -> tuple[int, ...]:
    """A new assignment onto `shard_count` shards that moves as few slots as possible.

    Every shard ends with ⌊SLOTS/n⌋ or ⌈SLOTS/n⌉ slots. Slots of shards that go away, and the
    surplus of shards above their quota, move to the shards below theirs; every other slot stays
    where it is, so a resize costs the minimum number of migrations.
    """
    if shard_count < 1:
        raise ValueError("a pool needs at least one shard")
    base, extra = divmod(len(owners), shard_count)
    quota = [base + (1 if i < extra else 0) for i in range(shard_count)]
    kept: dict[int, list[int]] = {i: [] for i in range(shard_count)}
    loose: list[int] = []
    for slot, owner in enumerate(owners):
        if owner < shard_count and len(kept[owner]) < quota[owner]:
            kept[owner].append(slot)
        else:
            loose.append(slot)
    new = list(owners)
    for shard in range(shard_count):
        while len(kept[shard]) < quota[shard]:
            slot = loose.pop()
            kept[shard].append(slot)
            new[slot] = shard
    return tuple(new)


def moves(old: tuple[int, ...], new: tuple[int, ...]) -> dict[tuple[int, int], list[int]]:
    """Slots that change owner, grouped by (from, to)."""
    out: dict[tuple[int, int], list[int]] = {}
    for slot, (a, b) in enumerate(zip(old, new, strict=True)):
        if a != b:
            out.setdefault((a, b), []).append(slot)
    return out
