"""`presence bench bigserver`: a server of a million members (issue 28 item 3).

One server, `big`, of `--members` members (1,000,000) and one of `--small-members` (1,000),
`small`, each with a channel, loaded with `presence load` (timed, with PostgreSQL's rows and sizes
after it). Then, on `--edges` edges, `--connected` members of `big` (20,000) connect and each watches
`--watch` (100) other members: a member list on screen, a window of the list; the windows start
`members / connected` apart, so together they cover the whole server and each member is watched
by about `watch x connected / members` sockets (2 at the full size). Meanwhile the connected
members change status at `--rate` per second (2,000) and members leave and join the server at
`--churn` per second (100; each leaver joins again a second later, written straight into
`server_members` as a host application would, so every change reaches the shards as a NOTIFY and
a relations reload of an account they hold).

Under that load, `--probes` members of each server (sockets of their own, in this process) take
turns at the operations whose cost must not grow with the server (the same operations on both
servers, their turns staggered by half a period so that neither waits on the other's, which goes
first alternating; target ≤ 1.2x the small server's figure):

- **sync**: `presence.subscribe` of 100 members of its server until its `presence.sync`;
- **query**: `presence.query` of the same 100 until the last answer;
- **typing**: `typing.start` in the server's channel until another probe (every probe subscribed
  to the channel) receives the `typing` frame (the channel's audience is its subscribers: the same
  count on both servers);
- **online**: the internal `online?serverId=G` count (HTTP, with the internal token);
- **reload**: a new account watched by the probe joins the server (INSERT into `server_members`)
  until the probe is told its status (the NOTIFY, the shard's relations reload, the watcher
  entering its audience).

Each probe's 100 members are one of five windows of members not connected, subscribed once at
set-up (so both servers' probes find them in the shards' memory); each probe takes a turn once a
minute at most (the lookup budget: 600 ids a minute). Memory per member: the shards' RSS growth
from before the sockets connected to after the window, over the members they then hold (watched,
with their relations and watchers, or with an account in memory, whichever count is larger).

    presence bench bigserver [--members 1000000] [--small-members 1000] [--connected 20000]
                             [--watch 100] [--rate 2000] [--churn 100] [--seconds 30]
                             [--probes 120] [--turns-per-s 2] [--quick] [--no-record]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from bench import fanout, results
from bench import loadgen as lg
from bench.results import machine_info, machine_summary

if TYPE_CHECKING:
    from cluster.config import Settings

NAME = "bigserver"
TARGET_RATIO = 1.2  # big server's p50 / small server's p50, per operation
OPERATIONS = ("sync", "query", "typing", "online", "reload")
SERVERS = ("big", "small")
WINDOWS = 5  # distinct target windows of the probes, per server
OP_TIMEOUT_S = 10.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench bigserver",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--members", type=int, default=1_000_000, help="members of the big server")
    p.add_argument("--small-members", type=int, default=1_000, help="members of the small server")
    p.add_argument("--connected", type=int, default=20_000, help="connected members of the big server")
    p.add_argument("--watch", type=int, default=100, help="members each connected member watches")
    p.add_argument("--rate", type=float, default=2_000.0, help="status changes per second")
    p.add_argument("--churn", type=float, default=100.0, help="members leaving or joining per second")
    p.add_argument("--seconds", type=float, default=30.0, help="the measured window")
    p.add_argument("--probes", type=int, default=120, help="probe members per server")
    p.add_argument("--turns-per-s", type=float, default=2.0, help="probe turns per second per server")
    p.add_argument("--generators", type=int, default=2, help="client processes of the connected members")
    p.add_argument(
        "--edges",
        type=int,
        default=None,
        help="edge processes (default: one per 15,000 sockets; this container caps a process at 20,000 fds)",
    )
    lg.add_common_args(p)
    args = p.parse_args(argv)
    if args.quick:
        args.members, args.connected, args.rate, args.churn = 5_000, 300, 200.0, 20.0
        args.seconds, args.probes, args.turns_per_s = 4.0, 30, 1.0
    if args.edges is None:
        args.edges = -(-(args.connected + 2 * args.probes) // 15_000)
    if args.connected + WINDOWS * args.watch + args.probes > args.members:
        p.error("--members must exceed --connected + the probes' windows + --probes")
    if args.small_members < WINDOWS * args.watch + args.probes:
        p.error(f"--small-members must be at least {WINDOWS * args.watch + args.probes}")
    if args.turns_per_s * 60 > args.probes * 2:
        p.error("each probe may take at most two turns a minute (the lookup budget): add --probes")
    return args


def main(argv: list[str], settings: Settings) -> int:
    return lg.main_in_env(NAME, parse(argv), settings, run, report)


# ------------------------------------------------------------------------------- who is who


def member(server: str, i: int) -> str:
    return f"{server}{i}"


def size_of(args: argparse.Namespace, server: str) -> int:
    return int(args.members if server == "big" else args.small_members)


def channel_of(server: str) -> str:
    return f"{server}-c0"


def window_of(args: argparse.Namespace, server: str, w: int) -> list[str]:
    """Probe target window w: members after the connected ones (big) or from the first (small)."""
    first = (args.connected if server == "big" else 0) + w * args.watch
    return [member(server, first + k) for k in range(args.watch)]


def probe_ids(args: argparse.Namespace, server: str) -> list[str]:
    """The probes: the last members of the server (never connected, never in a window)."""
    n = size_of(args, server)
    return [member(server, n - 1 - k) for k in range(args.probes)]


def list_window(i: int, members: int, connected: int, watch: int) -> list[int]:
    """The members connected member i watches: `watch` members from its window's start, the
    windows `members // connected` apart (so they cover the server); never itself."""
    start = i * max(1, members // connected)
    return [t for t in ((start + k) % members for k in range(1, watch + 2)) if t != i][:watch]


# ------------------------------------------------------------------------------- the load


def _fixture(args: argparse.Namespace, path: Path) -> None:
    servers = [
        {"id": s, "members": [member(s, i) for i in range(size_of(args, s))], "channels": [channel_of(s)]}
        for s in SERVERS
    ]
    path.write_text(json.dumps({"servers": servers}))


def load(args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage) -> dict[str, Any]:
    """`presence load` of both servers, timed, with a line every 10 s saying what PostgreSQL is
    doing; then the tables' rows and sizes."""
    import subprocess
    import sys

    path = env.tmp / "bigserver.json"
    _fixture(args, path)
    stage.log(
        f"presence load: {args.members:,} + {args.small_members:,} members ({path.stat().st_size:,} bytes)"
    )
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "cluster.cli", "load", str(path), "--data-dir", str(env.data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    while proc.poll() is None:
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            stage.log(f"presence load: {time.monotonic() - started:.0f} s, {_doing(env.database_url)}")
    seconds = time.monotonic() - started
    output = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        raise RuntimeError(f"presence load failed ({proc.returncode}):\n{output[-3000:]}")
    stage.log(f"presence load: {seconds:.1f} s: {output.strip()}")
    return {"load_s": seconds, "load_output": output.strip(), **asyncio.run(_rows(env.database_url))}


def _doing(database_url: str) -> str:
    """The statement PostgreSQL runs for `presence load` (its first words), for the progress line."""

    async def ask() -> str:
        import asyncpg

        conn = await asyncpg.connect(database_url)
        try:
            q = await conn.fetchval(
                "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 40) FROM pg_stat_activity "
                "WHERE state = 'active' AND pid <> pg_backend_pid() AND backend_type = 'client backend' "
                "ORDER BY query_start LIMIT 1"
            )
        finally:
            await conn.close()
        return f"PostgreSQL running: {q}" if q else "parsing or committing"

    try:
        return asyncio.run(ask())
    except Exception as e:  # a progress line only
        return f"({type(e).__name__})"


async def _rows(database_url: str) -> dict[str, Any]:
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("ANALYZE users; ANALYZE server_members")
        rows = {t: await conn.fetchval(f"SELECT count(*) FROM {t}") for t in ("users", "server_members")}
        sizes = {
            t: await conn.fetchval("SELECT pg_total_relation_size($1::regclass)", t)
            for t in ("users", "server_members")
        }
    finally:
        await conn.close()
    return {"pg_rows": rows, "pg_bytes": sizes}


# ------------------------------------------------------------------------------- the connected members


async def watch_lists(
    gen: lg.Generator, members: int, connected: int, watch: int, concurrency: int, timeout: float
) -> dict[str, Any]:
    """Generator phase: this generator's connected members (group "big") each subscribe to their
    window of the member list (`list_window`) and wait for its sync; they heartbeat from now on."""
    gen.prefix = "big"  # fanout_run's status changes read the account number after it
    await gen.heartbeats("big", 30.0)
    _, synced, errors = await gen._subscribe_all(
        "big",
        "big",
        members,
        watch,
        concurrency,
        timeout,
        lambda i: list_window(i, members, connected, watch),
    )
    return {"subscribed": synced, "errors": errors}


def connect_members(
    args: argparse.Namespace,
    env: lg.BenchEnv,
    stage: lg.Stage,
    workers: lg.Workers,
    edges: list[lg.EdgeProcess],
) -> dict[str, Any]:
    """The connected members of `big`, spread over the edges, each watching its window of the list."""
    shares = lg.split(args.connected, len(workers))
    opened = lg.connect_side(
        workers,
        stage,
        lg.Side("big", users="big"),
        [("127.0.0.1", e.port) for e in edges],
        shares,
        timeout=120.0,
        retries=5,  # a set-up that must be complete: a handshake reset in a burst is tried again
    )
    stage.log(f"connected {opened['connected']:,} members in {opened['seconds']:.1f} s; subscribing")
    started = time.monotonic()
    res = workers.call(
        "phase",
        {
            "target": "bench.bigserver:watch_lists",
            "kwargs": {
                "members": args.members,
                "connected": args.connected,
                "watch": args.watch,
                "concurrency": 100,
                "timeout": 120.0,
            },
        },
        timeout=1800.0,
        on_progress=stage.progress("subscribe", args.connected),
    )
    subscribed = sum(r["subscribed"] for r in res)
    errors = {k: v for r in res for k, v in r["errors"].items()}
    seconds = time.monotonic() - started
    stage.log(f"{subscribed:,} member lists of {args.watch} on screen in {seconds:.1f} s")
    return {"connect": opened, "subscribed": subscribed, "subscribe_s": seconds, "subscribe_errors": errors}


# ------------------------------------------------------------------------------- the probes


@dataclass
class Probes:
    """One server's probe sockets and what their operations measured."""

    server: str
    conns: list[lg.WsConn]
    db: Any  # an asyncpg connection of its own: the servers' turns run at once
    latencies: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPERATIONS})
    failures: dict[str, int] = field(default_factory=dict)
    online_seen: list[int] = field(default_factory=list)
    turn: int = 0
    busy: bool = False


