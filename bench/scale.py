"""`presence bench scale`: frames per second absorbed by the actor pool at 1, 2, 4 and 8 shards,
and the time a live resize takes under that load.

The sizes are measured there and back (1, 2, 4, 8, 4, 2, 1 by default) and each size's figure is
the mean of its phases: the machine's speed drifts over a run (a VM's neighbours, a pool that has
been resized), and in one direction only that drift lands on the sizes measured last. There and
back, the largest size sits in the middle of the run and the smallest at both ends, so a steady
drift cancels out of their ratio. Target (issue 16): the largest size (8) at least 0.7x the first
(1 shard).

Load generators are separate processes, each an edge without websockets: a real `Router` (the
edge's batching and long-polling, the same code a real edge runs) registering its accounts and
then sending `presence.update` operations as fast as the pool absorbs them, keeping many in
flight. The main process resizes the pool live between phases with `cluster.scale.resize`, so every
phase after the first also measures a resize under load. Everything runs on this machine: on two
cores the generators share the CPUs with the shards, so their CPU is reported too.

    presence bench scale [--shards 1,2,4,8,4,2,1] [--phase-s 10] [--generators 2] [--accounts 400]
                         [--quick] [--no-record] [--plot PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import loadgen as lg
from bench import results, targets
from bench.results import Progress, machine_info, machine_summary

if TYPE_CHECKING:
    from cluster.config import Settings

NAMESPACE = "presence-bench-scale"
# How long a load generator may take to start (Ray's client, its accounts connected).
GENERATOR_START_S = 180.0
TARGET_RATIO = targets.SCALE_RATIO


def per_size(phases: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each pool size's mean frames/s over its phases (in the order sizes first appear), with the
    phases' own figures."""
    sizes: dict[int, dict[str, Any]] = {}
    for ph in phases:
        entry = sizes.setdefault(ph["shards"], {"phases": []})
        entry["phases"].append(ph["ops_per_s"])
    for entry in sizes.values():
        entry["ops_per_s"] = sum(entry["phases"]) / len(entry["phases"])
    return sizes


def _generator(
    index: int,
    address: str,
    auth_mode: str | None,
    accounts: int,
    stop: Any,
    in_flight: int,
    gc_thresholds: tuple[int, int, int],
    out: Any,
    loading: Any,
) -> None:
    """One load-generator process, loading the pool until `stop` (an Event) is set: returns
    (per-second completed operations, CPU seconds). It stands for an edge, so it runs as an edge
    does: on uvloop, with the edges' collector policy (before 2026-12-03 it ran on asyncio's own
    loop with CPython's default collector, and measured the router slower than any edge runs it)."""
    if auth_mode:
        os.environ.setdefault("RAY_AUTH_MODE", auth_mode)
    from actors import clients, gc_policy

    lg.install_uvloop()
    clients.connect(address, NAMESPACE)
    gc_policy.apply(gc_thresholds)
    try:
        out.put(asyncio.run(_generate(index, accounts, stop, in_flight, loading)))
    finally:
        clients.shutdown()


async def _generate(index: int, accounts: int, stop: Any, in_flight: int, loading: Any) -> dict[str, Any]:
    from actors.clients import ShardClients
    from actors.core import ops
    from actors.metrics import Metrics
    from edge.router import Router

    async def no_restart(_: int) -> None:
        return None

    # The edges' own road to the shards: routed, MOVED sent again after each flip of a resize.
    router = Router(
        f"bench-{index}-{os.getpid()}",
        lambda _ids, _p: None,
        no_restart,
        Metrics(),
        ShardClients(direct=True),
        pull_wait_s=1.0,
        call_retry_s=30.0,
    )
    await router.start()
    users = [f"bench-{index}-{i}" for i in range(accounts)]
    await asyncio.gather(*(router.to_user(u, ops.Connect(u, f"s-{u}")) for u in users))
    loading.release()  # the main process measures nothing before every generator is here
    try:
        return await _Drive(router, users).run(stop, in_flight)
    finally:
        await router.close()


