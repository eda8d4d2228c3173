"""Every Ray call of the project, in one small module.

The actor classes themselves (`PresenceShard`, `FlushActor`, `SlotDirectory`) are plain Python;
this module turns them into named Ray actors, finds them again from any process, and is the only
place that imports `ray`. Unit tests of everything else never start Ray.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import psutil
import ray

from actors.core.contract import MailChunk, ShardStats
from actors.core.ops import Op
from actors.core.shard import SlotExport
from actors.core.slots import SlotMap
from actors.directory import SlotDirectory
from actors.flush import FlushActor
from actors.lane import LaneBroken, LaneClient, LaneServer
from actors.pgstore import PostgresStore
from actors.presence import PresenceShard, ShardConfig

log = logging.getLogger("presence.ray")

DIRECTORY = "directory"
# A pull's answer: (the shard's incarnation, a chunk of mail: see actors.core.contract.MailChunk).
Mail = tuple[str, MailChunk]
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

    async def stop(self) -> None:
        await (await self._ready()).stop()


@ray.remote
class _PresenceActor:
    def __init__(self, config: dict[str, Any]) -> None:
        shard_config = ShardConfig(**config)
        self.impl = PresenceShard(
            shard_config, flush_write=self._flush_write, store=PostgresStore(shard_config.database_url)
        )
        self._started: asyncio.Task[None] | None = None
        self._flush: Any = None
        # The direct lane (actors/lane.py) serves the edges' two hot calls.
        self._lane = LaneServer({"apply_and_collect": self.apply_and_collect, "pull": self.pull})
        self._lane_address: tuple[str, int] | None = None

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
        host = self.impl.config.lane_host
        node_ip = ray.util.get_node_ip_address()
        _, port = await self._lane.start(node_ip if host == "node" else host)
        # Listening on every interface: the edges are told the node's address, not the wildcard.
        self._lane_address = (node_ip if host in ("node", "0.0.0.0", "::", "") else host, port)

    async def lane_address(self) -> tuple[str, int, bytes]:
        """Where the direct lane listens and its secret (only Ray's admitted callers learn it)."""
        await self._ready()
        assert self._lane_address is not None
        return (*self._lane_address, self._lane.secret)

    async def export_slots(self, slots: list[int]) -> SlotExport:
        return await (await self._ready()).export_slots(slots)

    async def import_slots(self, export: SlotExport) -> None:
        await (await self._ready()).import_slots(export)

    async def mail_pending(self) -> int:
        return await (await self._ready()).mail_pending()

    async def apply(self, edge_id: str, ops: list[Op]) -> tuple[str, list[Any]]:
        return await (await self._ready()).apply(edge_id, ops)

    async def apply_and_collect(
        self, edge_id: str, ops: list[Op], incarnation: str | None, acked_seq: int
    ) -> tuple[str, list[Any], MailChunk]:
        return await (await self._ready()).apply_and_collect(edge_id, ops, incarnation, acked_seq)

    async def pull(
        self, edge_id: str, incarnation: str | None, acked_seq: int, wait_s: float, resend: bool = False
    ) -> Mail:
        return await (await self._ready()).pull(edge_id, incarnation, acked_seq, wait_s, resend)

    async def is_focused(self, user_id: str, channel_id: str) -> bool:
        return await (await self._ready()).is_focused(user_id, channel_id)

    async def operator_view(self, user_id: str) -> dict[str, Any] | None:
        return await (await self._ready()).operator_view(user_id)

    async def stats(self) -> ShardStats:
        return await (await self._ready()).stats()

    async def server_members(self, server_id: str) -> list[str]:
        return await (await self._ready()).server_members(server_id)

    async def postgres_ok(self) -> bool:
        return await (await self._ready()).postgres_ok()

    async def drain(self, timeout_s: float) -> int:
        return await (await self._ready()).drain(timeout_s)

    async def stop(self) -> None:
        await self._lane.close()
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
    if address is None:
        # Ray starts its workers at nice 15 (below its own daemons); here the workers are the
        # service's shards, which must not yield the CPU to every other process of the machine
        # (an edge in a reconnect storm, its clients): at nice 15 a busy core gives them ~3 %.
        init_kwargs.setdefault("_system_config", {}).setdefault("worker_niceness", 0)
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


def _ray_daemons() -> list[psutil.Process]:
    """A local cluster's GCS and raylet: this process's children (none for a cluster of its own)."""
    return [p for p in psutil.Process().children(recursive=True) if p.name() in ("gcs_server", "raylet")]


def _gone(daemons: list[psutil.Process], address: str) -> bool:
    if daemons:
        try:
            return any(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in daemons)
        except psutil.Error:  # reaped meanwhile
            return True
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return False
    except OSError:
        return True


def drain_pool(address: str, deadline_s: float = 75.0, settle_s: float = 2.0) -> int | None:
    """`stop_pool`, unless Ray itself goes away meanwhile or it takes past `deadline_s`; None
    then (nothing drained).

    A signal to the whole process group (systemd's default, `timeout`) reaches a local cluster's
    GCS and raylet too, and a driver's calls into a Ray that has gone wait without a deadline (or
    abort the whole process after a minute, clean-up and all). So: give such a signal `settle_s`
    to show, then drain in a thread, watching Ray's own processes (`address`, host:port, the GCS
    of a cluster of its own) and giving up as soon as one has gone."""
    daemons = _ray_daemons()
    if daemons and psutil.wait_procs(daemons, timeout=settle_s)[0]:
        return None
    if _gone(daemons, address):
        return None
    result: list[int] = []
    worker = threading.Thread(target=lambda: result.append(stop_pool()), daemon=True)
    worker.start()
    end = time.monotonic() + deadline_s
    while worker.is_alive() and time.monotonic() < end:
        worker.join(0.2)
        if worker.is_alive() and _gone(daemons, address):
            return None
    return result[0] if result else None


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
        _, _, count = ray.get(_directory().get_map.remote(), timeout=10)
    except Exception:
        count = 0
    shards = [h for h in (_find(shard_name(i)) for i in range(count)) if h is not None]
    try:
        left += sum(ray.get([h.drain.remote(drain_timeout_s) for h in shards], timeout=drain_timeout_s + 5))
        flush = _find(FLUSH)
        if flush is not None:
            left += ray.get(flush.drain.remote(drain_timeout_s), timeout=drain_timeout_s + 5)
    except Exception as e:
        log.error("draining last-seen failed: %s", e)
        left = -1
    for name in [DIRECTORY, FLUSH, *(shard_name(i) for i in range(count))]:
        handle = _find(name)
        if handle is not None:
            ray.kill(handle, no_restart=True)
    return left


def _find(name: str) -> Any:
    try:
        return ray.get_actor(name)
    except ValueError:
        return None


def _directory() -> Any:
    return ray.get_actor(DIRECTORY)


# What a call to an actor that died (or restarts) fails with, by either road.
ActorDied = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, LaneBroken)


