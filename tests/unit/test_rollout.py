"""`presence rollout` (cluster/rollout.py) on fakes: each shard emptied of its slots before it is
replaced and given exactly its slots back, the mail collected and last-seen handed on before each
restart, never a slot held twice or by nobody, then the FlushActor and the directory (its map
put back). tests/integration/test_rollout.py runs it on the real pool under load."""

from __future__ import annotations

from typing import Any

import pytest

from actors.core.shard import SlotExport
from actors.core.slots import SLOT_COUNT, SlotMap
from actors.directory import SlotDirectory
from cluster.rollout import MAP_CATCH_UP_S, SingleShard, edges_behind, rollout


class FakeShard:
    def __init__(self, fleet: FakeFleet, index: int, owned: set[int]) -> None:
        self.fleet, self.index, self.owned = fleet, index, owned
        self.incarnation = 0
        # The edges pulling from it that know its incarnation; a new one learns of them after
        # `looks_to_register` looks (their pulls come back from the restart).
        self.registered = list(fleet.edges)
        self.looks_to_register = 0

    async def export_slots(self, slots: list[int]) -> SlotExport:
        assert set(slots) <= self.owned
        self.owned -= set(slots)
        return SlotExport(frozenset(slots))

    async def import_slots(self, export: SlotExport) -> None:
        for other in self.fleet.shards.values():
            assert other.owned.isdisjoint(export.slots), "a slot held twice"
        assert set(self.registered) >= set(self.fleet.edges) - self.fleet.dead_edges, (
            "slots given back before every edge registered again"
        )
        self.owned |= export.slots

    async def edges_registered(self) -> list[str]:
        if self.looks_to_register > 0:
            self.looks_to_register -= 1
            if not self.looks_to_register:
                self.registered = sorted(set(self.fleet.edges) - self.fleet.dead_edges)
        return self.registered

    async def mail_pending(self) -> int:
        self.fleet.log.append(("mail", self.index))
        return 0

    async def drain(self, timeout_s: float) -> int:
        self.fleet.log.append(("drain", self.index))
        return 0


class FakeFleet:
    def __init__(self, count: int) -> None:
        m = SlotMap.even(count)
        self.version, self.owners, self.count = m.version, m.owners, count
        self.edges = ["e1", "e2"]
        self.dead_edges: set[str] = set()  # never register with a new incarnation
        self.shards = {i: FakeShard(self, i, set(m.slots_of(i))) for i in range(count)}
        self.log: list[tuple[Any, ...]] = []
        self.directory_age_s = 3600.0

    # the directory
    async def age_s(self) -> float:
        return self.directory_age_s

    async def get_map(self) -> tuple[int, tuple[int, ...], int]:
        return self.version, self.owners, self.count

    async def set_map(self, owners: tuple[int, ...], shard_count: int) -> int:
        for s, owner in enumerate(owners):
            assert s in self.shards[owner].owned, "the map names a shard that does not hold the slot"
        self.version += 1
        self.owners, self.count = tuple(owners), shard_count
        return self.version

    async def list_edges(self, max_age_s: float = 30.0) -> dict[str, dict[str, Any]]:
        return {e: {} for e in self.edges}

    # the fleet
    def shard(self, index: int) -> FakeShard:
        return self.shards[index]

    async def restart_shard(self, index: int) -> None:
        assert not self.shards[index].owned, "replaced while it still held slots"
        shard = self.shards[index]
        shard.incarnation += 1
        shard.registered, shard.looks_to_register = [], 3
        self.log.append(("restart", index))

    async def restart_flush(self) -> int:
        self.log.append(("flush",))
        return 0

    async def restart_directory(self, version: int, owners: tuple[int, ...], shard_count: int) -> None:
        assert (version, owners, shard_count) == (self.version, self.owners, self.count)
        self.log.append(("directory",))


async def test_every_shard_replaced_empty_and_given_its_slots_back() -> None:
    fleet = FakeFleet(4)
    before = fleet.owners
    summary = await rollout(lambda _: None, chunk=1000, directory=fleet, fleet=fleet)
    assert fleet.owners == before  # every slot back with its owner
    assert all(s.incarnation == 1 for s in fleet.shards.values())
    assert summary["moved_slots"] == 2 * SLOT_COUNT  # each slot out and back once
    restarts = [e for e in fleet.log if e[0] in ("restart", "flush", "directory")]
    assert restarts == [
        ("restart", 0),
        ("restart", 1),
        ("restart", 2),
        ("restart", 3),
        ("flush",),
        ("directory",),
    ]
    for i in range(4):  # the mail collected and last-seen handed on before each restart
        at = fleet.log.index(("restart", i))
        assert ("drain", i) in fleet.log[:at] and ("mail", i) in fleet.log[:at]


