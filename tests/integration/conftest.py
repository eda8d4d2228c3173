"""A real cluster for the integration tests: local Ray, the actor pool on real PostgreSQL and Redis,
and edges serving real websockets on free ports.

Timings are shortened (socket timeout 8 s, count refresh 1 s, flush 0.2 s) so that aging and
healing happen within a test's patience; the rules are the same as in production.
"""

from __future__ import annotations

import asyncio
import os
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import pytest

from actors import clients
from actors.pool import start_pool, stop_pool
from actors.presence import ShardConfig
from cluster import db, rayauth
from cluster.embedded import EmbeddedPostgres, EmbeddedRedis
from cluster.runtime import ClusterInfo, write_info
from edge.server import Edge, EdgeConfig
from edge.session import Limits
from edge.tokens import mint_token
from tests.parallel import one_start_at_a_time

SECRET = "integration-test-secret-of-at-least-32-bytes"
# Every edge's internal API wants a token (protocol.md "Internal HTTP"); the tests' edges share
# this one, also written to the data directory's `internal-token` as `presence up` does.
INTERNAL_TOKEN = "integration-internal-token"
SOCKET_TIMEOUT_S = 8.0
PULL_WAIT_S = 1.0
SHARDS = 3


@dataclass
class Cluster:
    database_url: str
    redis_url: str
    namespace: str
    data_dir: Path
    # The servers themselves, for fault tests that stop and restart them (None when external).
    pg: EmbeddedPostgres | None = None
    redis: EmbeddedRedis | None = None

    def require_servers(self) -> tuple[EmbeddedPostgres, EmbeddedRedis]:
        if self.pg is None or self.redis is None:
            pytest.skip("fault injection needs the embedded servers (PRESENCE_*_URL point elsewhere)")
        return self.pg, self.redis

    def token(self, user: str, ttl_s: int = 3600) -> str:
        return mint_token(user, SECRET, ttl_s=ttl_s)

    def edge_config(self, **overrides: object) -> EdgeConfig:
        base: dict[str, object] = {
            "secret": SECRET,
            "redis_url": self.redis_url,
            "ws_host": "127.0.0.1",
            "ws_port": 0,
            "internal_port": 0,
            "internal_token": INTERNAL_TOKEN,
            "pull_wait_s": PULL_WAIT_S,
            "count_ttl_s": 4.0,
            "limits": Limits(),
        }
        return EdgeConfig(**{**base, **overrides})  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def cluster(embedded_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pg: EmbeddedPostgres | None = None
    rd: EmbeddedRedis | None = None
    migrated_pg_url = os.environ.get("PRESENCE_DATABASE_URL")
    redis_url = os.environ.get("PRESENCE_REDIS_URL")
    with one_start_at_a_time():
        if migrated_pg_url is None:
            pg = EmbeddedPostgres()
            migrated_pg_url = pg.start(embedded_dir / "cluster")
        if redis_url is None:
            rd = EmbeddedRedis()
            redis_url = rd.start(embedded_dir / "cluster")
        asyncio.run(db.migrate(migrated_pg_url))
        namespace = f"presence-test-{uuid.uuid4().hex[:8]}"
        if os.environ.get("RAY_ADDRESS"):
            rayauth.prepare_join(os.environ["RAY_ADDRESS"])
        else:
            rayauth.prepare_local()  # as `presence up` does: token authentication, token file 0600
        clients.connect(os.environ.get("RAY_ADDRESS"), namespace)
        config = ShardConfig(
            shard_index=0,
            database_url=migrated_pg_url,
            redis_url=redis_url,
            socket_timeout_s=SOCKET_TIMEOUT_S,
            count_refresh_s=1.0,
            count_ttl_s=4.0,
            checkpoint_interval_s=3600.0,
            sweep_interval_s=0.2,
        )
        start_pool(SHARDS, config, flush_interval_s=0.2, flush_max_rows=1000)
    data_dir = tmp_path_factory.mktemp("presence-data")
    (data_dir / "secret").write_text(SECRET)
    (data_dir / "internal-token").write_text(INTERNAL_TOKEN)
    write_info(
        data_dir,
        ClusterInfo(
            migrated_pg_url,
            redis_url,
            clients.gcs_address(),
            namespace,
            "",
            "",
            os.getpid(),
            clients.auth_mode(),
        ),
    )
    try:
        yield Cluster(migrated_pg_url, redis_url, namespace, data_dir, pg, rd)
    finally:
        for server in (pg, rd):
            if server is not None and not server.running:
                server.restart()
        stop_pool(drain_timeout_s=5)
        clients.shutdown()
        for server in (rd, pg):
            if server is not None:
                server.stop()


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


def internal_request(url: str, token: str = INTERNAL_TOKEN) -> urllib.request.Request:
    """A GET of the internal API carrying the tests' internal token."""
    return urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
async def conn(cluster: Cluster) -> AsyncIterator[asyncpg.Connection]:
    c = await asyncpg.connect(cluster.database_url)
    yield c
    await c.close()


@pytest.fixture
def ids() -> Ids:
    return Ids()


class Ids:
    """Fresh account, server and channel ids per test, so tests never see each other's state."""

    def __init__(self) -> None:
        self.tag = uuid.uuid4().hex[:6]

    def __call__(self, name: str) -> str:
        return f"{name}-{self.tag}"


async def load(c: asyncpg.Connection, fixture: dict[str, object]) -> None:
    await db.load_fixture(c, fixture)
