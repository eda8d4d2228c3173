"""The edge: websockets I/O around `edge.session`, and the bridge to the shards through `edge.router`.

One `Edge` serves `/ws/presence` on the public port and the internal HTTP API on another. Each
socket's frames are handled in order (the next frame is read once the previous one's upstream
work is done), while frames of different sockets share the router's batches. Events from the
shards arrive in batches and go out through `edge.outbound` (each frame built once, written to
every socket without waiting on a slow reader): a client whose unread output passes the limit is
closed instead of holding anybody else up.
"""

from __future__ import annotations

import asyncio
import logging
import random
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from websockets.http11 import Request, Response

from actors import gc_policy
from actors.clients import DirectoryClient, ShardClients
from actors.core import frames, ops
from actors.core.answers import Found, Shown
from actors.core.backoff import Backoff
from actors.core.contract import EDGE_REGISTER_EVERY_S, Address, publication
from actors.core.frames import (
    AudienceNote,
    ChosenNote,
    Frame,
    SettingsNote,
    changed_about,
    internal_note,
    is_internal,
    type_of,
)
from actors.core.liveness import CutOff
from actors.core.shard import Claim
from actors.core.slots import SlotMap
from actors.counts import CountReader
from actors.metrics import Metrics
from edge import protocol as p
from edge.conn import Conn, Phase
from edge.deadlines import Deadlines
from edge.demo import DemoSite
from edge.http import InternalApi, internal_exposure_problem, is_loopback, json_response
from edge.http_server import HttpServer
from edge.opening import Entry, OpeningGate, OpeningPace, Turns
from edge.outbound import prepare, send_batch
from edge.reregistration import Departure, reregistration
from edge.router import Router, ShardUnavailable
from edge.session import (
    HEARTBEAT_ACK,
    HEARTBEAT_ACKED,
    Admission,
    Charged,
    Close,
    Command,
    Limits,
    Reply,
    Session,
)
from edge.tokens import demo_secret
from edge.transport import Socket, serve
from edge.watch_index import WatchIndex

# How long a drain waits for a group's departures to reach their shards before it sends their
# 1012s anyway (a shard answers in milliseconds; one that does not must not hold the drain up:
# the departures still land, later, as they did before).
HANDOVER_BEFORE_CLOSE_S = 1.0

log = logging.getLogger("presence.edge")

# The unlabelled counters of an edge process (this module and the router), exported at 0 from its
# start; tests/unit/test_metrics.py checks the list against the code.
COUNTERS = (
    "connections_total",
    "edge_departure_retries_total",
    "edge_moved_total",
    "edge_reregister_undone_total",
    "edge_reregistered_ops_total",
    "frames_out_total",
    "handshakes_refused_total",
    "held_overflows_total",
    "opening_evicted_total",
    "opening_expired_total",
    "opening_refused_total",
    "opening_waited_total",
    "repeats_dropped_total",
    "resync_frames_total",
    "resync_watches_total",
    "slow_clients_closed_total",
)
# The edge's own close codes (edge/protocol.py), declared by code in `presence_closes_total`.
CLOSE_CODES_COUNTED = (
    p.CLOSE_AUTH,
    p.CLOSE_SILENT,
    p.CLOSE_POLICY,
    p.CLOSE_TOO_BIG,
    p.CLOSE_TOO_MANY_CONNECTIONS,
    p.CLOSE_UNAVAILABLE,
    p.CLOSE_SERVICE_RESTART,
)
# `presence_frames_in_total`'s types: the contract's client frames, and what `_message` counts
# for a frame that is none of them (`invalid`) or was refused unread (`refused`).
FRAME_TYPES_COUNTED = (*p.CLIENT_FRAME_TYPES, "invalid", "refused")
# `presence_replies_total`'s types: every answer a socket's own frame can get (edge/session.py).
REPLY_TYPES_COUNTED = ("ready", "heartbeat.ack", "presence.sync", "presence.changed", "error")

WS_PATH = "/ws/presence"
# The opening gate's pace (`_pace_loop`): the loop's lateness probed every 10 ms while connections
# open, its places judged every 100 ms (a storm's burst is over within a few of them).
PACE_PROBE_S = 0.010
PACE_PROBES = 10
HELD_CAP = 1_000
# A registration that failed is tried again after 0.25 s, doubling up to EDGE_REGISTER_EVERY_S
# (the project's one backoff policy; not jittered: the waits are its windows).
REGISTER_RETRY = Backoff(first_s=0.25, cap_s=EDGE_REGISTER_EVERY_S, floor=1.0)
# The longest a stopping edge waits to tell the directory so (`Edge._unregister`).
UNREGISTER_TIMEOUT_S = 2.0
HEARTBEAT_ACK_TEXT = HEARTBEAT_ACK.text or ""
HEARTBEAT_ACK_BYTES = prepare(HEARTBEAT_ACK_TEXT)
# Counters of the fan-out's hot loop (`Edge._deliver`), their keys made once.
FRAMES_OUT = Metrics.key("frames_out_total")
REPEATS_DROPPED = Metrics.key("repeats_dropped_total")
# `frames_in_total` by the frame's type, each key made at the type's first frame.
FRAMES_IN = Metrics.keys_by("frames_in_total", "type")
# What an acknowledged heartbeat counts, as `_execute` and `_send` would count its reply.
HEARTBEAT_COUNTS = (
    Metrics.key("frames_in_total", type="heartbeat"),
    Metrics.key("replies_total", type="heartbeat.ack"),
    Metrics.key("frames_out_total"),
)


def forwarded_ip(values: list[str]) -> str | None:
    """The client's address from every line of the proxy's header (`client_ip_header`), in
    order: the last entry of the last line, the one the proxy next to the edge added. A client
    may send lines and entries of its own before it (HAProxy's `option forwardfor` adds a line
    of its own after the client's); an earlier one is never taken, or the client would choose
    its address. None: no such header, or an empty last line."""
    if not values or not values[-1]:
        return None
    return values[-1].rsplit(",", 1)[-1].strip()


