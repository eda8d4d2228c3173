"""The actor pool: the `@ray.remote` classes around the plain shells, starting and stopping them.

`PresenceShard`, `FlushActor` and `SlotDirectory` are plain Python; this module turns them into
named Ray actors and is what `presence up` (and a resize) imports to create them. Processes that
only call the actors import `actors.clients` instead, which never loads this module's imports
(asyncpg, the shard shell): an edge stays small (tests/unit/test_layers.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any, NamedTuple, Protocol, cast

import asyncpg
import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from actors.clients import (
    DIRECTORY,
    FLUSH,
    LANE_APPLY,
    LANE_PULL,
    DirectoryActor,
    DirectoryClient,
    FlushActorCalls,
    FlushClient,
    Remote,
    ShardActor,
    ShardClient,
    shard_name,
)
from actors.core.contract import WIRE_VERSION, ApplyReply, Mail, ShardStats
from actors.core.liveness import Fence, GcsAnswer, Standing, gcs_answer
from actors.core.ops import Batch
from actors.core.placement import SHARD_RESOURCE, eligible, place
from actors.core.shard import SlotExport
from actors.core.slots import SlotMap
from actors.directory import SlotDirectory
from actors.flush import FlushActor
from actors.lane import LaneServer
from actors.lazy_start import LazyStart
from actors.pgstore import PostgresStore
from actors.presence import PresenceShard, ShardConfig

log = logging.getLogger("presence.ray")


# Shards and the flusher are placed with num_cpus=0: they are I/O-bound asyncio processes, and a
# two-core machine must still be able to run eight of them beside the edges (nodes with no CPU to
# offer Ray too). One byte of Ray's logical `memory`: Ray ignores a soft node affinity for an
# actor that asks for nothing at all (the testbed found the directory, meant for the head, on a
# worker; its death there restarted it with the map it was born with).
_ACTOR_OPTIONS: dict[str, Any] = {
    "num_cpus": 0,
    "memory": 1,
    "max_restarts": -1,
    "max_task_retries": 0,
    "lifetime": "detached",
    "max_concurrency": 10_000,
}


class FlushHost:
    """The FlushActor's Ray face (`FlushActorCalls` in actors.clients)."""

    def __init__(self, database_url: str, interval_s: float, max_rows: int) -> None:
        self.impl = FlushActor(database_url, interval_s=interval_s, max_rows=max_rows)
        self._started = LazyStart(self.impl.start)

    async def _ready(self) -> FlushActor:
        await self._started.wait()
        return self.impl

    async def write(self, entries: list[tuple[str, float]]) -> None:
        await (await self._ready()).write(entries)

    async def drain(self, timeout_s: float) -> int:
        return await (await self._ready()).drain(timeout_s)

    async def stats(self) -> dict[str, Any]:
        return await (await self._ready()).stats()

    async def stop(self) -> None:
        await (await self._ready()).stop()


