"""The testbed's scenarios: real websocket watchers through HAProxy, faults done to whole nodes,
every watcher's final view judged by the history checker (tests/integration/history.py).

Each scenario records what it measured (seconds from the fault) into rows of one table, and the
expectations it checked: `run_all` prints the table and says whether every expectation held.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tests.integration.history import VIEW_CHECKS, Graph, check, departures_stored, mentions
from tests.integration.recorder import RecordedClient, Recorder
from tests.testbed.bed import Node, Testbed, log

SERVER = "tb-g"
# How long a watcher may take to show the truth after a node died: Ray declares a silent node dead
# after about 30-65 s of failed health checks (its defaults: every 3 s, 10 s timeout, 5 failures),
# and the dead edge's accounts must depart within AFTER_RAY_S of that verdict or of their shard
# being back (those whose shard died with the node), whichever is later: the shard's lazy start
# (PostgreSQL, the directory), the edges noticing the new incarnation (<= 1 s), their
# re-registration and the resync 2 s later. 5 s held once (2.1 s) and missed once by 1.9 s on
# two cores under load 7-9 (the second run in docs/testing.md): 10 s.
NODE_DEATH_BOUND_S = 90.0
AFTER_RAY_S = 10.0
# What `--only` can pick, in the order `run_all` runs them (`head-restart` is the GCS fault
# tolerance one with `--gcs-ft`, which runs no partition and no node death).
SCENARIOS = ("placement", "partition", "node-death", "head-restart")
# How long before its last lease renewal an edge may have last heard a socket (the edge renews
# its lease on every shard at least this often: actors/core's lease, docs/architecture.md).
LEASE_RENEWAL_S = 5.0

# Run on the head by `ssh`: Ray's view of nodes and of where each named actor lives, one JSON line
# a second (Ray's own state, not presence's: the observer must not depend on what it measures).
OBSERVER = r"""
import json, sys, time
import ray
ray.init(address="auto", namespace="presence", log_to_driver=False, configure_logging=False)
from ray._private import state
while True:
    nodes = {n["NodeID"]: {"ip": n["NodeManagerAddress"], "alive": n["Alive"]} for n in ray.nodes()}
    actors = {}
    for a in state.actors().values():
        name = a.get("Name")
        if name and a.get("State") not in ("DEAD",):
            node = (a.get("Address") or {}).get("NodeID")
            actors[name] = {"state": a.get("State"), "ip": nodes.get(node, {}).get("ip")}
    print(json.dumps({"t": time.time(), "nodes": nodes, "actors": actors}), flush=True)
    time.sleep(1)
