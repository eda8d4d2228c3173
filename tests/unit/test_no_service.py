"""Issue 29: commands that need the running service's secret find none and say so (exit 2)
instead of making up their own; `presence config` shows what the running service uses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cluster.cli import main
from cluster.runtime import ClusterInfo, write_info


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "PRESENCE_TOKEN_SECRET",
        "PRESENCE_INTERNAL_TOKEN",
        "PRESENCE_DATABASE_URL",
        "PRESENCE_REDIS_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_token_outside_the_project_exits_2_and_creates_nothing(
    tmp_path: Path, clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        main(["token", "alice", "--data-dir", str(tmp_path / ".presence")])
    assert e.value.code == 2
    err = capsys.readouterr()
    assert err.out == "" and "no running service" in err.err
    assert not (tmp_path / ".presence").exists()


def test_token_with_the_service_secret_still_works(tmp_path: Path, clean_env: None) -> None:
    (tmp_path / "secret").write_text("s" * 40)
    assert main(["token", "alice", "--data-dir", str(tmp_path)]) == 0


def test_config_shows_what_the_running_service_uses(
    tmp_path: Path, clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    write_info(
        tmp_path,
        ClusterInfo(
            "postgresql://postgres:pw1@127.0.0.1:5432/presence",
            "redis://:pw2@127.0.0.1:6379/0",
            "127.0.0.1:6379",
            "presence",
            "",
            "",
            1,
        ),
    )
    (tmp_path / "secret").write_text("the-secret")
    (tmp_path / "internal-token").write_text("the-internal-token")
    assert main(["config", "--json", "--data-dir", str(tmp_path)]) == 0
    values = json.loads(capsys.readouterr().out)
    assert values["database_url"] == "postgresql://postgres:<redacted>@127.0.0.1:5432/presence"
    assert values["redis_url"] == "redis://:<redacted>@127.0.0.1:6379/0"
    assert values["token_secret"] == "<redacted>" and values["internal_token"] == "<redacted>"
    assert main(["config", "--data-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert "pw1" not in text and "the-secret" not in text and "the-internal-token" not in text
    line = next(ln for ln in text.splitlines() if ln.startswith("PRESENCE_DATABASE_URL "))
    assert "(running service)" in line


def test_config_without_a_service_shows_unset(
    tmp_path: Path, clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "--json", "--data-dir", str(tmp_path)]) == 0
    values = json.loads(capsys.readouterr().out)
    assert values["database_url"] is None and values["token_secret"] is None
