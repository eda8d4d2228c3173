"""ray_cluster.yaml is a valid Ray cluster-launcher config, checked by Ray's own validation."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def load() -> dict[str, object]:
    return yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())  # type: ignore[no-any-return]


def test_ray_validates_the_cluster_config() -> None:
    from ray.autoscaler._private.util import validate_config

    validate_config(load())


def test_validation_can_fail() -> None:
    from ray.autoscaler._private.util import validate_config

    broken = copy.deepcopy(load())
    broken["head_node_type"] = "no-such-node-type"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(broken)


def test_head_runs_the_pool_and_workers_run_edges() -> None:
    config = load()
    head = " ".join(config["head_start_ray_commands"])  # type: ignore[arg-type]
    workers = " ".join(config["worker_start_ray_commands"])  # type: ignore[arg-type]
    assert "presence up" in head and "RAY_ADDRESS=auto" in head
    assert "presence edge" in workers and "--address=$RAY_HEAD_IP:6379" in workers
    assert any("pip install" in c for c in config["setup_commands"])  # type: ignore[union-attr]
