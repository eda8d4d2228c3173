"""How commands in other terminals find a running service: `<data dir>/cluster.json`.

`presence up` writes it once everything is ready and removes it on the way out. Environment
variables still win over it, so a real deployment needs no file at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

from cluster.config import Settings

CLUSTER_FILE = "cluster.json"
SECRET_FILE = "secret"
# The internal API's token when PRESENCE_INTERNAL_TOKEN is unset: `presence up` writes a fresh
# one at every start (0600); `presence edge`, the operator page's user and the tests read it.
INTERNAL_TOKEN_FILE = "internal-token"


def no_service(message: str) -> NoReturn:
    """A command needing the running service found none: say so (one line) and exit 2, never
    make up what the service would have (a secret of our own mints tokens it refuses)."""
    print(f"presence: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


@dataclass
class ClusterInfo:
    database_url: str
    redis_url: str | None
    ray_address: str
    ray_namespace: str
    ws_url: str
    internal_url: str
    pid: int
    # Ray 2.60 starts local clusters with token authentication; a process joining one must use
    # the same mode (the token itself is in ~/.ray/auth_token on this machine).
    ray_auth_mode: str | None = None
    # RAY_AUTH_TOKEN_PATH of `presence up`, when it named one (None: Ray's ~/.ray/auth_token).
    ray_auth_token_path: str | None = None


def write_private(path: Path, text: str) -> None:
    """Write a file readable by its owner only (0600), atomically, also over an older file of
    another mode: every file holding a secret or a URL with a password is written this way."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def write_info(data_dir: Path, info: ClusterInfo) -> None:
    """cluster.json holds the database and Redis URLs, passwords included: 0600."""
    write_private(data_dir / CLUSTER_FILE, json.dumps(asdict(info), indent=2))


def read_info(data_dir: Path) -> ClusterInfo | None:
    try:
        return ClusterInfo(**json.loads((data_dir / CLUSTER_FILE).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def remove_info(data_dir: Path) -> None:
    (data_dir / CLUSTER_FILE).unlink(missing_ok=True)


def token_secret(settings: Settings, create: bool = False) -> str:
    """`PRESENCE_TOKEN_SECRET`, or the one kept in the data directory (made by `presence up`,
    the only caller with `create`; any other finding none exits 2)."""
    if settings.token_secret:
        return settings.token_secret
    path = settings.data_dir / SECRET_FILE
    if path.exists():
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)  # made by hand, or by an older version
        return path.read_text().strip()
    if not create:
        no_service(
            f"no running service found in {settings.data_dir} (it holds no token secret): start one "
            "with `presence up` there, pass its --data-dir, or set PRESENCE_TOKEN_SECRET"
        )
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret)
    return secret


def new_internal_token(settings: Settings) -> str:
    """`PRESENCE_INTERNAL_TOKEN`, or a fresh one written to `<data_dir>/internal-token` (0600)."""
    if settings.internal_token:
        return settings.internal_token
    token = secrets.token_urlsafe(32)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    write_private(settings.data_dir / INTERNAL_TOKEN_FILE, token + "\n")
    return token


def internal_token(settings: Settings) -> str | None:
    """The running service's internal token: `PRESENCE_INTERNAL_TOKEN`, else the one `presence up`
    generated into the data directory, else None."""
    if settings.internal_token:
        return settings.internal_token
    try:
        return (settings.data_dir / INTERNAL_TOKEN_FILE).read_text().strip() or None
    except OSError:
        return None


def remove_internal_token(settings: Settings) -> None:
    if not settings.internal_token:
        (settings.data_dir / INTERNAL_TOKEN_FILE).unlink(missing_ok=True)


