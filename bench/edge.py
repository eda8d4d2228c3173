"""`presence bench edge`: what one edge process costs per socket, beside the bare websockets
server a user would write and the floor of the library itself, all three in the same run.

Three servers, each its own process: ours (`presence edge`, joined to an actor pool the benchmark
starts on embedded PostgreSQL and Redis), the bare server (`bench.echo_server`: websockets'
asyncio server on uvloop, configured as the edge was before issue 28) and the floor
(`bench.echo_server --sansio`: websockets' sans-I/O protocol on uvloop's transports through
`edge.transport`, with nothing else of ours). Load generator processes (`bench.loadgen`):

1. Idle sockets, one server at a time (bare, floor, ours): `--sockets` connections (100,000;
   clients bound to many 127.x.y.z source addresses, 900 each, so no address runs out of ports
   and the edge's per-address limits apply unchanged), `--concurrency` connects in flight. The
   clients of ours identify with a signed token and wait for `ready` (real presence sockets
   registered in the pool), the others send a hello and wait for its echo. Reported: handshakes
   (to `ready`, or to the echo) per second, the CPU per handshake of the server, its shards and
   the clients, and the server's RSS per socket above its own RSS before the first connection
   (VmRSS, after `--settle-s`). Idle clients heartbeat every 30 s. The handshakes are bound by the
   machine's CPU, clients included: the most ours / bare can reach here is reported beside it
   (`handshake_ceiling`).
   The idle sockets are closed once measured.
2. Heartbeats: `--connections` sockets per server (200) kept open from part 1; in turns (bare,
   floor, ours, then backwards, so that drift on a shared machine hits all alike) every
   connection keeps `--in-flight` heartbeats outstanding: `{"type":"heartbeat"}` answered by
   `{"type":"heartbeat.ack"}` from ours, echoed by the others. The figure is answers received
   per second over the measured windows, and per CPU-second of the server (meaningful also when
   other work shares the machine).

The edge's per-socket token bucket (20 frames/s, burst 60) would refuse such a flood: the edge
this benchmark starts has it raised (PRESENCE_SOCKET_RATE_PER_S / _BURST), and says so.

Open files: each server holds `--sockets` of them. The benchmark raises its own hard and soft
limits (as root; the servers and generators it starts inherit them), else it stops and says
which `ulimit -Hn` it needs.

    presence bench edge [--sockets 100000] [--concurrency 100] [--connections 200]
                        [--in-flight 8] [--seconds 10] [--rounds 2] [--generators 2]
                        [--quick] [--no-record] [--profile DIR]
"""

from __future__ import annotations

import argparse
import math
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import fanout, results, targets
from bench import loadgen as lg
from bench.results import machine_info, machine_summary

if TYPE_CHECKING:
    from cluster.config import Settings

NAME = "edge"
# The bounds (heartbeats/s and handshakes/s against the bare server, RSS per socket): bench/targets.py
TARGET_RATIO = targets.EDGE_HEARTBEAT_RATIO
TARGET_KIB = targets.EDGE_KIB_PER_SOCKET
TARGET_SOCKETS = targets.EDGE_SOCKETS
SERVERS = ("bare", "floor", "ours")
LABELS = {
    "bare": "bare websockets asyncio echo (uvloop)",
    "floor": "floor: websockets sans-I/O echo (edge.transport)",
    "ours": "ours: presence edge",
}
PER_PROCESS = 12_500  # idle sockets per generator process (its open files)
NOFILE_MARGIN = 2_000
RATE_ENV = {
    "PRESENCE_SOCKET_RATE_PER_S": "1000000000",
    "PRESENCE_SOCKET_RATE_BURST": "1000000000",
    # Every client comes from 127.0.0.1: the generators' connects (100 at a time each) may
    # outnumber one address's cap on connections still opening (100) on a busy machine.
    "PRESENCE_MAX_HANDSHAKES_PER_IP": "1000",
}


