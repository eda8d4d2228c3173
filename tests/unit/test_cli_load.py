"""`presence load`'s answers to what it cannot load, without a database: one line each, exit 2 for
the file, 1 for a database that is away, never a traceback (an operator's pass found three)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cluster import cli


def _load(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch) -> int:
    with socket.socket() as s:  # a port nobody listens on: no database
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PRESENCE_DATABASE_URL", f"postgresql://u:p@127.0.0.1:{port}/db")
    graph = tmp_path / "graph.json"
    graph.write_text(text)
    return cli.main(["load", str(graph), "--data-dir", str(tmp_path)])


def test_a_key_named_twice_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`json` keeps the last value: the first `users` list was dropped without a word."""
    assert _load(tmp_path, '{"users": [{"id": "a"}], "users": [{"id": "b"}]}', monkeypatch) == 2
    assert "the key 'users' appears twice in one object" in capsys.readouterr().err


def test_json_nested_too_deeply_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _load(tmp_path, "[" * 100_000 + "]" * 100_000, monkeypatch) == 2
    err = capsys.readouterr().err
    assert "nested too deeply" in err and "Traceback" not in err


def test_a_database_that_is_away_is_one_line_and_nothing_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _load(tmp_path, '{"users": [{"id": "a"}]}', monkeypatch) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("presence load: PostgreSQL did not take the load")
    assert lines[0].endswith("nothing was loaded")