"""


@dataclass
class Row:
    scenario: str
    what: str
    value: str
    ok: bool | None = None  # None: a measurement, not an expectation


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def measure(self, scenario: str, what: str, seconds: float | None) -> None:
        self.rows.append(Row(scenario, what, "-" if seconds is None else f"{seconds:.1f} s"))

    def expect(self, scenario: str, what: str, ok: bool, detail: str = "") -> None:
        self.rows.append(Row(scenario, what, detail or ("yes" if ok else "NO"), ok))

    def table(self) -> str:
        width = max(len(r.what) for r in self.rows)
        lines = [f"{'scenario':<14} {'measured / expected':<{width}}  value", "-" * (width + 40)]
        for r in self.rows:
            mark = "" if r.ok is None else ("  ok" if r.ok else "  FAILED")
            lines.append(f"{r.scenario:<14} {r.what:<{width}}  {r.value}{mark}")
        return "\n".join(lines)

    @property
    def ok(self) -> bool:
        return all(r.ok is not False for r in self.rows)


class Observer:
    """Ray's view from the head, read continuously in a thread."""

    def __init__(self, bed: Testbed) -> None:
        (bed.nodes[0].home / "observer.py").write_text(OBSERVER)
        key = bed.work / "keys" / "id_ed25519"
        self.proc = subprocess.Popen(
            ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", f"root@{bed.nodes[0].ip}",
             "bash --login -c 'RAY_AUTH_MODE=token exec python3 -u ~/observer.py'"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        self.samples: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with contextlib.suppress(ValueError):
                self.samples.append(json.loads(line))

    def latest(self) -> dict[str, Any] | None:
        return self.samples[-1] if self.samples else None

    def first(self, pred: Callable[[dict[str, Any]], bool], after: float) -> float | None:
        return next((s["t"] for s in self.samples if s["t"] >= after and pred(s)), None)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def shards_by_node(sample: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for name, a in sorted(sample["actors"].items()):
        if name.startswith("shard-") and a["state"] == "ALIVE":
            out.setdefault(a["ip"], []).append(name)
    return out


def internal_get(bed: Testbed, node: Node, path: str) -> Any:
    request = urllib.request.Request(
        f"{node.edge}{path}", headers={"Authorization": f"Bearer {bed.internal_token}"}
    )
    with urllib.request.urlopen(request, timeout=5) as r:
        return json.loads(r.read())


async def wait_until(check_fn: Callable[[], Any], timeout: float, interval: float = 0.1) -> float | None:
    """The time.time() at which `check_fn()` (sync or async) first held, or None at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check_fn()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return time.time()
        await asyncio.sleep(interval)
    return None


def shows(client: RecordedClient, user: str) -> str | None:
    """The status a watcher shows for `user` (the last sync or change about it)."""
    status = None
    for frame in client.log:
        if frame.get("type") == "presence.sync":
            for u in frame.get("users", []):
                if u.get("userId") == user:
                    status = u.get("status")
        elif frame.get("type") == "presence.changed" and frame.get("userId") == user:
            status = frame.get("status")
    return status


def edge_of(client: RecordedClient) -> str:
    return str(client.ws.response.headers.get("X-Presence-Edge", "?"))


async def load_graph(bed: Testbed, users: list[str], server: str = SERVER) -> None:
    import asyncpg

    from cluster import db

    conn = await asyncpg.connect(bed.database_url)
    try:
        await db.load_fixture(
            conn, {"users": [{"id": u} for u in users], "servers": [{"id": server, "members": users}]}
        )
    finally:
        await conn.close()


async def connect_watcher(
    rec: Recorder, url: str, user: str, users: list[str], secret: str
) -> RecordedClient:
    from edge.tokens import mint_token

    client = await rec.connect(url, user, mint_token(user, secret))
    # A client's heartbeats (the edge closes a socket silent for 90 s).
    beat = asyncio.get_running_loop().create_task(_heartbeats(client))
    client._reader.add_done_callback(lambda _: beat.cancel())
    others = [u for u in users if u != user]
    await client.send({"type": "presence.subscribe", "userIds": others})
    await client.expect(lambda f: f.get("type") == "presence.sync", timeout=15)
    return client


async def _heartbeats(client: RecordedClient, every_s: float = 20.0) -> None:
    with contextlib.suppress(Exception):
        while True:
            await asyncio.sleep(every_s)
            await client.send({"type": "heartbeat"})


async def node_death(bed: Testbed, report: Report, observer: Observer) -> None:
    """Three nodes, watchers spread over the edges by HAProxy; a status change goes round; then a
    worker node dies whole (its link goes silent, every process in it is killed). The dead edge's
    clients: half reconnect through HAProxy, half never come back. Measured from the kill."""
    name = "node death"
    per_edge = 4
    users = [f"tb-u{i}" for i in range(per_edge * len(bed.nodes))]
    await load_graph(bed, users)
    url = f"ws://127.0.0.1:{bed.lb_port}/ws/presence"
    rec = Recorder(Graph(frozenset(users), servers={SERVER: frozenset(users)}))
    clients = {u: await connect_watcher(rec, url, u, users, bed.secret) for u in users}
    spread = {e: sum(1 for c in clients.values() if edge_of(c) == e) for e in (n.name for n in bed.nodes)}
    report.expect(name, "watchers on every edge through HAProxy", all(spread.values()), json.dumps(spread))
    # Everybody sees everybody online.
    t0 = time.time()
    seen = await wait_until(
        lambda: all(shows(c, o) == "online" for u, c in clients.items() for o in users if o != u), 30
    )
    report.expect(name, "every watcher sees every account online", seen is not None)
    # A status change through one edge reaches every watcher on every edge.
    first = users[0]
    t0 = time.time()
    await clients[first].send({"type": "presence.update", "status": "dnd"})
    seen = await wait_until(
        lambda: all(shows(c, first) == "dnd" for u, c in clients.items() if u != first), 20
    )
    report.measure(name, "status change seen by every watcher", None if seen is None else seen - t0)
    report.expect(name, "status change reached every watcher", seen is not None)

    victim = bed.nodes[-1]
    await _rebalance_if_none_on(bed, report, observer, name, victim)
    on_victim = [u for u, c in clients.items() if edge_of(c) == victim.name]
    coming_back, abandoned = on_victim[: len(on_victim) // 2], on_victim[len(on_victim) // 2 :]
    survivors = {u: c for u, c in clients.items() if u not in on_victim}
    sample = observer.latest()
    report.expect(
        name,
        "shards on every node before",
        sample is not None and len(shards_by_node(sample)) == len(bed.nodes),
        json.dumps({ip: len(s) for ip, s in shards_by_node(sample).items()} if sample else {}),
    )

    pool_size = sum(len(v) for v in shards_by_node(sample).values()) if sample else 0
    killed_at = time.time()
    rec.fault(f"kill {victim.name}")
    bed.kill(victim)
    log(f"killed {victim.name} ({victim.ip}) with {len(on_victim)} clients on its edge")
    rec.killed([clients[u] for u in on_victim], at=killed_at, by=killed_at)
    closed = await wait_until(
        lambda: all(clients[u].close_code is not None or clients[u]._reader.done() for u in on_victim), 60
    )
    report.measure(
        name, "dead edge's clients closed by HAProxy", None if closed is None else closed - killed_at
    )

    async def reconnect(u: str) -> None:
        while True:
            try:
                clients[u] = await connect_watcher(rec, url, u, users, bed.secret)
                return
            except Exception:
                await asyncio.sleep(0.5)

    t_back = None
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(reconnect(u) for u in coming_back)), 120)
        t_back = time.time()
    report.measure(
        name, "its clients reconnected through HAProxy", None if t_back is None else t_back - killed_at
    )

    live = {u: clients[u] for u in [*survivors, *coming_back]}

    def departed() -> bool:
        return all(shows(c, a) == "offline" for c in live.values() for a in abandoned)

    t_departed = await wait_until(departed, 150)
    report.measure(
        name,
        "abandoned accounts offline to every watcher",
        None if t_departed is None else t_departed - killed_at,
    )
    ray_dead = observer.first(
        lambda s: any(n["ip"] == victim.ip and not n["alive"] for n in s["nodes"].values()), killed_at
    )
    report.measure(name, "Ray declared the node dead", None if ray_dead is None else ray_dead - killed_at)

    def shards_back(s: dict[str, Any]) -> bool:
        by_node = shards_by_node(s)
        return victim.ip not in by_node and sum(len(v) for v in by_node.values()) >= pool_size

    # The samples end now: the watchers may have seen the departure (through Ray's verdict, on
    # the surviving shards) before Ray restarted the dead node's shards elsewhere, and a judge
    # that read only the samples so far found no shard back and failed the row (2026-12-05).
    await wait_until(lambda: observer.first(shards_back, killed_at) is not None, 120)
    back = observer.first(shards_back, killed_at)
    report.expect(
        name,
        f"abandoned accounts offline within {AFTER_RAY_S:.0f} s of Ray's verdict / their shard back",
        ray_dead is not None
        and back is not None
        and t_departed is not None
        and t_departed - max(ray_dead, back) <= AFTER_RAY_S,
    )
    report.measure(
        name, "every shard alive on the surviving nodes", None if back is None else back - killed_at
    )

    # The truth from the operator view on a surviving edge; every live watcher must show it.
    survivor_node = bed.nodes[0]
    truth = (
        {u: "online" for u in [*survivors, *coming_back]}
        | {first: "dnd"}
        | dict.fromkeys(abandoned, "offline")
    )

    def converged() -> bool:
        return all(shows(c, t) == s for u, c in live.items() for t, s in truth.items() if t != u)

    t_conv = await wait_until(converged, 150)
    report.measure(
        name, "every watcher's view equals the truth", None if t_conv is None else t_conv - killed_at
    )
    report.expect(
        name,
        f"converged within {NODE_DEATH_BOUND_S:.0f} s",
        t_conv is not None and t_conv - killed_at <= NODE_DEATH_BOUND_S,
    )
    h = rec.history
    for u in users:
        view = await asyncio.to_thread(
            internal_get, bed, survivor_node, f"/api/v1/internal/presence/users/{u}"
        )
        h.final_status[u], h.final_sockets[u] = view["status"], view["sockets"]
    h.watchers = {c.name for c in live.values()}
    violations = check(h, VIEW_CHECKS)
    report.expect(name, "history checker: views, frames", not violations, f"{len(violations)} violations")
    for v in violations[:10]:
        log(f"violation: {v}")
    # The abandoned accounts' last-seen: when each was last heard, not the lease's end.
    from tests.integration.recorder import read_last_seen

    await asyncio.sleep(3)
    h.stored_after = await read_last_seen(bed.database_url, users) or {}
    for u in abandoned:
        life = h.sockets[next(n for n, s in h.sockets.items() if s.user == u)]
        life.gone_after = rec.last_word.get(
            next(n for n, s in h.sockets.items() if s.user == u), life.opened_at
        )
    late = [v for v in departures_stored(h) if any(v.startswith(a + ":") for a in abandoned)]
    # Measured, not expected: an account whose shard died with the node has no departure to
    # write (the restarted shard never knew the socket); its last-seen is its last checkpoint.
    report.rows.append(
        Row(
            name,
            "abandoned accounts' last-seen = last heard",
            f"{len(abandoned) - len(late)} of {len(abandoned)}",
        )
    )
    for v in late[:5]:
        log(f"last-seen: {v}")
    for c in live.values():
        await c.close()


# A presence command on the head, as its operator runs it (the node's presence.env, Ray's token).
ON_HEAD = "set -a; . ~/.presence.env; set +a; export RAY_AUTH_MODE=token; presence {} --data-dir ~/.presence"


def placement(bed: Testbed, report: Report, observer: Observer) -> None:
    """`presence status` names each shard's node; `presence scale 12` puts 4 on each of 3 nodes."""
    name = "placement"
    status = json.loads(bed.ssh(bed.nodes[0], ON_HEAD.format("status --json")))
    nodes = [s.get("node_ip") for s in status["shards"]]
    report.expect(name, "presence status shows each shard's node", all(nodes), json.dumps(nodes))
    t = time.time()
    out = bed.ssh(bed.nodes[0], ON_HEAD.format("scale 12"), timeout=300)
    report.measure(name, "presence scale 8 -> 12", time.time() - t)
    log(out.strip().splitlines()[-1] if out.strip() else "scale: no output")
    time.sleep(2.5)  # the observer's next samples
    sample = observer.latest() or {"actors": {}}
    spread = {ip: len(s) for ip, s in shards_by_node(sample).items()}
    report.expect(
        name,
        "scale 12 puts 4 on each node",
        sorted(spread.values()) == [12 // len(bed.nodes)] * len(bed.nodes),
        json.dumps(spread),
    )


def head_restart(bed: Testbed, report: Report) -> None:
    """The head dies (no GCS fault tolerance: the yaml's default) and comes back; the operator's
    one step is `ray up` again. While it is away `presence status` fails fast; after, the pool is
    back at its last size (12, from `presence scale`) and the surviving workers' edges serve."""
    from tests.testbed.bed import healthy

    name = "head restart"
    head = bed.nodes[0]
    workers = [n for n in bed.nodes[1:] if n.name in bed.procs]
    killed_at = time.time()
    bed.kill(head)
    log(f"killed the head {head.name}")
    status_cmd = (
        "set -a; . ~/.presence.env; set +a; export RAY_AUTH_MODE=token "
        f"RAY_ADDRESS={head.ip}:6379; presence status; echo exit=$?"
    )
    t = time.time()
    out = bed.ssh(workers[0], status_cmd, timeout=120, check=False) if workers else ""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    report.measure(name, "presence status while the head is away", time.time() - t)
    report.expect(
        name,
        "it fails in seconds with one line",
        time.time() - t < 10 and bool(lines) and lines[-1] != "exit=0",
        (lines[0][:60] + "…") if lines else "no output",
    )
    time.sleep(max(0.0, killed_at + 75 - time.time()))  # past Ray's 60 s: the workers' Ray gone
    bed.revive(head)
    seconds = bed.ray_up_again()
    report.measure(name, "ray up again (the head)", seconds)
    t_head = None
    with contextlib.suppress(TimeoutError):
        from tests.testbed.bed import wait_for

        wait_for(lambda: healthy(head.edge), 300, "the head's edge")
        t_head = time.time()
    report.measure(name, "head's edge healthy, from the kill", None if t_head is None else t_head - killed_at)
    status = json.loads(bed.ssh(head, ON_HEAD.format("status --json"), check=False) or "{}")
    shards = len(status.get("shards", []))
    report.expect(name, "the pool back at its last size (12)", shards == 12, f"{shards} shards")
    for w in workers:
        t_w = None
        with contextlib.suppress(TimeoutError):
            from tests.testbed.bed import wait_for

            wait_for(lambda w=w: healthy(w.edge), 300, f"the edge on {w.ip}")
            t_w = time.time()
        report.measure(
            name, f"{w.name}'s edge healthy, from the kill", None if t_w is None else t_w - killed_at
        )
        report.expect(name, f"{w.name}'s edge back", t_w is not None)


async def _watchers(
    bed: Testbed, prefix: str, per_edge: int = 3, unwatched: tuple[str, ...] = ()
) -> tuple[Recorder, list[str], dict[str, RecordedClient], str]:
    """Watchers spread by HAProxy, each subscribed to every other account of its own server
    (`unwatched`: members of it that have no watcher here, watched all the same)."""
    users = [f"{prefix}-u{i}" for i in range(per_edge * len(bed.nodes))]
    members = [*users, *unwatched]
    server = f"{prefix}-g"
    await load_graph(bed, members, server)
    url = f"ws://127.0.0.1:{bed.lb_port}/ws/presence"
    rec = Recorder(Graph(frozenset(members), servers={server: frozenset(members)}))
    clients = {u: await connect_watcher(rec, url, u, members, bed.secret) for u in users}
    return rec, users, clients, url


async def _keep_connected(
    rec: Recorder, url: str, users: list[str], clients: dict[str, RecordedClient], bed: Testbed,
    gone: list[str],
) -> None:  # fmt: skip
    """Clients HAProxy closed (their edge pulled) reconnect through it until they are in."""
    members = sorted(rec.history.graph.users)

    async def one(u: str) -> None:
        while True:
            try:
                clients[u] = await connect_watcher(rec, url, u, members, bed.secret)
                return
            except Exception:
                await asyncio.sleep(0.5)

    await asyncio.gather(*(one(u) for u in gone))


def everybody_shows(clients: dict[str, RecordedClient], users: list[str], status: str) -> bool:
    """Every watcher shows `status` for each of `users` (but itself)."""
    return all(shows(c, o) == status for u, c in clients.items() for o in users if o != u)


def _closed(c: RecordedClient) -> bool:
    return c.close_code is not None or c._reader.done()


async def _judge(
    name: str, bed: Testbed, report: Report, rec: Recorder, clients: dict[str, RecordedClient],
    truth: dict[str, str], since: float, bound_s: float, node: Node,
) -> None:  # fmt: skip
    """Every live watcher shows the truth, and the operator view says it too (both at once,
    measured from `since`: the operator view may differ for a moment while a shard is replaced
    and the edges register their sockets again); then the history checker, against the operator
    view as it was then."""
    views: dict[str, dict[str, Any]] = {}

    def converged() -> bool:
        return all(shows(c, t) == st for u, c in clients.items() for t, st in truth.items() if t != u)

    async def agreed() -> bool:
        if not converged():
            return False
        for u in truth:
            views[u] = await asyncio.to_thread(
                internal_get, bed, node, f"/api/v1/internal/presence/users/{u}"
            )
        return all(views[u]["status"] == st for u, st in truth.items())

    t_conv = await wait_until(agreed, bound_s + 60, interval=1.0)
    report.measure(name, "every watcher's view equals the truth", None if t_conv is None else t_conv - since)
    report.expect(
        name,
        f"converged within {bound_s:.0f} s (watchers and operator view)",
        t_conv is not None and t_conv - since <= bound_s,
        ""
        if t_conv is not None
        else "operator view: "
        + ", ".join(f"{u} {v['status']}" for u, v in views.items() if v["status"] != truth[u])[:80],
    )
    h = rec.history
    for u in truth:
        if u not in views:
            views[u] = await asyncio.to_thread(
                internal_get, bed, node, f"/api/v1/internal/presence/users/{u}"
            )
        h.final_status[u], h.final_sockets[u] = views[u]["status"], views[u]["sockets"]
    h.watchers = {c.name for c in clients.values()}
    violations = check(h, VIEW_CHECKS)
    report.expect(name, "history checker: views, frames", not violations, f"{len(violations)} violations")
    for v in violations[:10]:
        log(f"violation: {v}")


def _node_log_lines(bed: Testbed, node: Node, pattern: str) -> list[tuple[float, str]]:
    """(time, line) of the node's Ray worker logs (the shards') matching `pattern` (grep -E), from
    every Ray session the node had (Ray may have been started there again since)."""
    logs = "/tmp/ray/session_2*/logs/*.err"
    out = bed.ssh(node, f"grep -hE {pattern!r} {logs} 2>/dev/null || true", check=False)
    lines = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):  # a line without the logger's time
            lines.append((datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp(), line))
    return sorted(lines)


def _edge_log_lines(node: Node, pattern: str) -> list[tuple[float, str]]:
    """(time, line) of the node's presence.log (its edge's supervisor loop) matching `pattern`."""
    log_file = node.home / "presence.log"
    lines = []
    for line in log_file.read_text(errors="replace").splitlines() if log_file.exists() else []:
        if re.search(pattern, line):
            with contextlib.suppress(ValueError):
                lines.append((datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp(), line))
    return lines


# Run in the cut-off node's network namespace (not through HAProxy): sockets on the cut-off edge
# itself, made before the cut, that try a status change once its shards should be suspended
# (FENCE_LEASE_S, 8 s) and before it drains (15 s of its /healthz 503). What came back is printed.
INSIDE_CLIENT = r"""
import asyncio, json, sys, time
import websockets

async def one(url, token, go, out):
    got = {"frames": [], "closed": None}
    out.append(got)
    try:
        async with websockets.connect(url, open_timeout=15) as ws:
            await ws.send(json.dumps({"type": "identify", "token": token}))
            got["ready"] = json.loads(await asyncio.wait_for(ws.recv(), 15)).get("type")
            await go.wait()
            got["sent_at"] = time.time()
            await ws.send(json.dumps({"type": "presence.update", "status": "dnd"}))
            end = time.time() + 12
            while time.time() < end:
                frame = json.loads(await asyncio.wait_for(ws.recv(), end - time.time()))
                what = frame.get("code") or frame.get("status") or ""
                got["frames"].append(f"{frame.get('type')}:{what}")
    except websockets.ConnectionClosed as e:
        got["closed"] = e.rcvd.code if e.rcvd else "no close frame"
    except Exception as e:
        got["error"] = repr(e)[:200]

async def main():
    url, tokens = sys.argv[1], sys.argv[2:]
    go, out = asyncio.Event(), []
    tasks = [asyncio.create_task(one(url, t, go, out)) for t in tokens]
    await asyncio.sleep(3)
    print("connected", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    go.set()
    await asyncio.gather(*tasks)
    print(json.dumps(out), flush=True)

asyncio.run(main())
"""


async def _rebalance_if_none_on(
    bed: Testbed, report: Report, observer: Observer, name: str, victim: Node
) -> None:
    """A scenario that takes `victim` away measures what happens to its shards: if an earlier
    scenario (a partition past Ray's verdict) had Ray replace them elsewhere, and placement never
    moves shards back to a healed node, the operator's rebalance (`presence scale N` at the same N)
    gives it its share again first."""
    sample = observer.latest() or {"actors": {}}
    if victim.ip in shards_by_node(sample):
        return
    size = sum(len(v) for v in shards_by_node(sample).values())
    t = time.time()
    bed.ssh(bed.nodes[0], ON_HEAD.format(f"scale {size}"), timeout=300)
    got = await wait_until(lambda: victim.ip in shards_by_node(observer.latest() or {"actors": {}}), 30)
    report.measure(name, f"rebalance first (presence scale {size}: none on the node)", time.time() - t)
    report.expect(name, "the rebalance put shards on the node", got is not None)


async def partition(bed: Testbed, report: Report, observer: Observer, seconds: float) -> None:
    """A worker cut off (its link down: every packet dropped both ways) for `seconds`, then healed.
    Its edge's clients are closed by HAProxy; half reconnect through it, half never come back (their
    accounts must depart, not stay online: no ghost). Its shards suspend themselves (the fence):
    clients on the cut-off edge itself (in its namespace, past HAProxy) try a status change during
    the cut, which no watcher may ever see. Healed before Ray's verdict the shards serve again;
    after it, Ray has replaced them, the node's Ray has exited and its supervisor starts Ray and the
    edge there again. After the heal: a status change reaches every watcher, every view equals the
    truth, no violation."""
    from edge.tokens import mint_token

    name = f"partition {seconds:.0f} s"
    victim = bed.nodes[-1]
    await _rebalance_if_none_on(bed, report, observer, name, victim)
    inside = tuple(f"tp{int(seconds)}-in{i}" for i in range(2))
    rec, users, clients, url = await _watchers(bed, f"tp{int(seconds)}", unwatched=inside)
    members = [*users, *inside]
    script = bed.work / "inside_client.py"
    script.write_text(INSIDE_CLIENT)
    insider = subprocess.Popen(
        ["ip", "netns", "exec", victim.name, sys.executable, str(script), f"ws://{victim.ip}:8765/ws/presence",
         *(mint_token(u, bed.secret) for u in inside)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        await _partition(
            bed, report, observer, seconds, name, rec, users, members, clients, url, inside, insider
        )
    finally:
        insider.kill()
        insider.wait(10)
        for c in clients.values():
            await c.close()


async def _partition(
    bed: Testbed, report: Report, observer: Observer, seconds: float, name: str, rec: Recorder,
    users: list[str], members: list[str], clients: dict[str, RecordedClient], url: str,
    inside: tuple[str, ...], insider: subprocess.Popen[str],
) -> None:  # fmt: skip
    from tests.integration.recorder import read_last_seen

    assert insider.stdin is not None and insider.stdout is not None
    connected = await asyncio.to_thread(insider.stdout.readline)
    await wait_until(lambda: everybody_shows(clients, members, "online"), 30)
    report.expect(
        name, "clients on the cut-off edge itself (past HAProxy) online", connected.strip() == "connected"
    )
    victim = bed.nodes[-1]
    on_victim = [u for u, c in clients.items() if edge_of(c) == victim.name]
    coming_back, abandoned = on_victim[: len(on_victim) // 2], on_victim[len(on_victim) // 2 :]
    sample = observer.latest() or {"nodes": {}, "actors": {}}
    held = len(shards_by_node(sample).get(victim.ip, []))
    report.rows.append(Row(name, "shards on the node cut off", str(held)))
    victim_ids = {i for i, n in sample["nodes"].items() if n["ip"] == victim.ip and n["alive"]}
    cut_at = time.time()
    rec.fault(f"cut {victim.name}")
    bed.cut(victim)
    cut_done = time.time()  # `ip link set down` takes a moment on a loaded machine
    log(
        f"cut {victim.name} off for {seconds:.0f} s "
        f"({len(on_victim)} clients on its edge, {len(abandoned)} abandoned)"
    )
    closed = await wait_until(lambda: all(_closed(clients[u]) for u in on_victim), 30)
    report.measure(name, "its edge's clients closed by HAProxy", None if closed is None else closed - cut_at)
    back_at: list[float] = []
    back = asyncio.create_task(_keep_connected(rec, url, users, clients, bed, coming_back))
    back.add_done_callback(lambda _: back_at.append(time.time()))
    # The fence's lease and then some, before the cut-off edge drains (15 s of /healthz 503).
    await asyncio.sleep(max(0.0, cut_at + 12 - time.time()))
    insider.stdin.write("go\n")
    insider.stdin.flush()
    await asyncio.sleep(max(0.0, cut_at + seconds - time.time()))
    bed.heal(victim)
    healed_at = time.time()
    log(f"healed {victim.name}")
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(back), 180)
    report.measure(
        name, f"{len(coming_back)} of its clients back through HAProxy, from the cut",
        back_at[0] - cut_at if back_at else None,
    )  # fmt: skip
    tried = json.loads((await asyncio.to_thread(insider.stdout.readline)) or "[]")
    log(f"the cut-off edge's own clients: {json.dumps(tried)}")
    # A status change after the heal reaches everybody (the cut-off shards serve again, or Ray's
    # new incarnations do).
    first = next(u for u in users if u not in on_victim)
    t0 = time.time()
    await clients[first].send({"type": "presence.update", "status": "dnd"})
    live = {u: c for u, c in clients.items() if u not in abandoned}
    seen = await wait_until(lambda: everybody_shows(live, [first], "dnd"), 60)
    report.measure(name, "a status change after the heal seen by all", None if seen is None else seen - t0)
    gone = [*abandoned, *inside]
    truth = {u: "online" for u in users if u not in gone} | dict.fromkeys(gone, "offline") | {first: "dnd"}
    await _judge(name, bed, report, rec, live, truth, healed_at, 90.0, bed.nodes[0])
    # Ray's verdict on the node as it was at the cut (a node id of its own: once Ray runs there
    # again, the node has a new one, and the old one stays in the table, dead).
    ray_dead = observer.first(
        lambda smp: any(not smp["nodes"].get(i, {"alive": True})["alive"] for i in victim_ids), cut_at
    )
    report.measure(name, "Ray declared the node dead", None if ray_dead is None else ray_dead - cut_at)
    # The status changes tried on the cut-off edge itself during the cut: one whose shard is on
    # the cut-off node is refused by it, suspended (1011: the socket closed, its client goes to a
    # healthy edge) and never shown; one whose shard is across the cut waits, and may be applied
    # by that shard once healed (a delayed operation, not a second truth). Never shown before the
    # heal, never shown after a refusal.
    refused = [u for u, t in zip(inside, tried, strict=False) if t.get("closed") == 1011]
    shown = {u: [e.t for e in told_events(rec, u, "dnd")] for u in inside}
    wrong = [u for u, ts in shown.items() if ts and (u in refused or min(ts) < healed_at)]
    late = [u for u, ts in shown.items() if ts and u not in wrong]
    report.expect(
        name,
        "changes on the cut-off edge during the cut: refused, or applied after the heal",
        len(tried) == len(inside) and all("sent_at" in t for t in tried) and not wrong,
        f"{len(refused)} refused (1011), {len(late)} applied after the heal, {len(wrong)} wrong",
    )
    # Departures: an abandoned account's last-seen is when it was last heard: between its socket's
    # last frame less a lease renewal (what the shard last heard from the edge, LEASE_RENEWAL_S)
    # and the cut. Later is a moved departure, earlier (a checkpoint) or none a lost one.
    await asyncio.sleep(3)
    h = rec.history
    h.stored_after = await read_last_seen(bed.database_url, members) or {}
    verdicts: dict[str, list[str]] = {"right": [], "late": [], "early": [], "none": []}
    for u in abandoned:
        heard = max(rec.last_word.get(n, life.opened_at) for n, life in h.sockets.items() if life.user == u)
        at = h.stored_after.get(u)
        kind = (
            "none" if at is None
            else "late" if at > cut_done + h.tolerance_s
            else "early" if at < heard - LEASE_RENEWAL_S - h.tolerance_s
            else "right"
        )  # fmt: skip
        verdicts[kind].append(u if at is None else f"{u} {at - cut_at:+.1f} s")
    report.rows.append(
        Row(
            name,
            "abandoned accounts' last-seen = last heard (right / late / early / none)",
            " / ".join(str(len(v)) for v in verdicts.values())
            + "".join(f"; {k}: {', '.join(v)}" for k, v in verdicts.items() if k != "right" and v),
        )
    )
    suspended = _node_log_lines(bed, victim, "suspended: it has not reached|stops serving for good")
    resumed = _node_log_lines(bed, victim, "serving again")
    # The cut-off edge's own log (on the node's disk, not in its /tmp) names the suspended shards
    # that refused it: the evidence left when the shards' logs went with a Ray session.
    refusals = _edge_log_lines(victim, "is suspended \\(cut off from most nodes\\)")
    during = [t for t, _ in [*suspended, *refusals] if cut_at <= t <= healed_at]
    served_cut_off = [line for t, line in resumed if cut_at + 1 < t < healed_at]
    report.rows.append(
        Row(
            name,
            "its shards: suspended (their logs, its edge's refusals) / serving again, during the cut",
            f"{len(during)} / {len(served_cut_off)} (first suspension "
            + (f"{min(during) - cut_at:.1f} s after the cut)" if during else "none)"),
        )
    )
    report.expect(name, "the cut-off shards suspended themselves (fence)", bool(during))
    report.expect(name, "no cut-off shard served again while cut off", not served_cut_off)
    for line in served_cut_off[:3]:
        log(f"served while cut off: {line[:200]}")


def told_events(rec: Recorder, user: str, status: str) -> list[Any]:
    """Every frame (a sync or a change) that told a socket `user` is `status`."""
    return [
        e
        for e in rec.history.events
        if e.kind == "recv"
        and e.frame is not None
        and any(u == user and st == status for u, st, _ in mentions(e.frame, e.user))
    ]


async def head_restart_gcs_ft(bed: Testbed, report: Report) -> None:
    """GCS fault tolerance: the head dies whole and comes back (its disk kept, `ray up` again).
    Throughout, the workers' edges stay healthy and status changes made through them by accounts
    whose shards live on the workers reach every watcher on the workers; after, the pool is the
    same (adopted) and every view equals the truth."""
    from tests.testbed.bed import healthy, wait_for

    name = "head restart, GCS FT"
    head, workers = bed.nodes[0], bed.nodes[1:]
    rec, users, clients, url = await _watchers(bed, "tft")
    await wait_until(lambda: everybody_shows(clients, users, "online"), 30)
    disk = bed.keep_head_disk()
    on_head = [u for u, c in clients.items() if edge_of(c) == head.name]
    killed_at = time.time()
    rec.fault("kill the head")
    bed.kill(head)
    rec.killed([clients[u] for u in on_head], at=killed_at, by=killed_at)
    log("killed the head (GCS fault tolerance on)")
    unhealthy: list[str] = []
    stop = asyncio.Event()

    async def poll_health() -> None:
        while not stop.is_set():
            for w in workers:
                try:
                    ok = await asyncio.to_thread(healthy, w.edge)
                except Exception:
                    ok = False
                if not ok:
                    unhealthy.append(f"{w.name}@{time.time() - killed_at:.0f}s")
            await asyncio.sleep(1)

    polling = asyncio.create_task(poll_health())
    back = asyncio.create_task(_keep_connected(rec, url, users, clients, bed, on_head))
    await asyncio.sleep(5)
    # Accounts whose shard lives on a worker answer the operator view through a worker's edge.
    on_workers = [u for u in users if u not in on_head]
    alive = []
    for u in on_workers:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(
                asyncio.to_thread(internal_get, bed, workers[0], f"/api/v1/internal/presence/users/{u}"), 4
            )
            alive.append(u)
    changed, rounds_ok = [], 0
    for u in alive[:3]:
        t0 = time.time()
        await clients[u].send({"type": "presence.update", "status": "dnd"})
        watchers = [c for w, c in clients.items() if w in on_workers and w != u and not _closed(c)]
        if await wait_until(lambda u=u, ws=watchers: all(shows(c, u) == "dnd" for c in ws), 10):
            rounds_ok += 1
        changed.append(u)
        log(f"status change by {u} during the head's absence: {time.time() - t0:.1f} s")
    report.expect(
        name,
        "changes through the workers while the head is away reach their watchers",
        bool(changed) and rounds_ok == len(changed),
        f"{rounds_ok} of {len(changed)} (accounts answering: {len(alive)} of {len(on_workers)})",
    )
    await asyncio.sleep(max(0.0, killed_at + 40 - time.time()))
    bed.revive(head)
    bed.restore_head_disk(disk)
    report.measure(name, "ray up again (the head)", bed.ray_up_again())
    t_head = None
    with contextlib.suppress(TimeoutError):
        await asyncio.to_thread(wait_for, lambda: healthy(head.edge), 300, "the head's edge")
        t_head = time.time()
    report.measure(name, "head's edge healthy, from the kill", None if t_head is None else t_head - killed_at)
    stop.set()
    await polling
    report.expect(
        name, "the workers' edges healthy throughout", not unhealthy, ", ".join(unhealthy[:6]) or "yes"
    )
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(back, 120)
    status = json.loads(bed.ssh(head, ON_HEAD.format("status --json"), check=False) or "{}")
    shards = status.get("shards", [])
    report.expect(
        name,
        "the pool back whole at its size (12)",
        len(shards) == 12 and all("error" not in st for st in shards),
        f"{len(shards)} shards, {sum('error' in st for st in shards)} unavailable",
    )
    truth = {u: "online" for u in users} | dict.fromkeys(changed, "dnd")
    await _judge(name, bed, report, rec, clients, truth, t_head or time.time(), 60.0, workers[0])
    for c in clients.values():
        await c.close()


def run_all(bed: Testbed, partitions: list[float] | None = None, only: set[str] | None = None) -> bool:
    from tests.testbed.bed import healthy, wait_for

    only = set(SCENARIOS) if only is None else only

    report = Report()
    for what, seconds in bed.timings.items():
        report.measure("bring-up", what, seconds)
    observer = Observer(bed)
    try:
        t = time.time()
        got = asyncio.run(_first_sample(observer))
        report.measure("bring-up", "observer attached", time.time() - t)
        if got is not None:
            spread = {ip: len(s) for ip, s in shards_by_node(got).items()}
            report.expect(
                "placement",
                "shards on every node after ray up",
                len(spread) == len(bed.nodes),
                json.dumps(spread),
            )
        if "placement" in only:
            placement(bed, report, observer)
        if bed.gcs_ft:
            observer.close()
            if "head-restart" in only:
                asyncio.run(head_restart_gcs_ft(bed, report))
        else:
            for seconds in partitions if "partition" in only else []:
                asyncio.run(partition(bed, report, observer, seconds))
                t = time.time()
                back = True
                try:
                    # An edge that drained when cut off is back by itself (after a partition past
                    # Ray's verdict, once its supervisor started Ray there again)...
                    for node in bed.nodes:
                        wait_for(lambda node=node: healthy(node.edge), 300, f"the edge on {node.ip} back")
                    # ... and in the balancer (two good checks) before the next scenario spreads clients.
                    wait_for(lambda: set(bed.haproxy_states().values()) == {"UP"}, 60, "every edge UP")
                except TimeoutError as e:
                    back, why = False, str(e)
                report.measure(
                    f"partition {seconds:.0f} s", "every edge healthy again, from the end", time.time() - t
                )
                report.expect(
                    f"partition {seconds:.0f} s", "every edge back by itself (in HAProxy)", back,
                    "yes" if back else why[:80],
                )  # fmt: skip
                if not back:
                    break
            if "node-death" in only:
                asyncio.run(node_death(bed, report, observer))
            observer.close()
            if "head-restart" in only:
                head_restart(bed, report)
    finally:
        observer.close()
        print(report.table(), flush=True)
        (bed.work / "table.txt").write_text(report.table() + "\n")
    return report.ok


async def _first_sample(observer: Observer) -> dict[str, Any] | None:
    if await wait_until(lambda: observer.latest() is not None, 60, 0.5) is None:
        return None
    return observer.latest()
