"""`presence edge`: one more edge joining a running cluster, and what `presence up` shares with it.

What an edge process loads stays small: this module reaches the pool through `actors.clients`
only, never `actors.pool` or the shard shell, and nothing of asyncpg (tests/unit/test_layers.py
computes its import closure). `cluster/up.py`, which also starts PostgreSQL and the pool, builds
on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from actors import clients
from actors.core.liveness import LossWatch
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
    """Run one bring-up step with a progress line, so a slow start shows where it is. A stop
    asked for during the step and lost on the way (`interrupt`) stops the start-up after it."""
    print(f"  {label} …", end="", flush=True)
    started = time.monotonic()
    try:
        result = fn()
    except BaseException:
        print(" failed", flush=True)
        raise
    print(f" ok ({time.monotonic() - started:.1f} s)", flush=True)
    raise_if_interrupted()
    return result


_interrupted: list[int] = []


def interrupt(signo: int, frame: object) -> None:
    """SIGINT's and SIGTERM's handler while a process starts: `signal.default_int_handler`, but
    remembered. The KeyboardInterrupt it raises lands wherever the process happens to be, and
    where Python ignores exceptions it is lost: in an at-fork callback while Ray starts its
    processes ("Exception ignored in: <function _releaseLock>"), the service came up anyway and
    was killed 150 s later (once in a full suite). `raise_if_interrupted` raises it again."""
    _interrupted.append(signo)
    raise KeyboardInterrupt


def raise_if_interrupted() -> None:
    """A checkpoint of the start-up: KeyboardInterrupt if a stop was asked for (`interrupt`)."""
    if _interrupted:
        raise KeyboardInterrupt


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
            min_opening=settings.min_opening,
            opening_lag_s=settings.opening_lag_ms / 1000.0,
            max_opening_queued=settings.max_opening_queued,
            opening_queue_s=settings.opening_queue_s,
            opening_share_per_ip=settings.opening_share_per_ip,
            opening_idle_evict_s=settings.opening_idle_evict_s,
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
    signal.signal(signal.SIGTERM, interrupt)


def install_loop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        pass


# Exit code of an edge that lost Ray or was cut off: its supervisor starts it again.
LOST_RAY_EXIT = 3
# How often an edge probes its raylet and its own health.
WATCH_S = 1.0
# Why `watch` stopped an edge.
LOST_RAY = "lost Ray"
CUT_OFF = "cut off"
# A drain asked for over the internal API (`presence drain`), not by a signal.
DRAINED = "drained"
# A port it was given is taken (or not its to take): said in one line, exit 2.
CANNOT_LISTEN = "cannot listen"


def join_ray(
    address: str,
    namespace: str,
    node_ip: str | None,
    timeout_s: float,
    progress_s: float = 10.0,
    **init_kwargs: Any,
) -> None:
    """Join Ray at `address`, at most `timeout_s`: first wait for its GCS's port (a line every
    `progress_s` saying so), then `ray.init` (which, with no local raylet or an unanswering GCS, retries
    on its own for minutes: `presence edge` hung after a head restart). Past the deadline the
    process exits with one line and LOST_RAY_EXIT, and its supervisor tries again."""
    started = time.monotonic()
    deadline = started + timeout_s
    host, _, port = address.rpartition(":")
    said = started
    while host and port.isdigit() and not _port_open(host, int(port)):
        now = time.monotonic()
        if now >= deadline:
            _give_up(f"Ray's GCS at {address} did not answer within {timeout_s:.0f} s")
        if now - said >= progress_s:
            print(f"  still waiting for Ray's GCS at {address} ({now - started:.0f} s) …", flush=True)
            said = now
        time.sleep(min(0.5, progress_s))
    failed: list[BaseException] = []
    joining = threading.Thread(
        target=lambda: _catch(failed, lambda: clients.connect(address, namespace, node_ip, **init_kwargs)),
        daemon=True,
    )
    with clients.sigterm_kept(), _sigterm_notice_hidden():  # restored here, in the main thread
        joining.start()
        while joining.is_alive():
            left = deadline - time.monotonic()
            if left <= 0:
                _give_up(
                    f"could not join Ray at {address} within {timeout_s:.0f} s (is Ray running on this "
                    "node? `ray start` comes first)"
                )
            joining.join(min(progress_s, left))
            if joining.is_alive():
                print(f"  still joining Ray at {address} ({time.monotonic() - started:.0f} s) …", flush=True)
    if failed:
        # Ray refused at once (this node not among its nodes: its raylet gone after a long
        # partition, or not started yet): one line, and the supervisor tries again.
        _give_up(f"could not join Ray at {address} ({_first_line(failed[0])}; is Ray running on this node?)")


class _SigtermNotice(logging.Filter):
    """Ray's warning, when `ray.init` runs in a thread other than the main one, that it set no
    SIGTERM handler of its own. `join_ray` joins in a thread on purpose (to bound the join) and
    keeps this process's handler (`sigterm_kept`), so SIGTERM drains the edge as documented; the
    line, printed at every start of every `presence edge`, read as if it would not."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("SIGTERM handler is not set")


