"""`presence bench rtt`: the round trip of one call from a driver to a shard, nothing else.

Every edge → shard hop pays it (a status change pays two: `apply` up, `pull` down; a query one),
so it is the floor under the fanout and query latencies. Measured in this process (a Ray driver,
as an edge is) against the pool `bench_env` starts, idle: `stats` (the shard does almost
nothing) and `apply([ping])` (the edge's batched call with one no-op), awaited from asyncio as
the edge does, then `stats` through a blocking `ray.get`; each back to back and with a 10 ms pause
between calls (a quiet edge's calls find the processes asleep, which costs wake-ups). Beside
them, the edge's batched call by its real road, the shard's direct lane (actors/lane.py), and
the CPU one call costs by each road, back to back: this process's (the caller's) and the whole
machine's (both ends and Ray's daemons; run it on a quiet machine).

    presence bench rtt [--calls 300] [--quick] [--no-record]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from bench import loadgen as lg
from bench import results
from bench.results import machine_info, machine_summary

if TYPE_CHECKING:
    from cluster.config import Settings

NAME = "rtt"
# The CPU per call is read from the process's CPU times, counted in 10 ms ticks: 20 lane calls
# (--quick) were 0 ticks once. Each road runs this long at least, so a tick is under 2 % of it.
MIN_CPU_WINDOW_S = 0.5


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

    from actors import clients
    from actors.core import ops

    # Raw handles on purpose: this measures Ray's own round trip, under the clients' layer.
    shard = ray.get_actor(clients.shard_name(0))
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
    lane = clients.ShardClient(0, direct=True)
    lane_apply = lambda: lane.apply_and_collect("bench-rtt", [ops.PING], None, 0)  # noqa: E731
    for pause in (0.0, 0.01):
        gap = "back to back" if not pause else "10 ms apart"
        kinds[f"apply_and_collect([ping]), direct lane, {gap}"] = lg.summary_ms(
            asyncio.run(_timed(lane_apply, calls, pause))
        )
    return kinds


def cpu_per_call(calls: int) -> dict[str, dict[str, float]]:
    """CPU µs per call, back to back, of the edge's batched call by each road: at least `calls`
    calls and at least MIN_CPU_WINDOW_S of them (a process's CPU is counted in 10 ms ticks)."""
    import psutil
    import ray

    from actors import clients
    from actors.core import ops

    shard = ray.get_actor(clients.shard_name(0))

    async def by_ray() -> None:
        await shard.apply_and_collect.remote("bench-rtt-cpu", [ops.PING], None, 0)

    lane = clients.ShardClient(0, direct=True)

    async def by_lane() -> None:
        await lane.apply_and_collect("bench-rtt-cpu", [ops.PING], None, 0)

    me = psutil.Process()
    out: dict[str, dict[str, float]] = {}
    for road, call in (("Ray call", by_ray), ("direct lane", by_lane)):

        async def timed(call: Callable[[], Awaitable[None]] = call) -> tuple[int, float, float, float]:
            for _ in range(50):  # warm up: the lane's connection, Ray's leases
                await call()
            mine, machine, wall = me.cpu_times(), psutil.cpu_times(), time.perf_counter()
            made = 0
            while made < calls or time.perf_counter() - wall < MIN_CPU_WINDOW_S:
                await call()
                made += 1
            mine2, machine2, wall2 = me.cpu_times(), psutil.cpu_times(), time.perf_counter()
            busy = sum(getattr(machine2, f) - getattr(machine, f) for f in ("user", "system", "nice"))
            return made, (mine2.user + mine2.system - mine.user - mine.system), busy, wall2 - wall

        made, caller, machine, wall = asyncio.run(timed())
        out[road] = {
            "calls": made,
            "caller_us": caller / made * 1e6,
            "machine_us": machine / made * 1e6,
            "wall_us": wall / made * 1e6,
        }
    return out


def main(argv: list[str], settings: Settings) -> int:
    return lg.main_in_env(NAME, parse(argv), settings, run, report)


def run(args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage) -> dict[str, Any]:
    stage.log(f"timing {args.calls} calls of each kind against shard 0 of {env.shards}")
    kinds = measure(args.calls)
    stage.log(f"CPU of {args.calls * 10} calls back to back by each road")
    return {"latency": kinds, "cpu": cpu_per_call(args.calls * 10)}


def report(args: argparse.Namespace, measured: dict[str, Any], runtime: float, started_at: str) -> int:
    kinds, cpu = measured["latency"], measured["cpu"]
    machine = machine_info()
    print(f"\npresence bench rtt on {machine_summary(machine)} (commit {machine['commit']}), idle pool\n")
    rows = [
        [k, f"{v['p50']:.2f}", f"{v['p90']:.2f}", f"{v['p99']:.2f}", f"{v['max']:.2f}"]
        for k, v in kinds.items()
    ]
    results.print_table(["call to a shard", "p50 ms", "p90 ms", "p99 ms", "max ms"], rows)
    print()
    results.print_table(
        ["apply_and_collect([ping]), back to back", "wall µs", "caller CPU µs", "machine CPU µs"],
        [
            [road, f"{c['wall_us']:.0f}", f"{c['caller_us']:.0f}", f"{c['machine_us']:.0f}"]
            for road, c in cpu.items()
        ],
    )
    ray_cpu, lane_cpu = cpu["Ray call"]["machine_us"], cpu["direct lane"]["machine_us"]
    print(f"\nthe direct lane costs {lane_cpu / ray_cpu:.2f}x the CPU of a Ray call (whole machine)")
    payload = {
        "benchmark": NAME,
        "started_at": started_at,
        "runtime_s": runtime,
        "machine": machine,
        "calls": args.calls,
        "latency_ms": kinds,
        "cpu_per_call_us": cpu,
    }
    columns = [
        *results.lead_columns(machine),
        *((k, f"{v['p50']:.2f} / {v['p99']:.2f}") for k, v in kinds.items()),
        *((f"{road}: machine CPU µs per call", f"{c['machine_us']:.0f}") for road, c in cpu.items()),
    ]
    results.record(NAME, payload, args, RESULTS_TITLE, columns, row=not args.quick)
    return 0


RESULTS_TITLE = (
    "Round trip of one call from a driver (as an edge is) to an idle shard, by Ray and by the "
    "direct lane: the floor under every edge → shard hop. p50 / p99 ms; CPU µs per call."
)
