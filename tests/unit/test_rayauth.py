"""Ray token authentication chosen before Ray is imported (cluster/rayauth.py): the token file is
created or tightened to 0600, a local instance gets tokens unless disabled explicitly, and a
cluster to join gets the mode it requires or a one-line error; `presence up` never joins a stale
`ray start` cluster."""

from __future__ import annotations

import os
import secrets
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from cluster import rayauth


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path / ".ray" / "auth_token"


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_token_file_being_written_is_never_seen_empty(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two processes starting Ray at once (parallel test workers, two `presence up`): the one that
    finds the file while the other is still writing it must not go on with an empty token."""
    writing, release = threading.Event(), threading.Event()
    real_token_hex = secrets.token_hex
    calls: list[int] = []

    def slow_first_token(nbytes: int) -> str:
        calls.append(nbytes)
        if len(calls) == 1:  # the first writer stops half-way
            writing.set()
            release.wait(5)
        return real_token_hex(nbytes)

    monkeypatch.setattr(rayauth.secrets, "token_hex", slow_first_token)
    first = threading.Thread(target=rayauth.ensure_token_file)
    first.start()
    try:
        assert writing.wait(5)
        rayauth.ensure_token_file()  # the second, meanwhile
        assert len(env.read_text()) == 64, "the second starter saw a token file still being written"
    finally:
        release.set()
        first.join(5)
    assert len(env.read_text()) == 64 and mode_of(env) == 0o600
    assert [p.name for p in env.parent.iterdir()] == ["auth_token"], "no draft left behind"


def test_a_new_token_file_is_owner_only(env: Path) -> None:
    assert rayauth.ensure_token_file() == env
    assert mode_of(env) == 0o600 and len(env.read_text()) == 64


def test_an_open_token_file_is_tightened_and_kept(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.parent.mkdir()
    env.write_text("existing")
    os.chmod(env, 0o644)
    rayauth.ensure_token_file()
    assert mode_of(env) == 0o600 and env.read_text() == "existing"
    assert "now 0600" in capsys.readouterr().err


def test_a_local_instance_gets_tokens(env: Path) -> None:
    assert rayauth.prepare_local() == "token"
    assert os.environ["RAY_AUTH_MODE"] == "token" and mode_of(env) == 0o600


def test_tokens_off_only_when_asked_and_then_warned(
    env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert rayauth.prepare_local() == "disabled"
    assert "token authentication is off" in capsys.readouterr().err
    assert not env.exists()


def test_token_path_follows_ray(env: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert rayauth.token_path() == env
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "t"))
    assert rayauth.token_path() == tmp_path / "t"


def probe_answers(monkeypatch: pytest.MonkeyPatch, answer: str) -> list[str]:
    asked: list[str] = []

    def fake(address: str, timeout_s: float = 0) -> str:
        asked.append(address)
        return answer

    monkeypatch.setattr(rayauth, "probe", fake)
    return asked


def test_join_sets_token_mode_when_the_cluster_wants_it(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = probe_answers(monkeypatch, "auth")
    rayauth.ensure_token_file()
    rayauth.prepare_join("10.0.0.10:6379")
    assert asked == ["10.0.0.10:6379"] and os.environ["RAY_AUTH_MODE"] == "token"


def test_join_without_a_token_is_one_line(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe_answers(monkeypatch, "auth")
    with pytest.raises(SystemExit) as e:
        rayauth.prepare_join("10.0.0.10:6379")
    assert "\n" not in str(e.value) and "set RAY_AUTH_MODE=token" in str(e.value)


def test_join_of_an_open_cluster_changes_nothing(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe_answers(monkeypatch, "ok")
    rayauth.prepare_join("10.0.0.10:6379")
    assert "RAY_AUTH_MODE" not in os.environ


def test_join_of_an_unreachable_cluster_is_one_line(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe_answers(monkeypatch, "no answer from its GCS within 15 s (check the address and the firewall)")
    with pytest.raises(SystemExit) as e:
        rayauth.prepare_join("10.0.0.10:6379")
    assert str(e.value).startswith("presence: cannot join Ray at 10.0.0.10:6379: no answer")


@pytest.mark.parametrize("address", [None, "auto", "local"])
def test_no_probe_for_addresses_ray_resolves_itself(
    env: Path, monkeypatch: pytest.MonkeyPatch, address: str | None
) -> None:
    asked = probe_answers(monkeypatch, "auth")
    rayauth.prepare_join(address)
    assert asked == []


def test_explicit_mode_is_respected_but_needs_a_token(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = probe_answers(monkeypatch, "auth")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(SystemExit, match="no Ray token"):
        rayauth.prepare_join("10.0.0.10:6379")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "x" * 64)
    rayauth.prepare_join("10.0.0.10:6379")
    assert asked == []


def test_up_starts_a_new_local_instance_never_the_last_ray_start_cluster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    from actors import clients

    seen: dict[str, Any] = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.update(kw))
    clients.connect(None, "ns")
    assert seen["address"] == "local"
    clients.connect("10.0.0.10:6379", "ns")
    assert seen["address"] == "10.0.0.10:6379"


def test_the_process_raises_its_own_soft_file_limit_to_the_hard_one() -> None:
    import resource

    from cluster.runtime import raise_open_files_limit

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        before, after = raise_open_files_limit()
        assert before == min(256, hard)
        expected = hard if hard != resource.RLIM_INFINITY else 1 << 20
        assert after == expected == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
