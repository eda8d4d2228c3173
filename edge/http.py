"""The internal HTTP API, served on its own port by every edge (never behind the public balancer).

    GET /api/v1/internal/presence/focus?userId=U&channelId=C   {"focused": bool}
    GET /api/v1/internal/presence/online?serverId=G            {"online": N | null}
    GET /api/v1/internal/presence/users/U                      operator view
    GET /api/v1/internal/presence/active?hours=H[&serverId=G]  {"active": N | null}
    GET /api/v1/internal/presence/cluster                      the operator page's cluster panel
    GET /admin (+ /admin/admin.js, /admin/admin.css)           the operator page (static, no data)
    GET /api/v1/internal/edge/drain                            start draining this edge
    GET /healthz                                               200 when most shards answer (503 draining)
    GET /metrics                                               Prometheus text

Served by edge/http_server.py (one request per connection), not through websockets, whose request
parser drops any request with a body before a hook could answer it.

Guarded (protocol.md "Internal HTTP"), in this order: a `Host` that names neither the internal
address (the one the connection arrived on, the configured one, `localhost` on loopback) nor an
allowed host (`PRESENCE_INTERNAL_ALLOWED_HOSTS`) is 403, so a web page cannot read the port through
DNS rebinding; a method other than GET is 405, with or without a body (to HEAD without content:
edge/http_server.py); every request but `GET /healthz` must carry `Authorization: Bearer
<token>` (else 401, compared in constant time: the token is `PRESENCE_INTERNAL_TOKEN` or the one
`presence up` generated into the data directory, and an edge given none makes up its own, so the
port is never open); ids in paths and query strings are percent-decoded strictly and obey the id
rule (else 400); errors are a short JSON message, never an exception's text (which may carry a
traceback, a pid, an address or a path: those go to the edge's log).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http
import ipaddress
import logging
import secrets
import time
from collections.abc import Iterable, Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
from websockets.datastructures import Headers
from websockets.http11 import Response

from actors.clients import DirectoryClient, flush_stats
from actors.core.activity import REPORT_WINDOWS_H, BadWindow, parse_hours, window_start
from actors.core.contract import ShardStats
from actors.core.ids import id_problem
from actors.counts import CountReader
from actors.metrics import Metrics, render
from edge.http_server import HttpRequest, error_response
from edge.router import Router, Shard

if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection

PREFIX = "/api/v1/internal/presence"
# FlushActor figures exported by /metrics: statements and rows written, and what still waits.
FLUSH_COUNTERS = ("statements", "rows_written", "errors", "retries")
FLUSH_GAUGES = ("pending_rows", "in_flight_rows", "oldest_pending_age_seconds")
SHARD_TIMEOUT_S = 1.5
# Served without the internal token: load balancers and orchestrators probe it.
OPEN_PATHS = frozenset({"/healthz"})

log = logging.getLogger("presence.internal")
# What the operator page shows of the FlushActor (its backlog and whether it reaches PostgreSQL).
CLUSTER_FLUSH_KEYS = ("pending_rows", "in_flight_rows", "oldest_pending_age_s", "errors", "connected")
# The operator page: plain files, no build step, no data in them (the data comes from the JSON
# routes, which carry the internal token when one is set).
ADMIN_DIR = Path(__file__).parent / "static" / "admin"
ADMIN_FILES = {
    "/admin": ("admin.html", "text/html; charset=utf-8"),
    "/admin/": ("admin.html", "text/html; charset=utf-8"),
    "/admin/admin.js": ("admin.js", "text/javascript; charset=utf-8"),
    "/admin/admin.css": ("admin.css", "text/css; charset=utf-8"),
}


def is_loopback(host: str) -> bool:
    """Whether binding to `host` keeps a port on this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # any other name may resolve anywhere


def internal_exposure_problem(host: str, token: str | None) -> str | None:
    """Why an edge must not start with this internal host and token, or None."""
    if token or is_loopback(host):
        return None
    return (
        f"the internal API would listen on {host}, beyond this machine, without authentication: "
        "set PRESENCE_INTERNAL_TOKEN (or bind PRESENCE_INTERNAL_HOST to 127.0.0.1)"
    )


def _response(
    status: int, body: bytes, content_type: str, extra: tuple[tuple[str, str], ...] = ()
) -> Response:
    phrase = http.HTTPStatus(status).phrase
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            *extra,
        ]
    )
    return Response(status, phrase, headers, body)


def json_response(
    connection: ServerConnection | None, status: int, payload: Any, extra: tuple[tuple[str, str], ...] = ()
) -> Response:
    del connection
    return _response(status, orjson.dumps(payload), "application/json", extra)


