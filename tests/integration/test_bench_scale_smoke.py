"""`presence bench scale --quick` runs and writes well-formed results (never a speed assertion)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def test_bench_scale_quick(tmp_path: Path, migrated_pg_url: str, redis_url: str) -> None:
    plot = tmp_path / "scale.png"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "cluster.cli",
            "bench",
            "scale",
            "--quick",
            "--no-record",
            "--plot",
            str(plot),
            # As `bench all --results-dir` passes it: a path in the arguments the JSON records.
            "--output",
            str(tmp_path / "scale.json"),
            "--database-url",
            migrated_pg_url,
            "--redis-url",
            redis_url,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    path = Path(
        next(line.split(":", 1)[1].strip() for line in out.stdout.splitlines() if line.startswith("results:"))
    )
    assert path == tmp_path / "scale.json"
    result = json.loads(path.read_text())
    # There and back: 1 shard is measured at both ends, its figure the mean of the two.
    assert [p["shards"] for p in result["phases"]] == [1, 2, 1]
    assert all(isinstance(p["ops_per_s"], float) and p["ops_per_s"] > 0 for p in result["phases"])
    assert result["phases"][0]["resize_s"] is None
    assert result["phases"][1]["resize_s"] > 0 and result["phases"][2]["resize_s"] > 0
    one = result["sizes"]["1"]
    assert one["phases"] == [result["phases"][0]["ops_per_s"], result["phases"][2]["ops_per_s"]]
    two = result["sizes"]["2"]
    assert result["ratio_largest_to_first"] == pytest.approx(two["ops_per_s"] / one["ops_per_s"])
    assert [t["met"] for t in result["targets"]] == [None]  # --quick judges nothing
    # The sharding overhead, per pool size: shard calls per 1,000 frames and the router's CPU per frame.
    for p in result["phases"]:
        assert 0 < p["calls_per_1000"] <= 1000 and p["router_cpu_us_per_frame"] > 0, p
    if importlib.util.find_spec("matplotlib") is not None:  # the `dev` extra, not `test`
        assert plot.exists() and plot.stat().st_size > 1000
    else:
        assert "plot:    skipped (pip install matplotlib)" in out.stdout and not plot.exists()
    path.unlink()
