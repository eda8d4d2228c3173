"""`presence bench all`: every benchmark in one invocation, one after another, each printing its own
table, then a summary of every target (bench/targets.py): its figure, the baseline measured beside
it in the same run, their ratio, the bound, met or missed.

`lastseen` and `scale` bring up their own servers and Ray, so they run as subprocesses
(`presence bench NAME`). At full size so do the websocket benchmarks (`edge`, `connections`,
`fanout`, `query`, `reconnect`), each with its own PostgreSQL, Redis, Ray and actor pool: in one
shared pool each measured the one before it leaving (the shards keep a stopped edge's sockets
until its lease runs out, then depart them all: 50,000 of them after `connections`, in the middle
of `fanout`; bench all at 01baed5 measured fan-out p99 63 ms at 40,000/s where the same code
measured alone gave 11.5-16.3). With `--quick` (or `--shared`) they share one environment, started
once, each with fresh edges, load generators and account ids: faster, for smoke tests.

    presence bench all [--quick] [--no-record] [--only edge,fanout,…] [--isolated | --shared]
                       [--results-dir DIR] [--database-url URL] [--redis-url URL]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import math
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench import loadgen as lg
from bench import results, targets
from bench.results import machine_info, machine_summary, utc_now

if TYPE_CHECKING:
    from cluster.config import Settings

NAME = "all"
ORDER = ("lastseen", "scale", "edge", "connections", "fanout", "query", "reconnect")
SELF_CONTAINED = ("lastseen", "scale")  # they start their own servers and Ray
# reconnect last: the shards keep its dead edge's sockets until that edge's lease runs out (90 s).
IN_ENV = ("edge", "connections", "fanout", "query", "reconnect")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench all", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="every benchmark at its --quick size")
    p.add_argument("--no-record", action="store_true", help="append nothing to bench/RESULTS.md")
    p.add_argument("--only", default=",".join(ORDER), help=f"comma-separated subset of {','.join(ORDER)}")
    p.add_argument(
        "--isolated",
        action="store_true",
        help="each benchmark its own subprocess (default at full size)",
    )
    p.add_argument("--shared", action="store_true", help="the websocket benchmarks in one environment")
    p.add_argument("--results-dir", type=Path, default=None, help="JSON files here (default bench/results)")
    p.add_argument("--output", type=Path, default=None, help="the summary's JSON file")
    p.add_argument("--database-url", default=None)
    p.add_argument("--redis-url", default=None)
    p.add_argument("--shards", type=int, default=None)
    args = p.parse_args(argv)
    chosen = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in ORDER]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(ORDER)}")
    args.chosen = [n for n in ORDER if n in chosen]
    if args.isolated and args.shared:
        p.error("--isolated and --shared exclude each other")
    args.isolated = args.isolated or not (args.shared or args.quick)
    return args


def _common(args: argparse.Namespace, name: str, with_shards: bool = True) -> list[str]:
    argv: list[str] = []
    if args.quick:
        argv.append("--quick")
    if args.no_record:
        argv.append("--no-record")
    if args.database_url:
        argv += ["--database-url", args.database_url]
    if args.redis_url:
        argv += ["--redis-url", args.redis_url]
    if args.shards and with_shards:
        argv += ["--shards", str(args.shards)]
    if args.results_dir is not None:
        argv += ["--output", str(args.results_dir / f"{name}.json")]
    return argv


def _subprocess(args: argparse.Namespace, name: str) -> tuple[int, Path | None]:
    """`presence bench NAME` as a subprocess; its stdout passes through, its JSON path is read from
    its `results: PATH` line."""
    argv = [sys.executable, "-m", "cluster.cli", "bench", name, *_common(args, name, name in IN_ENV)]
    if name == "scale" and args.results_dir is not None:
        argv += ["--plot", str(args.results_dir / "scale.png")]
    proc = subprocess.Popen(argv, cwd=lg.ROOT, stdout=subprocess.PIPE, text=True, bufsize=1)
    path: Path | None = None
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        if line.startswith("results:"):
            path = Path(line.split(":", 1)[1].split(";", 1)[0].strip())
    return proc.wait(), path


def _banner(name: str) -> None:
    print(f"\n{'=' * 30} presence bench {name} {'=' * 30}", flush=True)


def main(argv: list[str], settings: Settings) -> int:
    args = parse(argv)
    started_at = utc_now()
    t0 = time.monotonic()
    if args.results_dir is not None:
        args.results_dir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[str, Any]] = {}
    for name in args.chosen:
        if name in SELF_CONTAINED or args.isolated:
            _banner(name)
            started = time.monotonic()
            code, path = _subprocess(args, name)
            runs[name] = {
                "exit": code,
                "json": str(path) if path else None,
                "seconds": time.monotonic() - started,
            }
    shared = [n for n in args.chosen if n in IN_ENV and not args.isolated]
    if shared:
        runs.update(_in_shared_env(args, settings, shared))
    runtime = time.monotonic() - t0
    return _summary(args, runs, runtime, started_at.isoformat(timespec="seconds"))


def _in_shared_env(
    args: argparse.Namespace, settings: Settings, names: list[str]
) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    stage = lg.Stage("all")
    try:
        env_cm = lg.bench_env(NAME, settings, args.database_url, args.redis_url, args.shards, stage.log)
        env = env_cm.__enter__()
    except Exception:
        traceback.print_exc()
        return {n: {"exit": 1, "json": None, "error": "environment failed to start"} for n in names}
    try:
        for name in names:
            _banner(name)
            module = importlib.import_module(f"bench.{name}")
            started = time.monotonic()
            started_at = utc_now().isoformat(timespec="seconds")
            argv = _common(args, name, with_shards=False)
            try:
                bench_args = module.parse(argv)
                measured = module.run(bench_args, env, lg.Stage(name))
                code = module.report(bench_args, measured, time.monotonic() - started, started_at)
                path = bench_args.output if bench_args.output is not None else _latest(name)
                runs[name] = {"exit": code, "json": str(path) if path else None}
            except Exception as e:
                traceback.print_exc()
                runs[name] = {"exit": 1, "json": None, "error": f"{type(e).__name__}: {e}"}
            runs[name]["seconds"] = time.monotonic() - started
    finally:
        env_cm.__exit__(None, None, None)
    return runs


def _latest(name: str) -> Path | None:
    from bench.results import RESULTS_DIR

    found = sorted(RESULTS_DIR.glob(f"{name}-*.json"))
    return found[-1] if found else None


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    if unit == "ms":
        return f"{lg.fmt_ms(value)} ms"
    if unit == "KiB":
        return f"{value:.2f} KiB"
    if abs(value) >= 100:
        return f"{value:,.0f} {unit}"
    return f"{value:.3g} {unit}"


def _ratio_text(v: targets.Verdict) -> str:
    return "-" if v.ratio is None else f"{v.ratio:.2f}x"


def summary_rows(verdicts: list[targets.Verdict]) -> list[list[str]]:
    """The summary's table: per target its figure, the baseline measured beside it, their ratio,
    the bound and the verdict."""
    return [
        [
            v.benchmark,
            v.name,
            _fmt(v.figure, v.unit) + (f" ({v.note})" if v.note else ""),
            _fmt(v.baseline, v.unit),
            _ratio_text(v),
            v.goal,
            f"not judged {v.unjudged}" if v.met is None else results.met_text(v.met),
        ]
        for v in verdicts
    ]


def verdicts_text(verdicts: list[targets.Verdict]) -> str:
    """The `## all` row's cell: how many were met, and each one missed with its figures."""
    judged = [v for v in verdicts if v.met is not None]
    missed = [v for v in judged if v.met is False]
    text = f"{len(judged) - len(missed)}/{len(judged)}"
    if missed:
        text += "; missed: " + "; ".join(
            f"{v.benchmark} {v.name} {_fmt(v.figure, v.unit)}"
            + (f" against {_fmt(v.baseline, v.unit)} = {_ratio_text(v)}" if v.baseline is not None else "")
            + f" ({v.goal})"
            for v in missed
        )
    # Not judged for want of a baseline (not for a size): named, or the count would hide them.
    unjudged = [v for v in verdicts if v.met is None and v.unjudged != targets.AT_THIS_SIZE]
    if unjudged:
        text += "; not judged: " + "; ".join(f"{v.benchmark} {v.name} {v.unjudged}" for v in unjudged)
    return text