class ShardHost:
    """A PresenceActor's Ray face (`ShardActor` in actors.clients): the lazy start, the lane."""

    def __init__(self, config: dict[str, Any]) -> None:
        shard_config = ShardConfig(**config)
        self.impl = PresenceShard(
            shard_config, flush_write=self._flush_write, store=PostgresStore(shard_config.database_url)
        )
        self._started = LazyStart(self._start)
        self._impl_started = False
        self._flush = FlushClient()
        # The direct lane (actors/lane.py) serves the edges' two hot calls.
        self._lane = LaneServer(
            {LANE_APPLY: self.apply_and_collect, LANE_PULL: self.pull},
            immediate={LANE_APPLY: self._apply_and_collect_now},
        )
        self._lane_address: tuple[str, int] | None = None
        self._node_watch: asyncio.Task[None] | None = None
        self._fence = Fence(FENCE_LEASE_S)
        self._standing = Standing.SERVING

    async def _flush_write(self, entries: list[tuple[str, float]]) -> None:
        # A restarted or replaced FlushActor is looked up again by the next call.
        await self._flush.write(entries)

    async def _ready(self) -> PresenceShard:
        # Ray re-runs __init__ after a crash but never an async start; starting lazily on the
        # first call covers both the first start and every restart.
        await self._started.wait()
        return self.impl

    async def _start(self) -> None:
        # The slots this shard serves come from the directory, also after a restart.
        version, owners, count = await DirectoryClient().get_map()
        slot_map = SlotMap(version, tuple(owners), count)
        self.impl.set_owned(set(slot_map.slots_of(self.impl.config.shard_index)))
        self.impl.node_id = ray.get_runtime_context().get_node_id()
        node_ip = _node_ip()
        self.impl.node_ip = node_ip
        if not self._impl_started:  # a start tried again must not start the loops twice
            await self.impl.start()
            self._impl_started = True
        host = self.impl.config.lane_host
        _, port = await self._lane.start(node_ip if host == "node" else host)
        # Listening on every interface: the edges are told the node's address, not the wildcard.
        self._lane_address = (node_ip if host in ("node", "0.0.0.0", "::", "") else host, port)
        self._fence.started(time.monotonic())
        self._node_watch = asyncio.get_running_loop().create_task(self._watch_cluster())

    async def _watch_cluster(self) -> None:
        """Every NODE_WATCH_S, Ray's view of the cluster, for two rules:

        - edges on a node Ray declared dead depart at once (their lease would keep their
          accounts online for up to 90 s more); each edge's node is in its registration with the
          directory;
        - the fence (actors/core/liveness.py `Fence`): a shard on a node cut off from most of the
          others suspends itself within FENCE_LEASE_S, before Ray can restart it elsewhere, and
          one Ray replaced meanwhile exits, so no two incarnations ever serve the same slots."""
        handled: set[str] = set()
        directory = DirectoryClient()
        my_node = ray.get_runtime_context().get_node_id()
        peers: list[tuple[str, int]] = []
        pending: asyncio.Future[_GcsView] | None = None
        while True:
            await asyncio.sleep(NODE_WATCH_S)
            if pending is None or pending.done():
                pending = asyncio.ensure_future(asyncio.to_thread(_gcs_view, my_node))
            try:
                view: _GcsView | None = await asyncio.wait_for(asyncio.shield(pending), GCS_WAIT_S)
            except Exception as e:  # the GCS away or slow (a head restart, a partition)
                log.info("asking Ray's GCS failed: %s", e)
                view = None
            answer = GcsAnswer.NO_ANSWER
            if view is not None:
                answer, peers = view.answer, view.peers
            reachable = 1 + sum(await asyncio.gather(*(_answers(host, port) for host, port in peers)))
            self._stand(self._fence.observe(answer, reachable, 1 + len(peers), time.monotonic()))
            if view is None:
                continue
            try:
                fresh = view.dead - handled
                if not fresh:
                    continue
                gone = self.impl.edges_died(await directory.edges_on(sorted(fresh)))
                if gone:
                    log.warning("edges %s departed: Ray declared their node dead", ", ".join(gone))
                handled |= fresh
            except Exception as e:  # the directory away for a moment: the next round
                log.info("watching Ray's nodes failed: %s", e)

    def _stand(self, standing: Standing) -> None:
        """Carry out the fence's verdict (one log line per change)."""
        if standing is self._standing:
            return
        index = self.impl.config.shard_index
        if standing is Standing.FENCED:
            log.error(
                "shard %d: Ray restarted this shard elsewhere (its node was declared dead): this "
                "incarnation stops serving for good and exits",
                index,
            )
            os._exit(1)
        if standing is Standing.SUSPENDED:
            log.error(
                "shard %d: suspended: it has not reached most of the nodes for %.0f s (this node cut "
                "off?); operations refused until it does",
                index,
                FENCE_LEASE_S,
            )
        else:
            log.warning("shard %d: serving again (it reaches most of the nodes)", index)
        self._standing = standing

    def _serving(self) -> None:
        """Refuse an operation while suspended: the edge retries it (TimeoutError, as a slow
        call), then closes the socket with 1011, and its client reconnects to a healthy edge."""
        if self._standing is not Standing.SERVING:
            index = self.impl.config.shard_index
            raise ShardSuspended(f"shard {index} is suspended (cut off from most nodes)")

    async def wire_version(self) -> int:
        """The internal wire version this shard speaks (actors/core/contract.py WIRE_VERSION):
        asked by an edge whose batches take Ray calls before its first one."""
        return WIRE_VERSION

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

    async def edges_registered(self) -> list[str]:
        return await (await self._ready()).edges_registered()

    async def apply(self, edge_id: str, ops: Batch) -> tuple[str, list[object]]:
        """Without the mail (bench/rtt.py times Ray's own round trip with it)."""
        return await (await self._ready()).apply(edge_id, ops)

    async def apply_and_collect(
        self, edge_id: str, ops: Batch, incarnation: str | None, acked_seq: int
    ) -> ApplyReply:
        self._serving()
        return await (await self._ready()).apply_and_collect(edge_id, ops, incarnation, acked_seq)

    def _apply_and_collect_now(
        self, edge_id: str, ops: Batch, incarnation: str | None, acked_seq: int
    ) -> ApplyReply | None:
        """The lane's road for a batch that needs no turn of the loop (None: it takes the task's)."""
        if not self._started.started:
            return None
        self._serving()
        return self.impl.apply_and_collect_now(edge_id, ops, incarnation, acked_seq)

    async def pull(
        self, edge_id: str, incarnation: str | None, acked_seq: int, wait_s: float, resend: bool = False
    ) -> Mail:
        self._serving()
        return await (await self._ready()).pull(edge_id, incarnation, acked_seq, wait_s, resend)

    async def is_focused(self, user_id: str, channel_id: str) -> bool:
        return await (await self._ready()).is_focused(user_id, channel_id)

    async def operator_view(self, user_id: str) -> dict[str, object] | None:
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


