"""Smoke test of the websocket benchmarks at their --quick sizes, first half: `presence bench all
--quick --only edge,connections,query` runs each one end to end (real edges, pool, PostgreSQL,
Redis) and each writes well-formed JSON (tests/integration/bench_quick.py; the other half is
test_bench_smoke_fanout.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .bench_quick import check_all_ran, check_report, run_quick

pytestmark = pytest.mark.integration
BENCHES = ("edge", "connections", "query")


@pytest.fixture(scope="module")
def quick_run(
    tmp_path_factory: pytest.TempPathFactory, migrated_pg_url: str, redis_url: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    return run_quick(tmp_path_factory, BENCHES, migrated_pg_url, redis_url)


def test_all_ran(quick_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    check_all_ran(*quick_run, BENCHES)


@pytest.mark.parametrize("name", BENCHES)
def test_bench_wrote_well_formed_json(
    name: str, quick_run: tuple[subprocess.CompletedProcess[str], Path]
) -> None:
    check_report(name, quick_run[1])
