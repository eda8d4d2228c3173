"""Every subscriber's view converges after a fault (issue 13, item 1), checked on a recorded history.

The scenario is the one an operator tried by hand: accounts connected on two edges, a watcher
subscribed to all of them, a fault, and during the fault some accounts change (close their
sockets, choose `dnd` or `invisible`, go idle, or connect for the first time). Once the fault is
over, the watcher's view of every account (the last status it heard, from `presence.sync` and
`presence.changed`) must equal the truth (the operator view) within seconds, without the watcher
reconnecting; and it must never be told a status it already shows (`history.repeated_frames`).

A few compact cases run in CI; the whole matrix (each fault by each kind of change) is `slow`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable
from dataclasses import dataclass

import asyncpg
import pytest
import websockets

from actors import clients
from actors.clients import DirectoryClient
from actors.core.slots import slot_of
from cluster.scale import resize
from edge.server import Edge

from .conftest import SHARDS, SOCKET_TIMEOUT_S, Cluster, Ids, internal_url, load, ws_url
from .history import VIEW_CHECKS, Graph, check, stale_views
from .recorder import RecordedClient, Recorder, operator_view
from .test_failures import start_edge_process
from .wsclient import eventually, of_type

pytestmark = pytest.mark.integration

CHANGES = ("close", "dnd", "invisible", "idle", "connect")
FAULTS = ("shards", "shard", "postgres", "redis", "edge", "resize")


@dataclass
class Scene:
    cluster: Cluster
    recorder: Recorder
    users: list[str]
    clients: dict[str, RecordedClient]
    urls: list[str]
    edge_proc_url: str | None = None


async def _connect_retrying(scene: Scene, user: str, url: str, within: float = 40.0) -> RecordedClient:
    """Connect, trying again while the service refuses (a fault may be under way)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await scene.recorder.connect(url, user, scene.cluster.token(user), timeout=15)
        except (OSError, AssertionError, websockets.InvalidHandshake, TimeoutError):
            if time.monotonic() > deadline:
                raise
            # A moment before connecting again (the shards restarting): the retry's pace.
            await asyncio.sleep(0.3)


async def _change(scene: Scene, kind: str, user: str, url: str) -> None:
    if kind == "connect":
        scene.clients[user] = await _connect_retrying(scene, user, url)
        return
    c = scene.clients[user]
    if kind == "close":
        await c.close()
    else:
        await c.send({"type": "presence.update", "status": kind})


