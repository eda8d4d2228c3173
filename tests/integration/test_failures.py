"""Failures with real processes: an edge killed with SIGKILL, Redis wiped."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import IO

import asyncpg
import pytest
import redis.asyncio as aioredis

from actors.counts import ACCOUNTS_KEY
from edge.server import Edge
from tests.timing import patience

from .conftest import SOCKET_TIMEOUT_S, Cluster, Ids, internal_request, load, ws_url
from .test_outages import count_is, online_count
from .test_presence_ws import connect, social
from .wsclient import Client, changed, eventually, of_type

pytestmark = pytest.mark.integration


def start_edge_process(
    cluster: Cluster,
    env_extra: dict[str, str] | None = None,
    base_env: dict[str, str] | None = None,
    output: list[str] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """`presence edge` as its own OS process, joining the test cluster through the data directory.
    Every line it prints is read as it comes (into `output`, if given): an unread pipe fills at
    64 KiB, and the edge then blocks on its next log line with its event loop frozen (a storm of
    2,000 sockets on a loaded machine logs that much: failed handshakes, sockets closed)."""
    env = {
        **(os.environ if base_env is None else base_env),
        "PRESENCE_EDGE_LEASE_REFRESH_S": "1",
        **(env_extra or {}),
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "edge",
            "--data-dir",
            str(cluster.data_dir),
            "--ws-port",
            "0",
            "--internal-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + patience(60)
    lines = output if output is not None else []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"websocket\s+(ws://\S+)", line)
        if m:
            threading.Thread(target=_read_all, args=(proc.stdout, lines), daemon=True).start()
            return proc, m.group(1)
    proc.kill()
    raise AssertionError("presence edge did not come up:\n" + "".join(lines))


def _read_all(stream: IO[str], lines: list[str]) -> None:
    for line in stream:  # until the process's end
        lines.append(line)


async def test_edge_killed_with_sigkill_ages_out(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, carol, *_ = await social(conn, ids)
    proc, url = start_edge_process(cluster)
    try:
        watcher = await connect(cluster, edge, alice)
        await watcher.request(
            {"type": "presence.subscribe", "userIds": [bob, carol]}, of_type("presence.sync")
        )
        bob_there = await Client.connect(url, cluster.token(bob))
        carol_there = await Client.connect(url, cluster.token(carol))
        carol_here = await connect(cluster, edge, carol)  # carol also has a socket on a surviving edge
        await watcher.expect(changed(bob, "online"))
        await watcher.expect(changed(carol, "online"))
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        # bob's only socket was on the dead edge: offline once the edge's lease runs out.
        await watcher.expect(changed(bob, "offline"), timeout=SOCKET_TIMEOUT_S + 10)
        waited = time.monotonic() - killed_at
        assert waited >= SOCKET_TIMEOUT_S - 2, f"aged out after {waited:.1f} s, before the timeout"
        # carol keeps her socket on the live edge: still online, no spurious offline.
        assert not [f for f in watcher.log if f.get("userId") == carol and f.get("status") == "offline"]
        for c in (bob_there, carol_there):
            await c.closed()
        await carol_here.close()
        await watcher.expect(changed(carol, "offline"))
        await watcher.close()
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_an_edge_stalled_past_its_lease_registers_again_and_its_watchers_hear_on(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    """A live edge whose process stalled past its lease at the shards (SIGSTOP: a paused VM, a long
    pause, a test process busy for longer than the suite's 8 s timeout) is forgotten there: its
    accounts depart. Back, it is told a new incarnation, registers its sockets again and starts
    its mail over, so its accounts are online again for everybody and its own watchers hear the
    changes made after. Before, its accounts stayed offline and the shards' next frames to it
    were skipped as already delivered."""
    alice, bob, carol, *_ = await social(conn, ids)
    # Its own socket timeout stays the default (90 s): only the shards' leases (8 s) run out.
    proc, url = start_edge_process(cluster)
    try:
        watcher = await connect(cluster, edge, alice)
        await watcher.request({"type": "presence.subscribe", "userIds": [bob]}, of_type("presence.sync"))
        bob_there = await Client.connect(url, cluster.token(bob))
        carol_there = await Client.connect(url, cluster.token(carol))
        await carol_there.request(
            {"type": "presence.subscribe", "userIds": [alice]}, of_type("presence.sync")
        )
        await watcher.expect(changed(bob, "online"))
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            await watcher.expect(changed(bob, "offline"), timeout=SOCKET_TIMEOUT_S + 10)
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        await watcher.expect(changed(bob, "online"), timeout=15)
        await watcher.send({"type": "presence.update", "status": "dnd"})
        await carol_there.expect(changed(alice, "dnd"), timeout=15)
        for c in (watcher, bob_there, carol_there):
            await c.close()
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_a_separate_edge_uses_the_data_dirs_internal_token(cluster: Cluster) -> None:
    """Issue 29: `presence edge` joining through the data directory answers the internal API
    with the token `presence up` wrote there (conftest writes INTERNAL_TOKEN), not without."""
    env = {k: v for k, v in os.environ.items() if k != "PRESENCE_INTERNAL_TOKEN"}
    output: list[str] = []
    proc, _ = start_edge_process(cluster, env_extra={}, base_env=env, output=output)
    try:

        def internal() -> str | None:
            found = (re.search(r"internal\s+(http://\S+)", line) for line in output)
            return next((m.group(1) for m in found if m), None)

        metrics = f"{await eventually(internal)}/metrics"
        with urllib.request.urlopen(internal_request(metrics), timeout=10) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(metrics, timeout=10)
        assert refused.value.code == 401
    finally:
        proc.terminate()
        proc.wait(30)


async def test_silent_socket_is_closed_and_goes_offline(
    cluster: Cluster, conn: asyncpg.Connection, ids: Ids
) -> None:
    from edge.session import Limits

    alice, bob, *_ = await social(conn, ids)
    quick = Edge(cluster.edge_config(limits=Limits(socket_timeout_s=2.0)))
    await quick.start()
    try:
        watcher = await Client.connect(ws_url(quick), cluster.token(alice))
        await watcher.request({"type": "presence.subscribe", "userIds": [bob]}, of_type("presence.sync"))
        silent = await Client.connect(ws_url(quick), cluster.token(bob))
        await watcher.expect(changed(bob, "online"))
        # The watcher keeps talking; bob says nothing and is closed as dead.
        deadline = time.monotonic() + 10
        while silent.close_code is None and time.monotonic() < deadline:
            await watcher.send({"type": "heartbeat"})
            with contextlib.suppress(TimeoutError):  # the watcher's pace, cut short by the close
                await silent.closed(timeout=0.3)
        assert silent.close_code == 4000
        await watcher.expect(changed(bob, "offline"))
        await watcher.close()
    finally:
        await quick.stop()


async def test_online_counts_span_shards_and_heal_after_flushall(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    members = [ids(f"m{i}") for i in range(6)]
    server = ids("g")
    await load(conn, {"servers": [{"id": server, "members": members, "channels": []}]})

    assert await online_count(edge, server) == 0
    clients = [await connect(cluster, edge, m) for m in members]
    await eventually(lambda: count_is(edge, server, 6), timeout=10)
    await clients[0].send({"type": "presence.update", "status": "invisible"})
    await clients[1].send({"type": "presence.update", "status": "dnd"})
    await eventually(lambda: count_is(edge, server, 5), timeout=10)
    r = aioredis.Redis.from_url(cluster.redis_url)
    # Wiped, and nothing left at that instant (read in the same transaction: a count read after
    # it may already hold a shard's next refresh, 1 s here, sooner than a loaded worker reads).
    async with r.pipeline(transaction=True) as wipe:
        _, accounts_left = await wipe.flushall().zcard(ACCOUNTS_KEY).execute()
    assert accounts_left == 0
    # Every shard rewrites its members within one refresh period (1 s here, 30 s by default).
    await eventually(lambda: count_is(edge, server, 5), timeout=10)
    assert await r.zcard(ACCOUNTS_KEY) >= 5
    await r.aclose()
    for c in clients:
        await c.close()
    await eventually(lambda: count_is(edge, server, 0), timeout=10)