async def open_probes(
    args: argparse.Namespace, env: lg.BenchEnv, edge: lg.EdgeProcess, server: str, db: Any
) -> Probes:
    """The server's probes, identified, subscribed to its channel, each once to its window (so
    both servers' probes find their members in the shards' memory)."""
    from edge.tokens import mint_token

    conns = []
    for k, user in enumerate(probe_ids(args, server)):
        c = await lg.open_ws("127.0.0.1", edge.port, lg.WS_PATH, lg.source_address(900_000 + k))
        c.user = user
        c.send(orjson.dumps({"type": "identify", "token": mint_token(user, env.secret, 7200)}))
        await c.expect(b"ready", 60.0)
        roster = c.expect(b"voice.roster", 60.0)
        c.send(orjson.dumps({"type": "channel.subscribe", "channelId": channel_of(server)}))
        await roster
        ids = window_of(args, server, k % WINDOWS)
        sync = c.expect(b"presence.sync", 60.0)
        c.send(orjson.dumps({"type": "presence.subscribe", "userIds": ids}))
        await sync
        c.send(orjson.dumps({"type": "presence.unsubscribe", "userIds": ids}))
        conns.append(c)
    return Probes(server, conns, db)


async def _sync(c: lg.WsConn, ids: list[str]) -> None:
    sync = c.expect(b"presence.sync", OP_TIMEOUT_S)
    c.send(orjson.dumps({"type": "presence.subscribe", "userIds": ids}))
    await sync
    c.send(orjson.dumps({"type": "presence.unsubscribe", "userIds": ids}))