def sockets_allowed(open_files: int) -> int:
    """The target's size, or the most a process allowed `open_files` can hold (whole thousands):
    a container whose hard limit root may not raise (20,000 here) still measures, at its size."""
    return min(TARGET_SOCKETS, (open_files - NOFILE_MARGIN) // 1_000 * 1_000)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench edge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--sockets",
        type=int,
        default=None,
        help=f"idle sockets per server (default {TARGET_SOCKETS:,}, or the most the open-file limit allows)",
    )
    p.add_argument("--concurrency", type=int, default=100, help="connects in flight, over all generators")
    p.add_argument("--settle-s", type=float, default=3.0, help="wait before reading memory")
    p.add_argument(
        "--connections", type=int, default=200, help="heartbeating connections to each server (default 200)"
    )
    p.add_argument("--in-flight", type=int, default=8, help="heartbeats outstanding per connection")
    p.add_argument("--seconds", type=float, default=10.0, help="measured seconds per server per round")
    p.add_argument("--warmup-s", type=float, default=1.0, help="unmeasured seconds before each window")
    p.add_argument("--rounds", type=int, default=2, help="turns per server (default 2)")
    p.add_argument("--generators", type=int, default=2, help="load-generator processes (default 2)")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="record py-spy profiles of each server's handshakes and first heartbeat window into DIR",
    )
    p.add_argument(
        "--profile-handshakes-s",
        type=float,
        default=3.0,
        help="with --profile: seconds of each server's handshakes recorded (default 3)",
    )
    lg.add_common_args(p)
    args = p.parse_args(argv)
    if args.quick:
        args.connections, args.seconds, args.rounds, args.generators = 50, 1.0, 1, 1
        args.warmup_s, args.sockets, args.settle_s = 0.5, 500, 1.0
    if args.sockets is not None and args.sockets < args.connections:
        p.error("--sockets counts the heartbeating connections too: it must be at least --connections")
    lg.require_profiler(p, args)
    return args


def main(argv: list[str], settings: Settings) -> int:
    return lg.main_in_env(NAME, parse(argv), settings, run, report)


def run(args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage) -> dict[str, Any]:
    if args.sockets is None:  # the target's size where this machine allows it, else the most it does
        limit = lg.raise_nofile(TARGET_SOCKETS + NOFILE_MARGIN)
        args.sockets = sockets_allowed(limit)
        if args.sockets < TARGET_SOCKETS:
            stage.log(
                f"the open-file limit here is {limit:,} per process and may not be raised: "
                f"{args.sockets:,} sockets per server instead of {TARGET_SOCKETS:,} (judged: not at the size)"
            )
    need = args.sockets + NOFILE_MARGIN
    if lg.raise_nofile(need) < need:
        raise RuntimeError(
            f"{args.sockets:,} sockets per server need {need:,} open files per process: run as root, or "
            f"raise the hard limit first (ulimit -Hn {need})"
        )
    stage.log(
        "starting the bare echo server, the sans-I/O floor and `presence edge` (socket rate limit raised)"
    )
    servers: dict[str, lg.ServerProcess] = {
        "bare": env.start_echo(),
        "floor": env.start_server("floor echo", ["-m", "bench.echo_server", "--port", "0", "--sansio"]),
        "ours": env.start_edge(RATE_ENV),
    }
    tag = secrets.token_hex(3)
    generators = max(args.generators, math.ceil((args.sockets - args.connections) / PER_PROCESS))
    out: dict[str, Any] = {"windows": [], "connect": {}, "idle": {}, "generators": generators}
    with lg.Workers(generators, {"secret": env.secret}) as workers:
        for name in SERVERS:
            out["idle"][name] = _idle(args, workers, stage, name, servers[name], tag)
            out["connect"][name] = {"connected": out["idle"][name]["heartbeating"]}
        for i, name in enumerate(_order(args.rounds)):
            stage.log(
                f"window {i + 1}/{3 * args.rounds}: {name}, {args.connections} connections x "
                f"{args.in_flight} in flight, {args.seconds:g} s"
            )
            profile = args.profile is not None and not any(w["server"] == name for w in out["windows"])
            out["windows"].append(_window(args, workers, name, servers[name], profile))
        for name in SERVERS:
            workers.call("close", {"group": name})
    out["edge_log_tail"] = servers["ours"].log.read_text(errors="replace")[-2000:]
    return out


def _order(rounds: int) -> list[str]:
    """bare, floor, ours, then backwards, ...: a drift of the machine's speed hits all alike."""
    return [name for r in range(rounds) for name in (SERVERS if r % 2 == 0 else SERVERS[::-1])]


def _sides(name: str, tag: str) -> tuple[lg.Side, lg.Side]:
    """(idle, heartbeating) clients of one server: distinct accounts on ours."""
    if name != "ours":
        return lg.Side(name), lg.Side(name)
    return lg.Side(name, f"bench-edge-{tag}-idle-"), lg.Side(name, f"bench-edge-{tag}-")