def _summary(
    args: argparse.Namespace, runs: dict[str, dict[str, Any]], runtime: float, started_at: str
) -> int:
    info = machine_info()
    reports, failed = _reports(args.chosen, runs)
    verdicts = targets.evaluate(reports)
    print(f"\n{'=' * 30} summary {'=' * 30}")
    print(
        f"presence bench all on {machine_summary(info)} (commit {info['commit']})"
        + (", --quick sizes (targets are for the full sizes)" if args.quick else "")
        + "\n"
    )
    rows = summary_rows(verdicts) + [
        [name, "FAILED", "-", "-", "-", "-", runs.get(name, {}).get("error", "no report")] for name in failed
    ]
    results.print_table(
        ["benchmark", "target", "figure", "baseline", "ratio", "goal", "met?"], rows, align_left=2
    )
    tally = verdicts_text(verdicts)
    print(f"\ntargets met: {tally}\n{len(failed)} benchmark(s) failed; total {runtime:.0f} s")
    payload = {
        **results.run_record(NAME, started_at, runtime, info),
        "quick": args.quick,
        "runs": runs,
        "targets": [{**dataclasses.asdict(v), "ratio": v.ratio} for v in verdicts],
        "failed": failed,
    }
    if args.output is None and args.results_dir is not None:
        args.output = args.results_dir / "all.json"
    columns = [
        *results.lead_columns(info),
        ("sizes", "quick" if args.quick else "full"),
        ("targets met", tally),
        ("failed", ", ".join(failed) or "none"),
        ("runtime", f"{runtime:.0f} s"),
    ]
    results.record(NAME, payload, args, RESULTS_TITLE, columns)
    return 1 if failed else 0


RESULTS_TITLE = (
    "`presence bench all`: every benchmark in one invocation; each also appends its own row above."
)


def _reports(
    chosen: list[str], runs: dict[str, dict[str, Any]]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The JSON report of every benchmark that ran to the end, and the names of those that failed
    (or whose report lacks a figure a target needs)."""
    reports: dict[str, dict[str, Any]] = {}
    failed = []
    for name in chosen:
        run = runs.get(name, {"exit": 1, "json": None})
        report = None
        if run.get("json"):
            try:
                report = json.loads(Path(run["json"]).read_text())
            except (OSError, ValueError):
                report = None
        try:
            if run["exit"] != 0 or report is None:
                raise ValueError(run.get("error", f"exit {run['exit']}"))
            targets.evaluate({name: report})
        except (KeyError, IndexError, TypeError, ValueError) as e:
            run.setdefault("error", f"{type(e).__name__}: {e}")
            failed.append(name)
            continue
        reports[name] = report
    return reports, failed