@contextlib.contextmanager
def _sigterm_notice_hidden() -> Iterator[None]:
    notice = _SigtermNotice()
    ray_worker = logging.getLogger("ray._private.worker")  # where Ray logs it
    ray_worker.addFilter(notice)
    try:
        yield
    finally:
        ray_worker.removeFilter(notice)


def _first_line(error: BaseException) -> str:
    """The first line of what went wrong, naming its cause too (Ray wraps it in ConnectionError)."""
    errors = [e for e in (error, error.__cause__) if e is not None and str(e).strip()]
    said = [str(e).strip().splitlines()[0] for e in errors]
    return ": ".join(said) or type(error).__name__


def wait_for_pool(deadline: float, timeout_s: float) -> None:
    """Wait until the slot directory answers (after a head restart, `presence up` starts the pool
    minutes after Ray is back: its edge would stop with a traceback at every try), a line every
    10 s; past `deadline`, one line and LOST_RAY_EXIT."""
    said = time.monotonic()
    while True:
        try:
            asyncio.run(asyncio.wait_for(clients.DirectoryClient().get_map(), 5))
            return
        except Exception:
            now = time.monotonic()
            if now >= deadline:
                _give_up(f"the pool (its slot directory) did not answer within {timeout_s:.0f} s of starting")
            if now - said >= 10:
                print("  still waiting for the pool (presence up starts it on the head) …", flush=True)
                said = now
            time.sleep(1.0)


def _catch(failed: list[BaseException], fn: Callable[[], object]) -> None:
    try:
        fn()
    except BaseException as e:  # handed to the waiting thread
        failed.append(e)


def _give_up(why: str) -> None:
    print(f"presence: {why}; exiting (its supervisor starts it again)", file=sys.stderr, flush=True)
    # A thread stuck inside ray.init cannot be stopped: leave at once.
    os._exit(LOST_RAY_EXIT)


