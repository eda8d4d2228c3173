"""The pieces every benchmark shares (issue 27 item 7): a server pair's clients (`loadgen.Side`,
`split`, `alternating`) and one way to record a run (`results.record`, `format_table`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from bench import loadgen as lg
from bench import results


def test_a_pair_alternates_so_that_a_drift_hits_both_alike() -> None:
    assert lg.alternating(1) == ["bare", "ours"]
    assert lg.alternating(3) == ["bare", "ours", "ours", "bare", "bare", "ours"]


@pytest.mark.parametrize(("n", "parts"), [(10, 3), (2, 5), (0, 2), (19_000, 2)])
def test_shares_cover_n_and_differ_by_at_most_one(n: int, parts: int) -> None:
    shares = lg.split(n, parts)
    assert len(shares) == parts and sum(shares) == n
    assert max(shares) - min(shares) <= 1 and shares == sorted(shares, reverse=True)


def test_ours_identifies_as_accounts_and_the_bare_side_sends_its_hello() -> None:
    ours = lg.Side("ours", "acct-")
    assert ours.ours
    assert ours.connect_kwargs(5, 2) == {"path": lg.WS_PATH, "users": ["acct-5", "acct-6"]}
    bare = lg.Side("bare")
    assert not bare.ours
    assert bare.connect_kwargs(5, 2) == {"path": "/", "hello": lg.BARE_HELLO, "users": None}
    assert lg.Side("bare", hello=b"x").connect_kwargs(0, 1)["hello"] == b"x"


def _args(tmp_path: Path, no_record: bool) -> argparse.Namespace:
    return argparse.Namespace(output=tmp_path / "run.json", no_record=no_record, quick=True)


def test_record_writes_the_json_and_one_row_whose_cells_sit_under_their_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    md = tmp_path / "RESULTS.md"
    monkeypatch.setattr(results, "RESULTS_MD", md)
    path = results.record(
        "demo", {"benchmark": "demo"}, _args(tmp_path, False), "Title.", [("a", "1"), ("b", "2")]
    )
    assert json.loads(path.read_text()) == {"benchmark": "demo"}
    assert "| a | b |\n| --- | --- |\n| 1 | 2 |" in md.read_text()
    assert capsys.readouterr().out.strip() == f"results: {path}; row appended to {md}"


def test_no_record_writes_the_json_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    md = tmp_path / "RESULTS.md"
    monkeypatch.setattr(results, "RESULTS_MD", md)
    path = results.record("demo", {}, _args(tmp_path, True), "Title.", [("a", "1")])
    assert path.exists() and not md.exists()
    assert capsys.readouterr().out.strip() == f"results: {path}"  # what `bench all` reads


def test_run_record_starts_every_json_alike() -> None:
    args = argparse.Namespace(quick=True, output=Path("x.json"), shards=None)
    rec = results.run_record("demo", "2026-12-03T23:00:00+00:00", 12.345, {"cpus": 2}, args)
    assert rec == {
        "benchmark": "demo",
        "started_at": "2026-12-03T23:00:00+00:00",
        "runtime_s": 12.3,
        "machine": {"cpus": 2},
        "args": {"quick": True, "output": "x.json", "shards": None},
    }


def test_a_table_aligns_its_label_columns_left_and_figures_right() -> None:
    assert results.format_table(["name", "n"], [["a", "10"], ["long", "2"]]) == (
        "name |  n\n-----+---\na    | 10\nlong |  2"
    )


async def test_a_window_waits_for_late_deliveries_until_they_stop_coming() -> None:
    """bench/loadgen.py `until_quiet`: deliveries still arriving after the window (a loaded
    machine's tail) are waited for, period after period, until one period brings none."""
    from bench.loadgen import until_quiet

    arrivals = iter([5, 3, 0, 7])  # what each period brings
    received = [100]

    async def sleep(_: float) -> None:
        received[0] += next(arrivals)

    assert await until_quiet(lambda: received[0], 1.0, cap_s=30.0, sleep=sleep) == 3
    assert received[0] == 108


async def test_a_window_stops_waiting_at_its_cap() -> None:
    from bench.loadgen import until_quiet

    received = [0]

    async def sleep(_: float) -> None:
        received[0] += 1  # never quiet

    assert await until_quiet(lambda: received[0], 2.0, cap_s=10.0, sleep=sleep) == 5