async def _query(c: lg.WsConn, ids: list[str]) -> None:
    """Until the last answer: one per id (every one is a member of the probe's server), all in one
    write, so counted as they arrive (a waiter per frame would miss those of the same read)."""
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    left = len(ids)

    def on_text(_c: lg.WsConn, payload: bytes) -> None:
        nonlocal left
        if payload.startswith(b'{"type":"error"') and not done.done():  # rate_limited...: say so
            done.set_exception(RuntimeError(orjson.loads(payload).get("code", "error")))
        elif payload.startswith(b'{"type":"presence.changed"') and orjson.loads(payload)["userId"] in wanted:
            left -= 1
            if not left and not done.done():
                done.set_result(None)

    wanted = set(ids)
    c.on_text = on_text
    try:
        c.send(orjson.dumps({"type": "presence.query", "userIds": ids}))
        await done
    finally:
        c.on_text = None


async def _typing(c: lg.WsConn, receiver: lg.WsConn, channel: str) -> None:
    got = asyncio.ensure_future(_typed(receiver, c.user))
    await asyncio.sleep(0)  # its waiter is set before the frame leaves
    c.send(orjson.dumps({"type": "typing.start", "channelId": channel}))
    try:
        await got
    finally:
        got.cancel()


async def _typed(receiver: lg.WsConn, typist: str) -> None:
    while (await receiver.expect(b"typing", OP_TIMEOUT_S))["userId"] != typist:
        pass


