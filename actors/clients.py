"""The pool seen from any process: typed clients of the named actors, and joining Ray.

What an edge (or `presence status`, `presence scale`, a bench) imports to reach the shards, the
slot directory and the FlushActor. It never imports what runs inside them (`actors.pool` hosts the
`@ray.remote` classes; `actors.presence`, `actors.flush`, `actors.pgstore` and asyncpg stay out
of an edge's process: tests/unit/test_layers.py checks the import closure).

Each call is a method with its own types. A Ray handle is untyped, so the actor's interface is
stated once here as a protocol (`ShardActor`, `DirectoryActor`, `FlushActorCalls`) and checked
against the actor classes of `actors.pool` by tests/unit/test_clients.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, cast

import ray

from actors.core.contract import WIRE_VERSION, ApplyReply, Mail, ShardStats, wire_compatible
from actors.core.ops import Batch, Operation, to_wire
from actors.core.shard import SlotExport
from actors.lane import LaneBroken, LaneClient, WireMismatch, tell_mismatch

DIRECTORY = "directory"
FLUSH = "flush"
# The two hot calls' names on the direct lane (actors/lane.py): its wire format, served by
# `actors.pool`'s shard under these names.
LANE_APPLY = "apply_and_collect"
LANE_PULL = "pull"

# The slot map as the directory hands it out: (version, owner of each slot, shard count).
MapTuple = tuple[int, tuple[int, ...], int]
# What an edge tells the directory about itself (ports, sockets; the directory adds `seen_at`).
EdgeInfo = dict[str, Any]


def shard_name(index: int) -> str:
    return f"shard-{index}"


# What a call to an actor that died (or restarts) fails with, by either road.
ActorDied = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, LaneBroken)

P = ParamSpec("P")
R = TypeVar("R")


class Remote(Protocol[P, R]):
    """An actor method seen through a Ray handle: `.remote(...)` starts the call."""

    def remote(self, *args: P.args, **kwargs: P.kwargs) -> ray.ObjectRef[R]: ...


class ShardActor(Protocol):
    """What `actors.pool`'s shard serves (the arguments and answers of `actors.presence`)."""

    wire_version: Remote[[], int]
    lane_address: Remote[[], tuple[str, int, bytes]]
    apply_and_collect: Remote[[str, Batch, str | None, int], ApplyReply]
    pull: Remote[[str, str | None, int, float, bool], Mail]
    is_focused: Remote[[str, str], bool]
    operator_view: Remote[[str], dict[str, object] | None]
    stats: Remote[[], ShardStats]
    server_members: Remote[[str], list[str]]
    postgres_ok: Remote[[], bool]
    export_slots: Remote[[list[int]], SlotExport]
    import_slots: Remote[[SlotExport], None]
    mail_pending: Remote[[], int]
    edges_registered: Remote[[], list[str]]
    drain: Remote[[float], int]


class DirectoryActor(Protocol):
    """What `actors.directory.SlotDirectory` serves."""

    get_map: Remote[[], MapTuple]
    set_map: Remote[[tuple[int, ...], int], int]
    restore: Remote[[int, tuple[int, ...], int], int]
    get_shard_config: Remote[[], dict[str, Any]]
    register_edge: Remote[[str, EdgeInfo], None]
    list_edges: Remote[[float], dict[str, EdgeInfo]]
    edges_on: Remote[[list[str]], list[str]]
    age_s: Remote[[], float]


class FlushActorCalls(Protocol):
    """What `actors.pool`'s FlushActor serves to clients (`write`: the shards' departures)."""

    write: Remote[[list[tuple[str, float]]], None]
    stats: Remote[[], dict[str, Any]]


H = TypeVar("H")