def _bad_id(name: str, value: str | None) -> Response | None:
    """400 when `value` (a required id parameter) is missing or breaks the id rule."""
    if not value:
        return error_response(400, f"{name} is required")
    problem = id_problem(value)
    if problem is not None:
        return error_response(400, f"{name}: {problem}")
    return None


class BadEncoding(ValueError):
    """A percent-encoded part of the request is not valid UTF-8 (an encoded surrogate is not)."""


def strict_unquote(text: str) -> str:
    """Percent-decoding that refuses what is not UTF-8 instead of repairing it: `zz%FF` and
    `zz%FE` would otherwise both become `zz\ufffd`, the same id."""
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise BadEncoding("not valid percent-encoded UTF-8") from None


def strict_query(query: str) -> dict[str, str]:
    """The first value of each parameter, decoded strictly (`strict_unquote`)."""
    try:
        # Blank values kept: `serverId=` is a bad id (400), not a missing one (which `active`
        # reads as "the whole cluster").
        pairs = parse_qs(query, keep_blank_values=True, errors="strict", max_num_fields=32)
    except UnicodeDecodeError:
        raise BadEncoding("not valid percent-encoded UTF-8") from None
    except ValueError:
        raise BadEncoding("too many query parameters") from None
    return {k: v[0] for k, v in pairs.items()}


