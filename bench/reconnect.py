"""`presence bench reconnect`: a reconnect storm. One edge dies (SIGKILL) under `--sockets`
identified sockets; every client reconnects to the other edge with the backoff real clients use;
beside a bare websockets server taking the same storm from the same clients, in the same run.

The clients' policy is the client library's own: `presence_client.reconnect_delay`, called as
`PresenceClient` calls it. A socket that was lost waits `reconnect_delay(0)` (full jitter in
[0, 1 s)), tries once (connect, identify, `ready`, within the client's `connect_timeout_s`), and
after each failed try waits `reconnect_delay(attempt)` with the attempt number (throttled after a
4029 or 1008 close, as the client is). Each socket draws from its own `random.Random` seeded by
`--seed` and its index, so the bare server and ours get the very same storm.

Bare (first): `bench.echo_server` twice (uvloop, compression off, the edge's settings). The
sockets connect to the first and each has its hello echoed; the first is killed; each socket
reconnects to the second, and counts as back once its hello is echoed again (the bare analogue of
identify → ready). The bare servers run without the background load below: they have no presence
to fan out.

Ours: two `presence edge` processes, A and B, joined to the pool. On B, a background fan-out load
(`--load-accounts` accounts each subscribed to `--load-subscriptions` others on a ring, status
changes at `--load-rate` per second, every pair a friendship) and `--watchers` watcher sockets,
each subscribed to `--per-watcher` of the first `--watched` storm accounts (friends, so the
audience rule lets every change through). The `--sockets` storm sockets identify on A. The
watched accounts then go idle (`presence.update idle` on their sockets on A), and the benchmark
waits until every watcher has seen it. The load runs `--before-s`; A is killed; every storm
socket reconnects to B and identifies.

What is measured, from the kill (one monotonic clock, this machine):

- identified: the time until every storm socket has its `ready` from B (per socket and the last);
- shown online again: for each (watcher, watched account) pair, the receive time of the
  `presence.changed online` the watcher gets for that account after the kill; the figure is the
  last pair. Why it is a real signal: the account's socket on A was idle and A's sockets stay
  registered in the shards until A's lease runs out (`socket_timeout_s`, 90 s after its last
  refresh), so the account's status moves from idle to online exactly when its new socket on B
  is registered in its shard, and the watchers see that change through the normal fan-out path.
  A storm over within the lease is therefore never seen as "offline" by a watcher: `offline
  flaps` counts `offline` frames the watchers got after the kill (0 expected; the benchmark does
  not wait the 90 s for A's lease to lapse, which changes nothing for accounts already back);
- fan-out p99 during the storm: the latency of the load's deliveries whose change was sent
  between the kill and the end of the storm (the later of the two times above), beside the same
  figure before the kill;
- edge B's and the shards' CPU during the storm (cores), and the bare second server's during its.

Ratio = ours / bare, ours being the later of "identified" and "shown online again". Targets:
ratio ≤ 2, fan-out p99 during the storm < 100 ms.

The edges' per-address admission caps (connections opening at once, new connections per second)
are raised for this benchmark: every loopback source address stands for 900 clients
(`loadgen.PER_ADDRESS`), which in the field would be 900 addresses with a cap each.

`--connect-timeout-s` lowers the time a try gets (only to study retries at small sizes).

    presence bench reconnect [--sockets 19000] [--watched 1000] [--watchers 150] [--per-watcher 50]
                             [--load-accounts 250] [--load-subscriptions 20] [--load-rate 50]
                             [--seed 1] [--quick] [--no-record]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import math
import os
import random
import secrets
import signal
import subprocess
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from bench import fanout, results, targets
from bench import loadgen as lg
from bench.results import machine_info, machine_summary

if TYPE_CHECKING:
    from cluster.config import Settings

NAME = "reconnect"
TARGET_RATIO = targets.RECONNECT_RATIO
TARGET_FANOUT_P99_MS = targets.RECONNECT_FANOUT_P99_MS
HEARTBEAT_S = 30.0
# Source addresses (loadgen.source_address): the load's sockets start at 0 (fanout_setup), the
# watchers and the storm further on, so no address carries more than PER_ADDRESS sockets on B.
WATCHER_BASE = 150_000
STORM_BASE = 200_000
# One edge's open files (20,000) minus room for its own (Ray, Redis, logs, listeners).
EDGE_SOCKETS_MAX = 19_500
HELLO = b'{"type":"hello"}'


def _client_connect_timeout_s() -> float:
    """`PresenceClient`'s default `connect_timeout_s` (connect + identify + ready), read from the
    client itself so the storm's clients give up on a try when real ones would."""
    from presence_client import PresenceClient

    default = inspect.signature(PresenceClient.__init__).parameters["connect_timeout_s"].default
    return float(default)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench reconnect",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sockets", type=int, default=19_000, help="sockets on the edge that dies (19,000)")
    p.add_argument("--watched", type=int, default=1_000, help="storm accounts with watchers (1,000)")
    p.add_argument("--watchers", type=int, default=150, help="watcher sockets on the other edge (150)")
    p.add_argument("--per-watcher", type=int, default=50, help="watched accounts per watcher (50)")
    p.add_argument("--load-accounts", type=int, default=250, help="fan-out load accounts on B (250)")
    p.add_argument("--load-subscriptions", type=int, default=20, help="subscriptions per load account (20)")
    p.add_argument("--load-rate", type=float, default=50.0, help="load status changes per second (50)")
    p.add_argument("--generators", type=int, default=2, help="processes holding the storm's sockets (2)")
    p.add_argument("--concurrency", type=int, default=400, help="connects in flight while setting up")
    p.add_argument("--before-s", type=float, default=3.0, help="load measured before the kill (3 s)")
    p.add_argument("--after-s", type=float, default=2.0, help="load kept after the storm (2 s)")
    p.add_argument("--storm-timeout-s", type=float, default=120.0, help="give up on the storm after this")
    p.add_argument(
        "--seed", type=int, default=1, help="seed of every socket's jitter (same for both servers)"
    )
    p.add_argument(
        "--connect-timeout-s",
        type=float,
        default=None,
        help="time a try gets (default: PresenceClient's connect_timeout_s; lower only to study retries)",
    )
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="py-spy profiles of edge B and of shard 0 from the kill, into DIR (storm-*-pyspy.txt)",
    )
    p.add_argument("--profile-s", type=float, default=30.0, help="how long the profiles run (30 s)")
    lg.add_common_args(p)
    args = p.parse_args(argv)
    if args.connect_timeout_s is None:
        args.connect_timeout_s = _client_connect_timeout_s()
    if args.quick:
        args.sockets, args.watched, args.watchers, args.per_watcher = 300, 60, 15, 20
        args.load_accounts, args.load_subscriptions, args.load_rate = 40, 8, 10.0
        args.generators, args.before_s, args.after_s, args.storm_timeout_s = 1, 1.0, 1.0, 60.0
    if not 0 < args.watched <= args.sockets:
        p.error("--watched must be between 1 and --sockets")
    if args.per_watcher > args.watched or args.watchers * args.per_watcher < args.watched:
        p.error(
            "every watched account needs a watcher: --watchers x --per-watcher ≥ --watched ≥ --per-watcher"
        )
    if args.load_subscriptions * 2 >= args.load_accounts:
        p.error("--load-subscriptions must be under half of --load-accounts")
    if args.sockets + args.watchers + args.load_accounts > EDGE_SOCKETS_MAX:
        p.error(f"edge B would hold more than {EDGE_SOCKETS_MAX:,} sockets (20,000 open files per process)")
    if args.sockets / args.generators > 18_000:
        p.error("too many sockets per generator process (20,000 open files each): raise --generators")
    return args


