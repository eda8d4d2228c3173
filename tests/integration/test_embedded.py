"""The embedded PostgreSQL and Redis: real servers, real processes, nothing left behind."""

from __future__ import annotations

import os
import signal
import socket
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psutil
import pytest
import redis

from cluster.embedded import EmbeddedPostgres, EmbeddedRedis, EmbeddedServerError, free_port
from tests.timing import wait_until

pytestmark = pytest.mark.integration


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
    password = (scratch / "postgres.password").read_text().strip()
    assert url == f"postgresql://postgres:{password}@127.0.0.1:{server.port}/postgres"
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
    assert fresh.start(scratch).startswith("postgresql://postgres:")
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
    password = (scratch / "redis.password").read_text().strip()
    assert url == f"redis://:{password}@127.0.0.1:{server.port}/0"
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


# -- credentials (issue 14) ----------------------------------------------------------------------


async def test_postgres_refuses_clients_without_the_password(embedded_pg: EmbeddedPostgres) -> None:
    port = embedded_pg.port
    for url in (
        f"postgresql://postgres@127.0.0.1:{port}/postgres",  # trusted before
        f"postgresql://postgres:wrong@127.0.0.1:{port}/postgres",
    ):
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(url)
    # The local socket too (pg_hba.conf trusted every local connection as superuser before).
    socket_dir = embedded_pg.data_dir / "pg"
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(host=str(socket_dir), port=port, user="postgres", database="postgres")
    conn = await asyncpg.connect(embedded_pg.url)
    assert await conn.fetchval("SELECT 1") == 1
    await conn.close()
    password = embedded_pg.data_dir / "postgres.password"
    assert stat.S_IMODE(password.stat().st_mode) == 0o600
    assert password.read_text().strip() in embedded_pg.url


async def test_postgres_data_dir_from_before_credentials_is_upgraded(scratch: Path) -> None:
    server = EmbeddedPostgres()
    server.start(scratch)
    server.stop()
    # Put the directory back the way the code before credentials left it: trust, no password.
    hba = scratch / "pg" / "pg_hba.conf"
    hba.write_text("local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\n")
    (scratch / "postgres.password").unlink()
    upgraded = EmbeddedPostgres()
    url = upgraded.start(scratch)
    try:
        assert stat.S_IMODE((scratch / "postgres.password").stat().st_mode) == 0o600
        conn = await asyncpg.connect(url)
        await conn.close()
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{upgraded.port}/postgres")
    finally:
        upgraded.stop()


def test_redis_refuses_clients_without_the_password_and_keeps_its_config(
    embedded_redis: EmbeddedRedis,
) -> None:
    port = embedded_redis.port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), timeout=2) as raw:
        raw.sendall(b"PING\r\n")
        assert raw.recv(128).startswith(b"-NOAUTH")
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=port, password="wrong").ping()
    client = redis.Redis.from_url(embedded_redis.url)
    try:
        assert client.ping()
        # CONFIG SET dir + SAVE wrote files anywhere before; MODULE LOAD runs code.
        for command in (("CONFIG", "SET", "dir", "/tmp"), ("MODULE", "LIST"), ("DEBUG", "SLEEP", "0")):
            with pytest.raises(redis.ResponseError, match="unknown command"):
                client.execute_command(*command)
    finally:
        client.close()
    data_dir = embedded_redis.log_path.parent.parent if embedded_redis.log_path else None
    assert data_dir is not None
    for path in (data_dir / "redis.password", data_dir / "redis" / "redis.conf"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    pid = embedded_redis.pid
    assert pid is not None
    process = psutil.Process(pid)
    assert embedded_redis.url.split("@")[0].split(":")[-1] not in " ".join(process.cmdline())
    if os.geteuid() == 0:  # never root: an unprivileged user that owns the redis directory only
        assert process.uids().effective != 0