def _idle(
    args: argparse.Namespace,
    workers: lg.Workers,
    stage: lg.Stage,
    name: str,
    server: lg.ServerProcess,
    tag: str,
) -> dict[str, Any]:
    """Part 1 on one server: `--sockets` connections (the idle ones first, timed, then the
    heartbeating ones), its RSS per socket above its RSS before; the idle ones closed after."""
    idle_side, side = _sides(name, tag)
    idle = args.sockets - args.connections
    target = [("127.0.0.1", server.port)]
    # The idle clients heartbeat as the contract asks from their first connection on: connecting
    # them all may take longer than the 90 s after which the edge closes a silent socket.
    workers.call("heartbeats", {"group": f"{name}-idle", "interval_s": 30.0})
    time.sleep(args.settle_s)
    rss0 = server.rss_kib()
    stage.log(f"{name}: {idle:,} idle connections, {args.concurrency} connects in flight")
    hs = _handshakes(args, workers, stage, name, server, idle_side, idle)
    beat = lg.connect_side(
        workers,
        stage,
        side,
        target,
        lg.split(args.connections, args.generators) + [0] * (len(workers) - args.generators),
        first_index=idle,
    )
    failed = hs["failed"] + beat["failed"]
    if failed:
        raise RuntimeError(f"{failed} connections to {name} failed: {hs['errors'] | beat['errors']}")
    time.sleep(args.settle_s)
    rss1 = server.rss_kib()
    held = sum(workers.call("open_count", {"group": f"{name}-idle"})) + beat["connected"]
    stage.log(
        f"{name}: {held:,} sockets, {hs['per_s']:,.0f} handshakes/s, RSS {rss0 / 1024:,.0f} → "
        f"{rss1 / 1024:,.0f} MiB ({(rss1 - rss0) / max(held, 1):.2f} KiB/socket)"
    )
    workers.call("close", {"group": f"{name}-idle"})
    return {
        "sockets": hs["connected"] + beat["connected"],
        "held_after_settle": held,
        "heartbeating": beat["connected"],
        "handshakes_per_s": hs["per_s"],
        "handshake_seconds": hs["seconds"],
        "handshake_cpu_us": hs["cpu_us"],
        "rss_before_kib": rss0,
        "rss_after_kib": rss1,
        "kib_per_socket": (rss1 - rss0) / max(held, 1),
    }