def main(argv: list[str], settings: Settings) -> int:
    return lg.main_in_env(NAME, parse(argv), settings, run, report)


def edge_env() -> dict[str, str]:
    """Per-address admission caps out of the way: 900 clients stand behind each loopback address
    and two generators may share one, and the bare server has no such caps. Ten times the clients
    of an address: at 900 a second (the earlier setting) a set-up that connects faster than that
    had handshakes refused."""
    n = 10 * lg.PER_ADDRESS
    return {
        "PRESENCE_MAX_HANDSHAKES_PER_IP": str(n),
        "PRESENCE_ACCEPTS_PER_IP_PER_S": str(n),
        "PRESENCE_ACCEPTS_PER_IP_BURST": str(2 * n),
    }


# ------------------------------------------------------------------------------- inside a generator
#
# Phases run by `Generator.phase("bench.reconnect:NAME", kwargs)`; their state lives here, one per
# generator process.


@dataclass
class _Storm:
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    lost_at: array[float] = field(default_factory=lambda: array("d"))
    ready_at: array[float] = field(default_factory=lambda: array("d"))
    attempts: array[int] = field(default_factory=lambda: array("i"))
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)


_storm_state = _Storm()


@dataclass(frozen=True)
class _Survivor:
    """Where a storm's sockets reconnect to, and how a try goes."""

    host: str
    port: int
    path: str
    identify: bool  # ours: identify and wait for `ready`; bare: the hello echoed back
    connect_timeout_s: float


class _TryFailed(Exception):
    def __init__(self, key: str, conn: lg.WsConn | None) -> None:
        super().__init__(key)
        self.key = key
        self.conn = conn


async def _try_once(to: _Survivor, index: int, hello: bytes) -> lg.WsConn:
    """One try of the client's: connect, upgrade, identify (or echo), within its timeout."""
    loop = asyncio.get_running_loop()
    new: lg.WsConn | None = None
    step = "tcp"  # where a try failed: tcp connect, websocket upgrade, identify (or echo)
    try:
        async with asyncio.timeout(to.connect_timeout_s):
            _, new = await loop.create_connection(
                lambda: lg.WsConn(to.host, to.port, to.path),
                to.host,
                to.port,
                local_addr=(lg.source_address(index), 0),
            )
            step = "upgrade"
            await new.opened
            step = "identify" if to.identify else "echo"
            if to.identify:
                new.send(hello)
                await new.expect(b"ready", to.connect_timeout_s)
            else:
                echoed = new.next_text()
                new.send(hello)
                await echoed
    except Exception as e:
        raise _TryFailed(f"{type(e).__name__} in {step}: {e}"[:100], new) from e
    return new


async def _reconnect(
    st: _Storm, to: _Survivor, conn: lg.WsConn, hello: bytes, seed: int, give_up_s: float
) -> lg.WsConn | None:
    """Once `conn` is lost, reconnect with the client library's policy; None once given up."""
    from presence_client import DEFAULT_BACKOFF, THROTTLING_CLOSE_CODES, reconnect_delay

    await conn.lost
    lost_at = time.monotonic()
    rng = random.Random(f"{seed}:{conn.index}")  # the same storm for either server
    attempt, throttled = 0, False
    while True:
        await asyncio.sleep(reconnect_delay(attempt, throttled, DEFAULT_BACKOFF, rng.random))
        try:
            new = await _try_once(to, conn.index, hello)
        except _TryFailed as failed:
            st.errors[failed.key] = st.errors.get(failed.key, 0) + 1
            throttled = failed.conn is not None and failed.conn.close_code in THROTTLING_CLOSE_CODES
            if failed.conn is not None and failed.conn.transport is not None:
                failed.conn.transport.abort()
            attempt += 1
            if time.monotonic() - lost_at > give_up_s:
                st.failed += 1
                return None
            continue
        st.ready_at.append(time.monotonic())
        st.lost_at.append(lost_at)
        st.attempts.append(attempt + 1)
        new.user, new.index = conn.user, conn.index
        return new