class _Drive:
    """Status updates of `users` through `router`, `in_flight` at a time, until told to stop;
    sampled four times a second: (offset, apply calls so far, operations in them, CPU seconds,
    operations answered), from which each phase's frames/s, calls per 1,000 frames and the
    router's (the edge's side) CPU per frame follow."""

    def __init__(self, router: Any, users: list[str]) -> None:
        self.router = router
        self.users = users
        # A count, not a timestamp per completion: that list grew by ~90,000 floats a second, to
        # millions, and its growth and the collector's walks over it weighed on each phase more
        # than on the one before (the first phase, 1 shard, was measured fastest).
        self.completed = 0
        self.running = True
        self.samples: list[tuple[float, float, float, float, int]] = []

    async def _worker(self, k: int, in_flight: int) -> None:
        from actors.core import ops

        n = 0
        while self.running:
            user = self.users[(k + n * in_flight) % len(self.users)]
            n += 1
            await self.router.to_user(user, ops.SetStatus(user, f"s-{user}", "idle" if n % 2 else "online"))
            self.completed += 1

    async def _sample(self, started: float, stop: Any) -> None:
        # Until the main process says the last phase is over (resizes take as long as they take:
        # a fixed duration once ran out before the last phase did, and measured it half idle).
        while self.running:
            calls, sent, _ = self.router.metrics.summaries.get(("edge_batch_ops", ()), (0.0, 0.0, 0.0))
            self.samples.append(
                (time.monotonic() - started, calls, sent, time.process_time(), self.completed)
            )
            await asyncio.sleep(0.25)
            self.running = not stop.is_set()

    async def run(self, stop: Any, in_flight: int) -> dict[str, Any]:
        cpu_started = time.process_time()
        started = time.monotonic()
        sampler = asyncio.create_task(self._sample(started, stop))
        await asyncio.gather(*(self._worker(k, in_flight) for k in range(in_flight)))
        cpu = time.process_time() - cpu_started
        await sampler
        return {
            "started": time.time() - (time.monotonic() - started),
            "samples": self.samples,
            "cpu_s": cpu,
            "wall_s": time.monotonic() - started,
        }


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--shards",
        default="1,2,4,8,4,2,1",
        help="pool sizes, in order; a size may come back (default 1,2,4,8,4,2,1: there and back)",
    )
    p.add_argument("--phase-s", type=float, default=10.0, help="measured seconds per pool size")
    p.add_argument("--generators", type=int, default=2, help="load-generator processes")
    p.add_argument("--accounts", type=int, default=400, help="accounts per generator")
    # 1,600: a busy edge (thousands of sockets) has that many frames on their way; at 400 over 8
    # shards no call could carry more than 50, and the figure was the closed loop's own limit.
    p.add_argument("--in-flight", type=int, default=1600, help="operations in flight per generator")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke test (1,2,1 shards, 2 s)")
    p.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    p.add_argument("--output", type=Path, default=None, help="JSON results file (default bench/results/…)")
    p.add_argument("--plot", default=None, help="PNG path (default: the JSON file's, as .png)")
    p.add_argument("--database-url", default=None)
    p.add_argument("--redis-url", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.phase_s, args.generators, args.accounts, args.in_flight = "1,2,1", 2.0, 1, 100, 100
    return args


def main(argv: list[str], settings: Settings) -> int:
    args = parse(argv)
    sizes = [int(s) for s in args.shards.split(",")]
    with tempfile.TemporaryDirectory(prefix="presence-bench-scale-") as tmp:
        return _run(args, sizes, Path(tmp), settings)


def _run(args: argparse.Namespace, sizes: list[int], tmp: Path, settings: Settings) -> int:
    from actors import clients
    from actors.pool import start_pool, stop_pool
    from cluster import db
    from cluster.embedded import EmbeddedPostgres, EmbeddedRedis
    from cluster.up import shard_config

    servers: list[Any] = []
    database_url = args.database_url or settings.database_url
    redis_url = args.redis_url or settings.redis_url
    if database_url is None:
        pg = EmbeddedPostgres()
        database_url = pg.start(tmp)
        servers.append(pg)
    if redis_url is None:
        rd = EmbeddedRedis()
        redis_url = rd.start(tmp)
        servers.append(rd)
    try:
        asyncio.run(db.migrate(database_url))
        clients.connect(None, NAMESPACE)
        try:
            # The shards as `presence up` configures them (the collector policy among the rest).
            start_pool(sizes[0], shard_config(settings, database_url, redis_url), 1.0, 1000)
            report = _measure(args, sizes, settings.gc_thresholds)
            stop_pool(drain_timeout_s=10)
        finally:
            clients.shutdown()
    finally:
        for server in reversed(servers):
            server.stop()
    return _report(args, sizes, report)


def _start_generators(
    args: argparse.Namespace, gc_thresholds: tuple[int, int, int]
) -> tuple[list[Any], Any, Any]:
    """The load generators' processes, once each is loading (their results' queue and their
    stop event along). Each starts Ray's client and connects its accounts: seconds, or a minute
    on a loaded machine (a fixed wait once measured a first phase with no load at all)."""
    from actors import clients

    ctx = mp.get_context("spawn")
    queue, stop, loading = ctx.Queue(), ctx.Event(), ctx.Semaphore(0)
    procs = [
        ctx.Process(
            target=_generator,
            args=(
                i,
                clients.gcs_address(),
                clients.auth_mode(),
                args.accounts,
                stop,
                args.in_flight,
                gc_thresholds,
                queue,
                loading,
            ),
        )
        for i in range(args.generators)
    ]
    for proc in procs:
        proc.start()
    for _ in procs:
        if not loading.acquire(timeout=GENERATOR_START_S):
            stop.set()
            raise RuntimeError(f"a load generator was not loading within {GENERATOR_START_S:.0f} s")
    return procs, queue, stop


def _measure(
    args: argparse.Namespace, sizes: list[int], gc_thresholds: tuple[int, int, int]
) -> dict[str, Any]:
    from cluster.scale import resize

    warmup_s = 3.0 if not args.quick else 1.0
    procs, queue, stop = _start_generators(args, gc_thresholds)
    progress = Progress("scale", len(sizes))
    phases: list[dict[str, Any]] = []
    time.sleep(warmup_s)  # the load settles before the first phase is measured
    for k, size in enumerate(sizes):
        resize_s = None
        if k and size != sizes[k - 1]:
            summary = asyncio.run(resize(size, progress=lambda _line: None))
            resize_s = summary["seconds"]
        started = time.time()
        progress.update(k, f"{size} shards: measuring {args.phase_s:.0f} s", time.monotonic())
        time.sleep(args.phase_s)
        phases.append({"shards": size, "start": started, "end": time.time(), "resize_s": resize_s})
    stop.set()
    generated = [queue.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    progress.done(f"measured {len(sizes)} pool sizes")
    for phase in phases:
        rate = calls = sent = cpu = 0.0
        for r in generated:
            lo, hi = phase["start"] - r["started"], phase["end"] - r["started"]
            inside = [s for s in r["samples"] if lo <= s[0] < hi]
            if len(inside) >= 2:
                rate += (inside[-1][4] - inside[0][4]) / (inside[-1][0] - inside[0][0])
                calls += inside[-1][1] - inside[0][1]
                sent += inside[-1][2] - inside[0][2]
                cpu += inside[-1][3] - inside[0][3]
        phase["ops_per_s"] = rate
        phase["calls_per_1000"] = 1000 * calls / sent if sent else None
        phase["router_cpu_us_per_frame"] = 1e6 * cpu / sent if sent else None
    cpu = sum(r["cpu_s"] for r in generated) / max(r["wall_s"] for r in generated)
    return {"phases": phases, "generator_cpu": cpu}


def _report(args: argparse.Namespace, sizes: list[int], report: dict[str, Any]) -> int:
    info = machine_info()
    phases = report["phases"]
    by_size = per_size(phases)
    base = by_size[sizes[0]]["ops_per_s"] or 1.0
    largest = max(by_size)
    ratio = by_size[largest]["ops_per_s"] / base
    judged = not args.quick and sizes[0] == 1 and largest == 8
    met = ratio >= TARGET_RATIO if judged else None
    print(
        f"\npool scaling on {machine_summary(info)} (commit {info['commit']}); "
        f"{args.generators} generator processes, load-generator CPU {report['generator_cpu']:.2f} cores\n"
    )
    _print_phases(phases, sizes, base)
    for size, entry in by_size.items():
        print(f"{size} shard(s): {_cell(entry, base)}")
    print(
        f"\n{largest} shards / {sizes[0]}: {ratio:.2f}x (each size the mean of its phases); target ≥ "
        f"{TARGET_RATIO:g}x at 8 shards against 1: {_met_text(met)}"
    )
    targets = [
        results.target(
            f"pool frames/s at {largest} shards / {sizes[0]}", ratio, "ratio", f"≥ {TARGET_RATIO:g}", met
        )
    ]
    payload = {
        "benchmark": "scale",
        "machine": info,
        "args": results.args_json(args),
        **report,
        "sizes": {str(k): v for k, v in by_size.items()},
        "ratio_largest_to_first": ratio,
        "targets": targets,
    }
    path = results.record("scale", payload, args, RESULTS_TITLE, _columns(args, info, report, by_size, base))
    plot = _plot(phases, Path(args.plot) if args.plot else path.with_suffix(".png"))
    print(f"plot:    {plot}" if plot else "plot:    skipped (pip install matplotlib)")
    return 0


RESULTS_TITLE = (
    "Frames/s absorbed by the pool (status updates through the edge router, batched) per pool size; "
    "resize = live `cluster.scale.resize` from the previous size under that load."
)


def _print_phases(phases: list[dict[str, Any]], sizes: list[int], base: float) -> None:
    rows = [
        [
            str(ph["shards"]),
            f"{ph['ops_per_s']:,.0f}",
            f"{ph['ops_per_s'] / base:.2f}x",
            _fmt(ph.get("calls_per_1000")),
            _fmt(ph.get("router_cpu_us_per_frame")),
            f"{ph['resize_s']:.2f} s" if ph["resize_s"] is not None else "-",
        ]
        for ph in phases
    ]
    results.print_table(
        ["shards", "frames/s", f"vs {sizes[0]} shard(s)", "shard calls / 1,000 frames", "edge CPU µs/frame",
         "resize under load"],
        rows,
        align_left=0,
    )  # fmt: skip
    print(
        "(edge CPU: the load generators' routers, which are the edges' own batching code, per frame; "
        "they also run the closed-loop load)\n"
    )


def _columns(
    args: argparse.Namespace,
    info: dict[str, Any],
    report: dict[str, Any],
    by_size: dict[int, dict[str, Any]],
    base: float,
) -> results.Columns:
    phases = report["phases"]
    return [
        *results.lead_columns(info),
        ("generators (CPU), in flight",
         f"{args.generators} ({report['generator_cpu']:.2f} cores), {args.in_flight}"),
        *[(f"{size} shards", _cell(entry, base)) for size, entry in by_size.items()],
        ("shard calls / 1,000 frames", " / ".join(_fmt(p.get("calls_per_1000")) for p in phases)),
        ("edge CPU µs/frame", " / ".join(_fmt(p.get("router_cpu_us_per_frame")) for p in phases)),
        ("resize times", ", ".join(
            f"→{p['shards']}: {p['resize_s']:.2f} s" for p in phases if p["resize_s"] is not None
        )),
    ]  # fmt: skip


def _cell(entry: dict[str, Any], base: float) -> str:
    """A size's mean frames/s and its ratio, with each phase's figure when it had several."""
    text = f"{entry['ops_per_s']:,.0f}/s ({entry['ops_per_s'] / base:.2f}x)"
    if len(entry["phases"]) > 1:
        text += " [" + " & ".join(f"{v:,.0f}" for v in entry["phases"]) + "]"
    return text


def _met_text(met: bool | None) -> str:
    return "not judged (--quick, or sizes other than 1 ... 8)" if met is None else "met" if met else "missed"


def _fmt(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def _plot(phases: list[dict[str, Any]], path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    by_size = sorted(per_size(phases).items())
    shards = [size for size, _ in by_size]
    ax.plot(shards, [entry["ops_per_s"] for _, entry in by_size], marker="o", label="mean of the phases")
    each = ([p["shards"] for p in phases], [p["ops_per_s"] for p in phases])
    ax.scatter(*each, marker="x", label="each phase")
    ax.legend()
    ax.set_xscale("log", base=2)
    ax.set_xticks(shards, [str(s) for s in shards])
    ax.set_xlabel("PresenceActor shards")
    ax.set_ylabel("frames/s absorbed")
    ax.set_title("Pool scaling (same machine, live resizes between points)")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
