"""The websocket benchmarks at their --quick sizes, for the smoke tests that run them
(test_bench_smoke_more.py, test_bench_smoke_fanout.py: two halves of `presence bench all --quick`,
on two workers of a parallel run instead of one after the other on one): one `presence bench all
--quick --only ...` run per module, and what each benchmark's JSON must hold. Never a speed: CI
machines differ, the figures are for RESULTS.md."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Every benchmark of `bench all` these smoke tests run, each in one of the two halves.
BENCHES = ("edge", "connections", "fanout", "query", "reconnect")


def run_quick(
    tmp_path_factory: pytest.TempPathFactory, benches: tuple[str, ...], database_url: str, redis_url: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out_dir = tmp_path_factory.mktemp("bench-quick")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "bench",
            "all",
            "--quick",
            "--no-record",
            "--only",
            ",".join(benches),
            "--results-dir",
            str(out_dir),
            "--database-url",
            database_url,
            "--redis-url",
            redis_url,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done, out_dir


def check_all_ran(done: subprocess.CompletedProcess[str], out_dir: Path, benches: tuple[str, ...]) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out_dir / "all.json").read_text())
    assert summary["benchmark"] == "all" and summary["failed"] == []
    assert {t["benchmark"] for t in summary["targets"]} == set(benches)
    assert "summary" in done.stdout


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _well_formed_targets(report: dict[str, Any]) -> None:
    assert report["targets"], report
    for t in report["targets"]:
        assert isinstance(t["name"], str) and isinstance(t["target"], str)
        assert _number(t["figure"]), t
        assert t["met"] in (True, False, None), t


def _latency(summary: dict[str, Any]) -> None:
    assert summary["n"] > 0
    for key in ("p50", "p99", "max"):
        assert _number(summary[key]), (key, summary)


def check_report(name: str, out_dir: Path) -> None:
    report = json.loads((out_dir / f"{name}.json").read_text())
    assert report["benchmark"] == name
    assert report["machine"]["cpus"] >= 1
    assert report["args"]["quick"] is True
    _well_formed_targets(report)
    if name == "edge":
        for side in ("bare", "ours"):
            assert _number(report[side]["per_s"]) and _number(report[side]["generator_cpu_cores"])
        assert _number(report["ratio"])
        for side in ("bare", "floor", "ours"):  # CPU per handshake, by process
            cpu = report["idle"][side]["handshake_cpu_us"]
            assert all(_number(cpu[k]) for k in ("server", "shards", "generators", "machine")), cpu
        assert report["idle"]["ours"]["handshake_cpu_us"]["shards"] > 0  # its sockets were registered
        assert _number(report["handshake_ceiling_ratio"])
    elif name == "connections":
        for side in ("bare", "ours"):
            assert isinstance(report[side]["connected"], int)
            assert _number(report[side]["kib_per_connection"])
        assert isinstance(report["ours"]["sockets_in_pool"], int)
    elif name == "fanout":
        assert report["changes"] > 0 and report["deliveries_expected"] > 0
        _latency(report["latency_ms"])
        assert _number(report["cpu_cores"]["generators"])
        # A window per rate on the same sockets, then the bare websockets server's at the last.
        rates = [w["rate"] for w in report["windows"]]
        assert len(rates) == 2 and rates[0] < rates[1]
        for w in [*report["windows"], report["bare"]]:
            assert w["delivered_fraction"] == 1.0, w  # every change reaches every watcher
            _latency(w["latency_ms"])
            assert _number(w["cpu_us_per_delivery"]["total"]) and w["cpu_us_per_delivery"]["total"] > 0
        for w in report["windows"]:
            assert _number(w["cpu_us_per_delivery"]["edges"]) and _number(w["cpu_us_per_delivery"]["shards"])
            assert w["ray_calls"]["apply"] > 0 and w["ray_calls"]["pull"] > 0
        assert report["bare"]["server"] == "bare" and report["bare"]["rate"] == rates[-1]
        names = [t["name"] for t in report["targets"]]
        assert any("ours / bare" in n for n in names), names
    elif name == "query":
        _latency(report["queries"]["latency_ms"])
        _latency(report["bare_queries"]["latency_ms"])  # the bare websockets + Redis server
        _latency(report["beside"]["latency_ms"])  # the seed's Redis call alone
        assert _number(report["bare_ratio_p99"]) and _number(report["ratio_p99"])
    else:
        sockets = report["args"]["sockets"]
        for side in ("bare", "ours"):
            storm = report[side]
            assert storm["sockets"] == storm["back"] == sockets and storm["failed"] == 0, storm
            assert _number(storm["seconds"]) and storm["seconds"] > 0
            _latency(storm["per_socket_ms"])
            assert sum(storm["attempts"].values()) == sockets
            assert _number(storm["server_cpu_cores"])
        shown = report["ours"]["shown_online"]
        assert shown["pairs"] > 0 and shown["missing"] == 0, shown
        assert _number(shown["seconds"]) and shown["seconds"] > 0
        assert shown["offline_flaps"] == 0  # edge A's lease outlives the storm
        assert _number(report["ratio"]) and _number(report["ratio_identified"])
        assert report["fanout"]["changes"] > 0
        _latency(report["fanout"]["before_ms"])
        _latency(report["fanout"]["storm_ms"])
