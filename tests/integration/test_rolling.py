"""A rolling restart of real `presence edge` processes under a supervisor loop, as in
`ray_cluster.yaml` (docs/operations.md "Upgrading"): `python -m cluster.rolling --edge ... --edge
...` drains each in turn, waits for the loop to start it again and for /healthz 200, then the
next. A client given both edges' URLs is moved from one to the other and back, and the account
watching it is told nothing at all."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import asyncpg
import pytest

from cluster.drain import health
from edge.server import Edge
from presence_client import PresenceClient

from .conftest import Cluster, Ids, load
from .test_drain import changes_about, watching
from .wsclient import eventually

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def supervised_edge(cluster: Cluster) -> Iterator[tuple[str, str]]:
    """`presence edge` on fixed ports under a restart loop; (websocket URL, internal URL)."""
    ws_port, internal_port = free_port(), free_port()
    command = (
        f'while true; do "{sys.executable}" -m cluster.cli edge --data-dir "{cluster.data_dir}" '
        f"--ws-port {ws_port} --internal-port {internal_port}; sleep 0.3; done"
    )
    env = {
        **os.environ,
        "PRESENCE_EDGE_LEASE_REFRESH_S": "1",
        "PRESENCE_DRAIN_GRACE_S": "0.3",
        "PRESENCE_DRAIN_WINDOW_S": "0.3",
        "PRESENCE_RESUME_S": "15",
    }
    loop = subprocess.Popen(
        ["bash", "-c", command],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield f"ws://127.0.0.1:{ws_port}/ws/presence", f"http://127.0.0.1:{internal_port}"
    finally:
        os.killpg(loop.pid, signal.SIGKILL)  # the loop and the edge it runs: its own session
        loop.wait(10)


async def healthy(url: str) -> bool:
    return (await asyncio.to_thread(health, url)).status == 200


async def test_rolling_restart_moves_clients_without_a_flicker(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, g = ids("alice"), ids("bob"), ids("g")
    await load(conn, {"users": [{"id": alice}, {"id": bob}], "servers": [{"id": g, "members": [alice, bob]}]})
    with supervised_edge(cluster) as (ws1, in1), supervised_edge(cluster) as (ws2, in2):
        await eventually(lambda: healthy(in1), timeout=90, interval=0.5)
        await eventually(lambda: healthy(in2), timeout=90, interval=0.5)
        first = (await asyncio.to_thread(health, in1)).edge, (await asyncio.to_thread(health, in2)).edge
        client = PresenceClient([ws1, ws2], cluster.token(alice))
        client.connect()
        await eventually(lambda: client.state == "open", timeout=20)
        watcher = await watching(cluster, edge, bob, alice)
        before = len(changes_about(watcher, alice))
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cluster.rolling",
            "--edge",
            in1,
            "--edge",
            in2,
            "--start-timeout",
            "120",
            "--data-dir",  # its internal-token, as `presence up` would have written it
            str(cluster.data_dir),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PRESENCE_INTERNAL_TOKEN": ""},
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 300)
        assert proc.returncode == 0, out.decode()
        assert "rolling restart done: 2 edges" in out.decode()
        after = (await asyncio.to_thread(health, in1)).edge, (await asyncio.to_thread(health, in2)).edge
        assert after[0] != first[0] and after[1] != first[1]  # both are new processes
        # Moved twice (1012 each time), back at once each time, and nobody told anything.
        await eventually(lambda: client.state == "open", timeout=20)
        closes = [d for d in client.reconnect_delays]
        assert len(closes) >= 2 and all(d < 1.0 for d in closes), closes
        await watcher.roundtrip()
        assert changes_about(watcher, alice)[before:] == [], out.decode()
        print(f"rolling restart of 2 edges: {time.monotonic() - started:.1f} s")
        await client.close()
