"""Smoke test of `presence bench lastseen --quick`: it runs end to end on real PostgreSQL and Redis and
writes well-formed results. Never a speed: CI machines differ, the figures are for RESULTS.md."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.lastseen import DESIGNS
from cluster.cli import main

pytestmark = pytest.mark.integration

NUMERIC_FIELDS = (
    "statements_per_s",
    "rows_per_s",
    "redis_commands_per_s",
    "departures_lost",
    "ratio_to_write_through",
)


def test_bench_lastseen_quick(
    pg_url: str, redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "lastseen.json"
    code = main([
        "bench", "lastseen", "--quick", "--no-record",
        "--database-url", pg_url, "--redis-url", redis_url, "--output", str(out),
    ])  # fmt: skip

    assert code == 0
    report = json.loads(out.read_text())
    assert report["benchmark"] == "lastseen"
    assert set(report["designs"]) == set(DESIGNS)
    for name, design in report["designs"].items():
        for key in NUMERIC_FIELDS:
            value = design[key]
            assert isinstance(value, int | float) and not isinstance(value, bool), (name, key, value)
            assert math.isfinite(value) and value >= 0, (name, key, value)
    ours = report["designs"]["ours"]
    assert ours["departures_lost"] == 0
    assert ours["departures"] > 0
    assert report["designs"]["coarse_redis_batched"]["departures_lost"] == 0
    assert isinstance(report["target"]["met"], bool)
    assert report["machine"]["cpus"] >= 1

    assert "statements vs write-through" in capsys.readouterr().out


def test_bench_unknown_name_lists_the_available_ones(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "nope"]) == 2
    err = capsys.readouterr().err
    assert "unknown benchmark 'nope'" in err
    assert "lastseen" in err


def test_bench_bigserver_quick(tmp_path: Path) -> None:
    """`presence bench bigserver --quick` (5,000 members, 300 connected) end to end, in a
    process of its own (its own Ray, and its own PostgreSQL and Redis: it loads servers named
    `big` and `small` and writes their memberships): every operation measured on both servers."""
    import subprocess
    import sys

    out = tmp_path / "bigserver.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "bench",
            "bigserver",
            "--quick",
            "--no-record",
            "--output",
            str(out),
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "bigserver" and report["args"]["quick"] is True
    assert report["load"]["load_s"] > 0
    assert report["setup"]["connect"]["failed"] == 0 and report["setup"]["subscribed"] == 300
    assert report["load"]["pg_rows"]["server_members"] == 5_000 + 1_000
    for server in ("big", "small"):
        for op, summary in report["window"]["probes"][server]["latency_ms"].items():
            assert summary["n"] > 0 and math.isfinite(summary["p50"]), (server, op, summary)
    assert (
        report["window"]["probes"]["big"]["online_seen"][1]
        > report["window"]["probes"]["small"]["online_seen"][1]
    )
    assert report["window"]["status_changes"] > 0 and report["window"]["deliveries"] > 0
    assert report["memory"]["accounts_in_shards"] > 0
    assert [t["met"] for t in report["targets"]] == [None] * 5  # no verdict at the quick size
    assert "p50 ratio" in done.stdout
