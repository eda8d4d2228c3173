"""A real cluster for the integration tests: local Ray, the actor pool on real PostgreSQL and Redis,
and edges serving real websockets on free ports.

Timings are shortened (socket timeout 8 s, count refresh 1 s, flush 0.2 s) so that aging and
healing happen within a test's patience; the rules are the same as in production.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from actors import ray_api
from actors.presence import ShardConfig
from cluster import db
from cluster.runtime import ClusterInfo, write_info
from edge.server import Edge, EdgeConfig
from edge.session import Limits
from edge.tokens import mint_token

SECRET = "integration-test-secret-of-at-least-32-bytes"
SOCKET_TIMEOUT_S = 8.0
PULL_WAIT_S = 1.0
SHARDS = 3


@dataclass
class Cluster:
    database_url: str
    redis_url: str
    namespace: str
    data_dir: Path

    def token(self, user: str, ttl_s: int = 3600) -> str:
        return mint_token(user, SECRET, ttl_s=ttl_s)

    def edge_config(self, **overrides: object) -> EdgeConfig:
        base: dict[str, object] = {
            "secret": SECRET, "redis_url": self.redis_url, "ws_host": "127.0.0.1", "ws_port": 0,
            "internal_port": 0, "pull_wait_s": PULL_WAIT_S, "count_ttl_s": 4.0,
            "limits": Limits(),
        }
        return EdgeConfig(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def cluster(migrated_pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    namespace = f"presence-test-{uuid.uuid4().hex[:8]}"
    ray_api.connect(os.environ.get("RAY_ADDRESS"), namespace)
    config = ShardConfig(
        shard_index=0, database_url=migrated_pg_url, redis_url=redis_url,
        socket_timeout_s=SOCKET_TIMEOUT_S, count_refresh_s=1.0, count_ttl_s=4.0,
        checkpoint_interval_s=3600.0, sweep_interval_s=0.2,
    )
    ray_api.start_pool(SHARDS, config, flush_interval_s=0.2, flush_max_rows=1000)
    data_dir = tmp_path_factory.mktemp("presence-data")
    (data_dir / "secret").write_text(SECRET)
    write_info(data_dir, ClusterInfo(migrated_pg_url, redis_url, ray_api.gcs_address(), namespace, "", "", os.getpid(),
                                     ray_api.auth_mode()))
    try:
        yield Cluster(migrated_pg_url, redis_url, namespace, data_dir)
    finally:
        ray_api.stop_pool(drain_timeout_s=5)
        ray_api.shutdown()


@pytest.fixture(scope="session")
async def edge(cluster: Cluster) -> AsyncIterator[Edge]:
    e = Edge(cluster.edge_config())
    await e.start()
    yield e
    await e.stop()


@pytest.fixture(scope="session")
async def second_edge(cluster: Cluster) -> AsyncIterator[Edge]:
    e = Edge(cluster.edge_config())
    await e.start()
    yield e
    await e.stop()


def ws_url(e: Edge) -> str:
    return f"ws://127.0.0.1:{e.ws_port}/ws/presence"


def internal_url(e: Edge) -> str:
    return f"http://127.0.0.1:{e.internal_port}"


@pytest.fixture
async def conn(cluster: Cluster) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(cluster.database_url)
    yield c
    await c.close()


@pytest.fixture
def ids() -> "Ids":
    return Ids()


class Ids:
    """Fresh account, server and channel ids per test, so tests never see each other's state."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]

    def __call__(self, name: str) -> str:
        return f"{name}-{self.tag}"


async def load(c: asyncpg.Connection, fixture: dict[str, object]) -> None:
    await db.load_fixture(c, fixture)