# How often a shard reads Ray's node table for nodes that died, and checks its fence.
NODE_WATCH_S = 1.0
# The longest a round waits for the GCS's answer (a GCS away: no answer, the round goes on).
GCS_WAIT_S = 2.0
# A shard that has not reached most of the nodes for this long suspends itself: well under Ray's
# quickest verdict on a silent node (5 failed health checks 3 s apart: 15 s; ~65 s measured).
FENCE_LEASE_S = 8.0
# How long a probe of another node's raylet may take.
PROBE_S = 0.5


class ShardSuspended(TimeoutError):
    """An operation refused by a suspended shard (a TimeoutError: edges retry it as a slow call)."""


class _GcsView(NamedTuple):
    answer: GcsAnswer
    peers: list[tuple[str, int]]  # the raylets of the other nodes that may carry shards
    dead: set[str]  # nodes Ray declared dead


def _gcs_view(my_node: str) -> _GcsView:
    """What Ray's GCS says of the nodes (a blocking call: run in a thread)."""
    nodes: Callable[[], list[dict[str, Any]]] = ray.nodes
    table = nodes()
    mine = next((n for n in table if str(n["NodeID"]) == my_node), None)
    answer = gcs_answer(None if mine is None else bool(mine["Alive"]))
    alive = {str(n["NodeID"]): n for n in table if n["Alive"]}
    carriers = eligible({node: dict(n.get("Resources") or {}) for node, n in alive.items()})
    peers = [(str(alive[n]["NodeManagerAddress"]), int(alive[n]["NodeManagerPort"])) for n in carriers]
    peers = [p for n, p in zip(carriers, peers, strict=True) if n != my_node]
    return _GcsView(answer, peers, {str(n["NodeID"]) for n in table if not n["Alive"]})


async def _answers(host: str, port: int) -> bool:
    """Whether a node's raylet accepts a connection within PROBE_S."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), PROBE_S)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


def _node_ip() -> str:
    """This node's address as Ray knows it (Ray does not annotate the function)."""
    get: Callable[[], str] = ray.util.get_node_ip_address
    return get()


class DirectoryHost:
    """The slot directory's Ray face (`DirectoryActor` in actors.clients): every map it publishes
    is also written to PostgreSQL, and a directory Ray restarts (its node died; the head came back
    with GCS fault tolerance) serves that map again, with a newer version, instead of the even
    map it was created with (after a `presence scale` that map names the wrong shards)."""

    def __init__(self, shard_count: int, shard_config: dict[str, Any] | None = None) -> None:
        self.impl = SlotDirectory(shard_count, shard_config)
        database_url: str | None = (shard_config or {}).get("database_url")
        self._store = MapStore(database_url) if database_url else None
        self._restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self._started = LazyStart(self._start)

    async def _start(self) -> None:
        if self._store is None:
            return
        saved = await self._store.load() if self._restarted else None
        if saved is not None:
            version = await self.impl.restore(*saved)
            log.warning(
                "slot directory restarted: serving the saved map (%d shards) as version %d", saved[2], version
            )
        else:
            await self._save()

    async def _save(self) -> None:
        if self._store is not None:
            m = self.impl.map
            await self._store.save(m.version, m.owners, m.shard_count)

    async def _ready(self) -> SlotDirectory:
        await self._started.wait()
        return self.impl

    async def get_shard_config(self) -> dict[str, Any]:
        return await (await self._ready()).get_shard_config()

    async def get_map(self) -> tuple[int, tuple[int, ...], int]:
        return await (await self._ready()).get_map()

    async def set_map(self, owners: tuple[int, ...], shard_count: int) -> int:
        version = await (await self._ready()).set_map(owners, shard_count)
        await self._save()
        return version

    async def restore(self, version: int, owners: tuple[int, ...], shard_count: int) -> int:
        served = await (await self._ready()).restore(version, owners, shard_count)
        await self._save()
        return served

    async def register_edge(self, edge_id: str, info: dict[str, Any]) -> None:
        await (await self._ready()).register_edge(edge_id, info)

    async def age_s(self) -> float:
        return await self.impl.age_s()

    async def list_edges(self, max_age_s: float = 30.0) -> dict[str, dict[str, Any]]:
        return await (await self._ready()).list_edges(max_age_s)

    async def edges_on(self, node_ids: list[str]) -> list[str]:
        return await (await self._ready()).edges_on(node_ids)


