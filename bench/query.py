"""`presence bench query`: `presence.query` for 100 ids under the fanout load, beside the design a
user would deploy instead (a bare websockets server answering the same frames from the seed's Redis
TTL keys with one pipelined `EXISTS`), driven by the same clients in the same window; and beside
the seed's Redis call alone.

The load is `bench fanout`'s (10,000 connected accounts x 50 subscriptions, 200 status changes
per second). On top of it, `--queriers` more accounts (each friends with the `--ids` accounts it
asks about, so every id is in its audience) send `presence.query` for those ids, `--query-rate`
per second in all, round robin, one query at a time per socket, within the per-account query
budget of the contract (600 ids a minute). Each query leaves at a seeded random moment within its
interval (`loadgen.query_moments`): on a grid from the window's start, every query left in step
with a status change (bench/profiles/README.md, "Query: where the milliseconds go"). A query's
latency is from its frame being sent to the last of its answers (one `presence.changed` per id)
being received, at the client.

The fair baseline (`bench.query_server`): a bare `websockets` server (uvloop, compression off,
the edge's settings) answering each `presence.query` with one `presence.changed` per id from one
pipelined `EXISTS presence:<id>` (redis-py asyncio), the answers in one write as ours. Each querier
has a socket to it too and asks it the same ids at the same moments as ours (the two queries of a
tick in turn first), so both see the same machine, load and clients; its latency is measured
like ours, client-side until the last answer. Target (issue 28, bench/targets.py): ours p99 ≤ 1.2x
its p99 in the same run, no query failed on either side (the absolute < 20 ms of earlier rounds is
dropped: the bare server alone measured 13-29 ms p99 on different hours).

The seed's call alone (`bench.baselines_redis`, the seed's `PresenceService`): every account
heartbeats with `SET presence:<id> 1 EX 30` every 30 s (spread evenly; these are the keys the bare
server reads), and `are_online(ids)` is timed for the same id lists at the same rate, from a
process of its own with redis-py, as the seed's service would. Its latency is the Redis call alone
(no client hop, no JSON): a lower bound for that design, kept for comparison with earlier rows.

    presence bench query [--queriers 300] [--ids 100] [--query-rate 20] [--queriers-apart]
                         [fanout load options] [--quick] [--no-record]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench import fanout, results, targets
from bench import loadgen as lg
from bench.results import machine_info, machine_summary

if TYPE_CHECKING:
    from cluster.config import Settings

NAME = "query"
TARGET_RATIO = targets.QUERY_P99_RATIO  # ours p99 / the bare websockets + Redis server's p99
HEARTBEAT_S = 30.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench query", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    fanout.add_load_args(p)
    p.add_argument("--queriers", type=int, default=300, help="querying accounts (default 300)")
    p.add_argument("--ids", type=int, default=100, help="ids per query (default 100, the contract's most)")
    p.add_argument("--query-rate", type=float, default=20.0, help="queries per second in all (default 20)")
    p.add_argument(
        "--queriers-apart",
        action="store_true",
        help="put the queriers in a generator process of their own instead of the fanout load's (where "
        "they also wait for those processes' loops, busy with thousands of deliveries a second)",
    )
    lg.add_common_args(p)
    args = p.parse_args(argv)
    if args.quick:
        fanout.quick_load(args)
        args.queriers, args.query_rate = 100, 10.0
    if len(args.rate) != 1:
        p.error("bench query runs one window: give one --rate")
    fanout.check_load_args(p, args)
    budget_per_s = args.queriers * 600 / 60 / args.ids
    if args.query_rate > budget_per_s:
        p.error(
            f"--query-rate {args.query_rate:g} exceeds the queriers' budget ({budget_per_s:g}/s at 600 ids a "
            "minute each): add --queriers"
        )
    return args


def main(argv: list[str], settings: Settings) -> int:
    return lg.main_in_env(NAME, parse(argv), settings, run, report)


def run(args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage) -> dict[str, Any]:
    stage.log("starting the bare websockets + Redis query server")
    server = env.start_server("bare query server", ["-m", "bench.query_server", "--redis-url", env.redis_url])
    try:
        return _run(args, env, stage, ("127.0.0.1", server.port))
    finally:
        env.stop(server)


def _run(
    args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage, bare: tuple[str, int]
) -> dict[str, Any]:
    queries = fanout.Queries(
        args.queriers, args.ids, args.query_rate, bare_target=bare, own_process=args.queriers_apart
    )
    tag: dict[str, str] = {}

    def beside(start_at: float, seconds: float) -> Callable[[], dict[str, Any]]:
        from bench.baselines_redis import run_baseline

        prefix = tag["prefix"]
        accounts = [f"{prefix}{i}" for i in range(args.accounts)]
        lists = [
            [f"{prefix}{t}" for t in lg.query_targets(j, args.accounts, args.ids)]
            for j in range(args.queriers)
        ]
        ctx = mp.get_context("spawn")
        recv, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=run_baseline,
            args=(env.redis_url, accounts, lists, start_at, seconds, args.query_rate, HEARTBEAT_S, send),
            daemon=True,
        )
        proc.start()
        send.close()

        def collect() -> dict[str, Any]:
            if not recv.poll(seconds + 120):
                proc.terminate()
                raise TimeoutError("the Redis baseline did not answer")
            result: dict[str, Any] = recv.recv()
            proc.join(10)
            if "error" in result:
                raise RuntimeError(f"Redis baseline failed: {result['error']}")
            lat = result.pop("latencies")
            return {**result, "answered": len(lat), "latency_ms": lg.summary_ms(lat)}

        return collect

    return fanout.run_load(args, env, stage, queries, beside, on_prefix=lambda p: tag.update(prefix=p))


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _figures(m: dict[str, Any]) -> dict[str, Any]:
    """The latencies of the three designs, their ratios and the targets' verdicts."""
    q, bq = m["queries"], m["bare_queries"]
    ours, redis, bare = q["latency_ms"], m["beside"]["latency_ms"], bq["latency_ms"]
    failed, bare_failed = sum(q["failed"].values()), sum(bq["failed"].values())
    bare_ratio_p99 = _ratio(ours["p99"], bare["p99"])
    return {
        "ours": ours,
        "redis": redis,
        "bare": bare,
        "failed": failed,
        "bare_failed": bare_failed,
        "met_ratio": bare_ratio_p99 <= TARGET_RATIO and failed == 0 and bare_failed == 0,
        "ratios": {
            "ratio_p50": _ratio(ours["p50"], redis["p50"]),
            "ratio_p99": _ratio(ours["p99"], redis["p99"]),
            "bare_ratio_p50": _ratio(ours["p50"], bare["p50"]),
            "bare_ratio_p99": bare_ratio_p99,
        },
    }