def _port_open(host: str, port: int, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def raylet_probe() -> Callable[[], bool]:
    """Whether this process's raylet still answers (a TCP connect to its port)."""
    host, port = clients.raylet_address()
    return lambda: _port_open(host, port)


async def watch(
    edge: Edge,
    stop: asyncio.Event,
    raylet_ok: Callable[[], bool] | None,
    ray_lost_s: float,
    cut_off_s: float | None,
    clock: Callable[[], float] = time.monotonic,
) -> str | None:
    """Why this edge must go (LOST_RAY, CUT_OFF), once it must: its raylet lost (Ray on this
    node is gone: the edge closes its sockets and exits; Ray's own client never recovers), or
    most of the shards out of reach for `cut_off_s` after it had served (its node cut off: it
    drains, so that its clients reconnect to a healthy edge; None: never). None while it serves."""
    raylet = LossWatch(ray_lost_s)
    shards = LossWatch(cut_off_s) if cut_off_s is not None else None
    served = False
    while not stop.is_set():
        await asyncio.sleep(WATCH_S)
        now = clock()
        if raylet_ok is not None and raylet.observe(await asyncio.to_thread(raylet_ok), now):
            print(
                f"presence edge {edge.edge_id}: lost Ray (this node's raylet has not answered for "
                f"{ray_lost_s:.0f} s); closing its sockets and exiting",
                file=sys.stderr,
                flush=True,
            )
            stop.set()
            return LOST_RAY
        healthy = edge.router.healthy()
        served = served or healthy
        if shards is not None and served and not edge.draining and shards.observe(healthy, now):
            print(
                f"presence edge {edge.edge_id}: most of the shards out of reach for {cut_off_s:.0f} s "
                "(this node cut off?); draining its sockets (1012) and exiting",
                file=sys.stderr,
                flush=True,
            )
            edge.drain(cut_off_since=time.time() - shards.failing_for(now))
            return CUT_OFF
    return None


async def serve_edge(
    config: EdgeConfig,
    announce: Callable[[Edge], None],
    raylet_ok: Callable[[], bool] | None = None,
    ray_lost_s: float = 5.0,
    cut_off_s: float | None = None,
) -> str | None:
    """Serve until Ctrl-C, a drain, or `watch` says the edge must go (returns why then: DRAINED
    for a drain asked for over the internal API, None for a signal's)."""
    edge = Edge(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    serving = signalled = False

    def terminate() -> None:
        nonlocal signalled
        signalled = True
        # The first SIGTERM drains (protocol.md "Drain and resume"); a second one stops at once,
        # and so does one before the edge serves (as during the rest of the start-up).
        if not serving:
            stop.set()
        elif edge.draining:
            print("second SIGTERM: stopping at once", flush=True)
            stop.set()
        else:
            print("\nSIGTERM: draining (a second SIGTERM stops at once) …", flush=True)
            edge.drain()

    # Before the edge starts: a signal during its start (Ray calls) raised KeyboardInterrupt
    # inside the loop, and closing it then waited for ever on tasks and threads stuck in Ray
    # (`presence up` killed 150 s later, once in a full suite).
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGTERM, terminate)
    # Asked for before these handlers, and swallowed on its way (`interrupt`): nothing started.
    raise_if_interrupted()
    try:
        await edge.start()
    except OSError as e:
        # Before: a traceback, after every server had been started.
        print(
            f"presence: cannot listen on the websocket port {config.ws_host}:{config.ws_port} or the "
            f"internal one {config.internal_host}:{config.internal_port}: {e.strerror or e}",
            file=sys.stderr,
            flush=True,
        )
        await edge.stop()
        return CANNOT_LISTEN
    if stop.is_set():  # stopped while it started: it never served, and stops as the start-up does
        await edge.stop()
        raise KeyboardInterrupt
    announce(edge)
    serving = True
    watching = asyncio.create_task(watch(edge, stop, raylet_ok, ray_lost_s, cut_off_s))
    drained = asyncio.create_task(edge.drained.wait())  # after SIGTERM or `presence drain`
    stopped = asyncio.create_task(stop.wait())
    await asyncio.wait((drained, stopped), return_when=asyncio.FIRST_COMPLETED)
    drained.cancel()
    stopped.cancel()
    why = watching.result() if watching.done() else None
    if why is None and edge.drained.is_set() and not signalled and not stop.is_set():
        why = DRAINED
    watching.cancel()
    if why != DRAINED:
        print("\nstopping: closing sockets …", flush=True)
    # else its sockets are closed already (the drain's log said so), and the caller says what
    # follows: `presence up` on one machine starts a new edge, and said "stopping" first (it is not
    # stopping), `presence edge` exits.
    if why == LOST_RAY:  # departures cannot land: do not wait for them long, nor tell the directory
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(edge.stop(unregister=False), 10)
    else:
        await edge.stop()
    return why


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
    print(f"  joining Ray at {info.ray_address} (at most {settings.ray_join_timeout_s:.0f} s) …", flush=True)
    started = time.monotonic()
    join_ray(info.ray_address, info.ray_namespace, settings.ray_node_ip, settings.ray_join_timeout_s)
    print(f"  joined Ray ({time.monotonic() - started:.1f} s)", flush=True)
    wait_for_pool(started + settings.ray_join_timeout_s, settings.ray_join_timeout_s)

    def announce(e: Edge) -> None:
        print(f"edge {e.edge_id} is up", flush=True)
        host = "127.0.0.1" if settings.ws_host in ("0.0.0.0", "::") else settings.ws_host
        print(f"  websocket   ws://{host}:{e.ws_port}/ws/presence", flush=True)
        print(f"  internal    http://{settings.internal_host}:{e.internal_port}", flush=True)

    install_loop()
    config = edge_config(settings, secret, info.redis_url, internal_token=api_token)
    try:
        served = serve_edge(config, announce, raylet_probe(), settings.ray_lost_s, settings.cut_off_s)
        why = asyncio.run(served)
    except BaseException:
        clients.shutdown()
        raise
    if why == LOST_RAY:
        os._exit(LOST_RAY_EXIT)  # Ray's client, its raylet gone, can hang in ray.shutdown
    clients.shutdown()
    if why == CANNOT_LISTEN:
        return 2
    if why == DRAINED:
        print("edge drained and stopped", flush=True)
    return 0 if why in (None, DRAINED) else LOST_RAY_EXIT