async def storm_arm(
    gen: lg.Generator,
    group: str,
    host: str,
    port: int,
    path: str,
    identify: bool,
    seed: int,
    connect_timeout_s: float,
    give_up_s: float,
) -> int:
    """Every open socket of `group` waits for its connection to be lost, then reconnects to
    (host, port) with the client's policy. Returns how many are armed; `storm_wait` collects."""
    from edge.tokens import mint_token

    global _storm_state
    _storm_state = st = _Storm()
    to = _Survivor(host, port, path, identify, connect_timeout_s)
    group_list = gen.groups.get(group, [])
    positions = {id(c): i for i, c in enumerate(group_list)}

    async def one(conn: lg.WsConn, hello: bytes) -> None:
        new = await _reconnect(st, to, conn, hello, seed, give_up_s)
        if new is not None:
            group_list[positions[id(conn)]] = new  # heartbeats and `close` find the new socket

    for c in [c for c in group_list if c.open]:
        hello = (
            orjson.dumps({"type": "identify", "token": mint_token(c.user, gen.secret, 7200)})
            if identify
            else HELLO
        )
        st.tasks.append(asyncio.create_task(one(c, hello)))
    return len(st.tasks)


async def storm_wait(gen: lg.Generator, timeout_s: float) -> dict[str, Any]:
    """Wait for every armed socket to be back (or given up); the times and counts."""
    st = _storm_state
    cpu0 = time.process_time()
    deadline = time.monotonic() + timeout_s
    total = len(st.tasks)
    while time.monotonic() < deadline:
        done = sum(1 for t in st.tasks if t.done())
        gen.progress({"done": done, "ok": len(st.ready_at), "of": total})
        if done == total:
            break
        await asyncio.sleep(0.25)
    pending = [t for t in st.tasks if not t.done()]
    for t in pending:
        t.cancel()
    for t in st.tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            key = f"{type(t.exception()).__name__}"
            st.errors[key] = st.errors.get(key, 0) + 1
    return {
        "armed": total,
        "ready_at": st.ready_at.tobytes(),
        "lost_at": st.lost_at.tobytes(),
        "attempts": st.attempts.tobytes(),
        "failed": st.failed + len(pending),
        "errors": st.errors,
        "cpu_s": time.process_time() - cpu0,
    }


async def send_status(gen: lg.Generator, group: str, status: str, prefix: str, below: int) -> int:
    """`presence.update status` on every socket of `group` whose account is `prefix` + i, i < below."""
    frame = orjson.dumps({"type": "presence.update", "status": status})
    n = 0
    for c in gen.groups.get(group, []):
        if c.open and int(c.user[len(prefix) :]) < below:
            c.send(frame)
            n += 1
    return n


def watched_by(j: int, watched: int, per_watcher: int) -> list[int]:
    """The storm accounts watcher j subscribes to: the next `per_watcher` on a ring of `watched`."""
    return [(j * per_watcher + k) % watched for k in range(per_watcher)]


@dataclass
class _Watch:
    """What the watchers have seen of the watched accounts: latest status per (watcher, account)
    and when each last turned online."""

    prefix: str = ""
    status: dict[tuple[int, int], str] = field(default_factory=dict)
    online_at: dict[tuple[int, int], float] = field(default_factory=dict)
    offline_at: array[float] = field(default_factory=lambda: array("d"))
    changer: asyncio.Task[None] | None = None
    stop: bool = False
    sends_user: array[int] = field(default_factory=lambda: array("i"))
    sends_status: bytearray = field(default_factory=bytearray)
    sends_t: array[float] = field(default_factory=lambda: array("d"))
    cpu0: float = 0.0


_watch_state = _Watch()


async def observers_setup(
    gen: lg.Generator,
    host: str,
    port: int,
    load_prefix: str,
    load_accounts: int,
    load_subscriptions: int,
    storm_prefix: str,
    watched: int,
    watcher_prefix: str,
    watchers: int,
    per_watcher: int,
    concurrency: int,
) -> dict[str, Any]:
    """On B: the fan-out load's accounts (connected, subscribed on their ring) and the watchers
    (connected, subscribed to their watched accounts)."""
    global _watch_state
    _watch_state = w = _Watch(prefix=storm_prefix)
    load = await gen.fanout_setup([(host, port)], load_prefix, load_accounts, load_subscriptions, concurrency)
    res = await gen.connect(
        "watchers", [(host, port)], watchers, WATCHER_BASE, [f"{watcher_prefix}{j}" for j in range(watchers)],
        concurrency=concurrency,
    )  # fmt: skip
    await gen.heartbeats("watchers", HEARTBEAT_S)

    def on_text(conn: lg.WsConn, payload: bytes) -> None:
        if not payload.startswith(b'{"type":"presence.changed"'):
            return
        t = time.monotonic()
        frame = orjson.loads(payload)
        user: str = frame["userId"]
        if not user.startswith(storm_prefix):
            return
        pair = (int(conn.user[len(watcher_prefix) :]), int(user[len(storm_prefix) :]))
        status = frame["status"]
        if status == "online" and w.status.get(pair) != "online":
            w.online_at[pair] = t
        elif status == "offline":
            w.offline_at.append(t)
        w.status[pair] = status

    synced = 0
    for c in gen.groups.get("watchers", []):
        j = int(c.user[len(watcher_prefix) :])
        ids = [f"{storm_prefix}{i}" for i in watched_by(j, watched, per_watcher)]
        sync = c.expect(b"presence.sync", 60.0)
        c.send(orjson.dumps({"type": "presence.subscribe", "userIds": ids}))
        frame = await sync
        for entry in frame["users"]:
            w.status[(j, int(entry["userId"][len(storm_prefix) :]))] = entry["status"]
        synced += 1
        c.on_text = on_text
    return {
        "load_connected": load["connected"],
        "load_subscribed": load["subscribed"],
        "watchers": res["connected"],
        "watchers_synced": synced,
        "pairs": sum(len(set(watched_by(j, watched, per_watcher))) for j in range(watchers)),
    }