def running_settings(settings: Settings) -> tuple[Settings, frozenset[str]]:
    """`settings` with what the service running from this data directory uses in place of what
    the environment leaves unset (its database and Redis URLs, Ray's address, its two ports, the
    token secret and the internal token it made), and the names of the settings taken from it."""
    info = read_info(settings.data_dir)
    if info is None:
        return settings, frozenset()
    used: dict[str, object] = {}
    if not settings.database_url:
        used["database_url"] = info.database_url
    if not settings.redis_url and info.redis_url:
        used["redis_url"] = info.redis_url
    if not settings.ray_address and info.ray_address:
        used["ray_address"] = info.ray_address
    # The ports it listens on (given on its command line, or chosen by it for 0): `presence
    # config` showed the defaults instead.
    for name, url in (("ws_port", info.ws_url), ("internal_port", info.internal_url)):
        with contextlib.suppress(ValueError):
            port = urlsplit(url).port
            if port is not None and name not in settings.model_fields_set:
                used[name] = port
    for name, file in (("token_secret", SECRET_FILE), ("internal_token", INTERNAL_TOKEN_FILE)):
        if not getattr(settings, name) and (settings.data_dir / file).exists():
            used[name] = (settings.data_dir / file).read_text().strip()
    return settings.model_copy(update=used), frozenset(used)


def database_url(settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    info = read_info(settings.data_dir)
    if info is None:
        no_service(
            f"no running service found in {settings.data_dir}: set PRESENCE_DATABASE_URL or start "
            f"the service with `presence up --data-dir {settings.data_dir}`"
        )
    return info.database_url


def ray_unreachable(address: str, command: str, timeout_s: float = 3.0) -> str | None:
    """Within seconds, the one line saying Ray's GCS does not answer, or None when it does:
    joining a Ray that is away retries for a minute or more (`presence status` hung 95 s while
    the head was down)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():  # "auto" and the like: Ray finds it itself
        return None
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as e:
        return (
            f"presence {command}: Ray is not reachable at {address} ({e.strerror or e}); "
            "is the head down? (docs/operations.md, failures: the Ray head node dies)"
        )


def ray_reachable_or_exit(address: str, command: str, timeout_s: float = 3.0) -> None:
    """`ray_unreachable`'s line as the command's exit."""
    away = ray_unreachable(address, command, timeout_s)
    if away is not None:
        raise SystemExit(away)


def cluster_info_or_exit(settings: Settings) -> ClusterInfo:
    info = read_info(settings.data_dir)
    if info is None and not settings.ray_address:
        no_service(
            f"no running service found in {settings.data_dir}: "
            "start one with `presence up` or set RAY_ADDRESS"
        )
    if info is None:
        if not settings.database_url:
            no_service("RAY_ADDRESS is set but PRESENCE_DATABASE_URL is not")
        return ClusterInfo(
            settings.database_url,
            settings.redis_url,
            settings.ray_address or "",
            settings.ray_namespace,
            "",
            "",
            0,
        )
    # Environment overrides what the file says.
    if settings.database_url:
        info.database_url = settings.database_url
    if settings.redis_url:
        info.redis_url = settings.redis_url
    if settings.ray_address:
        info.ray_address = settings.ray_address
    return info


def prepare_to_join(settings: Settings) -> None:
    """Set what Ray reads at import time to join the cluster `presence up` started.

    Must run before anything imports `ray`: Ray 2.60 fixes its authentication mode when it is
    imported, and a local cluster started by `presence up` requires tokens.
    """
    from cluster import rayauth

    info = read_info(settings.data_dir)
    if info is not None and info.ray_auth_mode and rayauth.MODE_VAR not in os.environ:
        os.environ[rayauth.MODE_VAR] = info.ray_auth_mode
    if info is not None and info.ray_auth_token_path and rayauth.TOKEN_PATH_VAR not in os.environ:
        os.environ[rayauth.TOKEN_PATH_VAR] = info.ray_auth_token_path
    rayauth.prepare_join(settings.ray_address or (info.ray_address if info else None))


def raise_open_files_limit() -> tuple[int, int]:
    """Raise this process's soft limit on open files to its hard limit; (before, after).

    Every websocket is a file, so an edge left at a login default of 1,024 refuses clients long
    before its CPU is busy. Only the soft limit moves (no privilege needed); raising the hard limit
    is the start command's job (`ulimit -n` in ray_cluster.yaml).
    """
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
    else:
        target = soft
    return soft, target
