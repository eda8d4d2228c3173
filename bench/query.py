"""`presence bench query`: `presence.query` for 100 ids under the fanout load, beside the seed's
Redis TTL design answering the same question (pipelined `EXISTS`) on the same Redis, in the same
window.

The load is `bench fanout`'s (10,000 connected accounts x 50 subscriptions, 200 status changes
per second). On top of it, `--queriers` more accounts (each friends with the `--ids` accounts it
asks about, so every id is in its audience) send `presence.query` for those ids, `--query-rate`
per second in all, round robin, one query at a time per socket, within the per-account query
budget of the contract (600 ids a minute). A query's latency is from its frame being sent to the
last of its answers (one `presence.changed` per id) being received, at the client.

The baseline (`bench.baselines_redis`, the seed's `PresenceService`): every account heartbeats
with `SET presence:<id> 1 EX 30` every 30 s (spread evenly), and `are_online(ids)` is timed for the
same id lists at the same rate, from a process of its own with redis-py, as the seed's service
would. Its latency is the Redis call alone (no client hop, no JSON): a lower bound for its design.

    presence bench query [--queriers 300] [--ids 100] [--query-rate 20] [fanout load options]
                         [--quick] [--no-record]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from bench import fanout
from bench import loadgen as lg
from bench.results import machine_info, machine_summary

if TYPE_CHECKING:
    from cluster.config import Settings

NAME = "query"
TARGET_P99_MS = 20.0
HEARTBEAT_S = 30.0


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench query", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    fanout.add_load_args(p)
    p.add_argument("--queriers", type=int, default=300, help="querying accounts (default 300)")
    p.add_argument("--ids", type=int, default=100, help="ids per query (default 100, the contract's most)")
    p.add_argument("--query-rate", type=float, default=20.0, help="queries per second in all (default 20)")
    lg.add_common_args(p)
    args = p.parse_args(argv)
    if args.quick:
        fanout.quick_load(args)
        args.queriers, args.query_rate = 100, 10.0
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
    queries = fanout.Queries(args.queriers, args.ids, args.query_rate)
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


def report(args: argparse.Namespace, m: dict[str, Any], runtime: float, started_at: str) -> int:
    info = machine_info()
    q = m["queries"]
    ours, redis = q["latency_ms"], m["beside"]["latency_ms"]
    failed = sum(q["failed"].values())
    met = ours["p99"] < TARGET_P99_MS and failed == 0
    ratio_p50 = ours["p50"] / redis["p50"] if redis["p50"] else float("nan")
    ratio_p99 = ours["p99"] / redis["p99"] if redis["p99"] else float("nan")
    print(
        f"\npresence bench query on {machine_summary(info)} (commit {info['commit']}): {args.ids} ids per "
        f"query, {args.query_rate:g} queries/s from {args.queriers} sockets, under {args.accounts:,} "
        f"accounts x {args.subscriptions} subscriptions and {args.rate:g} status changes/s, "
        f"{args.seconds:g} s\n"
    )
    rows = [
        [
            "ours: presence.query over the websocket (client-side)",
            f"{q['answered']:,}",
            f"{failed}",
            lg.fmt_ms(ours["p50"]),
            lg.fmt_ms(ours["p99"]),
            lg.fmt_ms(ours["max"]),
        ],
        [
            "seed: are_online, pipelined EXISTS (redis-py)",
            f"{m['beside']['answered']:,}",
            f"{m['beside']['error_count']}",
            lg.fmt_ms(redis["p50"]),
            lg.fmt_ms(redis["p99"]),
            lg.fmt_ms(redis["max"]),
        ],
    ]
    lg.print_table(["design", "queries", "failed", "p50 ms", "p99 ms", "max ms"], rows)
    fo = m["latency_ms"]
    print(
        f"\nours / seed: p50 {ratio_p50:.1f}x, p99 {ratio_p99:.1f}x (the seed's figure is its Redis call "
        "alone). "
        f"Fanout meanwhile: p99 {lg.fmt_ms(fo['p99'])} ms, {m['delivered_fraction']:.2%} delivered; "
        f"the seed's heartbeats: {m['beside']['heartbeats']:,} SET EX"
    )
    print(f"target p99 < {TARGET_P99_MS:g} ms: {lg.met_text(met)}")
    payload = {
        "benchmark": NAME,
        "started_at": started_at,
        "runtime_s": round(runtime, 1),
        "machine": info,
        "args": {
            k: (str(v) if v is not None and not isinstance(v, int | float | bool) else v)
            for k, v in vars(args).items()
        },
        **m,
        "ratio_p50": ratio_p50,
        "ratio_p99": ratio_p99,
        "targets": [
            lg.target("presence.query (100 ids) p99", ours["p99"], "ms", f"< {TARGET_P99_MS:g}", met)
        ],
    }
    lg.finish(
        NAME,
        payload,
        args,
        "`presence.query` for 100 ids (client-side, until the last answer) under the fanout load, beside the "
        "seed's Redis TTL design (`are_online`: pipelined EXISTS, redis-py, timed around the Redis call) "
        "for the same ids at the same rate in the same window.",
        [
            "date",
            "machine",
            "commit",
            "load",
            "ours p50/p99/max ms",
            "seed p50/p99/max ms",
            "ours/seed p99",
            "target p99 < 20 ms",
            "runtime",
        ],
        [
            lg.info_date(),
            machine_summary(info),
            info["commit"],
            f"{args.query_rate:g} q/s x {args.ids} ids; {args.accounts:,} x {args.subscriptions}, "
            f"{args.rate:g}/s",
            f"{lg.fmt_ms(ours['p50'])}/{lg.fmt_ms(ours['p99'])}/{lg.fmt_ms(ours['max'])}",
            f"{lg.fmt_ms(redis['p50'])}/{lg.fmt_ms(redis['p99'])}/{lg.fmt_ms(redis['max'])}",
            f"{ratio_p99:.1f}x",
            lg.met_text(met),
            f"{runtime:.0f} s",
        ],
    )
    print(f"runtime {runtime:.1f} s")
    return 0
