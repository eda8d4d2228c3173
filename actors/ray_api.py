"""Every Ray call of the project, in one small module.

The actor classes themselves (`PresenceShard`, `FlushActor`, `SlotDirectory`) are plain Python;
this module turns them into named Ray actors, finds them again from any process, and is the only
place that imports `ray`. Unit tests of everything else never start Ray.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable
from dataclasses import asdict
from typing import Any

import ray

from actors.core.slots import SlotMap
from actors.directory import SlotDirectory
from actors.flush import FlushActor
from actors.presence import PresenceShard, ShardConfig

log = logging.getLogger("presence.ray")

DIRECTORY = "directory"
FLUSH = "flush"


def shard_name(index: int) -> str:
    return f"shard-{index}"


# Shards and the flusher are placed with num_cpus=0: they are I/O-bound asyncio processes, and a
# two-core machine must still be able to run eight of them beside the edges.
_ACTOR_OPTIONS: dict[str, Any] = {
    "num_cpus": 0,
    "max_restarts": -1,
    "max_task_retries": 0,
    "lifetime": "detached",
    "max_concurrency": 10_000,
}


@ray.remote
class _FlushActor:
    def __init__(self, database_url: str, interval_s: float, max_rows: int) -> None:
        self.impl = FlushActor(database_url, interval_s=interval_s, max_rows=max_rows)
        self._started: asyncio.Task[None] | None = None

    async def _ready(self) -> FlushActor:
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self.impl.start())
        await self._started
        return self.impl

    async def write(self, entries: list[tuple[str, float]]) -> None:
        await (await self._ready()).write(entries)

    async def drain(self, timeout_s: float) -> int:
        return await (await self._ready()).drain(timeout_s)

    async def stats(self) -> dict[str, Any]:
        return await (await self._ready()).stats()

    async def server_members(self, server_id: str) -> list[str]:
        return await (await self._ready()).server_members(server_id)

    async def postgres_ok(self) -> bool:
        return await (await self._ready()).postgres_ok()

    async def stop(self) -> None:
        await (await self._ready()).stop()


@ray.remote
class _PresenceActor:
    def __init__(self, config: dict[str, Any]) -> None:
        self.impl = PresenceShard(ShardConfig(**config), flush_write=self._flush_write)
        self._started: asyncio.Task[None] | None = None
        self._flush: Any = None

    async def _flush_write(self, entries: list[tuple[str, float]]) -> None:
        if self._flush is None:
            self._flush = ray.get_actor(FLUSH)
        try:
            await self._flush.write.remote(entries)
        except ray.exceptions.RayActorError:
            self._flush = None  # restarted or replaced: look it up again next time
            raise

    async def _ready(self) -> PresenceShard:
        # Ray re-runs __init__ after a crash but never an async start; starting lazily on the
        # first call covers both the first start and every restart.
        if self._started is None:
            self._started = asyncio.get_running_loop().create_task(self._start())
        await self._started
        return self.impl

    async def _start(self) -> None:
        # The slots this shard serves come from the directory, also after a restart.
        version, owners, count = await ray.get_actor(DIRECTORY).get_map.remote()
        slot_map = SlotMap(version, tuple(owners), count)
        self.impl.set_owned(set(slot_map.slots_of(self.impl.config.shard_index)))
        self.impl.node_id = ray.get_runtime_context().get_node_id()
        await self.impl.start()

    async def export_slots(self, slots: list[int]) -> Any:
        return await (await self._ready()).export_slots(slots)

    async def import_slots(self, export: Any) -> None:
        await (await self._ready()).import_slots(export)

    async def mail_pending(self) -> int:
        return await (await self._ready()).mail_pending()

    async def apply(self, edge_id: str, ops: list[tuple[Any, ...]]) -> tuple[str, list[Any]]:
        return await (await self._ready()).apply(edge_id, ops)

    async def pull(self, edge_id: str, incarnation: str | None, acked_seq: int, wait_s: float) -> Any:
        return await (await self._ready()).pull(edge_id, incarnation, acked_seq, wait_s)

    async def is_focused(self, user_id: str, channel_id: str) -> bool:
        return await (await self._ready()).is_focused(user_id, channel_id)

    async def operator_view(self, user_id: str) -> dict[str, Any] | None:
        return await (await self._ready()).operator_view(user_id)

    async def stats(self) -> dict[str, Any]:
        return await (await self._ready()).stats()

    async def server_members(self, server_id: str) -> list[str]:
        return await (await self._ready()).server_members(server_id)

    async def postgres_ok(self) -> bool:
        return await (await self._ready()).postgres_ok()

    async def drain(self, timeout_s: float) -> int:
        return await (await self._ready()).drain(timeout_s)

    async def stop(self) -> None:
        await (await self._ready()).stop()


@ray.remote
class _Directory(SlotDirectory):
    pass


# ---------------------------------------------------------------------------- connecting


def connect(address: str | None, namespace: str, node_ip: str | None = None, **init_kwargs: Any) -> None:
    """Start a new local Ray instance (address None) or join the one at `address`.

    None means a new instance ("local"), never a cluster this machine's last `ray start` left
    behind (what `ray.init()` without an address would join). Joining a cluster with token
    authentication needs RAY_AUTH_MODE set before `ray` was imported: see `cluster.rayauth`.
    """
    if ray.is_initialized():
        return
    if node_ip:
        init_kwargs["_node_ip_address"] = node_ip
    ray.init(
        address=address or "local",
        namespace=namespace,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        **init_kwargs,
    )


def gcs_address() -> str:
    return str(ray.get_runtime_context().gcs_address)


def auth_mode() -> str | None:
    return os.environ.get("RAY_AUTH_MODE")


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()


# ---------------------------------------------------------------------------- the pool


def start_pool(
    shards: int,
    shard_config: ShardConfig,
    flush_interval_s: float,
    flush_max_rows: int,
    shard_resources: list[dict[str, float]] | None = None,
) -> None:
    """Create the directory, the FlushActor and `shards` PresenceActors, and wait until all answer.

    `shard_resources[i]`, if given, are custom Ray resources shard i asks for: the way to place
    shards on chosen nodes (give each node a resource of its own in `ray start --resources`)."""
    directory = _Directory.options(name=DIRECTORY, **_ACTOR_OPTIONS).remote(  # type: ignore[attr-defined]
        shards, asdict(shard_config)
    )
    flush = _FlushActor.options(name=FLUSH, **_ACTOR_OPTIONS).remote(  # type: ignore[attr-defined]
        shard_config.database_url, flush_interval_s, flush_max_rows
    )
    handles = [
        _PresenceActor.options(  # type: ignore[attr-defined]
            name=shard_name(i),
            resources=(shard_resources[i % len(shard_resources)] if shard_resources else None),
            **_ACTOR_OPTIONS,
        ).remote(asdict(ShardConfig(**{**asdict(shard_config), "shard_index": i})))
        for i in range(shards)
    ]
    ray.get([directory.get_map.remote(), flush.stats.remote(), *(h.stats.remote() for h in handles)])


def stop_pool(drain_timeout_s: float = 30.0) -> int:
    """Drain last-seen (shards → FlushActor → PostgreSQL), then kill every actor of the pool.
    Returns the number of last-seen values that could not be written."""
    left = 0
    try:
        _, _, count = ray.get(directory().get_map.remote(), timeout=10)
    except Exception:
        count = 0
    shards = [h for h in (find_shard(i) for i in range(count)) if h is not None]
    try:
        left += sum(ray.get([h.drain.remote(drain_timeout_s) for h in shards], timeout=drain_timeout_s + 5))
        flush = find(FLUSH)
        if flush is not None:
            left += ray.get(flush.drain.remote(drain_timeout_s), timeout=drain_timeout_s + 5)
    except Exception as e:
        log.error("draining last-seen failed: %s", e)
        left = -1
    for name in [DIRECTORY, FLUSH, *(shard_name(i) for i in range(count))]:
        handle = find(name)
        if handle is not None:
            ray.kill(handle, no_restart=True)
    return left


def find(name: str) -> Any:
    try:
        return ray.get_actor(name)
    except ValueError:
        return None


def find_shard(index: int) -> Any:
    return find(shard_name(index))


def directory() -> Any:
    return ray.get_actor(DIRECTORY)


def flush_actor() -> Any:
    return ray.get_actor(FLUSH)


def kill(handle: Any, restart: bool = True) -> None:
    ray.kill(handle, no_restart=not restart)


async def call(ref: Awaitable[Any], timeout_s: float | None = None) -> Any:
    """Await one Ray call with an optional timeout."""
    if timeout_s is None:
        return await ref
    return await asyncio.wait_for(ref, timeout_s)  # type: ignore[arg-type]


ActorDied = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


class ShardClient:
    """One shard as seen from an edge: the handle is looked up lazily and again after a failure."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._handle: Any = None

    def _h(self) -> Any:
        if self._handle is None:
            self._handle = ray.get_actor(shard_name(self.index))
        return self._handle

    async def _call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        try:
            ref = getattr(self._h(), method).remote(*args)
            return await (ref if timeout_s is None else asyncio.wait_for(ref, timeout_s))
        except (TimeoutError, *ActorDied, ValueError):
            self._handle = None
            raise

    async def apply(self, edge_id: str, ops: list[tuple[Any, ...]]) -> tuple[str, list[Any]]:
        return await self._call("apply", edge_id, ops)  # type: ignore[no-any-return]

    async def pull(self, edge_id: str, incarnation: str | None, acked_seq: int, wait_s: float) -> Any:
        return await self._call("pull", edge_id, incarnation, acked_seq, wait_s, timeout_s=wait_s + 30)

    async def is_focused(self, user_id: str, channel_id: str, timeout_s: float) -> bool:
        return await self._call("is_focused", user_id, channel_id, timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def operator_view(self, user_id: str, timeout_s: float) -> dict[str, Any] | None:
        return await self._call("operator_view", user_id, timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def stats(self, timeout_s: float) -> dict[str, Any]:
        return await self._call("stats", timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def server_members(self, server_id: str, timeout_s: float) -> list[str]:
        return await self._call("server_members", server_id, timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def postgres_ok(self, timeout_s: float) -> bool:
        return await self._call("postgres_ok", timeout_s=timeout_s)  # type: ignore[no-any-return]


class DirectoryClient:
    async def get_map(self) -> tuple[int, tuple[int, ...], int]:
        return await directory().get_map.remote()  # type: ignore[no-any-return]

    async def register_edge(self, edge_id: str, info: dict[str, Any]) -> None:
        await directory().register_edge.remote(edge_id, info)

    async def list_edges(self) -> dict[str, dict[str, Any]]:
        return await directory().list_edges.remote()  # type: ignore[no-any-return]


async def flush_stats(timeout_s: float) -> dict[str, Any]:
    return await asyncio.wait_for(flush_actor().stats.remote(), timeout_s)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- resizing


def _create_shard(index: int, config: dict[str, Any]) -> Any:
    return _PresenceActor.options(name=shard_name(index), **_ACTOR_OPTIONS).remote(  # type: ignore[attr-defined]
        {**config, "shard_index": index}
    )


async def resize(shards: int, progress: Any = print, chunk: int = 512) -> dict[str, Any]:
    """Grow or shrink the pool to `shards`, live, by moving slots (see cluster/scale.py)."""
    from actors.core.slots import moves, rebalance

    started = time.monotonic()
    d = directory()
    _, owners, count = await d.get_map.remote()
    config = await d.get_shard_config.remote()
    if shards == count:
        return {"from": count, "to": shards, "moved_slots": 0, "seconds": 0.0}
    if shards > count:
        new = [_create_shard(i, config) for i in range(count, shards)]
        await asyncio.gather(*(h.stats.remote() for h in new))
        progress(f"started shards {count}..{shards - 1}")
        # The larger count goes out first, so edges start collecting mail from the new shards.
        await d.set_map.remote(owners, shards)
    target = rebalance(tuple(owners), shards)
    current = list(owners)
    moved = 0
    plan = moves(tuple(owners), target)
    total = sum(len(s) for s in plan.values())
    for (src, dst), slots in sorted(plan.items()):
        for i in range(0, len(slots), chunk):
            part = slots[i : i + chunk]
            # Freeze + export in one call on the old owner, import on the new one, then flip the
            # map. Between export and flip the slots answer MOVED and edges wait for the flip.
            export = await find_shard(src).export_slots.remote(part)
            await find_shard(dst).import_slots.remote(export)
            for s in part:
                current[s] = dst
            await d.set_map.remote(tuple(current), max(shards, count))
            moved += len(part)
            progress(f"moved {moved}/{total} slots ({src} → {dst})")
    if shards < count:
        await d.set_map.remote(tuple(current), shards)
        for index in range(shards, count):
            handle = find_shard(index)
            deadline = time.monotonic() + 10
            while await handle.mail_pending.remote() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # let edges collect what was addressed to them here
            await handle.drain.remote(5.0)
            ray.kill(handle, no_restart=True)
        progress(f"retired shards {shards}..{count - 1}")
    return {"from": count, "to": shards, "moved_slots": moved, "seconds": time.monotonic() - started}
