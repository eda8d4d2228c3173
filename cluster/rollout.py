"""`presence rollout`: replace every actor of the pool with a fresh one running the code installed
now, live; nobody is told anything and no socket is closed.

Each PresenceActor in turn: its slots move to the other shards with the resize machinery (export,
import, flip the map: to everybody outside only their address changes), the edges collect the mail
still addressed to it, it hands its last-seen values to the FlushActor and saves its choices, and
Ray restarts it in a fresh process (which imports the installed code); once its new incarnation
answers and every edge that pulled from the old one has registered again with it (nothing to
register while it owns no slot), its slots move back. An edge that learnt of the new incarnation
only after that would register again every socket of those slots, under load, and its watchers
would resync. Then the FlushActor (drained first; the shards keep every last-seen until a write
is acknowledged, so its restart loses nothing), then the slot directory (its map put back at once
with a newer version). Between two releases the internal wire's version
(actors/core/contract.py) keeps edges and shards of both working together.

`rollout` is written against small protocols, so tests/unit/test_rollout.py runs it on fakes.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypedDict, cast

from actors import clients
from actors.core import placement
from actors.core.contract import EDGE_REGISTER_EVERY_S
from cluster.config import Settings
from cluster.runtime import cluster_info_or_exit, ray_reachable_or_exit
from cluster.scale import MAIL_POLL_S, MAIL_WAIT_S, RETIRE_DRAIN_S, Shard

RESTART_WAIT_S = 120.0
# How long the edges may take to route by the latest map before a shard or the directory is
# replaced. Each edge asks the directory for the map every 5 s and reports the version it routes
# by when it registers (right after); an edge still behind then would send operations to the
# actor being replaced, be answered MOVED or fail, and need the directory to learn where to go.
MAP_CATCH_UP_S = 15.0
MAP_POLL_S = 0.25
# An edge that has not registered with the directory for this long (it does every 5 s) is gone: a
# replaced shard does not wait for it to register again (the old incarnation still held the lease
# of an edge stopped a minute before: every shard waited MAP_CATCH_UP_S for it in bench rollout).
LIVE_EDGE_S = 2 * EDGE_REGISTER_EVERY_S + 1.0


class Directory(Protocol):
    async def get_map(self) -> tuple[int, tuple[int, ...], int]: ...
    async def set_map(self, owners: tuple[int, ...], shard_count: int) -> int: ...
    async def list_edges(self, max_age_s: float = 30.0) -> dict[str, dict[str, Any]]: ...
    async def age_s(self) -> float: ...


class ReplacedShard(Shard, Protocol):
    async def edges_registered(self) -> list[str]: ...


class Fleet(Protocol):
    """Reaching and replacing the pool's actors."""

    def shard(self, index: int) -> ReplacedShard: ...
    async def restart_shard(self, index: int) -> None: ...
    async def move_shard(self, index: int, node: str) -> None: ...
    async def restart_flush(self) -> int: ...
    async def restart_directory(self, version: int, owners: tuple[int, ...], shard_count: int) -> None: ...


class SingleShard(ValueError):
    """The pool has one shard: it cannot be replaced without its clients noticing."""


class RolloutSummary(TypedDict):
    shards: int
    moved_slots: int
    seconds: float


