"""`presence bench rtt`: the round trip of one Ray call from a driver to a shard, nothing else.

Every edge → shard hop pays it (a status change pays two: `apply` up, `pull` down; a query one),
so it is the floor under the fanout and query latencies. Measured in this process (a Ray driver,
as an edge is) against the pool `bench_env` starts, idle: `stats` (the shard does almost
nothing) and `apply([ping])` (the edge's batched call with one no-op), awaited from asyncio as
the edge does, then `stats` through a blocking `ray.get`; each back to back and with a 10 ms pause
between calls (a quiet edge's calls find the processes asleep, which costs wake-ups).

    presence bench rtt [--calls 300] [--quick] [--no-record]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from bench import loadgen as lg
from bench.results import append_row, machine_info, machine_summary, write_json

if TYPE_CHECKING:
    from cluster.config import Settings

NAME = "rtt"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench rtt", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--calls", type=int, default=300, help="calls per kind (default 300)")
    lg.add_common_args(p)
    args = p.parse_args(argv)
    if args.quick:
        args.calls = 20
    return args


async def _timed(call: Callable[[], Awaitable[Any]], n: int, pause_s: float) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        t = time.perf_counter()
        await call()
        out.append(time.perf_counter() - t)
        if pause_s:
            await asyncio.sleep(pause_s)
    return out


def _timed_sync(call: Callable[[], Any], n: int, pause_s: float) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        out.append(time.perf_counter() - t)
        if pause_s:
            time.sleep(pause_s)
    return out


def measure(calls: int) -> dict[str, dict[str, Any]]:
    import ray

    from actors import ray_api
    from actors.core import ops

    # Raw handles on purpose: this measures Ray's own round trip, under the clients' layer.
    shard = ray.get_actor(ray_api.shard_name(0))
    kinds: dict[str, dict[str, Any]] = {}
    for pause in (0.0, 0.01):
        gap = "back to back" if not pause else "10 ms apart"
        kinds[f"stats, awaited, {gap}"] = lg.summary_ms(
            asyncio.run(_timed(lambda: shard.stats.remote(), calls, pause))
        )
        kinds[f"apply([ping]), awaited, {gap}"] = lg.summary_ms(
            asyncio.run(_timed(lambda: shard.apply.remote("bench-rtt", [ops.PING]), calls, pause))
        )
        kinds[f"stats, ray.get, {gap}"] = lg.summary_ms(
            _timed_sync(lambda: ray.get(shard.stats.remote()), calls, pause)
        )
    return kinds


def main(argv: list[str], settings: Settings) -> int:
    return lg.main_in_env(NAME, parse(argv), settings, run, report)


def run(args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage) -> dict[str, Any]:
    stage.log(f"timing {args.calls} calls of each kind against shard 0 of {env.shards}")
    return measure(args.calls)


def report(args: argparse.Namespace, kinds: dict[str, Any], runtime: float, started_at: str) -> int:
    machine = machine_info()
    print(f"\npresence bench rtt on {machine_summary(machine)} (commit {machine['commit']}), idle pool\n")
    rows = [
        [k, f"{v['p50']:.2f}", f"{v['p90']:.2f}", f"{v['p99']:.2f}", f"{v['max']:.2f}"]
        for k, v in kinds.items()
    ]
    lg.print_table(["Ray call to a shard", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows)
    out = write_json(
        NAME,
        {
            "benchmark": NAME,
            "started_at": started_at,
            "runtime_s": runtime,
            "machine": machine,
            "calls": args.calls,
            "latency_ms": kinds,
        },
        args.output,
    )
    print(f"\nresults: {out}")
    if not args.no_record and not args.quick:
        cell = {k: f"{v['p50']:.2f} / {v['p99']:.2f}" for k, v in kinds.items()}
        append_row(
            NAME,
            "Round trip of one Ray call from a driver (as an edge is) to an idle shard: the floor under "
            "every edge → shard hop. p50 / p99 ms.",
            ["date", "machine", "commit", *cell],
            [lg.info_date(), machine_summary(machine), machine["commit"], *cell.values()],
        )
        print("row appended to bench/RESULTS.md")
    return 0
