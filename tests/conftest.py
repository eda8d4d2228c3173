"""Shared fixtures: PostgreSQL and Redis for the tests that ask for them.

Servers start lazily, only when a test requests a fixture, so unit tests never pay for them.
`pg_url` / `redis_url` are shared by the whole session and come from `PRESENCE_DATABASE_URL` /
`PRESENCE_REDIS_URL` when set; `embedded_pg` / `embedded_redis` are always private embedded
servers that a test may stop and restart without disturbing the shared ones.

Embedded servers live in their own `mkdtemp` directories under /tmp rather than under pytest's
tmp_path: PostgreSQL runs as another system user that must traverse the path, and pytest resets
its base directory to 0700 at the start of every session (including a parallel one).

Under pytest-xdist every worker is a session of its own with its own servers; how the tests are
shared out among the workers is tests/parallel.py.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import hypothesis
import pytest

from tests import parallel

if TYPE_CHECKING:
    import asyncpg
    from xdist.remote import Producer
    from xdist.scheduler.protocol import Scheduling

    from cluster.embedded import EmbeddedPostgres, EmbeddedRedis

TABLES = ("users", "friendships", "servers", "server_members", "channels")

# Hypothesis fails an example that takes over 200 ms by default: on two cores shared by parallel
# workers that measures the machine's load, not the code. Examples and steps are unchanged.
hypothesis.settings.register_profile("presence", deadline=None)
hypothesis.settings.load_profile("presence")


@pytest.hookimpl(tryfirst=True)  # before xdist names the lanes' tests after their group
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        parallel.heaviest_first(items)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return parallel.auto_workers()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    return parallel.make_scheduler(config, log)


_packing = parallel.Packing()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # On the controller of a parallel run, reports carry the worker that ran them.
    node = getattr(report, "node", None)
    if node is not None:
        _packing.add(node.gateway.id, report.nodeid, report.duration)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _packing.seconds:
        terminalreporter.write_sep("=", "how the groups packed onto the workers (tests/parallel.py)")
        for line in _packing.lines():
            terminalreporter.write_line(line)
        # Not a PRESENCE_* name: `presence` warns about those that name no setting.
        if path := os.environ.get("TEST_PACKING_FILE"):
            Path(path).write_text("\n".join(_packing.modules()) + "\n")


@pytest.fixture(scope="session")
def embedded_dir() -> Iterator[Path]:
    """One scratch directory under /tmp for every embedded server of the session."""
    path = Path(tempfile.mkdtemp(prefix="presence-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _start_pg(data_dir: Path) -> EmbeddedPostgres:
    from cluster.embedded import EmbeddedPostgres

    server = EmbeddedPostgres()
    with parallel.one_start_at_a_time():
        server.start(data_dir)
    return server


def _start_redis(data_dir: Path) -> EmbeddedRedis:
    from cluster.embedded import EmbeddedRedis

    server = EmbeddedRedis()
    server.start(data_dir)
    return server


@pytest.fixture(scope="session")
def pg_url(embedded_dir: Path) -> Iterator[str]:
    """The session's shared PostgreSQL (external when PRESENCE_DATABASE_URL is set)."""
    if url := os.environ.get("PRESENCE_DATABASE_URL"):
        yield url
        return
    server = _start_pg(embedded_dir / "shared")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(embedded_dir: Path) -> Iterator[str]:
    """The session's shared Redis (external when PRESENCE_REDIS_URL is set)."""
    if url := os.environ.get("PRESENCE_REDIS_URL"):
        yield url
        return
    server = _start_redis(embedded_dir / "shared")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _private_pg(embedded_dir: Path) -> Iterator[EmbeddedPostgres]:
    server = _start_pg(embedded_dir / "private")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _private_redis(embedded_dir: Path) -> Iterator[EmbeddedRedis]:
    server = _start_redis(embedded_dir / "private")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def embedded_pg(_private_pg: EmbeddedPostgres) -> EmbeddedPostgres:
    """A private PostgreSQL the test may stop and restart; running (same URL) at every test start."""
    if not _private_pg.running:
        _private_pg.restart()
    return _private_pg


@pytest.fixture
def embedded_redis(_private_redis: EmbeddedRedis) -> EmbeddedRedis:
    """A private Redis the test may stop and restart; running (same URL) at every test start."""
    if not _private_redis.running:
        _private_redis.restart()
    return _private_redis


@pytest.fixture(scope="session")
async def migrated_pg_url(pg_url: str) -> str:
    """The shared PostgreSQL with the schema applied (once per session)."""
    from cluster.db import migrate

    await migrate(pg_url)
    return pg_url


@pytest.fixture
async def db(migrated_pg_url: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection to the migrated shared database, every table emptied first."""
    import asyncpg

    conn = await asyncpg.connect(migrated_pg_url)
    try:
        await conn.execute(f"TRUNCATE {', '.join(TABLES)}")
        yield conn
    finally:
        await conn.close()