def report(args: argparse.Namespace, m: dict[str, Any], runtime: float, started_at: str) -> int:
    info = machine_info()
    f = _figures(m)
    _print(args, m, info, f)
    payload = {
        **results.run_record(NAME, started_at, runtime, info, args),
        **m,
        **f["ratios"],
        "targets": [
            results.target(
                "query p99: ours / bare websockets + Redis",
                f["ratios"]["bare_ratio_p99"],
                "ratio",
                f"≤ {TARGET_RATIO:g}",
                f["met_ratio"],
            ),
        ],
    }
    results.record(NAME, payload, args, RESULTS_TITLE, _columns(args, info, f, runtime))
    print(f"runtime {runtime:.1f} s")
    return 0


RESULTS_TITLE = (
    "`presence.query` for 100 ids (client-side, until the last answer) under the fanout load, beside a "
    "bare websockets server answering the same frames from Redis (one pipelined EXISTS; same clients, "
    "same window) and beside the seed's Redis call alone (`are_online`, timed around the call)."
)


def _three(lat: dict[str, float]) -> str:
    return f"{lg.fmt_ms(lat['p50'])}/{lg.fmt_ms(lat['p99'])}/{lg.fmt_ms(lat['max'])}"


def _columns(
    args: argparse.Namespace, info: dict[str, Any], f: dict[str, Any], runtime: float
) -> results.Columns:
    return [
        *results.lead_columns(info),
        (
            "load",
            f"{args.query_rate:g} q/s x {args.ids} ids; {args.accounts:,} x {args.subscriptions}, "
            f"{args.rate[0]:g}/s",
        ),
        ("ours p50/p99/max ms", _three(f["ours"])),
        ("bare ws+Redis p50/p99/max ms", _three(f["bare"])),
        ("ours/bare p99", f"{f['ratios']['bare_ratio_p99']:.2f}x"),
        ("seed call alone p50/p99/max ms", _three(f["redis"])),
        ("ours/seed p99", f"{f['ratios']['ratio_p99']:.1f}x"),
        ("target p99 < 20 ms (to issue 28)", "-"),
        (f"target ≤ {TARGET_RATIO:g}x bare (1.5x to issue 28)", results.met_text(f["met_ratio"])),
        ("runtime", f"{runtime:.0f} s"),
    ]


def _print(args: argparse.Namespace, m: dict[str, Any], info: dict[str, Any], f: dict[str, Any]) -> None:
    print(
        f"\npresence bench query on {machine_summary(info)} (commit {info['commit']}): {args.ids} ids per "
        f"query, {args.query_rate:g} queries/s from {args.queriers} sockets, under {args.accounts:,} "
        f"accounts x {args.subscriptions} subscriptions and {args.rate[0]:g} status changes/s, "
        f"{args.seconds:g} s\n"
    )
    beside = m["beside"]
    designs = [
        ("ours: presence.query over the websocket (client-side)",
         m["queries"]["answered"], f["failed"], f["ours"]),
        ("bare websockets + Redis pipelined EXISTS (client-side)",
         m["bare_queries"]["answered"], f["bare_failed"], f["bare"]),
        ("seed's Redis call alone: are_online, pipelined EXISTS",
         beside["answered"], beside["error_count"], f["redis"]),
    ]  # fmt: skip
    rows = [
        [
            label,
            f"{answered:,}",
            f"{failed}",
            lg.fmt_ms(lat["p50"]),
            lg.fmt_ms(lat["p99"]),
            lg.fmt_ms(lat["max"]),
        ]
        for label, answered, failed, lat in designs
    ]
    results.print_table(["design", "queries", "failed", "p50 ms", "p99 ms", "max ms"], rows)
    r, fo = f["ratios"], m["latency_ms"]
    print(
        f"\nours / bare websockets + Redis: p50 {r['bare_ratio_p50']:.2f}x, p99 {r['bare_ratio_p99']:.2f}x "
        f"(same clients, same window); ours / the seed's Redis call alone: p50 {r['ratio_p50']:.1f}x, p99 "
        f"{r['ratio_p99']:.1f}x. "
        f"Fanout meanwhile: p99 {lg.fmt_ms(fo['p99'])} ms, {m['delivered_fraction']:.2%} delivered; "
        f"the seed's heartbeats: {m['beside']['heartbeats']:,} SET EX"
    )
    print(f"target: p99 ≤ {TARGET_RATIO:g}x the bare server's: {results.met_text(f['met_ratio'])}")