def host_name(host_header: str) -> str:
    """The name part of a `Host` header (no port, no brackets, lower case, no final dot)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.rstrip(".")


def allowed_host_names(internal_host: str, allowed: Iterable[str]) -> frozenset[str]:
    """The `Host` names the internal port answers (besides the address a connection arrived on):
    its configured address, `localhost` when that is a loopback address, and the allow-list."""
    names = {host_name(internal_host)}
    if is_loopback(internal_host):
        names.add("localhost")
    names.update(host_name(h) for h in allowed if h.strip())
    return frozenset(n for n in names if n)


class DrainSettings(Protocol):
    @property
    def drain_grace_s(self) -> float: ...
    @property
    def drain_window_s(self) -> float: ...
    @property
    def resume_s(self) -> float: ...


class ServedEdge(Protocol):
    """What the internal API reads of the edge serving it (edge/server.py `Edge`). A protocol, so
    that this module does not import the server that imports it (tests/unit/test_layers.py)."""

    @property
    def edge_id(self) -> str: ...
    @property
    def router(self) -> Router: ...
    @property
    def counts(self) -> CountReader: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def conns(self) -> Sized: ...
    @property
    def config(self) -> DrainSettings: ...
    @property
    def draining(self) -> bool: ...
    def drain(self) -> object: ...


class InternalApi:
    def __init__(
        self,
        edge: ServedEdge,
        token: str | None = None,
        internal_host: str = "127.0.0.1",
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.edge = edge
        # Never an open port: an edge given no token makes up one nobody knows (tests read it
        # from `edge.api.token_text`).
        self.token_text = token or secrets.token_urlsafe(32)
        self.token = self.token_text.encode()
        self.host_names = allowed_host_names(internal_host, allowed_hosts)

    def _authorized(self, request: HttpRequest) -> bool:
        # One header exactly: two raised websockets' MultipleValuesError (no answer, and a
        # traceback in the log for each such request, from anybody who reaches the port).
        values = request.headers.get_all("Authorization")
        if len(values) != 1:
            return False
        scheme, _, given = values[0].partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token)

    def _host_allowed(self, request: HttpRequest) -> bool:
        given = request.headers.get_all("Host")
        if not given:
            # No browser sends a request without Host, so none can be a rebinding page's; a
            # load balancer's HTTP/1.0 health check (HAProxy's `option httpchk`) sends none.
            return True
        if len(given) != 1:
            return False
        name = host_name(given[0])
        return name in self.host_names or (bool(name) and name == host_name(request.local_host))

    async def handle(self, request: HttpRequest) -> Response:
        if not self._host_allowed(request):
            return error_response(403, "this Host is not served here")
        if request.method != "GET":
            return error_response(405, "only GET is served here", (("Allow", "GET"),))
        url = urlsplit(request.target)
        path = url.path
        # The operator page's files hold no data (the page asks for the token and sends it with
        # every JSON request); everything else but /healthz needs the token.
        if path in ADMIN_FILES:
            return self.admin_file(path)
        if path not in OPEN_PATHS and not self._authorized(request):
            challenge = (("WWW-Authenticate", "Bearer"),)
            return error_response(401, "a valid internal token is required", challenge)
        try:
            query = strict_query(url.query)
            if path == "/healthz":
                return await self.healthz()
            if path == "/metrics":
                return await self.metrics()
            if path == f"{PREFIX}/focus":
                return await self.focus(query)
            if path == f"{PREFIX}/online":
                return await self.online(query)
            if path.startswith(f"{PREFIX}/users/"):
                return await self.user(strict_unquote(path[len(PREFIX) + len("/users/") :]))
            if path == f"{PREFIX}/active":
                return await self.active(query)
            if path == f"{PREFIX}/cluster":
                return await self.cluster()
            if path == "/api/v1/internal/edge/drain":
                # A GET like every route here (the port answers 405 to anything else), and
                # harmless to repeat: the drain starts once (protocol.md "Drain and resume").
                return self.drain()
        except BadEncoding as e:
            return error_response(400, str(e))
        except TimeoutError:
            return error_response(503, "a shard did not answer in time")
        except Exception:
            # The details (a Ray traceback names pids, addresses and files) go to the log only.
            log.exception("internal request %s failed", path)
            return error_response(503, "presence could not answer; see the edge's log")
        return error_response(404, "no such route")

    def drain(self) -> Response:
        """Start this edge's drain (once; asking again answers the same)."""
        edge = self.edge
        already = edge.draining
        edge.drain()
        cfg = edge.config
        return json_response(
            None,
            200,
            {
                "edge": edge.edge_id,
                "draining": True,
                "alreadyDraining": already,
                "sockets": len(edge.conns),
                "graceS": cfg.drain_grace_s,
                "windowS": cfg.drain_window_s,
                "resumeS": cfg.resume_s,
            },
        )

    async def healthz(self) -> Response:
        router = self.edge.router
        # A draining edge says 503 at once, so that the balancer sends it nobody new.
        ok = router.healthy() and not self.edge.draining
        # No socket count: this answer needs no token, and a count that moves when an invisible
        # account connects would tell whoever can reach the port what `invisible` hides (the
        # count is in the token-guarded /metrics, `presence_open_connections`).
        body = {
            "ok": ok,
            "draining": self.edge.draining,
            "edge": self.edge.edge_id,
            "shards": router.map.shard_count if router.map else 0,
        }
        return json_response(None, 200 if ok else 503, body)

    async def focus(self, query: dict[str, str]) -> Response:
        user, channel = query.get("userId"), query.get("channelId")
        bad = _bad_id("userId", user) or _bad_id("channelId", channel)
        if bad is not None:
            return bad
        assert user is not None and channel is not None
        shard = self.edge.router.shards[self.edge.router.shard_of_user(user)]
        return json_response(None, 200, {"focused": await shard.is_focused(user, channel, SHARD_TIMEOUT_S)})

    async def online(self, query: dict[str, str]) -> Response:
        server = query.get("serverId")
        bad = _bad_id("serverId", server)
        if bad is not None:
            return bad
        assert server is not None
        return json_response(None, 200, {"online": await self.edge.counts.online_in_server(server)})

    async def active(self, query: dict[str, str]) -> Response:
        """Accounts (members of G where given) with a live socket at some moment of the last H
        hours (actors/core/activity.py); null when Redis cannot answer."""
        try:
            hours = parse_hours(query.get("hours"))
        except BadWindow as e:
            return error_response(400, str(e))
        since = window_start(time.time(), hours)
        server = query.get("serverId")
        if server is None:
            return json_response(None, 200, {"active": await self.edge.counts.active(since)})
        bad = _bad_id("serverId", server)
        if bad is not None:
            return bad
        shard = self.edge.router.shards[self.edge.router.shard_of_user(server)]
        members = await shard.server_members(server, SHARD_TIMEOUT_S)
        return json_response(None, 200, {"active": await self.edge.counts.active_among(members, since)})

    async def _current_shards(self) -> list[Shard]:
        """The clients of exactly the shards of the current slot map (an edge learns of a resize
        only when a call fails, so the map is read first: a shrink's retired shards are gone)."""
        router = self.edge.router
        with contextlib.suppress(Exception):
            await asyncio.wait_for(router.refresh_map(), SHARD_TIMEOUT_S)
        count = router.map.shard_count if router.map is not None else 0
        return [router.shards[i] for i in range(count) if i in router.shards]

    async def cluster(self) -> Response:
        """The operator page's cluster panel: shards, edges, pending last-seen, flush backlog,
        PostgreSQL and Redis health, and the active counts of the usual windows."""
        clients = await self._current_shards()
        stats = await asyncio.gather(*(c.stats(SHARD_TIMEOUT_S) for c in clients), return_exceptions=True)
        shards: list[dict[str, Any]] = []
        for client, st in zip(clients, stats, strict=True):
            if isinstance(st, ShardStats):
                keep = (
                    "shard", "node_ip", "slots", "accounts", "online", "sockets", "edges", "pending_last_seen"
                )  # fmt: skip
                shards.append({k: getattr(st, k) for k in keep})
            else:
                shards.append({"shard": client.index, "error": "did not answer"})
        try:
            flush: dict[str, Any] = await flush_stats(SHARD_TIMEOUT_S)
        except Exception:
            flush = {"error": "did not answer"}
        try:
            edges = await asyncio.wait_for(DirectoryClient().list_edges(), SHARD_TIMEOUT_S)
        except Exception:
            edges = {}
        postgres = False
        if clients:
            try:
                postgres = await clients[0].postgres_ok(SHARD_TIMEOUT_S)
            except Exception:
                postgres = False
        now = time.time()
        counts = self.edge.counts
        active = await asyncio.gather(*(counts.active(window_start(now, h)) for h in REPORT_WINDOWS_H))
        return json_response(
            None,
            200,
            {
                "edge": self.edge.edge_id,
                "shards": shards,
                "edges": [
                    {
                        "edgeId": e,
                        "wsPort": v.get("ws_port"),
                        "internalPort": v.get("internal_port"),
                        "sockets": v.get("sockets"),
                    }
                    for e, v in sorted(edges.items())
                ],
                "pendingLastSeen": sum(int(s.get("pending_last_seen") or 0) for s in shards),
                "flush": {k: flush.get(k) for k in CLUSTER_FLUSH_KEYS}
                if "error" not in flush
                else {"error": flush["error"]},
                "postgres": postgres,
                "redis": await counts.ping(),
                "accountsOnline": await counts.accounts_online(),
                "active": {f"{h:g}h": n for h, n in zip(REPORT_WINDOWS_H, active, strict=True)},
            },
        )

    def admin_file(self, path: str) -> Response:
        name, content_type = ADMIN_FILES[path]
        # The page is the operator's: never framed by another site, never cached stale.
        headers = (
            ("Cache-Control", "no-store"),
            ("X-Frame-Options", "DENY"),
            ("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'"),
        )
        return _response(200, (ADMIN_DIR / name).read_bytes(), content_type, headers)

    async def user(self, user_id: str) -> Response:
        bad = _bad_id("userId", user_id)
        if bad is not None:
            return bad
        router = self.edge.router
        try:
            view = await router.shards[router.shard_of_user(user_id)].operator_view(user_id, SHARD_TIMEOUT_S)
        except Exception:
            view = None
        if view is None:
            # This edge's slot map may predate a resize (it learns of moves only through MOVED
            # answers to its own batches): ask the owner named by a fresh map before saying 404.
            await router.refresh_map()
            view = await router.shards[router.shard_of_user(user_id)].operator_view(user_id, SHARD_TIMEOUT_S)
        if view is None:
            return error_response(404, "no such account")
        return json_response(None, 200, view)

    async def metrics(self) -> Response:
        self.edge.metrics.sample_process()
        self.edge.metrics.set("open_connections", len(self.edge.conns))
        snapshots: list[tuple[dict[str, str], dict[str, Any]]] = [
            ({"edge": self.edge.edge_id}, self.edge.metrics.snapshot())
        ]
        stats = await asyncio.gather(
            *(client.stats(SHARD_TIMEOUT_S) for client in await self._current_shards()),
            return_exceptions=True,
        )
        for st in stats:
            if isinstance(st, ShardStats):
                labels = {"shard": str(st.shard)}
                gauges: list[tuple[str, list[tuple[str, str]], float]] = [
                    (k, [], float(getattr(st, k)))
                    for k in ("accounts", "sockets", "online", "edges", "pending_last_seen")
                ]
                snap = dict(st.metrics)
                snap["gauges"] = [*snap.get("gauges", []), *[(f"shard_{n}", lab, v) for n, lab, v in gauges]]
                snapshots.append((labels, snap))
        try:
            flush = await flush_stats(SHARD_TIMEOUT_S)
        except Exception:  # a missing FlushActor shows as missing series
            flush = {}
        counters: list[tuple[str, list[tuple[str, str]], float]] = [
            (f"flush_{k}_total", [], float(flush[k])) for k in FLUSH_COUNTERS if k in flush
        ]
        gauges = [(f"flush_{k}", [], float(flush[k])) for k in FLUSH_GAUGES if k in flush]
        histograms = flush.get("metrics", {}).get("histograms", [])
        snapshots.append(({}, {"counters": counters, "gauges": gauges, "histograms": histograms}))
        text = render(snapshots)
        return _response(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
