"""`presence scale N`: resize the PresenceActor pool of a running cluster, live.

Slots move in groups: the old owner exports them (from then on it answers their operations with
MOVED), the new owner imports them, and the directory flips the map; edges that were told MOVED
wait for the flip and send the operation again, so every socket's frames still apply in order.
No socket, status, subscription, roster entry or unflushed last-seen is lost, and nobody is told
anything, because nothing changed but the address.

`resize` is written against the clients of `actors.clients` and `actors.pool` (the `Directory`,
`Shard` and `Pool` protocols below), so tests/unit/test_scale.py runs it against fakes. From Python, for
experiments (a driver already joined to the cluster):

    from cluster.scale import resize
    summary = await resize(6)      # {"from": 2, "to": 6, "moved_slots": 2730, "seconds": …}
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypedDict

from actors import clients
from actors.core.shard import SlotExport
from actors.core.slots import moves, rebalance
from cluster import db
from cluster.config import Settings
from cluster.runtime import cluster_info_or_exit, ray_reachable_or_exit

# A retiring shard waits this long for the edges to collect the mail addressed to them there.
MAIL_WAIT_S = 10.0
MAIL_POLL_S = 0.05
RETIRE_DRAIN_S = 5.0


class Shard(Protocol):
    async def export_slots(self, slots: list[int]) -> SlotExport: ...
    async def import_slots(self, export: SlotExport) -> None: ...
    async def mail_pending(self) -> int: ...
    async def drain(self, timeout_s: float) -> int: ...


class Directory(Protocol):
    async def get_map(self) -> tuple[int, tuple[int, ...], int]: ...
    async def set_map(self, owners: tuple[int, ...], shard_count: int) -> int: ...
    async def get_shard_config(self) -> dict[str, Any]: ...


class Pool(Protocol):
    def shard(self, index: int) -> Shard: ...
    async def start_shards(self, indices: Sequence[int], config: dict[str, Any]) -> None: ...
    def retire_shard(self, index: int) -> None: ...


# What `resize` did ("from" is a keyword: the functional form is the only way to spell it).
ResizeSummary = TypedDict("ResizeSummary", {"from": int, "to": int, "moved_slots": int, "seconds": float})


async def resize(
    shards: int,
    progress: Callable[[str], object] = print,
    chunk: int = 512,
    *,
    directory: Directory | None = None,
    pool: Pool | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> ResizeSummary:
    """Grow or shrink the pool to `shards`, live, by moving slots `chunk` at a time.

    Growing starts the new shards first and publishes the larger count (so edges start collecting
    mail from them) before any slot moves; shrinking publishes the smaller count after the last
    move, then retires each surplus shard once the edges collected its mail (or `MAIL_WAIT_S`
    passed) and its last-seen values are handed on."""
    if shards < 1:
        raise ValueError("a pool needs at least one shard")
    d: Directory = directory if directory is not None else clients.DirectoryClient()
    p: Pool = pool if pool is not None else _pool_client()
    started = clock()
    _, owners, count = await d.get_map()
    if shards == count:
        return {"from": count, "to": shards, "moved_slots": 0, "seconds": 0.0}
    if shards > count:
        await p.start_shards(range(count, shards), await d.get_shard_config())
        progress(f"started shards {count}..{shards - 1}")
        # The larger count goes out first, so edges start collecting mail from the new shards.
        await d.set_map(tuple(owners), shards)
    current = list(owners)
    moved = 0
    plan = moves(tuple(owners), rebalance(tuple(owners), shards))
    total = sum(len(s) for s in plan.values())
    for (src, dst), slots in sorted(plan.items()):
        for i in range(0, len(slots), chunk):
            part = slots[i : i + chunk]
            # Freeze + export in one call on the old owner, import on the new one, then flip the
            # map. Between export and flip the slots answer MOVED and edges wait for the flip.
            export = await p.shard(src).export_slots(part)
            await p.shard(dst).import_slots(export)
            for s in part:
                current[s] = dst
            await d.set_map(tuple(current), max(shards, count))
            moved += len(part)
            progress(f"moved {moved}/{total} slots ({src} → {dst})")
    if shards < count:
        await d.set_map(tuple(current), shards)
        for index in range(shards, count):
            retiring = p.shard(index)
            deadline = clock() + MAIL_WAIT_S
            while await retiring.mail_pending() and clock() < deadline:
                await sleep(MAIL_POLL_S)  # let edges collect what was addressed to them here
            await retiring.drain(RETIRE_DRAIN_S)
            p.retire_shard(index)
        progress(f"retired shards {shards}..{count - 1}")
    return {"from": count, "to": shards, "moved_slots": moved, "seconds": clock() - started}


def _pool_client() -> Pool:
    # Only a resize creates shards: the pool's module (the shard shell, asyncpg) is loaded then.
    from actors.pool import PoolClient

    return PoolClient()


# `presence scale N` at the pool's own size: cluster/rollout.py `rebalance` (given by the command
# line: rollout builds on this module, so this one cannot import it).
Rebalance = Callable[..., Coroutine[Any, Any, Mapping[str, Any]]]


def scale(settings: Settings, shards: int, rebalance: Rebalance | None = None) -> int:
    if shards < 1:
        print("presence scale: a pool needs at least one shard", file=sys.stderr)
        return 2
    info = cluster_info_or_exit(settings)
    ray_reachable_or_exit(info.ray_address, "scale")
    clients.connect(info.ray_address, info.ray_namespace)

    def progress(line: str) -> None:
        print(f"  {line}", flush=True)

    try:
        summary = asyncio.run(resize(shards, progress=progress))
        # The size outlives Ray's memory of it: `presence up` starts the pool at it again.
        asyncio.run(db.record_pool_size(info.database_url, shards))
        if summary["from"] == shards and rebalance is not None:
            spread: Mapping[str, Any] = asyncio.run(rebalance(progress))
            print(
                f"pool of {shards} shards rebalanced: {spread['shards']} moved to other nodes "
                f"({spread['moved_slots']} slots moved out and back) in {spread['seconds']:.2f} s"
            )
            return 0
    finally:
        clients.shutdown()
    print(
        f"pool resized from {summary['from']} to {summary['to']} shards: "
        f"{summary['moved_slots']} slots moved in {summary['seconds']:.2f} s"
    )
    return 0