class _Client:
    """A named actor seen from anywhere: the handle is looked up lazily and again after a failure.
    The clients are the only way out of this module: no caller holds a raw Ray handle."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handle: Any = None

    def _h(self) -> Any:
        if self._handle is None:
            self._handle = ray.get_actor(self.name)
        return self._handle

    async def _call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        try:
            ref = getattr(self._h(), method).remote(*args)
            return await (ref if timeout_s is None else asyncio.wait_for(ref, timeout_s))
        except (TimeoutError, *ActorDied, ValueError):
            self._handle = None
            raise

    def kill(self, restart: bool = True) -> None:
        """Kill the actor; with `restart`, Ray brings it back (a fresh incarnation: fault tests)."""
        ray.kill(self._h(), no_restart=not restart)
        self._handle = None


class ShardClient(_Client):
    """One shard, by index. With `direct`, the two hot calls (`apply_and_collect`, `pull`) take
    the shard's direct lane (actors/lane.py) instead of a Ray call each."""

    def __init__(self, index: int, direct: bool = False) -> None:
        super().__init__(shard_name(index))
        self.index = index
        self.direct = direct
        self._lane: LaneClient | None = None
        self._opening: asyncio.Lock | None = None
        self._lane_closed = False

    async def _hot(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        if not self.direct:
            return await self._call(method, *args, timeout_s=timeout_s)
        lane = self._lane
        if lane is None or lane.broken:
            lane = await self._open_lane()
        try:
            return await lane.call(method, *args, timeout_s=timeout_s)
        except LaneBroken:
            self._handle = None  # a restarted shard: find it again, and its new lane
            raise

    async def _open_lane(self) -> LaneClient:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:  # the batches and the pull racing to open it open one lane
            if self._lane is None or self._lane.broken:
                host, port, secret = await self._call("lane_address", timeout_s=30.0)
                lane = await LaneClient.open(host, port, secret)
                if self._lane_closed:  # the edge stopped meanwhile: open nothing that outlives it
                    lane.close()
                    raise LaneBroken("the edge's lanes are closed")
                self._lane = lane
            return self._lane

    async def lane_endpoint(self) -> tuple[str, int]:
        """Where the shard's direct lane listens (its secret stays inside this client)."""
        host, port, _ = await self._call("lane_address", timeout_s=30.0)
        return host, port

    def close_lane(self) -> None:
        self._lane_closed = True
        if self._lane is not None:
            self._lane.close()
            self._lane = None

    async def apply(self, edge_id: str, ops: list[Op]) -> tuple[str, list[Any]]:
        return await self._call("apply", edge_id, ops)  # type: ignore[no-any-return]

    async def apply_and_collect(
        self, edge_id: str, ops: list[Op], incarnation: str | None, acked_seq: int
    ) -> tuple[str, list[Any], MailChunk]:
        return await self._hot("apply_and_collect", edge_id, ops, incarnation, acked_seq)  # type: ignore[no-any-return]

    async def pull(
        self, edge_id: str, incarnation: str | None, acked_seq: int, wait_s: float, resend: bool = False
    ) -> Mail:
        mail: Mail = await self._hot(
            "pull", edge_id, incarnation, acked_seq, wait_s, resend, timeout_s=wait_s + 30
        )
        return mail

    async def is_focused(self, user_id: str, channel_id: str, timeout_s: float) -> bool:
        return await self._call("is_focused", user_id, channel_id, timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def operator_view(self, user_id: str, timeout_s: float) -> dict[str, Any] | None:
        return await self._call("operator_view", user_id, timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def stats(self, timeout_s: float) -> ShardStats:
        return await self._call("stats", timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def server_members(self, server_id: str, timeout_s: float) -> list[str]:
        return await self._call("server_members", server_id, timeout_s=timeout_s)  # type: ignore[no-any-return]

    async def postgres_ok(self, timeout_s: float) -> bool:
        return await self._call("postgres_ok", timeout_s=timeout_s)  # type: ignore[no-any-return]

    # A resize (cluster/scale.py) and stopping: no timeout, these wait as long as they take.

    async def export_slots(self, slots: list[int]) -> SlotExport:
        return await self._call("export_slots", slots)  # type: ignore[no-any-return]

    async def import_slots(self, export: SlotExport) -> None:
        await self._call("import_slots", export)

    async def mail_pending(self) -> int:
        return await self._call("mail_pending")  # type: ignore[no-any-return]

    async def drain(self, timeout_s: float) -> int:
        return await self._call("drain", timeout_s)  # type: ignore[no-any-return]


class DirectoryClient(_Client):
    """The slot directory: the slot map, the edges alive, the configuration of new shards."""

    def __init__(self) -> None:
        super().__init__(DIRECTORY)

    async def get_map(self) -> tuple[int, tuple[int, ...], int]:
        return await self._call("get_map")  # type: ignore[no-any-return]

    async def set_map(self, owners: tuple[int, ...], shard_count: int) -> int:
        return await self._call("set_map", owners, shard_count)  # type: ignore[no-any-return]

    async def get_shard_config(self) -> dict[str, Any]:
        return await self._call("get_shard_config")  # type: ignore[no-any-return]

    async def register_edge(self, edge_id: str, info: dict[str, Any]) -> None:
        await self._call("register_edge", edge_id, info)

    async def list_edges(self) -> dict[str, dict[str, Any]]:
        return await self._call("list_edges")  # type: ignore[no-any-return]


class FlushClient(_Client):
    """The FlushActor."""

    def __init__(self) -> None:
        super().__init__(FLUSH)

    async def stats(self, timeout_s: float) -> dict[str, Any]:
        return await self._call("stats", timeout_s=timeout_s)  # type: ignore[no-any-return]


async def flush_stats(timeout_s: float) -> dict[str, Any]:
    return await FlushClient().stats(timeout_s)


# ---------------------------------------------------------------------------- resizing


class PoolClient:
    """Creating and retiring shards: what a resize (cluster/scale.py) needs beyond the clients."""

    def shard(self, index: int) -> ShardClient:
        return ShardClient(index)

    async def start_shards(self, indices: Sequence[int], config: dict[str, Any]) -> None:
        """Create these shards with `config` (the directory's), and wait until each answers."""
        handles = [
            _PresenceActor.options(name=shard_name(i), **_ACTOR_OPTIONS).remote(  # type: ignore[attr-defined]
                {**config, "shard_index": i}
            )
            for i in indices
        ]
        await asyncio.gather(*(h.stats.remote() for h in handles))

    def retire_shard(self, index: int) -> None:
        """Kill a shard for good (its slots and mail are elsewhere by now)."""
        ShardClient(index).kill(restart=False)