def _online(edge: lg.EdgeProcess, server: str) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{edge.internal_port}/api/v1/internal/presence/online?serverId={server}",
        headers={"Authorization": f"Bearer {edge.internal_token}"},
    )
    with urllib.request.urlopen(request, timeout=OP_TIMEOUT_S) as r:
        return int(json.loads(r.read())["online"] or 0)


async def _reload(c: lg.WsConn, db: Any, server: str, joiner: str) -> float:
    """A new account the probe watches joins the server: from the INSERT until the probe is told
    its status (it entered the probe's audience). Returns that latency; the joiner leaves again."""
    sync = c.expect(b"presence.sync", OP_TIMEOUT_S)
    c.send(orjson.dumps({"type": "presence.subscribe", "userIds": [joiner]}))
    await sync  # outside the audience: the sync lists nothing, the watch stays
    told = asyncio.ensure_future(c.expect(b"presence.changed", OP_TIMEOUT_S))
    await asyncio.sleep(0)
    started = time.monotonic()
    await db.execute("INSERT INTO server_members (server_id, user_id) VALUES ($1, $2)", server, joiner)
    try:
        await told
        return time.monotonic() - started
    finally:
        told.cancel()
        c.send(orjson.dumps({"type": "presence.unsubscribe", "userIds": [joiner]}))
        await db.execute("DELETE FROM server_members WHERE server_id = $1 AND user_id = $2", server, joiner)


async def take_turn(args: argparse.Namespace, probes: Probes, edge: lg.EdgeProcess) -> None:
    """One probe's turn: each operation once, timed; a failure counted by operation."""
    k = probes.turn
    probes.turn += 1
    c, receiver = probes.conns[k % len(probes.conns)], probes.conns[(k + 1) % len(probes.conns)]
    ids = window_of(args, probes.server, k % len(probes.conns) % WINDOWS)
    loop = asyncio.get_running_loop()
    steps: list[tuple[str, Any]] = [
        ("sync", lambda: _sync(c, ids)),
        ("query", lambda: _query(c, ids)),
        ("typing", lambda: _typing(c, receiver, channel_of(probes.server))),
        ("online", lambda: loop.run_in_executor(None, _online, edge, probes.server)),
        ("reload", lambda: _reload(c, probes.db, probes.server, f"{probes.server}-joiner{k}")),
    ]
    for op, step in steps:
        started = time.monotonic()
        try:
            value = await asyncio.wait_for(step(), OP_TIMEOUT_S)
        except Exception as e:
            key = f"{op}: {type(e).__name__} {e}"[:80]
            probes.failures[key] = probes.failures.get(key, 0) + 1
            continue
        if op == "online":
            probes.online_seen.append(int(value))
        probes.latencies[op].append(value if op == "reload" else time.monotonic() - started)