_SAVE_MAP = (
    "INSERT INTO slot_map (version, shard_count, owners) VALUES ($1, $2, $3) "
    "ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version, "
    "shard_count = EXCLUDED.shard_count, owners = EXCLUDED.owners, set_at = now()"
)


class MapStore:
    """Where the directory keeps its map: one PostgreSQL connection, opened again after a failure
    (a resize flips the map dozens of times: a connection each cost seconds on a busy machine)."""

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url
        self._conn: asyncpg.Connection | None = None

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(self.database_url)
        return self._conn

    async def save(self, version: int, owners: tuple[int, ...], shard_count: int) -> None:
        try:
            await (await self._connection()).execute(_SAVE_MAP, version, shard_count, list(owners))
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            self._conn = None  # once more, on a fresh connection
            await (await self._connection()).execute(_SAVE_MAP, version, shard_count, list(owners))

    async def load(self) -> tuple[int, tuple[int, ...], int] | None:
        """The map the directory last published (None: never saved)."""
        row = await (await self._connection()).fetchrow("SELECT version, owners, shard_count FROM slot_map")
        return None if row is None else (int(row["version"]), tuple(row["owners"]), int(row["shard_count"]))


_FlushActor = ray.remote(FlushHost)
_PresenceActor = ray.remote(ShardHost)
_Directory = ray.remote(DirectoryHost)


# ---------------------------------------------------------------------------- placement
# The policy is actors/core/placement.py; docs/architecture.md "Placement" says why.


def _alive_nodes() -> dict[str, dict[str, float]]:
    nodes: Callable[[], list[dict[str, Any]]] = ray.nodes
    return {str(n["NodeID"]): dict(n.get("Resources") or {}) for n in nodes() if n["Alive"]}


def shard_nodes() -> list[str]:
    """The alive Ray nodes that may carry shards, in the policy's order."""
    return eligible(_alive_nodes())


def wait_for_shard_nodes(expected: int, timeout_s: float, poll_s: float = 1.0) -> int:
    """Wait until `expected` nodes may carry shards (workers joining after the head), at most
    `timeout_s`; returns how many there are."""
    deadline = time.monotonic() + timeout_s
    while True:
        count = len(shard_nodes())
        if count >= expected or time.monotonic() >= deadline:
            return count
        time.sleep(poll_s)


def _shard_options(node: str | None) -> dict[str, Any]:
    """Ray options placing a shard on `node` (soft: if that node is gone when Ray restarts the
    shard, it goes to another), and only ever on nodes marked to carry shards when any is."""
    options: dict[str, Any] = {}
    if node is not None:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node, soft=True)
    if any(r.get(SHARD_RESOURCE, 0) > 0 for r in _alive_nodes().values()):
        options["resources"] = {SHARD_RESOURCE: 0.001}
    return options


def _here() -> dict[str, Any]:
    """The directory and the FlushActor go on the node of `presence up` (the head), softly."""
    return {
        "scheduling_strategy": NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=True
        )
    }


# ---------------------------------------------------------------------------- the pool


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


# How long `presence up` gives the pool's drain on the way out.
POOL_DRAIN_DEADLINE_S = 75.0


def drain_pool(address: str, deadline_s: float = POOL_DRAIN_DEADLINE_S, settle_s: float = 2.0) -> int | None:
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


def start_pool(
    shards: int,
    shard_config: ShardConfig,
    flush_interval_s: float,
    flush_max_rows: int,
    shard_resources: list[dict[str, float]] | None = None,
) -> None:
    """Create the directory, the FlushActor and `shards` PresenceActors, and wait until all answer.

    Shards are spread over the nodes that may carry them (actors/core/placement.py), the
    directory and the FlushActor go on this process's node. `shard_resources[i]`, if given, are
    custom Ray resources shard i asks for instead: shards on chosen nodes (tests)."""
    directory = cast(
        DirectoryActor,
        _Directory.options(name=DIRECTORY, **_here(), **_ACTOR_OPTIONS).remote(shards, asdict(shard_config)),
    )
    flush = cast(
        FlushActorCalls,
        _FlushActor.options(name=FLUSH, **_here(), **_ACTOR_OPTIONS).remote(
            shard_config.database_url, flush_interval_s, flush_max_rows
        ),
    )
    if shard_resources:
        options = [{"resources": shard_resources[i % len(shard_resources)]} for i in range(shards)]
    else:
        options = [_shard_options(node) for node in place(shards, {}, shard_nodes())]
    handles = [
        cast(
            ShardActor,
            _PresenceActor.options(name=shard_name(i), **options[i], **_ACTOR_OPTIONS).remote(
                asdict(ShardConfig(**{**asdict(shard_config), "shard_index": i}))
            ),
        )
        for i in range(shards)
    ]
    ray.get(directory.get_map.remote())
    ray.get(flush.stats.remote())
    ray.get([h.stats.remote() for h in handles])


