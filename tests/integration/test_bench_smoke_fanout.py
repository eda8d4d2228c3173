"""Smoke test of the websocket benchmarks at their --quick sizes, second half: `presence bench all
--quick --only fanout,reconnect` runs each one end to end and each writes well-formed JSON
(tests/integration/bench_quick.py; the first half is test_bench_smoke_more.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .bench_quick import BENCHES as EVERY_BENCH
from .bench_quick import check_all_ran, check_report, run_quick

pytestmark = pytest.mark.integration
BENCHES = ("fanout", "reconnect")


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


def test_the_two_halves_run_every_benchmark() -> None:
    from .test_bench_smoke_more import BENCHES as FIRST_HALF

    assert sorted(FIRST_HALF + BENCHES) == sorted(EVERY_BENCH)