async def run_probes(args: argparse.Namespace, sides: list[Probes], edge: lg.EdgeProcess, end: float) -> int:
    """Turns at `--turns-per-s` on every server, the servers' turns staggered evenly over each
    period, which goes first alternating (not at the same moments: the two sides' probes then
    ran side by side and waited for each other, in this process's loop and at the edge,
    whichever happened to be second); a turn still running when its server's next is due makes
    that one skipped (returned)."""
    skipped, k, t0 = 0, 0, time.monotonic()
    running: set[asyncio.Task[None]] = set()

    def finisher(side: Probes) -> Callable[[asyncio.Task[None]], None]:
        def done(task: asyncio.Task[None]) -> None:
            side.busy = False
            running.discard(task)

        return done

    while time.monotonic() < end:
        # Which server goes first alternates, so both sample each phase of the period alike.
        first = k % len(sides)
        for i, side in enumerate(sides[first:] + sides[:first]):
            await asyncio.sleep(max(0.0, t0 + (k + i / len(sides)) / args.turns_per_s - time.monotonic()))
            if side.busy:
                skipped += 1
                continue
            side.busy = True
            task = asyncio.create_task(take_turn(args, side, edge))
            running.add(task)
            task.add_done_callback(finisher(side))
        k += 1
        await asyncio.sleep(max(0.0, t0 + k / args.turns_per_s - time.monotonic()))
    if running:
        await asyncio.wait(list(running), timeout=OP_TIMEOUT_S * len(OPERATIONS))
    return skipped


async def churn(db: Any, connected: int, per_s: float, end: float) -> int:
    """Connected members leave the big server and join it again a second later, `per_s` changes
    a second in all (written as a host application would: straight into `server_members`)."""
    gone: list[tuple[float, list[str]]] = []
    k = changes = 0
    tick = 0.1
    while time.monotonic() < end:
        n = max(1, round(per_s * tick / 2))
        leavers = [member("big", (k + j) % connected) for j in range(n)]
        k += n
        await db.execute(
            "DELETE FROM server_members WHERE server_id = 'big' AND user_id = ANY($1::text[])", leavers
        )
        gone.append((time.monotonic() + 1.0, leavers))
        changes += n
        while gone and (gone[0][0] <= time.monotonic() or time.monotonic() >= end):
            changes += await _rejoin(db, gone.pop(0)[1])
        await asyncio.sleep(tick)
    for _, leavers in gone:
        changes += await _rejoin(db, leavers)
    return changes


async def _rejoin(db: Any, users: list[str]) -> int:
    await db.execute(
        "INSERT INTO server_members (server_id, user_id) SELECT 'big', unnest($1::text[]) "
        "ON CONFLICT DO NOTHING",
        users,
    )
    return len(users)


# ------------------------------------------------------------------------------- the window


def run(args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage) -> dict[str, Any]:
    measured: dict[str, Any] = {"load": load(args, env, stage)}
    edges = [env.start_edge() for _ in range(args.edges)]
    edge = edges[0]  # the probes' and the online count's
    shards = fanout.pool_pids()["shards"]
    rss_before = sum(lg.rss_kib(p) for p in shards)
    with lg.Workers(args.generators, {"secret": env.secret}) as workers:
        measured["setup"] = connect_members(args, env, stage, workers, edges)
        stage.log(
            f"window: {args.seconds:g} s of probes, {args.rate:g} status changes/s, churn {args.churn:g}/s"
        )
        measured["window"] = asyncio.run(_window(args, env, workers, edge))
        stats = env.shard_stats()
        accounts, watched = sum(s.accounts for s in stats), sum(s.watched for s in stats)
        rss_after = sum(lg.rss_kib(p) for p in shards)
    measured["memory"] = {
        "shard_rss_kib_before": rss_before,
        "shard_rss_kib_after": rss_after,
        "accounts_in_shards": accounts,
        "watched_in_shards": watched,
        # A member the shards hold: watched (its relations and watchers; an offline one has no
        # account loaded) or with an account in memory (connected, or read for a query).
        "kib_per_member": (rss_after - rss_before) / max(accounts, watched, 1),
    }
    return measured


