"""`presence bench rtt --quick` runs and writes well-formed results (never a speed assertion)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_bench_rtt_quick(tmp_path: Path, migrated_pg_url: str, redis_url: str) -> None:
    output = tmp_path / "rtt.json"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "bench",
            "rtt",
            "--quick",
            "--no-record",
            "--output",
            str(output),
            "--database-url",
            migrated_pg_url,
            "--redis-url",
            redis_url,
            "--shards",
            "1",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    result = json.loads(output.read_text())
    assert result["benchmark"] == "rtt" and result["calls"] == 20
    assert len(result["latency_ms"]) == 8
    assert set(result["cpu_per_call_us"]) == {"Ray call", "direct lane"}
    for cpu in result["cpu_per_call_us"].values():
        # At least the calls asked for, over at least half a second: 20 lane calls alone were
        # once 0 ticks of the process's CPU clock (a figure of 0 µs per call).
        assert cpu["calls"] >= 20 and cpu["wall_us"] * cpu["calls"] >= 0.5e6
        assert cpu["caller_us"] > 0 and cpu["wall_us"] > 0
    for summary in result["latency_ms"].values():
        assert summary["n"] == 20
        assert 0 < summary["p50"] <= summary["max"] and not math.isnan(summary["p99"])
