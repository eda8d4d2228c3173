"""protocol.md "Safe defaults": both ports on 127.0.0.1 unless told otherwise, the demo only on a
loopback public host with the embedded database, an exposed internal API only with a token."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from cluster.config import Settings
from cluster.runtime import CLUSTER_FILE, SECRET_FILE, ClusterInfo, read_info, token_secret, write_info
from cluster.up import demo_mode
from edge.http import internal_exposure_problem, is_loopback


def test_both_ports_bind_to_loopback_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRESENCE_WS_HOST", raising=False)
    monkeypatch.delenv("PRESENCE_INTERNAL_HOST", raising=False)
    settings = Settings()
    assert settings.ws_host == "127.0.0.1"
    assert settings.internal_host == "127.0.0.1"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("10.0.0.5", False),
        ("presence.internal", False),
    ],
)
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_demo_only_on_loopback_with_the_embedded_database() -> None:
    assert demo_mode(Settings(ws_host="127.0.0.1", database_url=None)) == (True, None)
    on, why = demo_mode(Settings(ws_host="0.0.0.0", database_url=None))
    assert not on and why is not None and "loopback" in why
    on, why = demo_mode(Settings(ws_host="127.0.0.1", database_url="postgresql://db.internal/presence"))
    assert not on and why is not None and "embedded" in why
    assert demo_mode(Settings(demo=False)) == (False, None)


def test_exposed_internal_api_needs_a_token() -> None:
    assert internal_exposure_problem("127.0.0.1", None) is None
    assert internal_exposure_problem("0.0.0.0", "t") is None
    problem = internal_exposure_problem("0.0.0.0", None)
    assert problem is not None and "PRESENCE_INTERNAL_TOKEN" in problem and "\n" not in problem


def test_cluster_json_and_the_secret_are_owner_only(tmp_path: Path) -> None:
    """cluster.json carries the database and Redis URLs with their passwords: 0600, also when an
    older version left it 0644."""
    path = tmp_path / CLUSTER_FILE
    path.write_text("{}")
    path.chmod(0o644)
    info = ClusterInfo("postgresql://postgres:pw@127.0.0.1:5/postgres", None, "ray", "ns", "", "", 1)
    write_info(tmp_path, info)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_info(tmp_path) == info
    secret = tmp_path / SECRET_FILE
    secret.write_text("s3cret")
    secret.chmod(0o644)
    assert token_secret(Settings(data_dir=tmp_path, token_secret=None)) == "s3cret"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