class _Named(Generic[H]):
    """A named actor seen from anywhere: the handle is looked up lazily and again after a failure.
    The clients are the only way out of this module: no caller holds a raw Ray handle."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._handle: H | None = None

    def _h(self) -> H:
        if self._handle is None:
            # Ray's handle is untyped; the protocol `H` states what the actor serves.
            self._handle = cast(H, ray.get_actor(self.name))
        return self._handle

    async def _wait(self, start: Callable[[H], Awaitable[R]], timeout_s: float | None = None) -> R:
        """One call: `start(handle)` sends it; a failure forgets the handle (a restarted or
        replaced actor is looked up again by the next call)."""
        try:
            pending = start(self._h())
            return await (pending if timeout_s is None else asyncio.wait_for(pending, timeout_s))
        except (TimeoutError, *ActorDied, ValueError):
            self._handle = None
            raise

    def kill(self, restart: bool = True) -> None:
        """Kill the actor; with `restart`, Ray brings it back (a fresh incarnation: fault tests)."""
        ray.kill(cast(ray.actor.ActorHandle[Any], self._h()), no_restart=not restart)
        self._handle = None


def _for_version(ops: list[Operation[object]], version: int) -> Batch:
    """A batch in the form a shard of wire `version` reads: plain tuples from version 3 on, the
    typed operations for a version 2 shard (during a rolling upgrade, edges first)."""
    return to_wire(ops) if version >= 3 else ops


class ShardClient(_Named[ShardActor]):
    """One shard, by index. With `direct`, the two hot calls (`apply_and_collect`, `pull`) take
    the shard's direct lane (actors/lane.py) instead of a Ray call each."""

    def __init__(self, index: int, direct: bool = False) -> None:
        super().__init__(shard_name(index))
        self.index = index
        self.direct = direct
        self._lane: LaneClient | None = None
        self._opening: asyncio.Lock | None = None
        self._opening_loop: asyncio.AbstractEventLoop | None = None
        self._lane_closed = False
        # The Ray handle whose wire version was checked (the Ray road; the lane checks its own),
        # and that version.
        self._checked: object | None = None
        self._checked_version = WIRE_VERSION

    async def _check_wire(self) -> None:
        """Before the first Ray-road batch to a shard (found again after each restart): refuse
        one speaking a wire version too far from ours, with one clear log line, instead of
        sending it objects it cannot unpickle (the direct lane's handshake does this itself)."""
        handle = self._h()
        if self._checked is handle:
            return
        theirs = await self._wait(lambda h: h.wire_version.remote(), 30.0)
        if not wire_compatible(WIRE_VERSION, theirs):
            self._handle = None
            raise WireMismatch(tell_mismatch(WIRE_VERSION, theirs, f"shard {self.index}"))
        self._checked, self._checked_version = handle, theirs

    async def _open_lane(self) -> LaneClient:
        loop = asyncio.get_running_loop()
        if self._opening is None or self._opening_loop is not loop:
            # One lock per loop: a lock first waited on in an ended loop (one asyncio.run of a
            # benchmark's phase) cannot be waited on in the next.
            self._opening, self._opening_loop = asyncio.Lock(), loop
        async with self._opening:  # the batches and the pull racing to open it open one lane
            if self._lane is None or self._lane.broken:
                host, port, secret = await self._lane_address()
                lane = await LaneClient.open(host, port, secret)
                if self._lane_closed:  # the edge stopped meanwhile: open nothing that outlives it
                    lane.close()
                    raise LaneBroken("the edge's lanes are closed")
                self._lane = lane
            return self._lane

    async def _lane_address(self) -> tuple[str, int, bytes]:
        return await self._wait(lambda h: h.lane_address.remote(), 30.0)

    async def lane_endpoint(self) -> tuple[str, int]:
        """Where the shard's direct lane listens (its secret stays inside this client)."""
        host, port, _ = await self._lane_address()
        return host, port

    def close_lane(self) -> None:
        self._lane_closed = True
        if self._lane is not None:
            self._lane.close()
            self._lane = None

    # The hot calls: one await each on the common road (no closure on the lane's).

    async def apply_and_collect(
        self, edge_id: str, ops: list[Operation[object]], incarnation: str | None, acked_seq: int
    ) -> ApplyReply:
        if not self.direct:
            if self._checked is None or self._checked is not self._handle:
                await self._check_wire()
            batch = _for_version(ops, self._checked_version)
            return await self._wait(
                lambda h: h.apply_and_collect.remote(edge_id, batch, incarnation, acked_seq)
            )
        lane = self._lane
        if lane is None or lane.broken:
            lane = await self._open_lane()
        try:
            reply: ApplyReply = await lane.call(
                LANE_APPLY, edge_id, _for_version(ops, lane.peer_version), incarnation, acked_seq
            )
        except LaneBroken:
            self._handle = None  # a restarted shard: find it again, and its new lane
            raise
        return reply

    async def pull(
        self, edge_id: str, incarnation: str | None, acked_seq: int, wait_s: float, resend: bool = False
    ) -> Mail:
        timeout_s = wait_s + 30
        if not self.direct:
            if self._checked is None or self._checked is not self._handle:
                await self._check_wire()
            return await self._wait(
                lambda h: h.pull.remote(edge_id, incarnation, acked_seq, wait_s, resend), timeout_s
            )
        lane = self._lane
        if lane is None or lane.broken:
            lane = await self._open_lane()
        try:
            mail: Mail = await lane.call(
                LANE_PULL, edge_id, incarnation, acked_seq, wait_s, resend, timeout_s=timeout_s
            )
        except LaneBroken:
            self._handle = None
            raise
        return mail

    async def is_focused(self, user_id: str, channel_id: str, timeout_s: float) -> bool:
        return await self._wait(lambda h: h.is_focused.remote(user_id, channel_id), timeout_s)

    async def operator_view(self, user_id: str, timeout_s: float) -> dict[str, object] | None:
        return await self._wait(lambda h: h.operator_view.remote(user_id), timeout_s)

    async def stats(self, timeout_s: float) -> ShardStats:
        return await self._wait(lambda h: h.stats.remote(), timeout_s)

    async def server_members(self, server_id: str, timeout_s: float) -> list[str]:
        return await self._wait(lambda h: h.server_members.remote(server_id), timeout_s)

    async def postgres_ok(self, timeout_s: float) -> bool:
        return await self._wait(lambda h: h.postgres_ok.remote(), timeout_s)

    # A resize (cluster/scale.py) and stopping: no timeout, these wait as long as they take.

    async def export_slots(self, slots: list[int]) -> SlotExport:
        return await self._wait(lambda h: h.export_slots.remote(slots))

    async def import_slots(self, export: SlotExport) -> None:
        await self._wait(lambda h: h.import_slots.remote(export))

    async def mail_pending(self) -> int:
        return await self._wait(lambda h: h.mail_pending.remote())

    async def edges_registered(self) -> list[str]:
        return await self._wait(lambda h: h.edges_registered.remote())

    async def drain(self, timeout_s: float) -> int:
        return await self._wait(lambda h: h.drain.remote(timeout_s))