async def rollout(
    progress: Callable[[str], object] = print,
    chunk: int = 512,
    *,
    directory: Directory | None = None,
    fleet: Fleet | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    relocate: Mapping[int, str] | None = None,
) -> RolloutSummary:
    """Replace every shard, then the FlushActor and the directory; with `relocate` (shard →
    node, a rebalance), only those shards, each started again on its node."""
    d: Directory = directory if directory is not None else clients.DirectoryClient()
    f: Fleet = fleet if fleet is not None else RayFleet()
    started = clock()
    _, owners, count = await d.get_map()
    if count < 2:
        raise SingleShard(
            "a pool of one shard has nowhere to move its slots while it is replaced: "
            "`presence scale 2`, then `presence rollout`, then `presence scale 1`"
        )
    current = list(owners)
    moved = 0
    latest, _, _ = await d.get_map()

    async def move(src: int, dst: int, slots: Sequence[int]) -> None:
        nonlocal moved, latest
        for i in range(0, len(slots), chunk):
            part = list(slots[i : i + chunk])
            export = await f.shard(src).export_slots(part)
            await f.shard(dst).import_slots(export)
            for s in part:
                current[s] = dst
            latest = await d.set_map(tuple(current), count)
            moved += len(part)

    async def edges_caught_up(before: str) -> None:
        behind = await edges_behind(d, latest, clock, sleep)
        if behind:
            progress(f"{before}: edges still routing by an older map: {', '.join(behind)}")

    for index in range(count) if relocate is None else sorted(relocate):
        mine = [s for s, owner in enumerate(current) if owner == index]
        others = [i for i in range(count) if i != index]
        # Its slots spread over the others while it is replaced (round robin).
        plan: dict[int, list[int]] = {}
        for n, s in enumerate(mine):
            plan.setdefault(others[n % len(others)], []).append(s)
        for dst, slots in sorted(plan.items()):
            await move(index, dst, slots)
        await edges_caught_up(f"shard {index}")
        old = f.shard(index)
        try:
            pulling = await old.edges_registered()
        except AttributeError:  # the release before has no such call: the new process is told late
            pulling = []
        deadline = clock() + MAIL_WAIT_S
        while await old.mail_pending() and clock() < deadline:
            await sleep(MAIL_POLL_S)  # the edges collect what was addressed to them there
        left = await old.drain(RETIRE_DRAIN_S)
        if left:
            progress(f"shard {index}: {left} last-seen values or choices not handed on before restart")
        if relocate is None:
            await f.restart_shard(index)
        else:
            await f.move_shard(index, relocate[index])
        alive = await d.list_edges(LIVE_EDGE_S)
        missing = await edges_not_registered(f.shard(index), [e for e in pulling if e in alive], clock, sleep)
        if missing:
            late = ", ".join(missing)
            progress(f"shard {index}: edges not registered again within {MAP_CATCH_UP_S:g} s: {late}")
        for src, slots in sorted(plan.items()):
            await move(src, index, slots)
        where = "" if relocate is None else f" on node {relocate[index][:12]}"
        progress(f"shard {index} replaced{where} ({len(mine)} slots moved out and back)")
    if relocate is not None:
        return {"shards": len(relocate), "moved_slots": moved, "seconds": clock() - started}
    # The last moves back flipped the map: an edge that routes by the map before them would need
    # the directory (being replaced) to find those slots' owner again: 1011 after call_retry_s.
    await edges_caught_up("the directory")
    left = await f.restart_flush()
    progress("FlushActor replaced" + (f" ({left} rows left behind)" if left else ""))
    version, owners_now, count_now = await d.get_map()
    await f.restart_directory(version, owners_now, count_now)
    progress("slot directory replaced")
    return {"shards": count, "moved_slots": moved, "seconds": clock() - started}


