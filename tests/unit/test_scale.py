"""The live resize (cluster/scale.py `resize`) against fake clients: which calls it makes, in which
order, and that no slot is ever lost or held twice. tests/integration/test_resize.py runs the
same algorithm on real shards under load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from actors.core.shard import SlotExport
from actors.core.slots import SLOT_COUNT, SlotMap
from cluster import scale
from cluster.scale import resize


class FakeShard:
    def __init__(self, world: World, index: int, owned: set[int]) -> None:
        self.world = world
        self.index = index
        self.owned = owned
        self.mail: list[int] = []  # what mail_pending answers, one value per call (then 0)
        self.stuck = False  # mail nobody collects: mail_pending never reaches 0
        self.drained = False
        self.retired = False

    async def export_slots(self, slots: list[int]) -> SlotExport:
        assert not self.retired
        assert set(slots) <= self.owned, "exported a slot this shard does not hold"
        self.owned -= set(slots)
        self.world.log.append(("export", self.index, len(slots)))
        return SlotExport(frozenset(slots))

    async def import_slots(self, export: SlotExport) -> None:
        assert not self.retired
        for shard in self.world.shards.values():
            assert shard.owned.isdisjoint(export.slots), "a slot held twice"
        self.owned |= export.slots
        self.world.log.append(("import", self.index, len(export.slots)))

    async def mail_pending(self) -> int:
        if self.stuck:
            return 1
        return self.mail.pop(0) if self.mail else 0

    async def drain(self, timeout_s: float) -> int:
        self.drained = True
        self.world.log.append(("drain", self.index))
        return 0


class World:
    """The directory and the pool, faked together: they share the shards."""

    def __init__(self, count: int) -> None:
        m = SlotMap.even(count)
        self.version, self.owners, self.count = m.version, m.owners, count
        self.shards = {i: FakeShard(self, i, set(m.slots_of(i))) for i in range(count)}
        self.log: list[tuple[Any, ...]] = []
        self.now = 0.0

    # -- the directory

    async def get_map(self) -> tuple[int, tuple[int, ...], int]:
        return self.version, self.owners, self.count

    async def set_map(self, owners: tuple[int, ...], shard_count: int) -> int:
        # Every map published names, for each slot, a live shard that holds it.
        for slot, owner in enumerate(owners):
            assert owner < shard_count
            assert slot in self.shards[owner].owned and not self.shards[owner].retired
        self.version += 1
        self.owners, self.count = tuple(owners), shard_count
        self.log.append(("set_map", shard_count))
        return self.version

    async def get_shard_config(self) -> dict[str, Any]:
        return {"database_url": "postgresql://fake"}

    # -- the pool

    def shard(self, index: int) -> FakeShard:
        return self.shards[index]

    async def start_shards(self, indices: Sequence[int], config: dict[str, Any]) -> None:
        assert config == {"database_url": "postgresql://fake"}
        for i in indices:
            assert i not in self.shards or self.shards[i].retired
            self.shards[i] = FakeShard(self, i, set())
        self.log.append(("start", tuple(indices)))

    def retire_shard(self, index: int) -> None:
        shard = self.shards[index]
        assert not shard.owned and shard.drained and not shard.mail
        assert index not in self.owners
        shard.retired = True
        self.log.append(("retire", index))

    # -- the clock

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def resize(self, shards: int, chunk: int = 512, progress: list[str] | None = None) -> Any:
        lines = progress if progress is not None else []
        return await resize(
            shards, lines.append, chunk, directory=self, pool=self, clock=self.clock, sleep=self.sleep
        )

    def check_every_slot_held_once(self) -> None:
        live = [s for s in self.shards.values() if not s.retired]
        assert sum(len(s.owned) for s in live) == SLOT_COUNT
        assert set().union(*(s.owned for s in live)) == set(range(SLOT_COUNT))
        for slot, owner in enumerate(self.owners):
            assert slot in self.shards[owner].owned


def quotas(owners: tuple[int, ...], count: int) -> list[int]:
    return sorted(owners.count(i) for i in range(count))


async def test_growing_starts_the_shards_first_then_moves_the_minimum() -> None:
    w = World(2)
    lines: list[str] = []
    summary = await w.resize(6, progress=lines)
    assert summary["from"] == 2 and summary["to"] == 6
    assert summary["moved_slots"] == SLOT_COUNT - 2 * (SLOT_COUNT // 6 + 1) == 2730
    # New shards answer before the larger count is published, and that before any slot moves.
    assert w.log[0] == ("start", (2, 3, 4, 5))
    assert w.log[1] == ("set_map", 6)
    assert w.log[2][0] == "export"
    assert w.count == 6 and quotas(w.owners, 6) == [682, 682, 683, 683, 683, 683]
    w.check_every_slot_held_once()
    assert not any(entry[0] == "retire" for entry in w.log)
    assert lines[0] == "started shards 2..5"
    assert lines[-1].startswith("moved 2730/2730 slots")


async def test_shrinking_moves_first_then_retires_the_surplus() -> None:
    w = World(2)
    await w.resize(6)
    w.log.clear()
    lines: list[str] = []
    summary = await w.resize(3, progress=lines)
    assert summary["from"] == 6 and summary["to"] == 3 and summary["moved_slots"] == 2047
    kinds = [entry[0] for entry in w.log]
    # The smaller count is published once, after the last move; then each surplus shard goes.
    last_import = max(i for i, k in enumerate(kinds) if k == "import")
    assert w.log[last_import + 2] == ("set_map", 3)
    assert w.log[last_import + 3 :] == [
        ("drain", 3),
        ("retire", 3),
        ("drain", 4),
        ("retire", 4),
        ("drain", 5),
        ("retire", 5),
    ]
    assert all(entry[1] < 3 for entry in w.log if entry[0] == "import")  # nothing moves onto a leaver
    assert w.count == 3 and set(w.owners) == {0, 1, 2}
    w.check_every_slot_held_once()
    assert lines[-1] == "retired shards 3..5"


async def test_chunks_flip_the_map_after_each_group() -> None:
    w = World(3)
    lines: list[str] = []
    summary = await w.resize(4, chunk=64, progress=lines)
    exports = [entry for entry in w.log if entry[0] == "export"]
    assert all(n <= 64 for _, _, n in exports)
    assert sum(n for _, _, n in exports) == summary["moved_slots"] == 1024
    # One map per chunk (plus the larger count at the start), each one checked by set_map.
    assert [entry[0] for entry in w.log].count("set_map") == len(exports) + 1
    moved = [int(line.split()[1].split("/")[0]) for line in lines if line.startswith("moved")]
    assert moved == sorted(moved) and len(moved) == len(exports) and moved[-1] == 1024
    w.check_every_slot_held_once()


async def test_retirement_waits_for_the_edges_to_collect_their_mail() -> None:
    w = World(3)
    w.shards[2].mail = [5, 3, 1]
    await w.resize(2)
    assert ("retire", 2) in w.log
    assert w.now == pytest.approx(3 * scale.MAIL_POLL_S)  # polled until the mail was gone


async def test_mail_never_collected_is_given_up_after_the_wait() -> None:
    w = World(3)
    w.shards[2].stuck = True  # an edge that never comes for it (it is gone)
    await w.resize(2)
    assert ("retire", 2) in w.log
    assert w.now == pytest.approx(scale.MAIL_WAIT_S, abs=scale.MAIL_POLL_S)


async def test_same_size_does_nothing() -> None:
    w = World(4)
    summary = await w.resize(4)
    assert summary == {"from": 4, "to": 4, "moved_slots": 0, "seconds": 0.0}
    assert w.log == []


async def test_a_pool_needs_a_shard() -> None:
    with pytest.raises(ValueError):
        await World(2).resize(0)