async def _window(
    args: argparse.Namespace, env: lg.BenchEnv, workers: lg.Workers, edge: lg.EdgeProcess
) -> dict[str, Any]:
    import asyncpg

    dbs = [await asyncpg.connect(env.database_url) for _ in range(len(SERVERS) + 1)]
    try:
        sides = [await open_probes(args, env, edge, s, db) for s, db in zip(SERVERS, dbs, strict=False)]
        start_at = time.monotonic() + 1.0
        status: dict[str, Any] = {}
        thread = threading.Thread(target=_status_changes, args=(args, workers, start_at, status), daemon=True)
        thread.start()
        await asyncio.sleep(start_at - time.monotonic())
        end = start_at + args.seconds
        skipped, changes = await asyncio.gather(
            run_probes(args, sides, edge, end), churn(dbs[-1], args.connected, args.churn, end)
        )
        await asyncio.get_running_loop().run_in_executor(None, thread.join, 120.0)
        for c in (c for side in sides for c in side.conns):
            c.close()
    finally:
        for db in dbs:
            await db.close()
    if "error" in status:
        raise RuntimeError(f"status changes failed: {status['error']}")
    return {"probes": {s.server: _side_figures(s) for s in sides}, "skipped_turns": skipped,
            "churn_changes": changes, **status}  # fmt: skip


