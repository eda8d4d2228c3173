"""Shards and edges on different Ray nodes of one machine, talking as they would across hosts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from .conftest import Cluster, Ids, load

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


async def test_shards_and_edges_on_different_nodes(
    cluster: Cluster, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob = ids("alice"), ids("bob")
    await load(conn, {"friendships": [[alice, bob]]})
    env = {
        **os.environ,
        "MN_DATABASE_URL": cluster.database_url,
        "MN_REDIS_URL": cluster.redis_url,
        "MN_ALICE": alice,
        "MN_BOB": bob,
        "PYTHONPATH": str(ROOT),
    }
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run(
        [sys.executable, "-m", "tests.integration.multinode_scenario"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert out.returncode == 0 and lines, out.stdout[-2000:] + out.stderr[-4000:]
    result = json.loads(lines[-1])
    nodes = result["nodes"]
    # One shard and one edge on each worker node; nothing of ours on the head.
    assert result["shard_nodes"] == [nodes["a"], nodes["b"]]
    assert result["edge_nodes"] == [nodes["a"], nodes["b"]]
    assert result["seen"] == ["online", "dnd", "offline"]
