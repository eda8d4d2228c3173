"""ray_cluster.yaml gets through what `ray up` does before touching a machine: Ray's own
prepare_config (which refused `available_node_types` for on-premise clusters) and validate_config;
its start commands install a real package, run with token authentication, raise the file limit in
the command that starts each presence process, and are supervised and idempotent."""

from __future__ import annotations

import copy
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def load() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())  # type: ignore[no-any-return]


def prepared() -> dict[str, Any]:
    from ray.autoscaler._private.util import prepare_config

    return prepare_config(load())


def test_ray_prepares_and_validates_the_cluster_config() -> None:
    from ray.autoscaler._private.util import validate_config

    config = prepared()
    validate_config(config)
    assert config["provider"]["worker_ips"] and config["head_node_type"] in config["available_node_types"]


def test_validation_can_fail() -> None:
    from ray.autoscaler._private.util import validate_config

    broken = copy.deepcopy(prepared())
    broken["head_node_type"] = "no-such-node-type"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(broken)


def test_preparation_can_fail() -> None:
    config = load()
    config["available_node_types"] = {"head": {"resources": {}, "node_config": {}}}
    from ray.autoscaler._private.util import prepare_config

    with pytest.raises(BaseException):  # noqa: B017 - Ray's cli_logger.abort raises SystemExit-like errors
        prepare_config(config)


def commands(config: dict[str, Any], key: str) -> str:
    return "\n".join(config[key])


def test_head_runs_the_pool_and_workers_run_edges() -> None:
    config = load()
    head, workers = commands(config, "head_start_ray_commands"), commands(config, "worker_start_ray_commands")
    assert "presence up" in head and "RAY_ADDRESS=auto" in head
    assert "presence edge" in workers and '--address="$RAY_HEAD_IP:6379"' in workers


def test_a_real_install_line() -> None:
    config = load()
    setup = commands(config, "setup_commands")
    assert "pip install" in setup and "~/presence-dist/presence_cluster-" in setup
    assert "OWNER" not in setup and "git+" not in setup
    assert config["file_mounts"]["~/presence-dist"] == "./dist"


def test_ray_runs_with_token_authentication_and_the_token_is_owner_only() -> None:
    config = load()
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"
    assert "chmod 600 ~/.ray/auth_token" in commands(config, "setup_commands")
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        for cmd in config[key]:
            if "ray start" in cmd or "presence " in cmd:
                assert "RAY_AUTH_MODE=token" in cmd, cmd
    assert "--dashboard-host=127.0.0.1" in commands(config, "head_start_ray_commands")


@pytest.mark.parametrize("key", ["head_start_ray_commands", "worker_start_ray_commands"])
def test_presence_processes_are_supervised_idempotent_and_get_their_file_limit(key: str) -> None:
    (start,) = [c for c in load()[key] if "presence " in c]
    assert "flock -n ~/.presence/supervisor.lock" in start  # a second `ray up` starts nothing twice
    assert "while true" in start  # restarted when it exits
    # The limit is raised in the very command that execs the presence process.
    assert '(ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"; exec presence ' in start


def test_a_worker_whose_ray_is_gone_starts_it_again_before_its_edge(tmp_path: Path) -> None:
    """After a partition longer than Ray's verdict the node's raylet has exited (no GCS for 60 s,
    or told it is dead) and nothing else brings it back: the worker's supervisor loop starts Ray
    there again, with the start command's arguments, before `presence edge` (which would only wait
    for a Ray that is not there). The loop runs for real with `pgrep`, `ray` and `presence` faked."""
    worker = load()["worker_start_ray_commands"]
    (start,) = [c for c in worker if "presence edge" in c]
    (ray_start,) = [c for c in worker if "ray start" in c and "presence edge" not in c]
    fakes, home = tmp_path / "bin", tmp_path / "home"
    fakes.mkdir()
    home.mkdir()
    (home / ".presence.env").write_text("PRESENCE_X=1\n")
    calls = tmp_path / "calls"
    for name, body in {
        "pgrep": "exit 1",  # no raylet on this node
        "ray": f'echo "ray $*" >> {calls}',
        # The edge ends the loop: kill its supervisor (the loop's shell).
        "presence": f'echo "presence $*" >> {calls}; kill -TERM $PPID',
    }.items():
        (fakes / name).write_text(f"#!/bin/bash\n{body}\n")
        (fakes / name).chmod(0o755)
    env = {"PATH": f"{fakes}:/usr/bin:/bin", "HOME": str(home), "NODE_IP": "10.9.9.9"}
    env["RAY_HEAD_IP"] = "10.9.9.1"
    subprocess.run(["bash", "-c", start], env=env, check=True, timeout=10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (calls.exists() and "presence edge" in calls.read_text()):
        time.sleep(0.1)  # the loop runs in the background (nohup ... &)
    lines = calls.read_text().splitlines()
    assert lines[0] == (
        "ray start --address=10.9.9.1:6379 --node-ip-address=10.9.9.9 "
        '--resources={"presence_edge": 1, "presence_shard": 1}'
    ), lines
    assert lines[1].startswith("presence edge"), lines
    # The same arguments as the start command `ray up` runs (one rule, said twice).
    for arg in ('--address="$RAY_HEAD_IP:6379"', '"presence_edge": 1, "presence_shard": 1'):
        assert arg in ray_start.replace('\\"', '"').replace("'", ""), arg
