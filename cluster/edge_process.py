"""`presence edge`: one more edge joining a running cluster, and what `presence up` shares with it.

What an edge process loads stays small: this module reaches the pool through `actors.clients`
only, never `actors.pool` or the shard shell, and nothing of asyncpg (tests/unit/test_layers.py
computes its import closure). `cluster/up.py`, which also starts PostgreSQL and the pool, builds
on it.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import Callable
from typing import TypeVar

from actors import clients
from cluster.config import Settings, allowed_hosts
from cluster.runtime import (
    INTERNAL_TOKEN_FILE,
    cluster_info_or_exit,
    internal_token,
    no_service,
    token_secret,
)
from edge.http import internal_exposure_problem
from edge.server import Edge, EdgeConfig
from edge.session import Limits

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


def stop_like_ctrl_c_on_sigterm() -> None:
    """SIGTERM (a supervisor, `timeout`, `kill`) stops the process the way Ctrl-C does, at any
    moment, start-up included: every server started so far is stopped on the way out. Without
    this, a SIGTERM before the serving loop (which installs its own handler) killed the process
    outright and left the embedded PostgreSQL running."""
    signal.signal(signal.SIGTERM, signal.default_int_handler)


def install_loop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        pass


async def serve_edge(config: EdgeConfig, announce: Callable[[Edge], None]) -> None:
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


def refuse_insecure(settings: Settings) -> bool:
    """Print why the settings would expose what must stay closed (one line) and say so."""
    problem = internal_exposure_problem(settings.internal_host, settings.internal_token)
    if problem is not None:
        print(f"presence: refusing to start: {problem}", file=sys.stderr, flush=True)
        return True
    return False


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

    install_loop()
    try:
        config = edge_config(settings, secret, info.redis_url, internal_token=api_token)
        asyncio.run(serve_edge(config, announce))
    finally:
        clients.shutdown()
    return 0
