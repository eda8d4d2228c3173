"""Both clients against the real service, with the edge killed under them.

Each test gets its own `presence edge` OS process (started in parallel, once for the module) and
the in-process session edge as the survivor. The client is given both URLs (a list: the next one
on each reconnect); its edge is SIGKILLed; while it is away, one watched account leaves and
another arrives. It must reconnect after a jittered wait, resubscribe (accounts and channel),
rejoin its voice roster, and end with a picture equal to the truth (a fresh socket's sync).

The JavaScript half runs clients/js/test/live.test.mjs under node's test runner, with the URLs,
tokens and the edge's pid in the environment; it skips where node (or its WebSocket) is missing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from edge.server import Edge
from presence_client import BackoffPolicy, PresenceClient, TokenContext, reconnect_delay

from .conftest import Cluster, Ids, load, ws_url
from .test_failures import start_edge_process
from .wsclient import Client, eventually

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LIVE_JS = ROOT / "clients" / "js" / "test" / "live.test.mjs"


@dataclass
class Doomed:
    proc: subprocess.Popen[str]
    url: str


@pytest.fixture(scope="module")
def doomed_edges(cluster: Cluster) -> Iterator[list[Doomed]]:
    """Two `presence edge` processes, one per client, started side by side."""
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda _: start_edge_process(cluster), range(2)))
    edges = [Doomed(proc, url) for proc, url in started]
    try:
        yield edges
    finally:
        for e in edges:
            if e.proc.poll() is None:
                e.proc.kill()
            e.proc.wait(10)


@dataclass
class World:
    watcher: str
    a: str  # online before, leaves while the watcher is away
    b: str  # online throughout
    c: str  # arrives while the watcher is away
    stranger: str  # outside the watcher's audience
    channel: str


@pytest.fixture
async def world(conn: asyncpg.Connection, ids: Ids) -> AsyncIterator[World]:
    w = World(ids("w"), ids("a"), ids("b"), ids("c"), ids("x"), ids("ch"))
    await load(
        conn,
        {
            "users": [{"id": u} for u in (w.watcher, w.a, w.b, w.c, w.stranger)],
            "servers": [{"id": ids("g"), "members": [w.watcher, w.a, w.b, w.c], "channels": [w.channel]}],
        },
    )
    yield w


async def truth(cluster: Cluster, edge: Edge, w: World) -> dict[str, str]:
    """What a fresh socket of the watcher's account is told now."""
    fresh = await Client.connect(ws_url(edge), cluster.token(w.watcher))
    try:
        sync = await fresh.request(
            {"type": "presence.subscribe", "userIds": [w.a, w.b, w.c, w.stranger]},
            lambda f: f.get("type") == "presence.sync",
        )
        return {u["userId"]: u["status"] for u in sync["users"]}
    finally:
        await fresh.close()


def kill(doomed: Doomed) -> None:
    os.kill(doomed.proc.pid, signal.SIGKILL)
    doomed.proc.wait(10)


async def test_python_client_survives_its_edge(
    cluster: Cluster, edge: Edge, doomed_edges: list[Doomed], world: World
) -> None:
    w = world
    doomed = doomed_edges[0]
    draws = iter([0.6, 0.3, 0.8, 0.5, 0.2, 0.9] * 5)
    policy = BackoffPolicy(base_s=1.0)
    asked: list[TokenContext] = []

    def token(ctx: TokenContext) -> str:
        asked.append(ctx)
        return cluster.token(w.watcher)

    client = PresenceClient(
        [doomed.url, ws_url(edge)],
        token,
        heartbeat_interval_s=1.0,
        backoff=policy,
        random=lambda: next(draws),
    )
    states: list[str] = []
    client.on("state", lambda state, info: states.append(state))
    a = await Client.connect(ws_url(edge), cluster.token(w.a))
    b = await Client.connect(ws_url(edge), cluster.token(w.b))
    c: Client | None = None
    try:
        client.connect()
        await client.wait_open()
        assert client.url == doomed.url
        await client.subscribe([w.a, w.b, w.c, w.stranger])
        client.subscribe_channel(w.channel)
        client.join_voice(w.channel)
        await eventually(lambda: client.roster(w.channel) == [w.watcher], timeout=10)
        assert {u: e.status for u, e in client.presence.items()} == {
            w.a: "online",
            w.b: "online",
            w.c: "offline",
        }

        kill(doomed)
        await a.close()  # leaves while the watcher is away...
        c = await Client.connect(ws_url(edge), cluster.token(w.c))  # ...and c arrives
        # Resynced on the survivor (not still on the old socket, which the kill has not reached yet).
        await eventually(
            lambda: client.url == ws_url(edge) and client.state == "open" and client.synced, timeout=20
        )
        assert client.reconnect_delays[0] == pytest.approx(reconnect_delay(0, False, policy, lambda: 0.6))
        assert "reconnecting" in states
        expected = await truth(cluster, edge, w)
        assert expected == {w.a: "offline", w.b: "online", w.c: "online"}
        await eventually(lambda: {u: e.status for u, e in client.presence.items()} == expected, timeout=5)
        assert w.stranger not in client.presence
        assert [ctx.rejected for ctx in asked] == [False, False]
        # The channel and the voice roster came back with the new socket.
        await eventually(lambda: client.roster(w.channel) == [w.watcher], timeout=10)
        await b.send({"type": "typing.start", "channelId": w.channel})
        await eventually(lambda: client.typers(w.channel) == [w.b], timeout=10)
        # And the query helper answers through it: last-seen for the one who left.
        answers = await client.query([w.a, w.b, w.stranger])
        assert list(answers) == [w.a, w.b]
        assert answers[w.a].status == "offline" and answers[w.a].last_seen_at is not None
        assert client.get(w.a) is not None and client.get(w.a).last_seen_at == answers[w.a].last_seen_at  # type: ignore[union-attr]
    finally:
        await client.close()
        for sock in (a, b, c):
            if sock is not None:
                await sock.close()
    assert client.state == "closed"


def _node_with_websocket() -> list[str] | None:
    node = shutil.which("node")
    if node is None:
        return None
    for flags in ([], ["--experimental-websocket"]):
        probe = subprocess.run(
            [node, *flags, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"],
            capture_output=True,
            timeout=30,
        )
        if probe.returncode == 0:
            return [node, *flags]
    return None


async def test_js_client_survives_its_edge(
    cluster: Cluster, edge: Edge, doomed_edges: list[Doomed], world: World
) -> None:
    node = _node_with_websocket()
    if node is None:
        pytest.skip("node with a WebSocket (Node >= 20) is not installed: the JavaScript client is untested")
    w = world
    doomed = doomed_edges[1]
    env = {
        **os.environ,
        "PRESENCE_LIVE": json.dumps(
            {
                "doomedUrl": doomed.url,
                "survivorUrl": ws_url(edge),
                "doomedPid": doomed.proc.pid,
                "channel": w.channel,
                "users": {k: getattr(w, k) for k in ("watcher", "a", "b", "c", "stranger")},
                "tokens": {k: cluster.token(getattr(w, k)) for k in ("watcher", "a", "b", "c")},
            }
        ),
    }

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*node, "--test", str(LIVE_JS)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )

    result = await asyncio.to_thread(run)  # the survivor edge runs on this loop
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-3000:]
    assert doomed.proc.poll() is not None, "the test did not kill its edge"