def _status_changes(
    args: argparse.Namespace, workers: lg.Workers, start_at: float, out: dict[str, Any]
) -> None:
    """The connected members' status changes (`Generator.fanout_run`), in a thread beside the probes."""
    try:
        res = workers.call(
            "fanout_run",
            {"start_at": start_at, "seconds": args.seconds, "rate": args.rate / len(workers), "drain_s": 1.0,
             "group": "big"},
        )  # fmt: skip
    except Exception as e:  # reported by the window
        out["error"] = f"{type(e).__name__}: {e}"
        return
    out["status_changes"] = sum(len(r["sends"][0]) // 4 for r in res)
    out["deliveries"] = sum(len(r["receipts"][2]) // 8 for r in res)
    out["status_wall_s"] = max(r["wall_s"] for r in res)


def _side_figures(side: Probes) -> dict[str, Any]:
    return {
        "latency_ms": {op: lg.summary_ms(side.latencies[op]) for op in OPERATIONS},
        "failures": side.failures,
        "online_seen": [min(side.online_seen, default=0), max(side.online_seen, default=0)],
    }


# ------------------------------------------------------------------------------- the report


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def figures(args: argparse.Namespace, m: dict[str, Any]) -> dict[str, Any]:
    """Each operation's big / small ratios (p50, p99) and whether the p50 ratio met the target."""
    big, small = (m["window"]["probes"][s]["latency_ms"] for s in SERVERS)
    ratios = {op: {q: _ratio(big[op][q], small[op][q]) for q in ("p50", "p99")} for op in OPERATIONS}
    failed = sum(sum(m["window"]["probes"][s]["failures"].values()) for s in SERVERS)
    met = {op: ratios[op]["p50"] <= TARGET_RATIO and failed == 0 for op in OPERATIONS}
    return {"ratios": ratios, "met": met, "failed": failed, "all_met": all(met.values())}


def report(args: argparse.Namespace, m: dict[str, Any], runtime: float, started_at: str) -> int:
    info = machine_info()
    f = figures(args, m)
    _print(args, m, info, f)
    payload = {
        **results.run_record(NAME, started_at, runtime, info, args),
        **m,
        **f,
        "targets": [
            results.target(
                f"{op} on a server of {args.members:,} / of {args.small_members:,} (p50)",
                f["ratios"][op]["p50"],
                "ratio",
                f"≤ {TARGET_RATIO:g}",
                None if args.quick else f["met"][op],
            )
            for op in OPERATIONS
        ],
    }
    results.record(NAME, payload, args, RESULTS_TITLE, _columns(args, m, info, f, runtime))
    print(f"runtime {runtime:.1f} s")
    return 0


RESULTS_TITLE = (
    "A server of a million members (issue 28 item 3): `presence load` of it (time, PostgreSQL's rows), "
    "20,000 of its members connected each watching 100 (a member list on screen), 2,000 status changes/s "
    "and 100 members leaving or joining/s; meanwhile probes of each server time a subscribe's sync, a "
    "query of 100, typing in its channel, the internal online count and a relations reload (a watched "
    "account joining, until its watcher is told), big beside a 1,000-member server in the same run "
    "(target ≤ 1.2x, p50); the shards' memory per member they hold (watched or in memory)."
)


def _pair(lat: dict[str, float]) -> str:
    return f"{lg.fmt_ms(lat['p50'])}/{lg.fmt_ms(lat['p99'])}"


def _columns(
    args: argparse.Namespace, m: dict[str, Any], info: dict[str, Any], f: dict[str, Any], runtime: float
) -> results.Columns:
    big, small = (m["window"]["probes"][s]["latency_ms"] for s in SERVERS)
    load = m["load"]
    cells: list[tuple[str, str]] = [
        *results.lead_columns(info),
        (
            "size",
            f"{args.members:,} members, {args.connected:,} x {args.watch}, {args.rate:g}/s, "
            f"churn {args.churn:g}/s",
        ),
        ("load s", f"{load['load_s']:.1f}"),
        (
            "rows users / server_members",
            f"{load['pg_rows']['users']:,} / {load['pg_rows']['server_members']:,}",
        ),
        ("KiB per member held in shards", f"{m['memory']['kib_per_member']:.2f}"),
    ]
    for op in OPERATIONS:
        cells.append(
            (
                f"{op} ms big / small (p50/p99)",
                f"{_pair(big[op])} / {_pair(small[op])}: {f['ratios'][op]['p50']:.2f}x",
            )
        )
    cells += [
        ("target ≤ 1.2x", "quick" if args.quick else f"{sum(f['met'].values())}/{len(OPERATIONS)} met"),
        ("failed", str(f["failed"])),
        ("runtime", f"{runtime:.0f} s"),
    ]
    return cells


def _print(args: argparse.Namespace, m: dict[str, Any], info: dict[str, Any], f: dict[str, Any]) -> None:
    load, setup, w, mem = m["load"], m["setup"], m["window"], m["memory"]
    print(
        f"\npresence bench bigserver on {machine_summary(info)} (commit {info['commit']}): a server of "
        f"{args.members:,} members beside one of {args.small_members:,}\n"
        f"presence load: {load['load_s']:.1f} s; PostgreSQL: {load['pg_rows']['users']:,} users "
        f"({load['pg_bytes']['users'] / 2**20:.0f} MiB), {load['pg_rows']['server_members']:,} memberships "
        f"({load['pg_bytes']['server_members'] / 2**20:.0f} MiB)\n"
        f"{setup['connect']['connected']:,} members connected in {setup['connect']['seconds']:.1f} s, "
        f"{setup['subscribed']:,} lists of {args.watch} on screen in {setup['subscribe_s']:.1f} s; shards: "
        f"{mem['watched_in_shards']:,} members watched, {mem['accounts_in_shards']:,} accounts in memory, "
        f"{mem['kib_per_member']:.2f} KiB per member held "
        f"({mem['shard_rss_kib_before'] / 1024:.0f} → {mem['shard_rss_kib_after'] / 1024:.0f} MiB)\n"
        f"window {args.seconds:g} s: {w.get('status_changes', 0):,} status changes, "
        f"{w.get('deliveries', 0):,} deliveries, {w['churn_changes']:,} members left or joined, "
        f"{w['skipped_turns']} probe turns skipped\n"
    )
    big, small = (w["probes"][s]["latency_ms"] for s in SERVERS)
    rows = [
        [op, str(big[op]["n"]), _pair(big[op]), str(small[op]["n"]), _pair(small[op]),
         f"{f['ratios'][op]['p50']:.2f}x", f"{f['ratios'][op]['p99']:.2f}x",
         results.met_text(None if args.quick else f["met"][op])]
        for op in OPERATIONS
    ]  # fmt: skip
    results.print_table(
        [
            "operation",
            "big n",
            "big p50/p99 ms",
            "small n",
            "small p50/p99 ms",
            "p50 ratio",
            "p99 ratio",
            "≤ 1.2x",
        ],
        rows,
    )
    for s in SERVERS:
        p = w["probes"][s]
        print(
            f"{s}: online count seen {p['online_seen'][0]:,}-{p['online_seen'][1]:,}; "
            f"failures {p['failures'] or 0}"
        )