class DirectoryClient(_Named[DirectoryActor]):
    """The slot directory: the slot map, the edges alive, the configuration of new shards."""

    def __init__(self) -> None:
        super().__init__(DIRECTORY)

    async def get_map(self) -> MapTuple:
        return await self._wait(lambda h: h.get_map.remote())

    async def set_map(self, owners: tuple[int, ...], shard_count: int) -> int:
        return await self._wait(lambda h: h.set_map.remote(owners, shard_count))

    async def restore(self, version: int, owners: tuple[int, ...], shard_count: int) -> int:
        return await self._wait(lambda h: h.restore.remote(version, owners, shard_count))

    async def get_shard_config(self) -> dict[str, Any]:
        return await self._wait(lambda h: h.get_shard_config.remote())

    async def register_edge(self, edge_id: str, info: EdgeInfo) -> None:
        """Registers the edge with its Ray node, so that shards let it go when that node dies."""
        with_node = {**info, "node_id": ray.get_runtime_context().get_node_id()}
        await self._wait(lambda h: h.register_edge.remote(edge_id, with_node))

    async def edges_on(self, node_ids: list[str]) -> list[str]:
        return await self._wait(lambda h: h.edges_on.remote(node_ids))

    async def list_edges(self, max_age_s: float = 30.0) -> dict[str, EdgeInfo]:
        """The edges that registered within `max_age_s` (every EDGE_REGISTER_EVERY_S while alive)."""
        return await self._wait(lambda h: h.list_edges.remote(max_age_s))

    async def age_s(self) -> float:
        return await self._wait(lambda h: h.age_s.remote())