async def edges_behind(
    d: Directory,
    version: int,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> list[str]:
    """Wait (up to MAP_CATCH_UP_S) until every edge registered lately routes by map `version` or
    a newer one; the edges still behind then. An edge of a release that does not report its
    version is not waited for. A directory younger than one registration interval (the last
    rollout replaced it, or Ray restarted it) may not list every edge yet: its list is not taken
    for the fleet until it is older (a second rollout right after one went ahead at once, with
    every edge still on the map before its first moves)."""
    deadline = clock() + MAP_CATCH_UP_S
    while True:
        edges = await d.list_edges()
        behind = sorted(e for e, info in edges.items() if int(info.get("map_version", version)) < version)
        heard_from_all = await d.age_s() > EDGE_REGISTER_EVERY_S + 1.0
        if (not behind and heard_from_all) or clock() >= deadline:
            return behind
        await sleep(MAP_POLL_S)


async def edges_not_registered(
    shard: ReplacedShard,
    edges: Sequence[str],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> list[str]:
    """Wait (up to MAP_CATCH_UP_S) until each of `edges` has registered again with the shard's
    new incarnation (its pull is answered at once with the news: actors/presence.py `pull`); those
    still missing then (an edge that died meanwhile)."""
    deadline = clock() + MAP_CATCH_UP_S
    while edges:
        missing = sorted(set(edges) - set(await shard.edges_registered()))
        if not missing or clock() >= deadline:
            return missing
        await sleep(MAIL_POLL_S)
    return []


class Spread(Protocol):
    """Where the shards run, and the nodes that may carry them (a rebalance's inputs)."""

    async def node_of(self, index: int) -> str | None: ...
    async def shard_nodes(self) -> list[str]: ...


async def rebalance(
    progress: Callable[[str], object] = print,
    *,
    directory: Directory | None = None,
    fleet: Fleet | None = None,
    spread: Spread | None = None,
) -> RolloutSummary:
    """`presence scale N` at the pool's own size: the shards spread again over the alive nodes
    that may carry them, moving the fewest (actors/core/placement.py `rebalance`), each one as
    `presence rollout` replaces a shard (its slots out, a fresh actor on its new node, its slots
    back): nobody is told anything. For a node that joined or came back after the pool was made
    (Ray never moves a running actor; a shard restarted after its node died stays where Ray put
    it)."""
    d: Directory = directory if directory is not None else clients.DirectoryClient()
    f: Fleet = fleet if fleet is not None else RayFleet()
    where: Spread = spread if spread is not None else cast(Spread, f)
    _, _, count = await d.get_map()
    nodes = await asyncio.gather(*(where.node_of(i) for i in range(count)))
    current = dict(zip(range(count), nodes, strict=True))
    moves = placement.rebalance(current, await where.shard_nodes())
    if not moves:
        progress("the shards are spread evenly already: nothing to move")
        return {"shards": 0, "moved_slots": 0, "seconds": 0.0}
    progress(f"moving {len(moves)} of {count} shards to spread them evenly")
    return await rollout(progress, directory=d, fleet=f, relocate=moves)


class RayFleet:
    """The real pool: Ray restarts each actor in a fresh worker process (the code installed now)."""

    def shard(self, index: int) -> clients.ShardClient:
        return clients.ShardClient(index)

    async def node_of(self, index: int) -> str | None:
        node: str | None = await _pool().node_of(index)
        return node

    async def shard_nodes(self) -> list[str]:
        from actors.pool import shard_nodes

        return await asyncio.to_thread(shard_nodes)

    async def move_shard(self, index: int, node: str) -> None:
        """Replace shard `index` (emptied of its slots) by a fresh actor on `node`."""
        config = await clients.DirectoryClient().get_shard_config()
        clients.ShardClient(index).kill(restart=False)
        # Its name is free once Ray has finished with the old actor.
        await _until_answers(lambda: _pool().start_shard_on(index, config, node), lambda _: True)

    async def restart_shard(self, index: int) -> None:
        client = clients.ShardClient(index)
        before = (await client.stats(10.0)).incarnation
        client.kill(restart=True)
        await _until_answers(lambda: _incarnation(index), lambda inc: inc not in (None, before))

    async def restart_flush(self) -> int:
        import ray

        from actors.clients import FLUSH

        handle = ray.get_actor(FLUSH)
        left = int(await handle.drain.remote(RETIRE_DRAIN_S))
        ray.kill(handle, no_restart=False)
        await _until_answers(lambda: clients.FlushClient().stats(5.0), lambda st: st is not None)
        return left

    async def restart_directory(self, version: int, owners: tuple[int, ...], shard_count: int) -> None:
        directory = clients.DirectoryClient()
        killed = time.monotonic()
        directory.kill(restart=True)
        # The old process may still answer for a moment after the kill: the map is put back into
        # one made after it (its age shorter than the time since the kill; durations, so the two
        # hosts' clocks need not agree). Else the rollout said "replaced" while Ray was still
        # restarting the directory, and the next caller failed (test_rollout under load).
        await _until_answers(directory.age_s, lambda age: age < time.monotonic() - killed)
        await _until_answers(lambda: directory.restore(version, owners, shard_count), lambda v: v is not None)


def _pool() -> Any:
    # Only a rebalance creates shards here: the pool's module (the shard shell) is loaded then.
    from actors.pool import PoolClient

    return PoolClient()


async def _incarnation(index: int) -> str | None:
    return (await clients.ShardClient(index).stats(5.0)).incarnation


async def _until_answers(call: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool]) -> Any:
    deadline = time.monotonic() + RESTART_WAIT_S
    while True:
        try:
            value = await call()
            if ok(value):
                return value
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError("the restarted actor did not answer in time")
        await asyncio.sleep(0.2)


def cmd_rollout(settings: Settings) -> int:
    info = cluster_info_or_exit(settings)
    ray_reachable_or_exit(info.ray_address, "rollout")
    clients.connect(info.ray_address, info.ray_namespace)
    try:
        summary = asyncio.run(rollout(progress=lambda line: print(f"  {line}", flush=True)))
    except SingleShard as e:
        print(f"presence rollout: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        print(f"presence rollout: stopped: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        clients.shutdown()
    print(
        f"pool rolled out: {summary['shards']} shards, the FlushActor and the directory replaced, "
        f"{summary['moved_slots']} slots moved in {summary['seconds']:.2f} s"
    )
    return 0
