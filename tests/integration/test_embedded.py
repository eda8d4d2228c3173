"""The embedded PostgreSQL and Redis: real servers, real processes, nothing left behind."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import asyncpg
import psutil
import pytest
import redis

from cluster.embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedServerError, free_port

pytestmark = pytest.mark.integration


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def live_processes_mentioning(text: str) -> list[psutil.Process]:
    """Processes (zombies excluded: they hold nothing) whose command line or cwd mentions `text`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if text in " ".join(proc.info["cmdline"] or ()) or text in proc.cwd():
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def scratch(embedded_dir: Path) -> Iterator[Path]:
    yield Path(tempfile.mkdtemp(dir=embedded_dir))


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


async def test_postgres_start_stop_leaves_nothing(scratch: Path) -> None:
    server = EmbeddedPostgres()
    started = time.monotonic()
    url = server.start(scratch)
    assert time.monotonic() - started < 10
    assert url == f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
    assert server.pid is not None and server.running
    assert (scratch / "pg" / "PG_VERSION").exists()
    assert (scratch / "postgres.log").stat().st_size > 0

    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SHOW max_connections") == "200"
        assert await conn.fetchval("SHOW fsync") == "on"
        assert await conn.fetchval("SHOW listen_addresses") == "127.0.0.1"
    finally:
        await conn.close()

    assert live_processes_mentioning(str(scratch / "pg"))
    port = server.port
    assert port is not None
    server.stop()
    assert server.pid is None and not server.running
    assert live_processes_mentioning(str(scratch / "pg")) == []
    assert not port_open(port)
    server.stop()  # idempotent


async def test_postgres_restart_keeps_port_and_data(embedded_pg: EmbeddedPostgres) -> None:
    url, old_pid = embedded_pg.url, embedded_pg.pid
    conn = await asyncpg.connect(url)
    await conn.execute("CREATE TABLE IF NOT EXISTS kept (v int); TRUNCATE kept; INSERT INTO kept VALUES (7)")
    await conn.close()

    assert embedded_pg.restart() == url
    assert old_pid is not None and embedded_pg.pid != old_pid
    assert not pid_alive(old_pid)
    conn = await asyncpg.connect(url)
    try:
        assert await conn.fetchval("SELECT v FROM kept") == 7
    finally:
        await conn.execute("DROP TABLE kept")
        await conn.close()


def test_postgres_adopts_a_server_left_running(scratch: Path) -> None:
    first = EmbeddedPostgres()
    url = first.start(scratch)
    pid = first.pid
    # A new process (a restarted `presence up`) finds the server of the killed previous one.
    second = EmbeddedPostgres()
    started = time.monotonic()
    assert second.start(scratch) == url
    assert time.monotonic() - started < 1.0
    assert second.pid == pid
    second.stop()
    assert not first.running
    assert live_processes_mentioning(str(scratch / "pg")) == []


async def test_postgres_starts_after_kill_9(scratch: Path) -> None:
    server = EmbeddedPostgres()
    url = server.start(scratch)
    pid = server.pid
    assert pid is not None
    client = await asyncpg.connect(url)  # a backend that outlives its postmaster for a moment
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not pid_alive(pid), what="the killed postmaster to exit")
    client.terminate()
    pidfile = scratch / "pg" / "postmaster.pid"
    assert pidfile.exists()  # stale
    # Make it worse: the stale pid now belongs to a live process that is not postgres.
    lines = pidfile.read_text().splitlines()
    pidfile.write_text("\n".join([str(os.getpid()), *lines[1:]]) + "\n")

    fresh = EmbeddedPostgres()
    assert fresh.start(scratch).startswith("postgresql://postgres@127.0.0.1:")
    assert fresh.running and fresh.pid != pid
    conn = await asyncpg.connect(fresh.url)
    assert await conn.fetchval("SELECT 1") == 1
    await conn.close()
    fresh.stop()
    assert live_processes_mentioning(str(scratch / "pg")) == []


def test_postgres_start_failure_shows_the_log(scratch: Path) -> None:
    server = EmbeddedPostgres()
    server.start(scratch)
    server.stop()
    port = server.port
    assert port is not None
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(EmbeddedServerError, match="Address already in use"):
            server.start(scratch)  # the same port again, as a restart must
    assert live_processes_mentioning(str(scratch / "pg")) == []


def test_redis_start_restart_stop(scratch: Path) -> None:
    server = EmbeddedRedis()
    url = server.start(scratch)
    assert url == f"redis://127.0.0.1:{server.port}/0"
    pid = server.pid
    assert pid is not None

    client = redis.Redis.from_url(url)
    client.set("k", "v")
    assert server.restart() == url
    assert server.pid != pid and not pid_alive(pid)
    assert client.get("k") is None  # nothing is persisted: a restart is also a wipe
    assert client.ping()
    client.close()

    assert (scratch / "redis" / "redis.log").stat().st_size > 0
    port = server.port
    assert port is not None
    server.stop()
    assert server.pid is None
    assert live_processes_mentioning(str(scratch / "redis")) == []
    assert not port_open(port)
    server.stop()  # idempotent


def test_redis_stops_a_leftover_on_the_same_directory(scratch: Path) -> None:
    leftover = EmbeddedRedis()
    leftover.start(scratch)
    old_pid = leftover.pid
    assert old_pid is not None

    server = EmbeddedRedis()
    server.start(scratch)
    assert not pid_alive(old_pid)
    assert server.pid != old_pid and server.running
    server.stop()
    leftover.stop()
    assert live_processes_mentioning(str(scratch / "redis")) == []


def test_redis_start_failure_shows_the_log(scratch: Path) -> None:
    server = EmbeddedRedis()
    server.start(scratch)
    server.stop()
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", server.port or 0))
        squatter.listen()
        with pytest.raises(EmbeddedServerError, match="Address already in use"):
            server.start(scratch)
    assert server.pid is None
    assert live_processes_mentioning(str(scratch / "redis")) == []


def test_embedded_fixtures_are_running(embedded_pg: EmbeddedPostgres, embedded_redis: EmbeddedRedis) -> None:
    assert embedded_pg.running and port_open(embedded_pg.port or 0)
    embedded_redis.stop()
    assert not embedded_redis.running  # the fixture restarts it for the next test that asks