def _peer_ip(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if peer else "unknown"


class EdgeSocket(Socket):
    """A public connection (edge/transport.py), counted against its client address from accept
    until it has authenticated or gone (`Admission.handshake_begin` / `handshake_end`): half-open
    upgrades and sockets that never identify are bounded per address. Each edge makes a subclass
    naming it.

    Edge-wide, it also takes a place at the opening gate (edge/opening.py) for the same span;
    while it waits for one, what it sends is kept unread (`Socket.hold`)."""

    __slots__ = ("busy", "conn", "gated", "greeted", "handshake_ip")
    edge: Edge

    def __init__(self) -> None:
        config = self.edge.config
        super().__init__(max_size=config.max_frame_bytes, write_limit=config.send_buffer_bytes)
        self.handshake_ip: str | None = None
        self.gated = False  # holds a place at the opening gate (or waits for one)
        self.greeted = False  # its first commands (identify) were carried out
        self.busy = False  # a command is being carried out: its next frames wait (`Socket.pause`)
        self.conn: Conn | None = None  # from the handshake until its departure was journalled

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # With a client address header, counted once the header is read instead.
        if self.edge.config.client_ip_header is None and not self.begin_handshake(_peer_ip(transport)):
            return
        self.gated = True
        self.edge.opening_begin(self)

    def take_turn(self) -> None:
        """Its turn at the gate: what arrived meanwhile is read now, and reading resumes."""
        self.release()

    def begin_handshake(self, ip: str) -> bool:
        assert self.transport is not None
        if not self.edge.handshake_begin(self.transport, ip):
            return False
        self.handshake_ip = ip
        return True

    def end_handshake(self) -> None:
        """Authenticated or gone (harmless to repeat)."""
        if self.handshake_ip is not None:
            self.edge.admission.handshake_end(self.handshake_ip)
            self.handshake_ip = None
        if self.gated:
            self.gated = False
            self.edge.opening_end(self)

    def on_request(self, request: Request) -> Response | None:
        return self.edge._public_request(self, request)

    def on_open(self) -> None:
        self.edge._opened(self)

    def on_message(self, message: str | bytes) -> None:
        if self.conn is not None:
            self.edge._message(self, self.conn, message)

    def on_close(self) -> None:
        self.end_handshake()
        self.edge._closed(self)

    def on_control(self) -> None:
        if self.conn is not None:
            self.edge._control(self.conn)

    def on_fragment(self) -> None:
        if self.conn is not None:
            self.edge._control(self.conn)

    def on_refused(self, code: int) -> None:
        self.edge.metrics.inc("closes_total", code=str(code))

    def on_slow(self) -> None:
        # Not inside the transport's write that noticed it: aborted in a step of its own.
        asyncio.get_running_loop().call_soon(self.edge._too_slow, self)


class _Refused(asyncio.Protocol):
    """An accepted connection dropped at once (the opening gate's line is full)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).abort()


@dataclass
class EdgeConfig:
    secret: str
    redis_url: str | None
    ws_host: str = "127.0.0.1"
    ws_port: int = 8765
    internal_host: str = "127.0.0.1"
    internal_port: int = 8766
    # `Authorization: Bearer <this>` required on the internal API (but /healthz). Unset: the
    # internal host must be a loopback address, and the edge makes up a token nobody knows.
    internal_token: str | None = None
    # `Host` names the internal API answers besides its own address (else 403).
    internal_allowed_hosts: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)
    max_frame_bytes: int = 16 * 1024
    # Connections the kernel completes for the public port before the edge accepts them.
    listen_backlog: int = 100
    send_buffer_bytes: int = 1024 * 1024
    batch_window_ms: float = 2.0
    batch_idle_window_ms: float = 0.2
    batch_connect_window_ms: float = 20.0
    batch_max_ops: int = 500
    batch_max_in_flight: int = 2
    # The batches and long-polls take each shard's direct lane (actors/lane.py), not Ray calls.
    shard_lane_direct: bool = True
    pull_gather_ms: float = 0.0
    count_ttl_s: float = 90.0
    # Demo mode: serve the demo page at / and mint tokens for the demo accounts only.
    demo: bool = False
    call_retry_s: float = 10.0
    # Most shards silent this long: the edge cannot serve (/healthz 503), and counts itself cut
    # off from then on (`Edge.cut_off`: a socket lost later and not heard since departs when it
    # was last heard).
    unreachable_after_s: float = 15.0
    # How long a pull waits for mail; also the longest gap between lease renewals, so it must
    # stay well under the shards' socket timeout.
    pull_wait_s: float = 5.0
    # Behind a proxy: the header naming the client's address (its last entry, the one the
    # proxy added), for the per-address socket limit. None: the peer address of the socket.
    client_ip_header: str | None = None
    # How long the edge remembers each departure, to report it again to a shard that restarts
    # meanwhile (the dead incarnation may not have written its last-seen yet).
    departure_journal_s: float = 120.0
    # After a shard restarted and every edge registered its sockets again, each watcher is
    # brought to the truth: a fresh watch answer, and only the differences are sent.
    resync_delay_s: float = 2.0
    # How long a socket this edge closes for its own reasons (1012, 1011) keeps its account's
    # presence upstream, for its client to come back (protocol.md "Drain and resume").
    resume_s: float = 15.0
    # A drain (SIGTERM, `presence drain`): /healthz answers 503 at once; connections are still
    # accepted for `drain_grace_s` (the balancer's health checks notice meanwhile), then the
    # sockets are closed with 1012 spread evenly over `drain_window_s`, and the edge waits up to
    # `drain_handoff_s` for their departures to reach the shards before it stops.
    drain_grace_s: float = 4.0
    drain_window_s: float = 10.0
    drain_handoff_s: float = 15.0
    # The process's cycle-collector policy (actors/gc_policy.py); None leaves it alone (an edge
    # embedded in somebody else's process, tests).
    gc_thresholds: tuple[int, int, int] | None = None


class Edge:
    def __init__(self, config: EdgeConfig) -> None:
        self.config = config
        self.edge_id = "edge-" + secrets.token_hex(6)
        self.metrics = Metrics(COUNTERS)
        # The close codes an operator alerts on, at 0 from the start: a series born at its first
        # close would hide that close from rate() and increase().
        for code in CLOSE_CODES_COUNTED:
            self.metrics.declare("closes_total", code=str(code))
        for kind in FRAME_TYPES_COUNTED:
            self.metrics.declare("frames_in_total", type=kind)
        for kind in REPLY_TYPES_COUNTED:
            self.metrics.declare("replies_total", type=kind)
        self.directory = DirectoryClient()
        self.router = Router(
            self.edge_id,
            self._deliver,
            self._reregister,
            self.metrics,
            ShardClients(direct=config.shard_lane_direct, directory=self.directory),
            window_ms=config.batch_window_ms,
            idle_window_ms=config.batch_idle_window_ms,
            connect_window_ms=config.batch_connect_window_ms,
            max_ops=config.batch_max_ops,
            max_in_flight=config.batch_max_in_flight,
            pull_wait_s=config.pull_wait_s,
            pull_gather_ms=config.pull_gather_ms,
            call_retry_s=config.call_retry_s,
            forget=self._forget_shard,
            unreachable_after_s=config.unreachable_after_s,
        )
        self.conns: dict[str, Conn] = {}
        # Which sockets watch each account and what they see of it: a shard publishes a change
        # once for this edge, and it is expanded here (edge/watch_index.py).
        self.watch_index = WatchIndex()
        # When to look at each socket for the liveness rule (`_liveness_loop`).
        self.deadlines: Deadlines[str] = Deadlines()
        self.admission = Admission(config.limits)
        # How many places the gate has now, from the event loop's lateness (`_pace_loop`).
        self.pace = OpeningPace(
            min(config.limits.min_opening, config.limits.max_opening),
            config.limits.max_opening,
            config.limits.opening_lag_s,
        )
        self._opening_begun = asyncio.Event()
        self.opening: OpeningGate[EdgeSocket] = OpeningGate(
            self.pace.limit,
            config.limits.max_opening_queued,
            config.limits.opening_queue_s,
            share=config.limits.opening_share_per_ip,
            evict_after_s=config.limits.opening_idle_evict_s,
        )
        self.metrics.set("opening_limit", self.opening.limit)
        self._socket_class: type[EdgeSocket] = type(
            "EdgeConnection", (EdgeSocket,), {"__slots__": (), "edge": self}
        )
        # Recent departures with their sockets' claims, oldest first: see `_reregister`.
        self.departures: deque[Departure] = deque()
        self.counts = CountReader(config.redis_url, ttl_s=config.count_ttl_s)
        problem = internal_exposure_problem(config.internal_host, config.internal_token)
        if problem is not None:
            raise InsecureConfig(problem)
        self.api = InternalApi(
            self, config.internal_token, config.internal_host, config.internal_allowed_hosts
        )
        self.internal_http = HttpServer(self.api.handle)
        # The demo only ever on a loopback public host (`presence up` also wants the embedded
        # database): elsewhere / and /demo/token answer 404 and demo tokens are refused.
        self.demo = DemoSite(config.secret) if config.demo and is_loopback(config.ws_host) else None
        self.demo_key = demo_secret(config.secret) if self.demo is not None else None
        self._servers: list[asyncio.Server] = []
        self._tasks: list[asyncio.Task[None]] = []
        # Tasks carrying out a socket's commands, and its clean-up once gone.
        self._handlers: set[asyncio.Task[Any]] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._drain: asyncio.Task[None] | None = None
        self._registration: dict[str, Any] | None = None  # what it last told the directory
        self._cut_off_since: float | None = None  # a drain because cut off: since when
        # When this edge was last cut off from most of the shards, healed or not (`_closed`).
        self.cut_off = CutOff()
        # Set once a drain has handed every departure to the shards: the process may stop.
        self.drained = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.router.start()
        self._servers.append(
            await serve(
                self._new_connection, self.config.ws_host, self.config.ws_port, self.config.listen_backlog
            )
        )
        await self.internal_http.start(self.config.internal_host, self.config.internal_port)
        self._tasks.append(asyncio.create_task(self._liveness_loop()))
        if self.pace.floor < self.pace.ceiling:
            self._tasks.append(asyncio.create_task(self._pace_loop()))
        # Known to the directory before `start` returns: `presence rollout` waits only for the
        # edges the directory lists to route by the newest map (cluster/rollout.py `edges_behind`).
        registered = await self._register()
        self._tasks.append(asyncio.create_task(self._register_loop(registered)))
        if self.config.gc_thresholds is not None:
            gc_policy.apply(self.config.gc_thresholds, self.metrics)

    @property
    def ws_port(self) -> int:
        return int(self._servers[0].sockets[0].getsockname()[1])

    @property
    def internal_port(self) -> int:
        return self.internal_http.port

    @property
    def draining(self) -> bool:
        return self._drain is not None

    def drain(self, cut_off_since: float | None = None) -> asyncio.Task[None]:
        """Start draining, once (asking again changes nothing): see `_drain_run`. `cut_off_since`:
        the edge drains because it has been cut off from most shards since then (a wall-clock
        time), which decides when its sockets depart (`Conn.closed_by_server`)."""
        if self._drain is None:
            self._cut_off_since = cut_off_since
            self._drain = asyncio.create_task(self._drain_run())
        return self._drain

    async def _drain_run(self) -> None:
        """/healthz says 503 from now on; after the grace, no more connections are accepted and
        the sockets are closed with 1012 evenly over the drain window (their clients reconnect to
        the other edges in a trickle, not a storm), each a resumable departure; once their
        departures have landed, `drained` is set and the edge may stop."""
        cfg = self.config
        loop = asyncio.get_running_loop()
        log.warning(
            "edge %s draining: /healthz answers 503; accepting for %.1f s more, then closing %d sockets "
            "with 1012 over %.1f s",
            self.edge_id,
            cfg.drain_grace_s,
            len(self.conns),
            cfg.drain_window_s,
        )
        await asyncio.sleep(cfg.drain_grace_s)
        if self._servers:
            self._servers[0].close()  # stop listening; sockets stay open
        for ws in self.opening.drain():  # never read: nothing to close gracefully
            ws.abort()
        conns = list(self.conns.values())
        started = loop.time()
        step = max(1, len(conns) // 10)
        i = 0
        while i < len(conns):
            delay = started + cfg.drain_window_s * i / len(conns) - loop.time()
            if delay > 0.002:
                await asyncio.sleep(delay)
            # Every socket due by now goes in one group (handing departures over takes a round trip).
            window = cfg.drain_window_s
            due = int((loop.time() - started) * len(conns) / window) + 1 if window > 0 else len(conns)
            end = min(len(conns), max(i + 1, due))
            await self._close_for_restart(conns[i:end])
            if end // step > i // step and end < len(conns):
                log.warning("edge %s draining: %d of %d sockets closed", self.edge_id, end, len(conns))
            i = end
        await self._close_for_restart(list(self.conns.values()))  # still identifying when the list was taken
        late = await self._departed(cfg.drain_handoff_s)
        if late:
            log.error(
                "edge %s draining: %d departures not handed to the shards after %.1f s; stopping anyway",
                self.edge_id,
                late,
                cfg.drain_handoff_s,
            )
        log.warning(
            "edge %s drained: %d sockets closed in %.1f s, their departures handed to the shards",
            self.edge_id,
            len(conns),
            loop.time() - started + cfg.drain_grace_s,
        )
        self.drained.set()

    async def _close_for_restart(self, group: list[Conn]) -> None:
        """Close sockets with 1012: their clients reconnect at once, to another edge, and each
        account keeps its presence meanwhile (a resumable departure, `resume_s`).

        Each departure is handed to its shard before the 1012 is sent (the socket's frames are
        ignored from the moment it went): a client back on another edge a fraction of a second
        later cannot overtake it. It did when the departure followed the close: the new socket,
        awake, registered beside the old idle one, so the account showed online, then idle again
        when its late departure landed (bench rollout: 73 such flickers in a rolling restart).
        One with a frame in flight is closed at once; its handler hands its departure over."""
        now = time.time()
        closing: list[Conn] = []
        handing_over: list[asyncio.Task[None]] = []
        for conn in group:
            if conn.session.socket_id not in self.conns or conn.went_at is not None:
                continue
            conn.closed_by_server(now, self._cut_off_since)
            closing.append(conn)
            if not (isinstance(conn.ws, EdgeSocket) and conn.ws.busy):
                cleanup = self._finish(conn)
                if cleanup is not None:
                    handing_over.append(cleanup)
        if handing_over and self._cut_off_since is None:  # cut off: the shards would not answer
            await asyncio.wait(handing_over, timeout=HANDOVER_BEFORE_CLOSE_S)
        for conn in closing:
            self._close(conn, p.CLOSE_SERVICE_RESTART, "service restart; reconnect")

    async def _departed(self, timeout: float) -> int:
        """Wait (at most `timeout`) until every socket is gone and its departure handed to the
        shards; returns how many were not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.conns or self._handlers:
            left = deadline - loop.time()
            if left <= 0:
                break
            # Sockets wait for their clients' close frames with no task of their own: looked at
            # again every 50 ms, or as soon as a clean-up finishes.
            if self._handlers:
                await asyncio.wait(set(self._handlers), timeout=min(left, 0.05))
            else:
                await asyncio.sleep(min(left, 0.05))
        return len(self.conns) + len(self._handlers)

    async def stop(self, unregister: bool = True) -> None:
        """Close every socket (each one's departure is registered upstream), then stop, telling
        the directory so (`unregister`; not when Ray is gone: a lookup of its actor could block)."""
        if self._drain is not None and not self._drain.done():
            self._drain.cancel()  # stopped at once (a second SIGTERM): whatever is left goes now
        for server in self._servers:
            server.close()
        for ws in self.opening.drain():  # never read: nothing to close gracefully
            ws.abort()
        for ws in list(self.opening.active):
            if ws.conn is None:  # still in its upgrade
                ws.abort()
        for conn in list(self.conns.values()):
            self._close(conn, 1001, "")  # as websockets' `Server.close` closes its connections
        await self._departed(30.0)
        await self.internal_http.close()
        for t in self._tasks:
            t.cancel()
        if unregister:
            await self._unregister()
        await self.router.close()
        await self.counts.close()

    # ------------------------------------------------------------------ the opening gate

    def _new_connection(self) -> asyncio.Protocol:
        """The public port's protocol factory, called at accept: with the gate's line full, the
        connection is dropped before anything more is built for it (a storm brings thousands a
        second)."""
        if self.opening.full():
            self.metrics.inc("opening_refused_total")
            return _Refused()
        return self._socket_class()

    def handshake_begin(self, transport: asyncio.BaseTransport, ip: str) -> bool:
        """Count a connection still opening against its address (`Admission.handshake_begin`);
        False: over the address's cap, and the connection is dropped."""
        refused = self.admission.handshake_begin(ip, time.time())
        if refused is None:
            return True
        self.metrics.inc("handshakes_refused_total")
        log.debug("dropping a connection from %s: %s", ip, refused)
        cast(asyncio.Transport, transport).abort()
        return False

    def opening_begin(self, ws: EdgeSocket) -> None:
        """A connection was accepted: open it now, let it wait its turn unread, or drop it."""
        now = time.monotonic()
        source = ws.handshake_ip or ""
        self._opening_begun.set()  # wakes the pace's probe
        match self.opening.enter(ws, now, source):
            case Entry.GO:
                pass
            case Entry.WAIT:
                ws.hold()
                self.metrics.inc("opening_waited_total")
                # An address under its share waits: one holding more gives up an idle place.
                self._make_room(self.opening.make_room(now, source))
            case Entry.REFUSE:
                self.metrics.inc("opening_refused_total")
                ws.abort()

    def _make_room(self, idle: list[EdgeSocket]) -> None:
        for ws in idle:
            self.metrics.inc("opening_evicted_total")
            ws.abort()

    def opening_end(self, ws: EdgeSocket) -> None:
        """`ws` is authenticated or gone: its place goes to the next in line."""
        self._take_turns(self.opening.leave(ws, time.monotonic()))

    async def _pace_loop(self) -> None:
        """The gate's places (`OpeningPace`): while connections are opening, the loop's lateness
        is probed every `PACE_PROBE_S` and judged every `PACE_PROBES` probes; asleep while none
        are (an idle edge wakes for nothing), and the next storm starts from the floor."""
        loop = asyncio.get_running_loop()
        while True:
            if not (self.opening.active or self.opening.waiting):
                self._set_opening_limit(self.pace.rest())
                self._opening_begun.clear()
                await self._opening_begun.wait()
            worst, waited, busiest = 0.0, False, 0
            for _ in range(PACE_PROBES):
                due = loop.time() + PACE_PROBE_S
                await asyncio.sleep(PACE_PROBE_S)
                worst = max(worst, loop.time() - due)
                waited = waited or bool(self.opening.waiting)
                busiest = max(busiest, len(self.opening.active))
            self._set_opening_limit(self.pace.observe(worst, waited, busiest))

    def _set_opening_limit(self, limit: int) -> None:
        if limit != self.opening.limit:
            self.opening.limit = limit
            self.metrics.set("opening_limit", limit)
            self._take_turns(self.opening.expire(time.monotonic()))  # more places: the line moves

    def _take_turns(self, turns: Turns[EdgeSocket]) -> None:
        loop = asyncio.get_running_loop()
        for ws, waited in turns.admitted:
            self.metrics.observe("opening_wait_seconds", waited)
            loop.call_soon(ws.take_turn)  # not inside the caller's callback: its own turn
        for ws in turns.expired:
            self.metrics.inc("opening_expired_total")
            ws.abort()

    # ------------------------------------------------------------------ HTTP on the public port

    def _public_request(self, ws: EdgeSocket, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == WS_PATH:
            if self._servers and not self._servers[0].is_serving():  # as websockets' server says it
                return ws.protocol.reject(503, "Server is shutting down.\n")
            if self.config.client_ip_header is not None and not ws.begin_handshake(
                self._client_ip(ws, request)
            ):
                return json_response(None, 429, {"error": "too many connections from this address"})
            return None
        if self.demo is not None:
            response = self.demo.handle(request)
            if response is not None:
                return response
        # The path is not repeated back (as on the internal port): a body that echoes what a
        # stranger sent is a reflection for someone else's use.
        return json_response(None, 404, {"error": f"nothing here; websockets connect to {WS_PATH}"})

    # ------------------------------------------------------------------ one socket
    #
    # No task per socket: its transport calls `_opened`, `_message` and `_closed`. A frame whose
    # commands wait on the shards is carried out by a task of its own (`_serve`), and the
    # socket's next frames wait unread meanwhile (`Socket.pause`), so each socket's frames are
    # handled in order; a heartbeat is answered inside the callback.

    def _opened(self, ws: EdgeSocket) -> None:
        """The upgrade was accepted."""
        now = time.time()
        assert ws.request is not None
        session = Session(
            secret=self.config.secret,
            now=now,
            limits=self.config.limits,
            admission=self.admission,
            ip=self._client_ip(ws, ws.request),
            demo_key=self.demo_key,
        )
        conn = ws.conn = Conn(ws, session)
        self.conns[session.socket_id] = conn
        self.deadlines.add(session.socket_id, session.deadline())
        self.metrics.inc("connections_total")
        # Else it waits for identify, closed by `_liveness_loop` if none comes in time.
        # Every line: `headers.get` raises on a repeated header (a traceback in the log for each
        # such request, from anybody who can connect).
        authorization = ws.request.headers.get_all("Authorization")
        commands = session.open() or session.authenticate_headers(authorization, now)
        if commands:
            self._begin(ws, conn, commands)

    def _message(self, ws: EdgeSocket, conn: Conn, raw: str | bytes) -> None:
        if conn.went_at is not None:  # closing (a drain hands its departure over first): too late
            return
        session = conn.session
        commands = session.receive(raw, time.time())
        if commands is HEARTBEAT_ACKED:  # most frames: answered on the shortest road
            self._ack_heartbeat(conn)
            return
        kind = (session.last_frame_type or "refused") if ws.greeted else "identify"
        self.metrics.inc_key(FRAMES_IN[kind])  # a type of the contract, "invalid" or "refused"
        if commands or not ws.greeted:
            self._begin(ws, conn, commands)

    def _control(self, conn: Conn) -> None:
        """A ping, a pong or a fragment before a message's last: liveness and the flood bucket
        (`Session.control`). Its only command is the flood's close, carried out here (not queued
        behind a command the socket is busy with: a flood of pings is read even while its frames
        wait). A fragment is charged like any frame: empty continuation frames, which never make
        a message, kept the edge's one core busy for as long as a client sent them, never closed."""
        if conn.went_at is not None:
            return
        for cmd in conn.session.control(time.time()):
            if isinstance(cmd, Close):
                self._close(conn, cmd.code, cmd.reason)

    def _close(self, conn: Conn, code: int, reason: str) -> None:
        """Close the socket with `code`, counted by code in `presence_closes_total`."""
        self.metrics.inc("closes_total", code=str(code))
        conn.ws.close(code, reason)

    def _begin(self, ws: EdgeSocket, conn: Conn, commands: list[Command]) -> None:
        if not ws.greeted and ws.gated:
            # Its identify (or its upgrade's token) is being carried out: it is working on its
            # opening, not holding a place idle, and is never dropped to make room.
            self.opening.progressed(ws)
        ws.busy = True
        ws.pause()
        task = asyncio.create_task(self._serve(ws, conn, commands))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _serve(self, ws: EdgeSocket, conn: Conn, commands: list[Command]) -> None:
        """Carry out one frame's commands (or the upgrade's), then read the socket's next frame."""
        try:
            if await self._run(conn, commands) and not ws.greeted:
                ws.greeted = True
                # Authenticated: its deadline is now the liveness timeout's instead of the
                # identify timeout's (which may be the later one, when configured so), and from
                # now on it counts as a socket.
                self.deadlines.add(conn.session.socket_id, conn.session.deadline())
                ws.end_handshake()
        except Exception:
            log.exception("closing %s: its frame failed", conn.session.socket_id)
            self._close(conn, p.CLOSE_UNAVAILABLE, "internal error")
        finally:
            ws.busy = False
            if ws.lost:
                self._finish(conn)
            else:
                ws.resume()

    def _closed(self, ws: EdgeSocket) -> None:
        """The connection is gone; its departure waits for the command in flight, if any (a
        `connect` that lands after all must be undone)."""
        conn = ws.conn
        if conn is None:
            return
        if ws.closed_by_client:
            conn.went(time.time())
        else:  # its client may have gone long before: beyond a cut this edge has been through
            conn.lost(time.time(), self.cut_off.since)
        if not ws.busy:
            self._finish(conn)

    def _finish(self, conn: Conn) -> asyncio.Task[None] | None:
        """The socket is gone for this edge (once: a drain finishes it before its close): its
        departure and clean-up go to the shards; the task doing that, if any."""
        s = conn.session
        if self.conns.pop(s.socket_id, None) is None:
            return None
        self.watch_index.drop(s.socket_id)
        # In the same step as the pop (no await between): a restart noticed from now on
        # finds the socket either live or in the journal, never in neither.
        self._journal_departure(conn)
        s.gone()
        if not conn.registered or s.user_id is None:
            return None
        task = asyncio.create_task(self._cleanup(conn))
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        return task

    def _journal_departure(self, conn: Conn) -> None:
        if not conn.registered or conn.session.user_id is None:
            return
        now = time.time()
        s = conn.session
        self.departures.append(
            Departure(conn.departed_at(time.time()), conn.session.user_id, Claim(*s.claim()))
        )
        horizon = now - self.config.departure_journal_s
        while self.departures and self.departures[0].at < horizon:
            self.departures.popleft()

    def _client_ip(self, ws: Socket, request: Request) -> str:
        header = self.config.client_ip_header
        if header is not None:
            forwarded = forwarded_ip(request.headers.get_all(header))
            if forwarded is not None:
                return forwarded
        peer = ws.remote_address
        return str(peer[0]) if peer else "unknown"

    async def _run(self, conn: Conn, commands: list[Command]) -> bool:
        """Carry out a session's commands; False once the socket is closed."""
        for cmd in commands:
            try:
                if not await self._execute(conn, cmd):
                    return False
            except ShardUnavailable as e:
                log.warning("closing %s: %s", conn.session.socket_id, e)
                conn.closed_by_server(time.time())
                self._close(conn, p.CLOSE_UNAVAILABLE, "presence is restarting; reconnect")
                return False
        return True

    async def _execute(self, conn: Conn, cmd: Command) -> bool:
        s = conn.session
        match cmd:
            case Reply(frame=frame, text=text):
                self._reply(conn, frame, text)
            case Close(code=code, reason=reason):
                # What the client still sends is dropped (edge/transport.py), so a flooding
                # client's answering close frame is read, not stuck behind its frames.
                self._close(conn, code, reason)
                return False
            case ops.Connect():
                connected = await self.router.to_user(cmd.user_id, cmd)
                conn.connected()
                self._reply(conn, s.connected(connected).frame)
                self._release(conn)
            case Charged():
                return await self._charged(conn, cmd)
            case ops.Unwatch(targets=targets):
                self.watch_index.unwatch(cmd.socket_id, targets)
                await self.router.to_users(targets, lambda ts: cmd._replace(targets=tuple(ts)))
            case ops.SetStatus(user_id=user, status=status):
                await self.router.to_user(user, cmd)
                s.acknowledged(status, time.time())  # claimed after a restart
            case ops.Focus() | ops.Settings():
                await self.router.to_user(cmd.user_id, cmd)
            case (
                ops.ChannelSubscribe()
                | ops.ChannelUnsubscribe()
                | ops.TypingStart()
                | ops.TypingStop()
                | ops.VoiceJoin()
                | ops.VoiceLeave()
            ):
                verdict = await self.router.to_channel(cmd.channel_id, cmd)
                return await self._run(conn, s.channel_result(cmd, verdict))
        return True

    async def _charged(self, conn: Conn, cmd: Charged) -> bool:
        """A subscription or a query, charged to the account's lookup budget first (`Charged`)."""
        s = conn.session
        charge, op = cmd.charge, cmd.op
        if isinstance(op, ops.Watch):
            if charge is not None and not await self.router.to_user(charge.user_id, charge):
                self._reply(conn, s.budget_refused(cmd).frame)
                return True
            conn.hold += 1
            try:
                answers = await self.router.to_users(op.targets, lambda ts: op._replace(targets=tuple(ts)))
                statuses = {shown.user_id: shown.status for answer in answers for shown in answer}
                users = [Shown(u, statuses[u]) for u in op.targets if u in statuses]
                s.synced(users)
                self._reply(conn, frames.sync((u.user_id, u.status) for u in users))
            finally:
                self._release(conn)
            return True
        query = op
        assert charge is not None  # a query is always charged

        def lookup() -> Awaitable[list[list[Found]]]:
            return self.router.to_users(query.targets, lambda ts: query._replace(targets=tuple(ts)))

        if not cmd.together:
            charged = await self.router.to_user(charge.user_id, charge)
            lookups = await lookup() if charged else []
        else:  # the charge and the lookup in the same round trip (see Session.lookups_careful_until)
            spent, looked = await asyncio.gather(
                self.router.to_user(charge.user_id, charge), lookup(), return_exceptions=True
            )
            if isinstance(spent, BaseException):
                raise spent
            charged = spent
            if charged and isinstance(looked, BaseException):
                raise looked  # a refused charge hides the lookup's failure too: it never was
            lookups = [] if isinstance(looked, BaseException) else looked
        if not charged:
            self.metrics.inc("edge_lookups_refused_total", discarded=str(cmd.together).lower())
            self._reply(conn, s.budget_refused(cmd, time.time()).frame)
            return True
        found = {a.user_id: a for part in lookups for a in part}
        answered: list[bytes] = []
        for u in query.targets:
            if u in found:
                a = found[u]
                answered.append(orjson.dumps(frames.changed(u, a.status, a.last_seen_at)))
        if send_batch(conn.ws, answered):  # the answers in one write
            self.metrics.inc("frames_out_total", n=len(answered))
            self.metrics.inc("replies_total", n=len(answered), type="presence.changed")
        return True

    async def _cleanup(self, conn: Conn) -> None:
        """The socket is gone: remove it, its subscriptions and its channel state everywhere."""
        s = conn.session
        if not conn.registered or s.user_id is None:
            return
        sid = s.socket_id
        user, at = s.user_id, conn.departed_at(time.time())
        resume_s = self.config.resume_s if conn.resumable else 0.0
        calls: list[Awaitable[Any]] = [
            # Until it lands: a socket left registered would keep its account online for as
            # long as this edge lives (its lease stays fresh). Repeating it is harmless.
            self.router.until_landed(
                lambda: self.router.to_user(user, ops.Disconnect(user, sid, at, resume_s)),
                f"departure of {sid}",
            )
        ]
        if s.subscriptions:
            calls.append(
                self.router.to_users(
                    sorted(s.subscriptions), lambda targets: ops.Unwatch(sid, tuple(targets))
                )
            )
        channels = s.touched_channels()
        if channels:
            calls.append(self.router.to_channels(channels, lambda cs: ops.DropSocket(sid, tuple(cs))))
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, BaseException):
                # The shard is gone for longer than the retry window; when it comes back it has
                # no memory of this socket, so there is nothing left to undo.
                log.warning("clean-up of %s incomplete: %s", sid, result)

    # ------------------------------------------------------------------ frames out

    def _reply(self, conn: Conn, frame: Frame, text: str | None = None) -> None:
        """Send the answer to the socket's own frame, counted by type in `presence_replies_total`."""
        self.metrics.inc("replies_total", type=str(frame.get("type")))
        self._send(conn, text if text is not None else frames.text(frame))

    def _send(self, conn: Conn, payload: str) -> None:
        conn.ws.send_text(payload)
        self.metrics.inc("frames_out_total")

    def _ack_heartbeat(self, conn: Conn) -> None:
        """What `_execute` and `_send` would do for a heartbeat's ack (`_message` answers
        `HEARTBEAT_ACKED` here, before `_run`), without building anything per frame."""
        inc = self.metrics.inc_key
        inc(HEARTBEAT_COUNTS[0])
        inc(HEARTBEAT_COUNTS[1])
        if conn.ws.write(HEARTBEAT_ACK_BYTES):
            inc(HEARTBEAT_COUNTS[2])

    def _release(self, conn: Conn) -> None:
        conn.hold -= 1
        if conn.hold:
            return
        if conn.held:
            held, conn.held = conn.held, []
            for payload in held:
                about = changed_about(payload)
                if about is None or conn.session.tell(*about):
                    self._send(conn, payload)
        if conn.held_lost is not None:
            lost, conn.held_lost = conn.held_lost, None
            self._spawn(self._look_again(conn, lost))

    async def _look_again(self, conn: Conn, lost: set[str]) -> None:
        """Frames of the types `lost` were dropped for this socket while it was held (more came
        than `HELD_CAP`: a watcher of many accounts, resynced during a storm). What they would
        have changed is brought back to the truth:
        - `presence.changed`: its view of every account it watches, as after a shard's restart;
        - `presence.self`: its account's own status, asked of its shard and sent again;
        - `voice.roster`: the roster of every channel it subscribed to (a subscribe again, which
          the shard answers with the roster and changes nothing else).
        `typing` is not made up for: a client shows it 10 s at most anyway.
        Before, those frames were simply lost, and the socket showed the state before them until
        each changed again."""
        self.metrics.inc("held_overflows_total")
        s = conn.session
        user, sid = s.user_id, s.socket_id
        if user is None:
            return
        looks: list[Awaitable[object]] = []
        if "presence.changed" in lost:
            looks.append(self._refresh_views(conn, sorted(s.subscriptions)))
        if "presence.self" in lost:
            looks.append(self._resend_own_status(conn))
        if "voice.roster" in lost:
            looks += [
                self.router.to_channel(c, ops.ChannelSubscribe(c, user, sid)) for c in sorted(s.channels)
            ]
        for result in await asyncio.gather(*looks, return_exceptions=True):
            if isinstance(result, Exception):
                log.warning("%s not looked at again after held frames overflowed: %s", sid, result)

    async def _resend_own_status(self, conn: Conn) -> None:
        """Its account's real status, as its shard has it now, in a `presence.self`; its other
        frames wait meanwhile, so that no later change is overtaken by this answer."""
        s = conn.session
        if s.user_id is None or s.socket_id not in self.conns:
            return
        conn.hold += 1
        try:
            answer = await self.router.to_user(s.user_id, ops.Query(s.user_id, s.visibility, (s.user_id,)))
            for found in answer:
                self._send(conn, frames.text(frames.self_status(found.status)))
        finally:
            self._release(conn)

    def _deliver(self, address: Address, payload: str) -> None:
        """A batch item from a shard: one payload for some of this edge's sockets, named or the
        watchers of an account (a publication, expanded by the index). The hot loop of fan-out
        (every delivery passes here): one pass over the recipients, each written to as it comes,
        the frame's bytes built once (`outbound.prepare`; a client whose unread output passes the
        limit is noticed by its transport: `EdgeSocket.on_slow`)."""
        watched = publication(address)
        if watched is not None:
            socket_ids: Collection[str] = self.watch_index.watchers(*watched)
        else:
            socket_ids = cast("tuple[str, ...]", address)  # sockets by id
            if is_internal(payload):
                self._internal(socket_ids, payload)
                return
        about = changed_about(payload)
        user, status = about if about is not None else ("", "")
        conns = self.conns
        data: bytes | None = None
        written = repeats = 0
        for sid in socket_ids:
            conn = conns.get(sid)
            if conn is None:
                continue
            if conn.hold:
                if len(conn.held) < HELD_CAP:
                    conn.held.append(payload)
                else:  # dropped: what it changes is looked at afresh when the hold ends
                    if conn.held_lost is None:
                        conn.held_lost = set()
                    conn.held_lost.add(type_of(payload))
                continue
            if about is not None and not conn.session.tell(user, status):
                repeats += 1
                continue
            if data is None:
                data = prepare(payload)
            if conn.ws.write(data):
                written += 1
        if repeats:
            self.metrics.inc_key(REPEATS_DROPPED, repeats)
        if written:
            self.metrics.inc_key(FRAMES_OUT, written)

    def _internal(self, socket_ids: tuple[str, ...], payload: str) -> None:
        """Frames from the shards meant for the edge itself, never for clients."""
        note = internal_note(payload)
        for sid in socket_ids:
            conn = self.conns.get(sid)
            if conn is None:
                continue
            match note:
                case AudienceNote(inside, outside):
                    # Only accounts the socket still watches: a note of a watch made before an
                    # unsubscribe that overtook it must not list the socket again.
                    s = conn.session
                    assert s.user_id is not None
                    watched = [t for t in inside if t in s.subscriptions]
                    self.watch_index.see(sid, s.user_id, watched, outside)
                    # Out of the audience, the socket's view of the account means nothing: back
                    # in, it is told the status even if it is the one it was told before.
                    for target in outside:
                        s.view.pop(target, None)
                case SettingsNote(visibility, at):
                    conn.session.note_visibility(visibility, at)
                case ChosenNote(status, at):
                    conn.session.note_chosen(status, at)

    def _forget_shard(self, lost: Callable[[str], bool]) -> None:
        """A shard restarted empty (or forgot this edge): what it decided about who sees the
        accounts `lost` is gone with it (the watches registered again bring new notes), so no
        publication of the new incarnation reaches a socket on an old decision."""
        self.watch_index.forget(lost)

    def _too_slow(self, ws: Socket) -> None:
        """A client whose unread output passed the limit (`send_buffer_bytes`, the transport's
        high-water mark) is closed instead of holding anybody up."""
        if ws.transport is not None:
            self.metrics.inc("slow_clients_closed_total")
            # Abort rather than close: a client that does not read would not read a close frame.
            ws.abort()

    # ------------------------------------------------------------------ background duties

    async def _liveness_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            now = time.time()
            for socket_id in self.deadlines.due(now):
                conn = self.conns.get(socket_id)
                if conn is None:
                    continue  # gone since
                close = conn.session.expired(now)
                if close is None:
                    self.deadlines.add(socket_id, conn.session.deadline())
                else:
                    if close.code == p.CLOSE_SILENT:
                        # Per the contract, a silent socket departs when it was last heard.
                        conn.went(conn.session.last_frame_at)
                    self._close(conn, close.code, close.reason)
            self.metrics.set("open_connections", len(self.conns))
            self.cut_off.observe(self.router.healthy(), now)
            self.admission.sweep(now)
            gate_now = time.monotonic()
            self._take_turns(self.opening.expire(gate_now))
            self._make_room(self.opening.make_room(gate_now))
            self.metrics.set("opening_active", len(self.opening.active))
            self.metrics.set("opening_queued", len(self.opening.waiting))

    async def _register_loop(self, registered: bool) -> None:
        """Registers every `EDGE_REGISTER_EVERY_S`; after a failure, again after `REGISTER_RETRY`
        (0.25 s, doubling up to that period). A directory just replaced (the end of `presence
        rollout`) lists only the edges that registered since, and a rollout begun soon after
        trusts its list once the directory is one period old: an edge whose try failed as the
        directory went, and that waited a whole period to try again, was not listed yet, and kept
        routing by its old map while a shard it still sent slots to was replaced
        (tests/integration/test_rollout.py, its second test, on a loaded machine)."""
        failures = 0
        while True:
            failures = 0 if registered else failures + 1
            await asyncio.sleep(
                EDGE_REGISTER_EVERY_S if registered else REGISTER_RETRY.delay(failures - 1, random.random)
            )
            registered = await self._register()

    async def _register(self) -> bool:
        """Tell the directory this edge is alive and which map it routes by; False if it failed."""
        try:
            await self.router.refresh_map()
            assert self.router.map is not None
            info = {
                "ws_port": self.ws_port,
                "internal_port": self.internal_port,
                "sockets": len(self.conns),
                # The map this edge routes by: `presence rollout` replaces a shard or the
                # directory only once every edge routes by the map without it.
                "map_version": self.router.map.version,
            }
            await self.directory.register_edge(self.edge_id, info)
            self._registration = info
        except Exception as e:
            log.info("directory unreachable: %s", e)
            return False
        return True

    async def _unregister(self) -> None:
        """Tell the directory this edge has stopped (its registration loop cancelled first), so
        that it is no longer listed: `presence status` showed a drained edge for 30 s with the
        sockets it had had, and `presence rollout` right after a rolling restart waited 15 s for
        the last edge drained to route by the newest map, naming it as still behind. A directory
        of the release before keeps listing it until it ages out, as it always did."""
        if self._registration is None:
            return  # never registered
        try:
            await asyncio.wait_for(
                self.directory.register_edge(
                    self.edge_id, {**self._registration, "sockets": 0, "stopped": True}
                ),
                UNREGISTER_TIMEOUT_S,
            )
        except Exception as e:  # Ray or the directory away: it ages out of the list instead
            log.info("could not tell the directory this edge stopped: %s", e)

    async def _reregister(self, shard: int) -> None:
        """A shard restarted empty: tell it again about every live socket of ours it owns, and
        report again the departures it may not have written (edge/reregistration.py)."""
        registered_by = self.router.map
        assert registered_by is not None
        registered = [c for c in self.conns.values() if c.registered and c.session.user_id is not None]
        live = [c for c in registered if c.phase is Phase.LIVE]
        plan = reregistration(shard, registered_by, [c.registration() for c in registered], self.departures)
        for op in plan.replays:
            self._replay(op)
        self.metrics.inc("edge_reregistered_ops_total", n=len(plan.register))
        results = await asyncio.gather(
            *(self.router.to_shard(shard, op) for op in plan.register), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                log.warning("re-registration on shard %d incomplete: %s", shard, result)
        # A socket that closed meanwhile may have had its clean-up overtaken by its registration
        # here (a retried call lands after a later one): undo it, or it stays a ghost online for
        # as long as this edge lives.
        for conn in live:
            if conn.session.socket_id not in self.conns:
                self.metrics.inc("edge_reregister_undone_total")
                await self._cleanup(conn)
        self._spawn(self._resync(shard, registered_by))

    def _replay(self, op: ops.Departed) -> None:
        """Report a departure again to a restarted shard, in the background and until it lands
        (re-registration must not wait). Routed by the account rather than sent to the restarted
        shard: a slot that a resize moved meanwhile answers MOVED, which must not count as landed."""
        self._spawn(
            self.router.until_landed(
                lambda: self.router.to_user(op.user_id, op), f"replayed departure of {op.user_id}"
            )
        )

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _resync(self, shard: int, registered_by: SlotMap) -> None:
        """Bring every watcher's view of the accounts on a restarted shard back to the truth.

        The dead incarnation's mail is gone, and changes made while it was away (a socket that
        closed, a status chosen) reach nobody who watched them: the new incarnation only knows the
        watches registered again. Once every edge has had time to register its sockets again
        (`resync_delay_s`), each watcher asks afresh and is sent only what differs from what it
        shows; its other events wait meanwhile, so none overtakes the answer.

        Only the accounts the shard owned when this edge registered again (`registered_by`, the
        map then) and owns still: slots that a resize or `presence rollout` moved to the new
        incarnation since came with their watchers and lost nothing."""
        await asyncio.sleep(self.config.resync_delay_s)

        async def one(conn: Conn) -> None:
            s = conn.session
            targets = sorted(
                t
                for t in s.subscriptions
                if self.router.shard_of_user(t) == shard and registered_by.shard_of(t) == shard
            )
            await self._refresh_views(conn, targets)

        conns = [c for c in self.conns.values() if c.registered and c.session.subscriptions]
        for result in await asyncio.gather(*(one(c) for c in conns), return_exceptions=True):
            if isinstance(result, BaseException):
                log.warning("resync after the restart of shard %d incomplete: %s", shard, result)

    async def _refresh_views(self, conn: Conn, targets: list[str]) -> None:
        """Ask afresh what the socket may see of `targets` and send it only what differs from
        what it shows; its other events wait meanwhile, so none overtakes the answer. Nothing to
        do for no targets, or a socket gone."""
        s = conn.session
        if not targets or s.socket_id not in self.conns:
            return
        conn.hold += 1
        self.metrics.inc("resync_watches_total")
        try:
            user = s.user_id
            assert user is not None
            answers = await self.router.to_users(targets, lambda ts: ops.Watch(user, s.socket_id, tuple(ts)))
            differences = s.differences([shown for answer in answers for shown in answer])
            for frame in differences:
                self._send(conn, frames.text(frame))
            self.metrics.inc("resync_frames_total", n=len(differences))
        finally:
            self._release(conn)


class InsecureConfig(ValueError):
    """The edge was configured to expose something it must not; the message says how to fix it."""