async def observers_wait(
    gen: lg.Generator,
    status: str,
    since: float,
    watched: int,
    watchers: int,
    per_watcher: int,
    timeout_s: float,
) -> dict[str, Any]:
    """Wait until every watcher shows `status` for each of its accounts (for "online": turned
    online after `since`); per account, when its last watcher saw it."""
    w = _watch_state
    pairs = {(j, i) for j in range(watchers) for i in watched_by(j, watched, per_watcher)}

    def there(pair: tuple[int, int]) -> bool:
        if w.status.get(pair) != status:
            return False
        return status != "online" or w.online_at.get(pair, -math.inf) >= since

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not all(there(p) for p in pairs):
        await asyncio.sleep(0.05)
    missing = {p for p in pairs if not there(p)}
    last: dict[int, float] = {}  # account → when its last watcher saw it (accounts all saw)
    if status == "online":
        for j, i in pairs - missing:
            last[i] = max(last.get(i, -math.inf), w.online_at[(j, i)])
        for _, i in missing:
            last.pop(i, None)
    return {
        "pairs": len(pairs),
        "missing": len(missing),
        "accounts_missing": len({i for _, i in missing}),
        "account_shown_at": [last[i] for i in sorted(last)],
        "offline_after": sum(1 for t in w.offline_at if t >= since),
    }


async def load_start(gen: lg.Generator, start_at: float, rate: float) -> int:
    """Status changes of the load's accounts at `rate` per second from `start_at`, round robin,
    alternating idle and online (as bench fanout's); receipts recorded from `start_at`."""
    w = _watch_state
    conns = [c for c in gen.groups.get("fanout", []) if c.open]
    frames = {
        0: lg.client_frame(b'{"type":"presence.update","status":"online"}'),
        1: lg.client_frame(b'{"type":"presence.update","status":"idle"}'),
    }
    changes = [0] * len(conns)
    prefix = gen.prefix

    async def changer() -> None:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        gen.recording = True
        w.cpu0 = time.process_time()
        t0, k = time.monotonic(), 0
        while not w.stop:
            due = int((time.monotonic() - t0) * rate) + 1
            while k < due and conns:
                idx = k % len(conns)
                c = conns[idx]
                changes[idx] += 1
                status = changes[idx] % 2
                w.sends_t.append(time.monotonic())
                c.send_raw(frames[status])
                w.sends_user.append(int(c.user[len(prefix) :]))
                w.sends_status.append(status)
                k += 1
            await asyncio.sleep(max(0.0, t0 + k / rate - time.monotonic()))

    w.changer = asyncio.create_task(changer())
    return len(conns)


async def load_stop(gen: lg.Generator, drain_s: float) -> dict[str, Any]:
    w = _watch_state
    w.stop = True
    if w.changer is not None:
        await w.changer
    cpu = time.process_time() - w.cpu0
    await asyncio.sleep(drain_s)
    gen.recording = False
    return {
        "sends": (w.sends_user.tobytes(), bytes(w.sends_status), w.sends_t.tobytes()),
        "receipts": (gen.receipts_user.tobytes(), bytes(gen.receipts_status), gen.receipts_t.tobytes()),
        "cpu_s": cpu,
    }


# ------------------------------------------------------------------------------- the benchmark


def _split(n: int, parts: int) -> list[int]:
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def _phase(target: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"target": f"bench.reconnect:{target}", "kwargs": kwargs}


async def _load_watchers(
    database_url: str, storm_prefix: str, watcher_prefix: str, args: argparse.Namespace
) -> int:
    from bench.fanout import insert_friendships

    users = [f"{storm_prefix}{i}" for i in range(args.watched)]
    users += [f"{watcher_prefix}{j}" for j in range(args.watchers)]
    a, b = [], []
    for j in range(args.watchers):
        for i in set(watched_by(j, args.watched, args.per_watcher)):
            a.append(f"{watcher_prefix}{j}")
            b.append(f"{storm_prefix}{i}")
    await insert_friendships(database_url, users, a, b)
    return len(a)