def _handshakes(
    args: argparse.Namespace,
    workers: lg.Workers,
    stage: lg.Stage,
    name: str,
    server: lg.ServerProcess,
    idle_side: lg.Side,
    idle: int,
) -> dict[str, Any]:
    """The idle connections' handshakes, timed (`lg.connect_side`'s totals), with the CPU each
    process spent per handshake (`cpu_us`); profiled with `--profile`."""
    # py-spy for the first `--profile-handshakes-s` of the handshakes (it cannot be stopped early
    # without losing its output; fewer sockets than that many seconds' worth leave it idle).
    spy_path = args.profile / f"edge-{name}-handshakes-pyspy.txt" if args.profile is not None else None
    spy = lg.start_profile(spy_path, server.pid, args.profile_handshakes_s) if spy_path else None
    shards = fanout.pool_pids()["shards"] if name == "ours" else []
    cpu0 = _handshake_cpu(server, workers, shards)
    hs = lg.connect_side(
        workers,
        stage,
        idle_side,
        [("127.0.0.1", server.port)],
        lg.split(idle, len(workers)),
        group=f"{name}-idle",
        concurrency=max(1, args.concurrency // len(workers)),
    )
    cpu1 = _handshake_cpu(server, workers, shards)
    if spy is not None and spy_path is not None:
        lg.finish_profile(spy, spy_path)
    return hs | {"cpu_us": {k: (cpu1[k] - cpu0[k]) / max(hs["connected"], 1) * 1e6 for k in cpu0}}


def _handshake_cpu(server: lg.ServerProcess, workers: lg.Workers, shards: list[int]) -> dict[str, float]:
    """CPU seconds so far: the server's, its shards' (ours), the load generators' (which mint a
    token per account before they connect: a few µs of theirs per handshake), the machine's."""
    return {
        "server": server.cpu_seconds(),
        "shards": fanout.cpu_of(shards),
        "generators": workers.cpu_seconds(),
        "machine": lg.machine_cpu_seconds(),
    }


def handshake_ceiling(idle: dict[str, dict[str, Any]]) -> float:
    """The handshakes/s ratio ours / bare where handshakes are bound by the machine's CPU, if
    ours cost the floor's CPU per handshake (websockets' sans-I/O protocol and nothing else) and
    its shards none: the bare server's CPU and its clients' per handshake against the floor's and
    ours' clients'. It is the most any edge that registers its sockets can reach on this machine
    (less, since registering costs something): a target above it cannot be met here."""
    bare, floor, ours = (idle[n]["handshake_cpu_us"] for n in ("bare", "floor", "ours"))
    return _ratio(bare["server"] + bare["generators"], floor["server"] + ours["generators"])


def _window(
    args: argparse.Namespace, workers: lg.Workers, name: str, server: lg.ServerProcess, profile: bool
) -> dict[str, Any]:
    """One measured window of one server: every connection keeps `in_flight` heartbeats out."""
    spy_path = args.profile / f"edge-{name}-pyspy.txt" if profile else None
    spy = lg.start_profile(spy_path, server.pid, args.warmup_s + args.seconds) if spy_path else None
    cpu0, wall0 = server.cpu_seconds(), time.monotonic()
    res = workers.call(
        "pipeline",
        {"group": name, "seconds": args.seconds, "warmup_s": args.warmup_s, "in_flight": args.in_flight},
    )
    server_cpu = (server.cpu_seconds() - cpu0) / (time.monotonic() - wall0)
    if spy is not None and spy_path is not None:
        lg.finish_profile(spy, spy_path)
    wall = max(r["wall_s"] for r in res)
    count = sum(r["count"] for r in res)
    return {
        "server": name,
        "answers": count,
        "wall_s": wall,
        "per_s": count / wall,
        "server_cpu_cores": server_cpu,
        "generator_cpu_cores": sum(r["cpu_s"] for r in res) / wall,
        "unanswered_after_stop": sum(r["unanswered"] for r in res),
    }


def _aggregate(windows: list[dict[str, Any]], server: str) -> dict[str, float]:
    ws = [w for w in windows if w["server"] == server]
    answers = sum(w["answers"] for w in ws)
    wall = sum(w["wall_s"] for w in ws)
    cpu = sum(w["server_cpu_cores"] * w["wall_s"] for w in ws) / wall
    return {
        "per_s": answers / wall,
        "server_cpu_cores": cpu,
        "per_cpu_s": answers / (cpu * wall) if cpu else 0.0,
        "generator_cpu_cores": sum(w["generator_cpu_cores"] * w["wall_s"] for w in ws) / wall,
        "answers": answers,
        "wall_s": wall,
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def report(args: argparse.Namespace, measured: dict[str, Any], runtime: float, started_at: str) -> int:
    info = machine_info()
    beats = {name: _aggregate(measured["windows"], name) for name in SERVERS}
    idle = measured["idle"]
    bare, ours = beats["bare"], beats["ours"]
    ratio = _ratio(ours["per_s"], bare["per_s"])
    ratio_cpu = _ratio(ours["per_cpu_s"], bare["per_cpu_s"])
    hs_ratio = _ratio(idle["ours"]["handshakes_per_s"], idle["bare"]["handshakes_per_s"])
    kib = idle["ours"]["kib_per_socket"]
    full_size = args.sockets >= TARGET_SOCKETS and idle["ours"]["held_after_settle"] >= TARGET_SOCKETS
    _print(args, info, beats, idle)
    targets = [
        results.target(
            "edge heartbeats/s, ours / bare", ratio, "ratio", f"≥ {TARGET_RATIO}", ratio >= TARGET_RATIO
        ),
        results.target(
            "edge handshakes (to ready)/s, ours / bare",
            hs_ratio,
            "ratio",
            f"≥ {TARGET_RATIO}",
            hs_ratio >= TARGET_RATIO,
        ),
        results.target(
            f"edge RSS per idle identified socket at {TARGET_SOCKETS:,}",
            kib,
            "KiB",
            f"≤ {TARGET_KIB:g}",
            (kib <= TARGET_KIB) if full_size else None,
        ),
    ]
    for t in targets:
        print(
            f"target {t['name']}: {t['figure']:.2f} {t['unit']} ({t['target']}): {results.met_text(t['met'])}"
        )
    payload = {
        **results.run_record(NAME, started_at, runtime, info),
        "args": results.args_json(args),
        "edge_env": RATE_ENV,
        **beats,
        "idle": idle,
        "ratio": ratio,
        "ratio_per_cpu_s": ratio_cpu,
        "ratio_floor": _ratio(ours["per_s"], beats["floor"]["per_s"]),
        "handshake_ratio": hs_ratio,
        "handshake_ratio_floor": _ratio(idle["ours"]["handshakes_per_s"], idle["floor"]["handshakes_per_s"]),
        "handshake_ceiling_ratio": handshake_ceiling(idle),
        "windows": measured["windows"],
        "targets": targets,
    }
    results.record(NAME, payload, args, RESULTS_TITLE, _columns(args, info, beats, idle, targets, runtime))
    print(f"runtime {runtime:.1f} s")
    return 0


def _columns(
    args: argparse.Namespace,
    info: dict[str, Any],
    beats: dict[str, dict[str, float]],
    idle: dict[str, dict[str, Any]],
    targets: list[dict[str, Any]],
    runtime: float,
) -> list[tuple[str, str]]:
    def three(f: Callable[[str], str]) -> str:
        return "/".join(f(name) for name in SERVERS)

    return [
        *results.lead_columns(info),
        (
            "load",
            f"{idle['ours']['held_after_settle']:,} idle sockets; {args.connections} conns x "
            f"{args.in_flight} in flight, {args.rounds}x{args.seconds:g} s",
        ),
        ("KiB/socket bare/floor/ours", three(lambda n: f"{idle[n]['kib_per_socket']:.2f}")),
        ("handshakes/s bare/floor/ours", three(lambda n: f"{idle[n]['handshakes_per_s']:,.0f}")),
        ("heartbeats/s bare/floor/ours", three(lambda n: f"{beats[n]['per_s']:,.0f}")),
        ("per CPU-s bare/floor/ours", three(lambda n: f"{beats[n]['per_cpu_s']:,.0f}")),
        ("ours/bare hs, hb", f"{targets[1]['figure']:.2f}, {targets[0]['figure']:.2f}"),
        (
            f"targets ≥ {TARGET_RATIO}x, ≤ {TARGET_KIB:g} KiB",
            ", ".join(results.met_text(t["met"]) for t in (targets[1], targets[0], targets[2])),
        ),
        ("runtime", f"{runtime:.0f} s"),
    ]


RESULTS_TITLE = (
    "One edge process (`presence edge`, rate limit raised) beside the bare websockets asyncio echo server "
    "on uvloop and the floor (websockets' sans-I/O echo on uvloop's transports, nothing of ours), same "
    "clients, same run: RSS per idle socket above the empty process and handshakes/s (idle sockets, one "
    "server at a time), heartbeats/s (windows alternating between the three)."
)


def _print(
    args: argparse.Namespace,
    info: dict[str, Any],
    beats: dict[str, dict[str, float]],
    idle: dict[str, dict[str, Any]],
) -> None:
    print(
        f"\npresence bench edge on {machine_summary(info)} (commit {info['commit']}): {args.sockets:,} idle "
        f"sockets per server ({args.concurrency} connects in flight); {args.connections} connections per "
        f"server x {args.in_flight} heartbeats in flight, {args.rounds} x {args.seconds:g} s per server\n"
        "NOTE: the edge under test runs with its per-socket rate limit raised (default 20 frames/s, "
        "burst 60) so that one socket may pipeline heartbeats.\n"
    )
    rows = [
        [
            LABELS[name],
            f"{idle[name]['held_after_settle']:,}",
            f"{idle[name]['kib_per_socket']:.2f}",
            f"{idle[name]['handshakes_per_s']:,.0f}",
            f"{beats[name]['per_s']:,.0f}",
            f"{beats[name]['server_cpu_cores']:.2f}",
            f"{beats[name]['per_cpu_s']:,.0f}",
        ]
        for name in SERVERS
    ]
    results.print_table(
        ["server", "sockets", "KiB/socket", "handshakes/s", "heartbeats/s", "CPU (cores)", "per CPU-s"], rows
    )
    print("\nhandshakes: CPU µs per handshake, by process (the machine's: every process of it)")
    cpu_rows = [
        [LABELS[name]]
        + [f"{idle[name]['handshake_cpu_us'][k]:,.0f}" for k in ("server", "shards", "generators", "machine")]
        + [f"{idle[name]['handshake_cpu_us']['machine'] * idle[name]['handshakes_per_s'] / 1e6:.2f}"]
        for name in SERVERS
    ]
    results.print_table(["server", "server", "its shards", "clients", "machine", "cores busy"], cpu_rows)
    print(
        "ours / bare at the most, if ours cost what the floor costs and its shards nothing: "
        f"{handshake_ceiling(idle):.2f}x\n"
    )