class LaggingEdgeFleet(FakeFleet):
    """An edge that learns each new map only at its third registration after the flip, and an
    edge of an older release that reports no version."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.edge_version, self.looks = self.version, 0

    async def set_map(self, owners: tuple[int, ...], shard_count: int) -> int:
        self.looks = 0
        return await super().set_map(owners, shard_count)

    async def list_edges(self, max_age_s: float = 30.0) -> dict[str, dict[str, Any]]:
        self.looks += 1
        if self.looks >= 3:
            self.edge_version = self.version
        return {"e1": {"map_version": self.edge_version}, "old": {"sockets": 3}}

    async def restart_shard(self, index: int) -> None:
        self.log.append(("edge routes by", self.edge_version, "map", self.version))
        await super().restart_shard(index)

    async def restart_directory(self, version: int, owners: tuple[int, ...], shard_count: int) -> None:
        self.log.append(("edge routes by", self.edge_version, "map", self.version))
        await super().restart_directory(version, owners, shard_count)


async def test_nothing_is_replaced_while_an_edge_routes_by_an_older_map() -> None:
    """An edge behind would send the slots just moved to the shard being restarted (or need the
    directory being replaced to find them): each waits until the edges route by the latest map."""
    fleet = LaggingEdgeFleet(3)
    now = [0.0]

    async def sleep(s: float) -> None:
        now[0] += s

    await rollout(lambda _: None, chunk=1000, directory=fleet, fleet=fleet, clock=lambda: now[0], sleep=sleep)
    seen = [e for e in fleet.log if e[0] == "edge routes by"]
    assert len(seen) == 4 and all(e[1] == e[3] for e in seen), seen


async def test_a_directory_too_young_to_have_heard_from_every_edge_is_not_taken_for_the_fleet() -> None:
    """A directory just replaced (the last rollout) or restarted lists no edge until each
    registers again: the rollout went ahead at once while every edge still routed by the map
    before the moves (test_rollout's integration test, run after another rollout)."""
    fleet = FakeFleet(2)
    now = [0.0]

    async def sleep(s: float) -> None:
        now[0] += s

    async def young() -> float:
        return now[0]  # made when the rollout began

    async def edges(_max_age_s: float = 30.0) -> dict[str, dict[str, Any]]:
        # The edge registers 5 s in, with the map it routes by then: the latest.
        return {"e1": {"map_version": fleet.version}} if now[0] >= 5.0 else {}

    restarted_at: list[float] = []
    restart = fleet.restart_shard

    async def restart_noting_when(index: int) -> None:
        restarted_at.append(now[0])
        await restart(index)

    fleet.age_s = young  # type: ignore[method-assign]
    fleet.list_edges = edges  # type: ignore[method-assign]
    fleet.restart_shard = restart_noting_when  # type: ignore[method-assign]
    lines: list[str] = []
    await rollout(lines.append, chunk=1000, directory=fleet, fleet=fleet, clock=lambda: now[0], sleep=sleep)
    assert len(restarted_at) == 2 and restarted_at[0] > 6.0, restarted_at
    assert not any("older map" in line for line in lines), lines


async def test_an_edge_that_never_catches_up_holds_the_rollout_back_for_a_bounded_time() -> None:
    fleet = FakeFleet(2)
    now = [0.0]
    lines: list[str] = []

    async def stuck(_max_age_s: float = 30.0) -> dict[str, dict[str, Any]]:
        return {"e9": {"map_version": 0}}

    async def sleep(s: float) -> None:
        now[0] += s

    fleet.list_edges = stuck  # type: ignore[method-assign]
    fleet.edges = []  # e9 pulls from no shard: no shard waits for it to register again
    await rollout(lines.append, chunk=1000, directory=fleet, fleet=fleet, clock=lambda: now[0], sleep=sleep)
    assert sum("e9" in line for line in lines) == 3  # before each shard and the directory, then on
    assert now[0] == pytest.approx(3 * 15.0, abs=1.0)


async def test_an_edge_that_said_it_stopped_is_not_waited_for() -> None:
    """The last edge a rolling restart drained registered one last time as it stopped
    (edge/server.py `_unregister`): the directory no longer lists it, and the rollout that follows
    does not wait 15 s for it to catch up with the map, nor name it as behind (it did both: the
    directory listed every edge heard from in the last 30 s)."""
    directory = SlotDirectory(2)
    directory.started -= 3600.0  # has heard from every edge long since
    version = (await directory.get_map())[0]
    await directory.register_edge("e-old", {"ws_port": 1, "sockets": 3, "map_version": version})
    await directory.register_edge("e-new", {"ws_port": 1, "sockets": 0, "map_version": version + 1})
    await directory.register_edge(
        "e-old", {"ws_port": 1, "sockets": 0, "map_version": version, "stopped": True}
    )
    assert list(await directory.list_edges()) == ["e-new"]
    now = [0.0]

    async def sleep(s: float) -> None:
        now[0] += s

    assert await edges_behind(directory, version + 1, clock=lambda: now[0], sleep=sleep) == []
    assert now[0] == 0.0


async def test_a_pool_of_one_is_refused_with_what_to_do() -> None:
    fleet = FakeFleet(1)
    with pytest.raises(SingleShard, match="presence scale 2"):
        await rollout(lambda _: None, directory=fleet, fleet=fleet)
    assert fleet.log == [] and fleet.shards[0].incarnation == 0


class FakeSpreadFleet(FakeFleet):
    """A fleet whose shards run on nodes: the head holds all but shard 3."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.node = {i: ("head" if i != 3 else "w1") for i in range(count)}

    async def node_of(self, index: int) -> str | None:
        return self.node[index]

    async def shard_nodes(self) -> list[str]:
        return ["head", "w1", "w2"]

    async def move_shard(self, index: int, node: str) -> None:
        assert not self.shards[index].owned, "moved while it still held slots"
        self.node[index] = node
        self.log.append(("move", index, node))


async def test_scale_at_the_same_size_moves_the_fewest_shards_each_emptied_and_given_its_slots_back() -> None:
    from collections import Counter

    from cluster.rollout import rebalance

    fleet = FakeSpreadFleet(6)
    before = fleet.owners
    summary = await rebalance(lambda _: None, directory=fleet, fleet=fleet)
    assert sorted(Counter(fleet.node.values()).values()) == [2, 2, 2]
    moved = [entry for entry in fleet.log if entry[0] == "move"]
    assert summary["shards"] == len(moved) == 3  # head 5 → 2, w1 1 → 2, w2 0 → 2
    assert fleet.owners == before and not any(
        entry[0] in ("restart", "flush", "directory") for entry in fleet.log
    )
    for i, shard in fleet.shards.items():
        assert shard.owned == set(SlotMap(0, before, 6).slots_of(i))
    again = await rebalance(lambda _: None, directory=fleet, fleet=fleet)
    assert again["shards"] == 0


async def test_a_replaced_shard_gets_its_slots_back_only_once_its_edges_registered_again() -> None:
    """Every edge that pulled from the old incarnation registers again with the new one while it
    owns nothing (FakeShard.import_slots refuses slots before): registering after the slots were
    back re-sent every socket of them under load, and their watchers resynced."""
    fleet = FakeFleet(3)
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)

    await rollout(lambda _: None, directory=fleet, fleet=fleet, sleep=sleep)
    assert all(s.incarnation == 1 and s.registered == ["e1", "e2"] for s in fleet.shards.values())
    assert len(slept) >= 2 * 3  # each replaced shard was looked at until its edges were back


async def test_an_edge_that_never_registers_again_holds_a_shard_back_for_a_bounded_time() -> None:
    """An edge that died meanwhile never registers with the new incarnation: the shard gets its
    slots back after MAP_CATCH_UP_S, and the progress names the edge."""
    fleet = FakeFleet(2)
    fleet.dead_edges = {"e2"}
    now = [0.0]
    lines: list[str] = []

    async def sleep(s: float) -> None:
        now[0] += s

    await rollout(lines.append, directory=fleet, fleet=fleet, clock=lambda: now[0], sleep=sleep)
    late = [line for line in lines if "not registered again" in line]
    assert len(late) == 2 and all(line.endswith(": e2") for line in late)
    assert now[0] >= 2 * MAP_CATCH_UP_S


async def test_a_shard_of_the_release_before_is_replaced_without_the_wait() -> None:
    """The actors being replaced run the release before, which has no `edges_registered` (Ray's
    handle raises AttributeError): the rollout goes on as that release's did, no wait."""
    fleet = FakeFleet(2)
    fleet.edges = []  # nothing to wait for in the new processes either

    async def missing() -> list[str]:
        raise AttributeError("'ActorHandle' object has no attribute 'edges_registered'")

    for shard in fleet.shards.values():
        shard.edges_registered = missing  # type: ignore[method-assign]
    summary = await rollout(lambda _: None, chunk=1000, directory=fleet, fleet=fleet)
    assert summary["shards"] == 2