def surviving_pool(timeout_s: float = 60.0) -> int | None:
    """The shard count of a pool that outlived the head's restart (GCS fault tolerance keeps the
    detached actors; Ray restarts those of the dead head elsewhere), or None when there is none
    (a fresh Ray: `start_pool`)."""
    directory = _find(DIRECTORY)
    if directory is None:
        return None
    _, _, count = ray.get(cast(DirectoryActor, directory).get_map.remote(), timeout=timeout_s)
    return int(count)


def stop_pool(drain_timeout_s: float = 30.0) -> int:
    """Drain last-seen (shards → FlushActor → PostgreSQL), then kill every actor of the pool.
    Returns the number of last-seen values that could not be written."""
    left = 0
    try:
        _, _, count = ray.get(cast(DirectoryActor, ray.get_actor(DIRECTORY)).get_map.remote(), timeout=10)
    except Exception:
        count = 0
    shards = [cast(ShardActor, h) for h in (_find(shard_name(i)) for i in range(count)) if h is not None]
    try:
        left += sum(ray.get([h.drain.remote(drain_timeout_s) for h in shards], timeout=drain_timeout_s + 5))
        flush = _find(FLUSH)
        if flush is not None:
            drained = cast(_FlushDrain, flush).drain.remote(drain_timeout_s)
            left += ray.get(drained, timeout=drain_timeout_s + 5)
    except Exception as e:
        log.error("draining last-seen failed: %s", e)
        left = -1
    for name in [DIRECTORY, FLUSH, *(shard_name(i) for i in range(count))]:
        handle = _find(name)
        if handle is not None:
            ray.kill(handle, no_restart=True)
    return left


class _FlushDrain(Protocol):
    """What stopping the pool asks of the FlushActor beyond its clients' calls."""

    drain: Remote[[float], int]


def _find(name: str) -> ray.actor.ActorHandle[Any] | None:
    try:
        return ray.get_actor(name)
    except ValueError:
        return None


# ---------------------------------------------------------------------------- resizing


class PoolClient:
    """Creating and retiring shards: what a resize (cluster/scale.py) needs beyond the clients."""

    def shard(self, index: int) -> ShardClient:
        return ShardClient(index)

    async def start_shards(self, indices: Sequence[int], config: dict[str, Any]) -> None:
        """Create these shards with `config` (the directory's), each on the eligible node with
        the fewest shards (the pool's other shards counted), and wait until each answers."""
        existing = range(min(indices)) if indices else range(0)
        current = dict(zip(existing, await asyncio.gather(*(self.node_of(i) for i in existing)), strict=True))
        targets = place(len(indices), current, await asyncio.to_thread(shard_nodes))
        handles = [
            cast(
                ShardActor,
                _PresenceActor.options(name=shard_name(i), **_shard_options(node), **_ACTOR_OPTIONS).remote(
                    {**config, "shard_index": i}
                ),
            )
            for i, node in zip(indices, targets, strict=True)
        ]
        await asyncio.gather(*(h.stats.remote() for h in handles))

    async def start_shard_on(self, index: int, config: dict[str, Any], node: str) -> None:
        """Create shard `index` on `node` (a rebalance) and wait until it answers."""
        handle = cast(
            ShardActor,
            _PresenceActor.options(name=shard_name(index), **_shard_options(node), **_ACTOR_OPTIONS).remote(
                {**config, "shard_index": index}
            ),
        )
        await handle.stats.remote()

    async def node_of(self, index: int) -> str | None:
        """The Ray node shard `index` runs on (None if it does not answer within 10 s)."""
        try:
            return (await ShardClient(index).stats(timeout_s=10)).node_id
        except Exception:
            return None

    def retire_shard(self, index: int) -> None:
        """Kill a shard for good (its slots and mail are elsewhere by now)."""
        ShardClient(index).kill(restart=False)
