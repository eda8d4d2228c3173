"""cluster/drain.py, the parts without an edge: which URL `presence drain` asks, and its exit codes
for what it could not even ask (the asking itself: tests/integration/test_drain.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.config import Settings
from cluster.drain import DrainUsage, drain, edge_url


@pytest.mark.parametrize("given", ["127.0.0.1:8766", "http://[::1", "ftp://host:8766", "notaurl", "http://"])
def test_what_is_no_internal_url_is_said_so(given: str) -> None:
    """Before: "the edge at notaurl did not answer (ValueError)", as if something had been tried."""
    with pytest.raises(DrainUsage, match="is not an edge's internal URL"):
        edge_url(Settings(), given)


def test_an_internal_url_is_taken_as_given() -> None:
    assert edge_url(Settings(), "http://10.0.0.5:8766/") == "http://10.0.0.5:8766"


def test_nothing_to_ask_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert drain(Settings(data_dir=tmp_path), None, wait=False) == 2
    assert drain(Settings(data_dir=tmp_path), "notaurl", wait=False) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("presence drain: ") for line in lines)