def _connect_storm(
    workers: lg.Workers, stage: lg.Stage, side: lg.Side, target: lg.ServerProcess, args: argparse.Namespace
) -> dict[str, Any]:
    """The storm's sockets on the server about to die, every one of them (set-up, not measured)."""
    label = f"{side.name}: identify on A" if side.ours else f"{side.name}: connect"
    shares = lg.split(args.sockets, args.generators)
    res = lg.connect_side(
        workers, stage, side, [("127.0.0.1", target.port)], shares,
        group="storm", first_index=STORM_BASE, label=label,
        concurrency=max(1, args.concurrency // len(shares)),
        retries=3,  # set-up, not measured: a reset under 400 connects at once is tried again
    )  # fmt: skip
    connected, seconds = res["connected"], res["seconds"]
    stage.log(f"{label}: {connected:,} connected in {seconds:.1f} s ({res['per_s']:,.0f}/s)")
    if res["failed"]:
        raise RuntimeError(f"{label}: only {connected:,} of {sum(shares):,} connected: {res['errors']}")
    return {"connected": connected, "seconds": seconds, "per_s": res["per_s"]}


def _arm(
    workers: lg.Workers, survivor: lg.ServerProcess, identify: bool, args: argparse.Namespace, path: str
) -> tuple[list[int], dict[str, float]]:
    """Every storm socket waits for its connection to be lost, its reconnect ready (tokens minted:
    a burst of CPU in the generators, done before the load's measured window); then the
    survivor's /metrics, the storm's starting point."""
    armed: list[int] = workers.call(
        "phase",
        _phase(
            "storm_arm",
            {
                "group": "storm",
                "host": "127.0.0.1",
                "port": survivor.port,
                "path": path,
                "identify": identify,
                "seed": args.seed,
                "connect_timeout_s": args.connect_timeout_s,
                "give_up_s": args.storm_timeout_s,
            },
        ),
    )
    return armed, _metrics(survivor)


def _start_spies(
    args: argparse.Namespace, survivor: lg.ServerProcess, shard_pids: list[int] | None
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """With `--profile`, py-spy on the surviving edge and on shard 0 from the kill (ours only)."""
    if args.profile is None or shard_pids is None:
        return []
    return [
        (lg.start_profile(path, pid, args.profile_s), path)
        for name, pid in (("edge", survivor.pid), ("shard0", (shard_pids or [0])[0]))
        if pid
        for path in [args.profile / f"storm-{name}-pyspy.txt"]
    ]


def _finish_spies(args: argparse.Namespace, spies: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    for spy, path in spies:
        spy.wait(args.profile_s + 60)
        lg.summarize_profile(path)


def _run_storm(
    workers: lg.Workers,
    stage: lg.Stage,
    label: str,
    pair: tuple[lg.ServerProcess, lg.ServerProcess],
    args: argparse.Namespace,
    armed: tuple[list[int], dict[str, float]],
    shard_pids: list[int] | None = None,
) -> dict[str, Any]:
    """Kill the first of `pair` under its armed sockets (`_arm`), wait until every socket is back on
    the second; with `shard_pids`, the shards' CPU meanwhile too."""
    victim, survivor = pair
    counts, metrics0 = armed
    spies = _start_spies(args, survivor, shard_pids)
    cpu0, shards0 = survivor.cpu_seconds(), fanout.cpu_of(shard_pids or [])
    killed_at = time.monotonic()
    os.kill(victim.pid, signal.SIGKILL)
    stage.log(f"{label}: killed {victim.label} (SIGKILL) under {sum(counts):,} sockets")
    res = workers.call(
        "phase",
        _phase("storm_wait", {"timeout_s": args.storm_timeout_s + 30}),
        timeout=args.storm_timeout_s + 90,
        on_progress=stage.progress(f"{label}: back", sum(counts)),
    )
    cpu, cpu_at = survivor.cpu_seconds() - cpu0, time.monotonic()
    shards_cpu = fanout.cpu_of(shard_pids or []) - shards0
    victim.proc.wait(10)
    metrics1 = _metrics(survivor)
    _finish_spies(args, spies)
    out = _storm_figures(res, killed_at)
    out |= {
        "sockets": sum(counts),
        "server_cpu_s": cpu,
        "server_cpu_cores": cpu / (cpu_at - killed_at),  # from the kill until all were back
        "shards_cpu_cores": shards_cpu / (cpu_at - killed_at) if shard_pids else None,
        "metrics": _metrics_delta(metrics0, metrics1),
    }
    retries = sum(int(k) * v for k, v in out["attempts"].items()) - out["back"]
    stage.log(
        f"{label}: {out['back']:,}/{sum(counts):,} back in {out['seconds']:.2f} s "
        f"(p50 {lg.fmt_ms(out['per_socket_ms']['p50'])} ms per socket), {retries:,} "
        f"retries, {out['failed']} given up; survivor CPU {out['server_cpu_cores']:.2f} cores"
    )
    return out


def _storm_figures(res: list[dict[str, Any]], killed_at: float) -> dict[str, Any]:
    """What the generators saw of one storm, from the kill: per socket and in all."""
    ready, lost, attempts = array("d"), array("d"), array("i")
    errors: dict[str, int] = {}
    for r in res:
        ready.frombytes(r["ready_at"])
        lost.frombytes(r["lost_at"])
        attempts.frombytes(r["attempts"])
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    per_socket = [t - killed_at for t in ready]
    ready_by_s = [0] * (int(max(per_socket, default=0.0)) + 1)
    for t in per_socket:
        ready_by_s[int(t)] += 1
    histogram: dict[str, int] = {}
    for a in attempts:
        histogram[str(a)] = histogram.get(str(a), 0) + 1
    return {
        "back": len(ready),
        "failed": sum(r["failed"] for r in res),
        "seconds": max(ready, default=math.nan) - killed_at,
        "per_socket_ms": lg.summary_ms(per_socket),
        "lost_noticed_ms": lg.summary_ms([t - killed_at for t in lost]),
        "attempts": dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
        "errors": errors,
        "generator_cpu_s": sum(r["cpu_s"] for r in res),
        "killed_at": killed_at,
        "ready_by_s": ready_by_s,
    }


@dataclass(frozen=True)
class _Accounts:
    """The account ids of one run: the storm's, the watchers' and the fan-out load's."""

    storm: str
    watchers: str
    load: str

    @classmethod
    def fresh(cls) -> _Accounts:
        tag = secrets.token_hex(3)
        return cls(f"rc-{tag}-", f"rw-{tag}-", f"rl-{tag}-")


def run(args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage) -> dict[str, Any]:
    accounts = _Accounts.fresh()
    out: dict[str, Any] = {"generators": args.generators}
    stage.log(f"loading {args.watchers} watchers x {args.per_watcher} and {args.load_accounts} load accounts")
    out["friendships"] = asyncio.run(
        fanout.load_graph(
            env.database_url, accounts.load, args.load_accounts, args.load_subscriptions, None, ""
        )
    ) + asyncio.run(_load_watchers(env.database_url, accounts.storm, accounts.watchers, args))
    with lg.Workers(args.generators, {"secret": env.secret}) as storm:
        out |= _bare(args, env, stage, storm)
        out |= _ours(args, env, stage, storm, accounts)
    return out


def _bare(args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage, storm: lg.Workers) -> dict[str, Any]:
    """The same clients, the same seeds, two echo servers: the first is killed under them."""
    stage.log(f"bare: {args.sockets:,} sockets on a websockets echo server, then it is killed")
    with env.serving(env.start_echo(), env.start_echo()) as (first, second):
        connect = _connect_storm(storm, stage, lg.Side("bare", hello=HELLO), first, args)
        bare = _run_storm(storm, stage, "bare", (first, second), args, _arm(storm, second, False, args, "/"))
        bare.pop("killed_at")
        storm.call("close", {"group": "storm", "timeout": 10.0})
    return {"bare_connect": connect, "bare": bare}


def _ours(
    args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage, storm: lg.Workers, accounts: _Accounts
) -> dict[str, Any]:
    """Edges A and B: the storm's sockets identified on A, watchers and the fan-out load on B;
    A is killed under them while the load runs."""
    stage.log("ours: edges A and B")
    edges = (env.start_edge(edge_env()), env.start_edge(edge_env()))
    with env.serving(*edges), lg.Workers(1, {"secret": env.secret}) as observers:
        out = {"observers": _observers_on(args, stage, observers, edges[1], accounts)}
        storm.call("heartbeats", {"group": "storm", "interval_s": HEARTBEAT_S})
        out["ours_connect"] = _connect_storm(storm, stage, lg.Side("ours", accounts.storm), edges[0], args)
        _watched_go_idle(args, stage, storm, observers, accounts)
        # Armed before the load starts: minting 19,000 tokens is a burst of the generators' CPU
        # that would otherwise land in the last second before the kill.
        armed = _arm(storm, edges[1], True, args, lg.WS_PATH)
        start_at = time.monotonic() + 0.5
        observers.call("phase", _phase("load_start", {"start_at": start_at, "rate": args.load_rate}))
        time.sleep(max(0.0, start_at + args.before_s - time.monotonic()))
        ours = _run_storm(storm, stage, "ours", edges, args, armed, fanout.pool_pids()["shards"])
        killed_at = ours.pop("killed_at")
        end = _shown_online(args, stage, observers, ours, killed_at)
        time.sleep(max(0.0, end + args.after_s - time.monotonic()))
        load = observers.call("phase", _phase("load_stop", {"drain_s": 1.0}))[0]
        out["ours"] = ours
        out["fanout"] = _fanout_windows(load, args.load_subscriptions, killed_at, end)
        storm.call("close", {"group": "storm", "timeout": 10.0})
        observers.call("close", {"group": "watchers"})
        observers.call("close", {"group": "fanout"})
    return out


def _observers_on(
    args: argparse.Namespace,
    stage: lg.Stage,
    observers: lg.Workers,
    edge_b: lg.ServerProcess,
    accounts: _Accounts,
) -> dict[str, Any]:
    """On B: the fan-out load's accounts and the watchers, all subscribed."""
    stage.log(
        f"on B: {args.load_accounts} load accounts x {args.load_subscriptions}, {args.watchers} watchers"
    )
    setup = {
        "host": "127.0.0.1",
        "port": edge_b.port,
        "load_prefix": accounts.load,
        "load_accounts": args.load_accounts,
        "load_subscriptions": args.load_subscriptions,
        "storm_prefix": accounts.storm,
        "watched": args.watched,
        "watcher_prefix": accounts.watchers,
        "watchers": args.watchers,
        "per_watcher": args.per_watcher,
        "concurrency": min(args.concurrency, 100),
    }
    obs: dict[str, Any] = observers.call("phase", _phase("observers_setup", setup))[0]
    if obs["load_subscribed"] < args.load_accounts or obs["watchers_synced"] < args.watchers:
        raise RuntimeError(f"set-up on B incomplete: {obs}")
    return obs


def _wait_kw(args: argparse.Namespace) -> dict[str, Any]:
    return {"watched": args.watched, "watchers": args.watchers, "per_watcher": args.per_watcher}


def _watched_go_idle(
    args: argparse.Namespace, stage: lg.Stage, storm: lg.Workers, observers: lg.Workers, accounts: _Accounts
) -> None:
    """The watched accounts go idle on A; returns once every watcher has seen it."""
    idle_kw = {"group": "storm", "status": "idle", "prefix": accounts.storm, "below": args.watched}
    storm.call("phase", _phase("send_status", idle_kw))
    idle = observers.call(
        "phase",
        _phase("observers_wait", {"status": "idle", "since": 0.0, "timeout_s": 60.0, **_wait_kw(args)}),
    )[0]
    if idle["missing"]:
        raise RuntimeError(f"{idle['missing']} watcher pairs never saw their account go idle")
    stage.log(f"{idle['pairs']:,} watcher pairs see the watched accounts idle; load starts")


def _shown_online(
    args: argparse.Namespace, stage: lg.Stage, observers: lg.Workers, ours: dict[str, Any], killed_at: float
) -> float:
    """Wait until every watcher saw its accounts online again; adds that to `ours`; returns when
    the storm ended (the later of identified and shown online)."""
    shown = observers.call(
        "phase",
        _phase(
            "observers_wait", {"status": "online", "since": killed_at, "timeout_s": 60.0, **_wait_kw(args)}
        ),
        timeout=120,
    )[0]
    shown_at = [t - killed_at for t in shown["account_shown_at"]]
    t_shown = killed_at + max(shown_at, default=math.nan)
    end = max(killed_at + ours["seconds"], t_shown)
    ours["shown_online"] = {
        "pairs": shown["pairs"],
        "missing": shown["missing"],
        "seconds": t_shown - killed_at,
        "per_account_ms": lg.summary_ms(shown_at),
        "offline_flaps": shown["offline_after"],
    }
    ours["storm_s"] = end - killed_at
    stage.log(
        f"ours: every watched account shown online again after {t_shown - killed_at:.2f} s "
        f"({shown['missing']} pairs missing, {shown['offline_after']} offline frames)"
    )
    return end


def _metrics(server: lg.ServerProcess) -> dict[str, float]:
    """The survivor's /metrics samples (an edge's: its own and its shards'), {} for the bare one."""
    if not isinstance(server, lg.EdgeProcess):
        return {}
    try:
        text = server.metrics_text()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or "_bucket{" in line:
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


# What of the survivor's /metrics the storm changed, kept in the results (the causes of waiting).
_METRICS_KEPT = (
    "opening",
    "gc_pause",
    "edge_batch_ops",
    "edge_actor_call",
    "edge_delivery",
    "edge_pull",
    "shard_",
)


def _metrics_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counts and sums as the storm's increase; maxima as they are after it."""
    out: dict[str, float] = {}
    for name, value in after.items():
        if not any(k in name for k in _METRICS_KEPT):
            continue
        base = name.split("{", 1)[0]
        if base.endswith("_max"):
            if value != before.get(name):
                out[name] = value
        elif value != before.get(name, 0.0):
            out[name] = value - before.get(name, 0.0)
    return out


def _fanout_windows(load: dict[str, Any], subscriptions: int, killed_at: float, end: float) -> dict[str, Any]:
    d = fanout.match_deliveries([load])
    before, storm, after = array("d"), array("d"), array("d")
    for sent, lat in zip(d.sent_at, d.latency, strict=True):
        (before if sent < killed_at else storm if sent <= end else after).append(lat)
    expected = d.changes * subscriptions
    # Per second from the kill: when the deliveries waited (which part of the storm).
    by_s: dict[int, array[float]] = {}
    for sent, lat in zip(d.sent_at, d.latency, strict=True):
        if sent <= end:  # before the kill too (negative seconds), to compare
            by_s.setdefault(math.floor(sent - killed_at), array("d")).append(lat)
    timeline = [{"s": k, **lg.summary_ms(v)} for k, v in sorted(by_s.items())]
    return {
        "storm_by_s": timeline,
        "changes": d.changes,
        "deliveries_expected": expected,
        "deliveries_received": d.received - d.unmatched,
        "delivered_fraction": (d.received - d.unmatched) / expected if expected else math.nan,
        "before_ms": lg.summary_ms(before),
        "storm_ms": lg.summary_ms(storm),
        "after_ms": lg.summary_ms(after),
        "generator_cpu_s": load["cpu_s"],
    }


# ------------------------------------------------------------------------------- report


def _figures(args: argparse.Namespace, m: dict[str, Any]) -> dict[str, Any]:
    """Ours / bare and the targets' verdicts."""
    bare, ours = m["bare"], m["ours"]
    complete = ours["failed"] == 0 and ours["shown_online"]["missing"] == 0 and bare["failed"] == 0
    ratio = ours["storm_s"] / bare["seconds"] if bare["seconds"] > 0 else math.nan
    storm_p99 = m["fanout"]["storm_ms"]["p99"]
    return {
        "ratio": ratio,
        "ratio_identified": ours["seconds"] / bare["seconds"] if bare["seconds"] > 0 else math.nan,
        # At --quick size the storm fits in the first jitter window: no figure for the targets.
        "met_ratio": None if args.quick else ratio <= TARGET_RATIO and complete,
        "met_p99": None if args.quick else storm_p99 < TARGET_FANOUT_P99_MS and complete,
        "storm_p99": storm_p99,
    }


def report(args: argparse.Namespace, m: dict[str, Any], runtime: float, started_at: str) -> int:
    info = machine_info()
    f = _figures(args, m)
    _print(args, m, info, f)
    payload = {
        **results.run_record(NAME, started_at, runtime, info, args),
        **m,
        "ratio": f["ratio"],
        "ratio_identified": f["ratio_identified"],
        "targets": [
            results.target(
                "reconnect storm: ours / bare server",
                f["ratio"],
                "ratio",
                f"≤ {TARGET_RATIO:g}",
                f["met_ratio"],
            ),
            results.target(
                "fan-out p99 during the storm",
                f["storm_p99"],
                "ms",
                f"< {TARGET_FANOUT_P99_MS:g}",
                f["met_p99"],
            ),
        ],
    }
    results.record(NAME, payload, args, RESULTS_TITLE, _columns(args, m, info, f, runtime))
    print(f"runtime {runtime:.1f} s")
    return 0


RESULTS_TITLE = (
    "Reconnect storm: an edge holding N identified sockets is killed (SIGKILL); every client reconnects "
    "to the other edge with presence_client's jittered backoff, same seeds, beside a bare websockets "
    "server taking the same storm. Times from the kill until every socket is identified and every "
    "watched account is shown online again to its watchers; fan-out p99 on B during the storm."
)


def _columns(
    args: argparse.Namespace, m: dict[str, Any], info: dict[str, Any], f: dict[str, Any], runtime: float
) -> results.Columns:
    bare, ours, fo = m["bare"], m["ours"], m["fanout"]
    return [
        *results.lead_columns(info),
        ("sockets", f"{args.sockets:,}"),
        ("bare s", f"{bare['seconds']:.2f}"),
        ("ours identified s", f"{ours['seconds']:.2f}"),
        ("ours shown online s", f"{ours['shown_online']['seconds']:.2f}"),
        ("ours/bare", f"{f['ratio']:.2f}x"),
        ("fan-out p99 before/storm ms", f"{lg.fmt_ms(fo['before_ms']['p99'])}/{lg.fmt_ms(f['storm_p99'])}"),
        ("CPU edge B/shards", f"{ours['server_cpu_cores']:.2f}/{ours['shards_cpu_cores']:.2f}"),
        ("target ≤ 2x", results.met_text(f["met_ratio"])),
        ("target p99 < 100 ms", results.met_text(f["met_p99"])),
        ("runtime", f"{runtime:.0f} s"),
    ]


def _print(args: argparse.Namespace, m: dict[str, Any], info: dict[str, Any], f: dict[str, Any]) -> None:
    print(
        f"\npresence bench reconnect on {machine_summary(info)} (commit {info['commit']}): {args.sockets:,} "
        f"sockets on the server killed (SIGKILL), reconnecting with presence_client.reconnect_delay "
        f"(seed {args.seed}); on B {args.watchers} watchers of {args.watched:,} accounts and "
        f"{args.load_accounts} load accounts x {args.load_subscriptions} at {args.load_rate:g} changes/s\n"
    )
    _print_table(m["bare"], m["ours"])
    bare, ours, fo = m["bare"], m["ours"], m["fanout"]
    print(
        f"\nours / bare: {f['ratio']:.2f}x (identified and shown online; identified alone "
        f"{f['ratio_identified']:.2f}x); "
        f"offline frames seen by watchers after the kill: {ours['shown_online']['offline_flaps']}"
    )
    print(
        f"set-up connects (before any storm, {args.concurrency} in flight): bare "
        f"{m['bare_connect']['per_s']:,.0f}/s, ours (identify on A) {m['ours_connect']['per_s']:,.0f}/s; "
        f"in the storm: bare {bare['back'] / bare['seconds']:,.0f}/s, ours "
        f"{ours['back'] / ours['seconds']:,.0f}/s"
    )
    print(
        f"CPU during the storm (cores): edge B {ours['server_cpu_cores']:.2f}, shards "
        f"{ours['shards_cpu_cores']:.2f}; the bare server {bare['server_cpu_cores']:.2f}"
    )
    print(
        f"fan-out on B ({fo['changes']:,} changes, {fo['delivered_fraction']:.2%} delivered): p99 before the "
        f"kill {lg.fmt_ms(fo['before_ms']['p99'])} ms, during the storm {lg.fmt_ms(f['storm_p99'])} ms "
        f"(n {fo['storm_ms']['n']:,}), after {lg.fmt_ms(fo['after_ms']['p99'])} ms"
    )
    print(
        f"targets: ours ≤ {TARGET_RATIO:g}x bare: {results.met_text(f['met_ratio'])}; fan-out p99 during the "
        f"storm < {TARGET_FANOUT_P99_MS:g} ms: {results.met_text(f['met_p99'])}"
    )


def _print_table(bare: dict[str, Any], ours: dict[str, Any]) -> None:
    rows = [
        [
            label,
            f"{r['back']:,}/{r['sockets']:,}",
            f"{r['seconds']:.2f}",
            lg.fmt_ms(r["per_socket_ms"]["p50"]),
            lg.fmt_ms(r["per_socket_ms"]["p99"]),
            f"{sum(int(k) * v for k, v in r['attempts'].items()) - r['back']:,}",
            f"{r['server_cpu_cores']:.2f}",
        ]
        for label, r in (
            ("bare websockets echo (uvloop)", bare),
            ("ours: presence edge B (identified)", ours),
        )
    ]
    shown = ours["shown_online"]
    rows.append(
        [
            "ours: shown online again to every watcher",
            f"{shown['pairs'] - shown['missing']:,}/{shown['pairs']:,} pairs",
            f"{shown['seconds']:.2f}",
            lg.fmt_ms(shown["per_account_ms"]["p50"]),
            lg.fmt_ms(shown["per_account_ms"]["p99"]),
            "-",
            "-",
        ]
    )
    results.print_table(["server", "back", "all back s", "p50 ms", "p99 ms", "retries", "CPU cores"], rows)