class FlushClient(_Named[FlushActorCalls]):
    """The FlushActor."""

    def __init__(self) -> None:
        super().__init__(FLUSH)

    async def write(self, entries: list[tuple[str, float]]) -> None:
        """Hand last-seen values over; returns once the batch holding them is committed."""
        await self._wait(lambda h: h.write.remote(entries))

    async def stats(self, timeout_s: float) -> dict[str, Any]:
        return await self._wait(lambda h: h.stats.remote(), timeout_s)


async def flush_stats(timeout_s: float) -> dict[str, Any]:
    return await FlushClient().stats(timeout_s)


class ShardClients:
    """The pool as an edge's router reaches it (edge/router.py `Shards`): the directory's slot map
    and a client per shard, injected into the router, as a Ray Serve deployment receives the
    handles it calls; its unit tests inject fakes."""

    def __init__(self, direct: bool, directory: DirectoryClient | None = None) -> None:
        self.direct = direct
        self.directory = directory if directory is not None else DirectoryClient()

    async def get_map(self) -> MapTuple:
        return await self.directory.get_map()

    def shard(self, index: int) -> ShardClient:
        return ShardClient(index, direct=self.direct)


# ---------------------------------------------------------------------------- joining Ray


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
    with sigterm_kept(), logging_kept():
        ray.init(
            address=address or "local",
            namespace=namespace,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            **init_kwargs,
        )


@contextlib.contextmanager
def logging_kept() -> Iterator[None]:
    """This process's root logger as it was before `ray.init`, which applies its
    `logging_config` (meant for the job's actors: the shards, the FlushActor) to the driver too,
    adding a handler of its own beside ours (cluster/logs.py `configure`): `presence up` printed
    every line of its edge twice, the second in Ray's format with its job, worker and node ids."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@contextlib.contextmanager
def sigterm_kept() -> Iterator[None]:
    """A SIGTERM handler of this process's own handles SIGTERM again after `ray.init`, which
    replaces it twice.

    In Python, with `sys.exit(15)`: `presence up` exited 15 instead of stopping like Ctrl-C (130).
    In C, with abseil's failure-signal handler (Ray's core worker): it prints a stack, passes the
    signal on, and arms a 3-second alarm that aborts the process. A graceful stop longer than 3 s
    died of SIGABRT halfway, the embedded PostgreSQL left running. A process without a handler of
    its own (the short commands, a bench) keeps Ray's: exit, running the clean-ups. Restoring needs
    the main thread: `presence edge` joins in another one and so wraps its wait in this instead."""
    ours = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(ours) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, ours)


def gcs_address() -> str:
    return str(ray.get_runtime_context().gcs_address)


def raylet_address() -> tuple[str, int]:
    """This process's raylet (host, port): what an edge probes to know it still has Ray."""
    node = ray._private.worker.global_worker.node
    if node is None:
        raise RuntimeError("not joined to Ray")
    return str(node.node_ip_address), int(node.node_manager_port)


def auth_mode() -> str | None:
    return os.environ.get("RAY_AUTH_MODE")


def shutdown() -> None:
    if ray.is_initialized():
        ray.shutdown()
