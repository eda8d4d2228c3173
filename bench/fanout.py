"""`presence bench fanout`: how long a status change takes to reach every subscriber.

The load: `--accounts` connected accounts (10,000), each subscribed to `--subscriptions` others
(50) and watched by as many (account i subscribes to i+1 … i+50 on a ring, and each such pair
is an accepted friendship in PostgreSQL, so the audience rule lets every change through), and
`--rate` status changes per second (200, so 10,000 deliveries per second). Generator processes
hold all the sockets, split over `--edges` edges (`presence edge` processes joined to the pool
this benchmark starts); account i sits on edge i mod edges, so changes cross edges.

Nothing is added to the wire (the contract is fixed). Each generator changes its own accounts'
statuses round robin, alternating `idle` and `online` per account, and records the send time of
each (account, change number, status); every socket records the receive time of each
`presence.changed` (account, status) it gets. A receipt belongs to the latest change of that
account to that status sent before it, so latency = receive - send, both read from the same
monotonic clock of this machine. Deliveries expected = changes x subscribers per account; the
table says how many arrived within `--drain-s` after the last change.

    presence bench fanout [--accounts 10000] [--subscriptions 50] [--rate 200] [--seconds 30]
                          [--edges 1] [--generators 2] [--quick] [--no-record]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import math
import secrets
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import loadgen as lg
from bench.results import machine_info, machine_summary

if TYPE_CHECKING:
    from cluster.config import Settings

NAME = "fanout"
TARGET_P99_MS = 50.0


@dataclass
class Queries:
    """The query load `bench query` adds on top of the fanout load."""

    queriers: int
    ids: int
    rate: float
    timeout_s: float = 5.0
    # A bare server answering the same queries (bench.query_server), asked beside ours.
    bare_target: tuple[str, int] | None = None


def add_load_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--accounts", type=int, default=10_000, help="connected accounts (default 10,000)")
    p.add_argument("--subscriptions", type=int, default=50, help="subscriptions per account (default 50)")
    p.add_argument("--rate", type=float, default=200.0, help="status changes per second (default 200)")
    p.add_argument("--seconds", type=float, default=30.0, help="measured seconds (default 30)")
    p.add_argument(
        "--drain-s", type=float, default=3.0, help="wait for late deliveries after the last change"
    )
    p.add_argument(
        "--edges",
        type=int,
        default=1,
        help="`presence edge` processes (default 1)",
    )
    p.add_argument("--generators", type=int, default=2, help="load-generator processes (default 2)")
    p.add_argument("--concurrency", type=int, default=100, help="connects in flight over all generators")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="py-spy profiles of the first edge and of shard 0 during the window, into DIR",
    )


def quick_load(args: argparse.Namespace) -> None:
    args.accounts, args.subscriptions, args.rate, args.seconds = 1_000, 20, 50.0, 5.0
    args.drain_s, args.edges, args.generators = 1.0, 1, 1


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench fanout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_load_args(p)
    lg.add_common_args(p)
    args = p.parse_args(argv)
    if args.quick:
        quick_load(args)
    check_load_args(p, args)
    return args


def check_load_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.subscriptions * 2 >= args.accounts:
        p.error("--subscriptions must be under half of --accounts (the ring would wrap onto itself)")
    if args.accounts / args.generators > 18_000:
        p.error("too many sockets per generator process (20,000 open files each): raise --generators")
    if args.accounts / args.edges > 18_000:
        p.error("too many sockets per edge (20,000 open files per process): raise --edges")


def main(argv: list[str], settings: Settings) -> int:
    return lg.main_in_env(NAME, parse(argv), settings, run_load, report)


# ------------------------------------------------------------------------------- the load


async def load_graph(
    database_url: str, prefix: str, accounts: int, subscriptions: int, queries: Queries | None, q_prefix: str
) -> int:
    """Accounts and friendships: every subscription pair, and each querier with its query ids."""

    pairs_a: list[str] = []
    pairs_b: list[str] = []
    for i in range(accounts):
        for t in lg.fanout_targets(i, accounts, subscriptions):
            pairs_a.append(f"{prefix}{i}")
            pairs_b.append(f"{prefix}{t}")
    users = [f"{prefix}{i}" for i in range(accounts)]
    if queries is not None:
        users += [f"{q_prefix}{j}" for j in range(queries.queriers)]
        for j in range(queries.queriers):
            for t in lg.query_targets(j, accounts, queries.ids):
                pairs_a.append(f"{q_prefix}{j}")
                pairs_b.append(f"{prefix}{t}")
    await insert_friendships(database_url, users, pairs_a, pairs_b)
    return len(pairs_a)


async def insert_friendships(database_url: str, users: list[str], a: list[str], b: list[str]) -> None:
    """The accounts and the friendships (a[k], b[k]) in one transaction, then fresh statistics."""
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            await conn.execute(
                "INSERT INTO users (id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING", users
            )
            # PostgreSQL orders each pair itself (the table wants a < b in its own collation).
            await conn.execute(
                """INSERT INTO friendships (a, b)
                   SELECT LEAST(x, y), GREATEST(x, y) FROM unnest($1::text[], $2::text[]) AS p(x, y)
                   ON CONFLICT DO NOTHING""",
                a,
                b,
            )
        await conn.execute("ANALYZE friendships")
    finally:
        await conn.close()


def pool_pids() -> dict[str, list[int]]:
    """PIDs of this benchmark's PresenceActor and FlushActor processes (Ray workers under the
    raylet this process started), for CPU accounting."""
    import psutil

    out: dict[str, list[int]] = {"shards": [], "flush": []}
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if cmd.startswith("ray::_PresenceActor"):
            out["shards"].append(p.pid)
        elif cmd.startswith("ray::_FlushActor"):
            out["flush"].append(p.pid)
    return out


def cpu_of(pids: list[int]) -> float:
    """CPU seconds used so far by these processes (those gone count 0)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += lg.cpu_seconds(pid)
    return total


