"""How commands in other terminals find a running service: `<data dir>/cluster.json`.

`presence up` writes it once everything is ready and removes it on the way out. Environment
variables still win over it, so a real deployment needs no file at all.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from cluster.config import Settings

CLUSTER_FILE = "cluster.json"
SECRET_FILE = "secret"


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


def token_secret(settings: Settings, create: bool = True) -> str:
    """`PRESENCE_TOKEN_SECRET`, or the one kept in the data directory (made on first use)."""
    if settings.token_secret:
        return settings.token_secret
    path = settings.data_dir / SECRET_FILE
    if path.exists():
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)  # made by hand, or by an older version
        return path.read_text().strip()
    if not create:
        raise SystemExit(
            f"no token secret: set PRESENCE_TOKEN_SECRET or run `presence up --data-dir {settings.data_dir}`"
        )
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret)
    return secret


def database_url(settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    info = read_info(settings.data_dir)
    if info is None:
        raise SystemExit(
            "no database: set PRESENCE_DATABASE_URL or start the service with "
            f"`presence up --data-dir {settings.data_dir}`"
        )
    return info.database_url


def cluster_info_or_exit(settings: Settings) -> ClusterInfo:
    info = read_info(settings.data_dir)
    if info is None and not settings.ray_address:
        raise SystemExit(
            f"no running service found in {settings.data_dir}: "
            "start one with `presence up` or set RAY_ADDRESS"
        )
    if info is None:
        if not settings.database_url:
            raise SystemExit("RAY_ADDRESS is set but PRESENCE_DATABASE_URL is not")
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