async def scenario(
    cluster: Cluster,
    edges: list[Edge],
    conn: asyncpg.Connection,
    ids: Ids,
    fault: str,
    changes: dict[str, int],
    n: int = 20,
) -> None:
    users = [ids(f"v{i}") for i in range(n)]
    watcher = ids("watcher")
    await load(conn, {"servers": [{"id": ids("g"), "members": [*users, watcher], "channels": []}]})
    graph = Graph(users=frozenset([*users, watcher]), servers={ids("g"): frozenset([*users, watcher])})
    recorder = Recorder(graph)
    h = recorder.history
    scene = Scene(cluster, recorder, users, {}, [ws_url(e) for e in edges])
    proc = None
    if fault == "edge":
        proc, scene.edge_proc_url = start_edge_process(cluster)
    plan: list[tuple[str, str]] = []  # (change, user), in blocks of consecutive accounts
    for kind, count in changes.items():
        plan += [(kind, u) for u in users[len(plan) : len(plan) + count]]
    newcomers = {u for kind, u in plan if kind == "connect"}
    # The accounts on the edge that dies are the last ones, which no change touches.
    doomed = set(users[-4:]) if fault == "edge" else set()
    assert not doomed & {u for _, u in plan}
    try:
        w = await recorder.connect(scene.urls[0], watcher, cluster.token(watcher))
        h.watchers.add(w.name)
        for i, u in enumerate(users):
            if u in newcomers:
                continue
            url = (
                scene.edge_proc_url
                if u in doomed and scene.edge_proc_url
                else scene.urls[i % len(scene.urls)]
            )
            scene.clients[u] = await recorder.connect(url, u, cluster.token(u))
        await w.request({"type": "presence.subscribe", "userIds": users}, of_type("presence.sync"))

        async def settled() -> list[str]:
            try:
                views = await asyncio.gather(
                    *(operator_view(internal_url(edges[0]), u) for u in [*users, watcher])
                )
            except OSError as e:  # the operator view waits on the shards too
                return [f"no operator view: {e}"]
            for u, view in zip([*users, watcher], views, strict=True):
                h.final_status[u] = view["status"]
            return stale_views(h)

        await eventually(lambda: _empty(settled()), timeout=15, interval=0.3)
        recorder.fault(fault)
        during = [
            _change(scene, kind, u, scene.urls[i % len(scene.urls)]) for i, (kind, u) in enumerate(plan)
        ]
        await inject(fault, cluster, scene, proc, during)
        # Converged within seconds of the fault's end, without reconnecting.
        within = SOCKET_TIMEOUT_S + 20 if fault == "edge" else 20
        with contextlib.suppress(AssertionError):  # the checker below names what stayed stale
            await eventually(lambda: _empty(settled()), timeout=within, interval=0.5)
        await settled()
        violations = check(h, VIEW_CHECKS)
        assert not violations, "\n".join(violations[:30])
        assert w.close_code is None, "the watcher must not have had to reconnect"
    finally:
        for c in scene.clients.values():
            await c.close()
        with contextlib.suppress(Exception):
            await w.close()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)


async def _empty(stale: Awaitable[list[str]]) -> bool:
    return not await stale


async def inject(
    fault: str, cluster: Cluster, scene: Scene, proc: object, during: list[Awaitable[None]]
) -> None:
    """Start the fault, make the changes while it lasts, and end it."""
    if fault in ("shards", "shard"):
        _, owners, count = await DirectoryClient().get_map()
        shards = range(count) if fault == "shards" else [owners[slot_of(scene.users[0])]]
        for i in shards:
            clients.ShardClient(i).kill(restart=True)
        await asyncio.gather(*during)
    elif fault in ("postgres", "redis"):
        pg, redis = cluster.require_servers()
        server = pg if fault == "postgres" else redis
        restarting = asyncio.create_task(asyncio.to_thread(server.restart))
        await asyncio.gather(*during)
        await restarting
    elif fault == "edge":
        import subprocess

        assert isinstance(proc, subprocess.Popen)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        await asyncio.gather(*during)
    elif fault == "resize":
        resizing = asyncio.create_task(resize(SHARDS + 2, progress=lambda _: None, chunk=64))
        try:
            await asyncio.gather(*during)
        finally:
            await resizing
            await resize(SHARDS, progress=lambda _: None, chunk=64)
    else:
        raise ValueError(fault)


# --------------------------------------------------------------------------- CI: the reported cases


async def test_every_shard_killed_closes_and_dnd_reach_the_watcher(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    """The ghost from the issue: 5 closes and 5 `dnd` while every shard restarts."""
    await scenario(cluster, [edge, second_edge], conn, ids, "shards", {"close": 5, "dnd": 5})


async def test_one_shard_killed_invisible_and_newcomers_reach_the_watcher(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    await scenario(
        cluster, [edge, second_edge], conn, ids, "shard", {"invisible": 3, "connect": 3, "close": 3}
    )


# --------------------------------------------------------------------------- the whole matrix


@pytest.mark.slow
@pytest.mark.parametrize("change", CHANGES)
@pytest.mark.parametrize("fault", FAULTS)
async def test_view_converges(
    cluster: Cluster,
    edge: Edge,
    second_edge: Edge,
    conn: asyncpg.Connection,
    ids: Ids,
    fault: str,
    change: str,
) -> None:
    await scenario(cluster, [edge, second_edge], conn, ids, fault, {change: 5})
