"""Ray with token authentication (issue 14, item 2): a process that reaches Ray's ports without
the cluster's token cannot call a shard; the token file is owner-only; joining a cluster that
requires tokens is detected before Ray's own half-minute of retries."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from actors import clients
from cluster import rayauth

from .conftest import Cluster

pytestmark = pytest.mark.integration

CALL_SHARD = """
import sys
import ray
ray.init(address=sys.argv[1], namespace=sys.argv[2], include_dashboard=False, log_to_driver=False)
shard = ray.get_actor("shard-0")
print("CALLED", ray.get(shard.stats.remote(), timeout=20).shard)
"""


def call_shard(cluster: Cluster, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    # Ray retries a refused connection for ~20 s by default; two tries are enough to be refused.
    base["RAY_gcs_server_port_wait_time_s"] = "2"
    return subprocess.run(
        [sys.executable, "-c", CALL_SHARD, clients.gcs_address(), cluster.namespace],
        capture_output=True,
        text=True,
        timeout=90,
        env={**base, **env},
    )


def test_the_test_cluster_runs_with_token_authentication(cluster: Cluster) -> None:
    assert os.environ.get("RAY_AUTH_MODE") == "token"
    if not os.environ.get("RAY_AUTH_TOKEN"):
        mode = stat.S_IMODE(rayauth.token_path().stat().st_mode)
        assert mode == 0o600, oct(mode)


def test_a_client_without_the_token_cannot_call_a_shard(cluster: Cluster) -> None:
    refused = call_shard(cluster, RAY_AUTH_MODE="disabled")
    assert refused.returncode != 0 and "CALLED" not in refused.stdout, refused.stdout
    assert "InvalidAuthToken" in refused.stderr or "Authentication" in refused.stderr, refused.stderr[-2000:]
    wrong = call_shard(cluster, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="not-the-token-" + "0" * 50)
    assert wrong.returncode != 0 and "CALLED" not in wrong.stdout, wrong.stdout
    # The same call with the cluster's token goes through: the refusals above are the token's doing.
    allowed = call_shard(cluster, RAY_AUTH_MODE="token")
    assert "CALLED 0" in allowed.stdout, allowed.stderr[-2000:]


def test_joining_a_token_cluster_is_detected(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    address = clients.gcs_address()
    assert rayauth.probe(address) == "auth"
    monkeypatch.delenv("RAY_AUTH_MODE")
    rayauth.prepare_join(address)  # a token is at hand (this machine's): the mode is set
    assert os.environ["RAY_AUTH_MODE"] == "token"


def test_joining_a_token_cluster_without_a_token_is_one_line(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "no-token-here"))
    with pytest.raises(SystemExit) as e:
        rayauth.prepare_join(clients.gcs_address())
    message = str(e.value)
    assert "\n" not in message
    assert "requires token authentication: set RAY_AUTH_MODE=token" in message
    assert "RAY_AUTH_MODE" not in os.environ