def run_load(
    args: argparse.Namespace,
    env: lg.BenchEnv,
    stage: lg.Stage,
    queries: Queries | None = None,
    beside: Callable[[float, float], Callable[[], dict[str, Any]]] | None = None,
    on_prefix: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Set the load up, run it for `args.seconds`, and measure. `beside(start_at, seconds)` starts
    something that runs in the same window (the Redis baseline of `bench query`) and returns a
    function that collects its result; `on_prefix` is told the accounts' id prefix (fresh per run,
    so runs on the same database never meet)."""
    tag = secrets.token_hex(3)
    prefix, q_prefix = f"fo-{tag}-", f"fq-{tag}-"
    if on_prefix is not None:
        on_prefix(prefix)
    out: dict[str, Any] = {}
    stage.log(
        f"loading {args.accounts:,} accounts and their friendships"
        + (f", {queries.queriers} queriers" if queries else "")
    )
    t = time.monotonic()
    out["friendships"] = asyncio.run(
        load_graph(env.database_url, prefix, args.accounts, args.subscriptions, queries, q_prefix)
    )
    out["load_graph_s"] = time.monotonic() - t
    stage.log(f"starting {args.edges} edge process(es)")
    edges = [env.start_edge() for _ in range(args.edges)]
    targets = [("127.0.0.1", e.port) for e in edges]
    with lg.Workers(args.generators, {"secret": env.secret}) as workers:
        total = args.accounts + (queries.queriers if queries else 0)
        stage.log(f"connecting {total:,} sockets and subscribing each account to {args.subscriptions}")
        setup = workers.call(
            "fanout_setup",
            {
                "targets": targets,
                "prefix": prefix,
                "accounts": args.accounts,
                "subscriptions": args.subscriptions,
                "concurrency": max(1, args.concurrency // args.generators),
                "queriers": queries.queriers if queries else 0,
                "query_prefix": q_prefix,
                "bare_query_target": queries.bare_target if queries else None,
            },
            on_progress=stage.progress("connect + subscribe", args.accounts),
        )
        connected = sum(r["connected"] for r in setup)
        subscribed = sum(r["subscribed"] for r in setup)
        out["setup"] = {
            "connected": connected,
            "subscribed": subscribed,
            "failed": sum(r["failed"] for r in setup),
            "errors": [r["errors"] for r in setup] + [r["subscribe_errors"] for r in setup],
            "connect_s": max(r["connect_s"] for r in setup),
            "subscribe_s": max(r["subscribe_s"] for r in setup),
            "queriers": sum(r.get("queriers", 0) for r in setup),
            "queriers_bare": sum(r.get("queriers_bare", 0) for r in setup),
        }
        stage.log(
            f"{connected:,} connected in {out['setup']['connect_s']:.1f} s, {subscribed:,} subscribed in "
            f"{out['setup']['subscribe_s']:.1f} s"
        )
        if connected < args.accounts or subscribed < connected:
            raise RuntimeError(f"set-up incomplete: {out['setup']}")
        time.sleep(1.0 if args.quick else 2.0)  # frames of the set-up (accounts coming online) drain
        start_at = time.monotonic() + 1.0
        collect = beside(start_at, args.seconds) if beside is not None else None
        pids = pool_pids()
        cpu0 = {
            "edges": sum(e.cpu_seconds() for e in edges),
            "shards": cpu_of(pids["shards"]),
            "flush": cpu_of(pids["flush"]),
        }
        stage.log(
            f"running: {args.rate:g} changes/s for {args.seconds:g} s"
            + (f", {queries.rate:g} queries/s of {queries.ids} ids" if queries else "")
        )
        spies = []
        if args.profile is not None:
            spies = [
                (
                    lg.start_profile(args.profile / f"{stage.bench}-{label}-pyspy.txt", pid, args.seconds),
                    label,
                )
                for label, pid in (("edge", edges[0].pid), ("shard0", (pids["shards"] or [0])[0]))
                if pid
            ]
        per_gen = args.rate / args.generators
        ticker = _Ticker(stage, start_at, args.seconds)
        res = workers.call(
            "fanout_run",
            {
                "start_at": start_at,
                "seconds": args.seconds,
                "rate": per_gen,
                "drain_s": args.drain_s,
                "query_rate": (queries.rate / args.generators) if queries else 0.0,
                "query_ids": queries.ids if queries else 0,
                "accounts": args.accounts,
                "query_timeout_s": queries.timeout_s if queries else 5.0,
            },
            timeout=args.seconds + args.drain_s + 120,
            on_progress=None,
            tick=ticker,
        )
        ticker.done()
        for spy, label in spies:
            if spy is not None:
                spy.wait(60)
                lg.summarize_profile(args.profile / f"{stage.bench}-{label}-pyspy.txt")
        wall = max(r["wall_s"] for r in res)
        window = args.seconds + args.drain_s
        cpu = {
            "edges": (sum(e.cpu_seconds() for e in edges) - cpu0["edges"]) / window,
            "shards": (cpu_of(pids["shards"]) - cpu0["shards"]) / window,
            "flush": (cpu_of(pids["flush"]) - cpu0["flush"]) / window,
            "generators": sum(r["cpu_s"] for r in res) / wall,
        }
        out["cpu_cores"] = cpu
        out["beside"] = collect() if collect is not None else None
        stage.log("computing latencies")
        out.update(_latencies(res, args.subscriptions))
        out["queries"] = _query_results(res) if queries else None
        out["bare_queries"] = _query_results(res, "bare_") if queries and queries.bare_target else None
        out["open_at_end"] = sum(r["open"] for r in res)
        workers.call("close", {"group": "fanout"})
        if queries:
            workers.call("close", {"group": "queriers"})
            workers.call("close", {"group": "queriers_bare"})
    for e in edges:
        env.stop(e)
    return out


class _Ticker:
    """Progress of a timed window on stderr while the generators run it."""

    def __init__(self, stage: lg.Stage, start_at: float, seconds: float) -> None:
        from bench.results import Progress

        self.start_at, self.seconds = start_at, seconds
        self.bar = Progress(f"{stage.bench}: run", 100)

    def __call__(self) -> None:
        now = time.monotonic()
        done = min(100, max(0, int((now - self.start_at) / self.seconds * 100)))
        self.bar.update(done, f"{max(0.0, now - self.start_at):.0f}/{self.seconds:g} s", now)

    def done(self) -> None:
        self.bar.done("window measured")


@dataclass
class Deliveries:
    """Every receipt matched to its change (`match_deliveries`)."""

    changes: int
    received: int
    unmatched: int
    first_sent: float  # the first change's send time (0.0 when none)
    sent_at: array[float]  # per matched receipt: when its change was sent (monotonic)
    latency: array[float]  # per matched receipt: receive - send, seconds


def match_deliveries(res: list[dict[str, Any]]) -> Deliveries:
    """Match every receipt to the latest change of that account to that status sent before it
    (generators' `sends` and `receipts`, the same monotonic clock)."""
    sends: dict[int, tuple[list[float], list[int]]] = {}
    n_sends = 0
    for r in res:
        users, statuses, times = r["sends"]
        u, t = array("i"), array("d")
        u.frombytes(users)
        t.frombytes(times)
        n_sends += len(u)
        for k in range(len(u)):
            entry = sends.setdefault(u[k], ([], []))
            entry[0].append(t[k])
            entry[1].append(statuses[k])
    sent_at, latency = array("d"), array("d")
    unmatched = 0
    received = 0
    for r in res:
        users, statuses, times = r["receipts"]
        u, t = array("i"), array("d")
        u.frombytes(users)
        t.frombytes(times)
        received += len(u)
        for k in range(len(u)):
            sent = sends.get(u[k])
            if sent is None:
                unmatched += 1
                continue
            ts, ss = sent
            i = bisect.bisect_right(ts, t[k]) - 1
            while i >= 0 and ss[i] != statuses[k]:
                i -= 1
            if i < 0:
                unmatched += 1
                continue
            sent_at.append(ts[i])
            latency.append(t[k] - ts[i])
    first = min((ts[0] for ts, _ in sends.values() if ts), default=0.0)
    return Deliveries(n_sends, received, unmatched, first, sent_at, latency)


def _latencies(res: list[dict[str, Any]], subscriptions: int) -> dict[str, Any]:
    """Match every receipt to its change; latencies and delivery counts."""
    d = match_deliveries(res)
    by_second: dict[int, array[float]] = {}
    for sent, lat in zip(d.sent_at, d.latency, strict=True):
        by_second.setdefault(int(sent - d.first_sent), array("d")).append(lat)
    expected = d.changes * subscriptions
    return {
        "changes": d.changes,
        "deliveries_expected": expected,
        "deliveries_received": d.received - d.unmatched,
        "receipts_unmatched": d.unmatched,
        "delivered_fraction": (d.received - d.unmatched) / expected if expected else math.nan,
        "latency_ms": lg.summary_ms(d.latency),
        # By the second of the window the change was sent in: shows whether a bad p99 is a
        # steady queue or a few stalls (and when they happen).
        "latency_ms_by_second": [
            {"second": sec, **lg.summary_ms(by_second[sec])} for sec in sorted(by_second)
        ],
    }


def _query_results(res: list[dict[str, Any]], side: str = "") -> dict[str, Any]:
    """Queries answered, failed and their latencies; `side` "bare_": those to the bare server."""
    lat = [x for r in res for x in r[f"{side}query_latencies"]]
    failures: dict[str, int] = {}
    for r in res:
        for k, v in r[f"{side}query_failures"].items():
            failures[k] = failures.get(k, 0) + v
    return {
        "answered": len(lat),
        "failed": failures,
        "skipped_busy": sum(r["query_skipped"] for r in res),
        "latency_ms": lg.summary_ms(lat),
    }


# ------------------------------------------------------------------------------- report


def report(args: argparse.Namespace, m: dict[str, Any], runtime: float, started_at: str) -> int:
    info = machine_info()
    lat = m["latency_ms"]
    met = lat["p99"] < TARGET_P99_MS and m["delivered_fraction"] >= 0.999
    print(
        f"\npresence bench fanout on {machine_summary(info)} (commit {info['commit']}): {args.accounts:,} "
        f"accounts x {args.subscriptions} subscriptions, {args.rate:g} changes/s "
        f"({args.rate * args.subscriptions:,.0f} deliveries/s) for {args.seconds:g} s, {args.edges} edge(s), "
        f"{args.generators} generator processes\n"
    )
    lg.print_table(
        ["changes", "deliveries expected", "delivered", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"],
        [
            [
                f"{m['changes']:,}",
                f"{m['deliveries_expected']:,}",
                f"{m['deliveries_received']:,} ({m['delivered_fraction']:.2%})",
                lg.fmt_ms(lat["p50"]),
                lg.fmt_ms(lat["p90"]),
                lg.fmt_ms(lat["p99"]),
                lg.fmt_ms(lat["p999"]),
                lg.fmt_ms(lat["max"]),
            ]
        ],
        align_left=0,
    )
    cpu = m["cpu_cores"]
    print(
        f"\nCPU during the window (cores): edges {cpu['edges']:.2f}, shards {cpu['shards']:.2f}, "
        f"FlushActor {cpu['flush']:.2f}, load generators {cpu['generators']:.2f}"
    )
    print(
        f"set-up: {m['setup']['connected']:,} connected in {m['setup']['connect_s']:.1f} s, subscribed in "
        f"{m['setup']['subscribe_s']:.1f} s; {m['friendships']:,} friendships loaded in "
        f"{m['load_graph_s']:.1f} s"
    )
    print(f"target p99 < {TARGET_P99_MS:g} ms with every delivery made: {lg.met_text(met)}")
    payload = {
        "benchmark": NAME,
        "started_at": started_at,
        "runtime_s": round(runtime, 1),
        "machine": info,
        "args": lg.args_json(args),
        **m,
        "targets": [lg.target("fanout latency p99", lat["p99"], "ms", f"< {TARGET_P99_MS:g}", met)],
    }
    lg.finish(
        NAME,
        payload,
        args,
        "Status change → subscriber latency (send time of the change frame to receive time of each "
        "`presence.changed`, same clock), real sockets through `presence edge` processes into the pool.",
        [
            "date",
            "machine",
            "commit",
            "load",
            "delivered",
            "p50 ms",
            "p99 ms",
            "max ms",
            "CPU edges/shards/generators",
            "target p99 < 50 ms",
            "runtime",
        ],
        [
            lg.info_date(),
            machine_summary(info),
            info["commit"],
            f"{args.accounts:,} x {args.subscriptions}, {args.rate:g}/s, {args.seconds:g} s, "
            f"{args.edges} edges",
            f"{m['delivered_fraction']:.2%}",
            lg.fmt_ms(lat["p50"]),
            lg.fmt_ms(lat["p99"]),
            lg.fmt_ms(lat["max"]),
            f"{cpu['edges']:.2f}/{cpu['shards']:.2f}/{cpu['generators']:.2f}",
            lg.met_text(met),
            f"{runtime:.0f} s",
        ],
    )
    print(f"runtime {runtime:.1f} s")
    return 0


def run(args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage) -> dict[str, Any]:
    """The benchmark's measurement in a given environment (what `bench all` calls)."""
    return run_load(args, env, stage)
