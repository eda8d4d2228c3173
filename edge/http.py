"""The internal HTTP API, served on its own port by every edge (never behind the public balancer).

    GET /api/v1/internal/presence/focus?userId=U&channelId=C   {"focused": bool}
    GET /api/v1/internal/presence/online?serverId=G            {"online": N | null}
    GET /api/v1/internal/presence/users/U                      operator view
    GET /api/v1/internal/presence/active?hours=H[&serverId=G]  {"active": N | null}
    GET /api/v1/internal/presence/cluster                      the operator page's cluster panel
    GET /admin (+ /admin/admin.js, /admin/admin.css)           the operator page (static, no data)
    GET /api/v1/internal/edge/drain                            start draining this edge
    GET /healthz                                               200 when every shard answers (503 draining)
    GET /metrics                                               Prometheus text

Served through websockets' `process_request` hook, so the edge needs no second HTTP stack.

Guarded (protocol.md "Internal HTTP"): only GET (else 405); with an internal token configured
(`PRESENCE_INTERNAL_TOKEN`) every request but `GET /healthz` must carry `Authorization: Bearer
<token>` (else 401, compared in constant time); ids obey the id rule (else 400); errors are a short
JSON message, never an exception's text (which may carry a traceback, a pid, an address or a path:
those go to the edge's log).
"""

from __future__ import annotations

import asyncio
import hmac
import http
import ipaddress
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from actors.clients import DirectoryClient, flush_stats
from actors.core.activity import REPORT_WINDOWS_H, BadWindow, parse_hours, window_start
from actors.core.contract import ShardStats
from actors.core.ids import id_problem
from actors.metrics import render

if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection

    from edge.server import Edge

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
        return json_response(None, 400, {"error": f"{name} is required"})
    problem = id_problem(value)
    if problem is not None:
        return json_response(None, 400, {"error": f"{name}: {problem}"})
    return None


class InternalApi:
    def __init__(self, edge: Edge, token: str | None = None) -> None:
        self.edge = edge
        self.token = token.encode() if token else None

    def _authorized(self, request: Request) -> bool:
        if self.token is None:
            return True
        scheme, _, given = (request.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token)

    async def handle(self, connection: ServerConnection, request: Request) -> Response:
        url = urlsplit(request.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
        if request.method != "GET":
            return json_response(None, 405, {"error": "only GET is served here"}, (("Allow", "GET"),))
        # The operator page's files hold no data (the page asks for the token and sends it with
        # every JSON request); everything else but /healthz needs the token when one is set.
        if path in ADMIN_FILES:
            return self.admin_file(path)
        if path not in OPEN_PATHS and not self._authorized(request):
            return json_response(
                None, 401, {"error": "a valid internal token is required"}, (("WWW-Authenticate", "Bearer"),)
            )
        try:
            if path == "/healthz":
                return await self.healthz()
            if path == "/metrics":
                return await self.metrics()
            if path == f"{PREFIX}/focus":
                return await self.focus(query)
            if path == f"{PREFIX}/online":
                return await self.online(query)
            if path.startswith(f"{PREFIX}/users/"):
                return await self.user(unquote(path[len(PREFIX) + len("/users/") :]))
            if path == f"{PREFIX}/active":
                return await self.active(query)
            if path == f"{PREFIX}/cluster":
                return await self.cluster()
            if path == "/api/v1/internal/edge/drain":
                # A GET like every route here (the port answers 405 to anything else), and
                # harmless to repeat: the drain starts once (protocol.md "Drain and resume").
                return self.drain()
        except TimeoutError:
            return json_response(None, 503, {"error": "a shard did not answer in time"})
        except Exception:
            # The details (a Ray traceback names pids, addresses and files) go to the log only.
            log.exception("internal request %s failed", path)
            return json_response(None, 503, {"error": "presence could not answer; see the edge's log"})
        return json_response(None, 404, {"error": "no such route"})

    def drain(self) -> Response:
        """Start this edge's drain (once; asking again answers the same)."""
        edge = self.edge
        edge.drain()
        cfg = edge.config
        return json_response(
            None,
            200,
            {
                "edge": edge.edge_id,
                "draining": True,
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
        body = {
            "ok": ok,
            "draining": self.edge.draining,
            "edge": self.edge.edge_id,
            "shards": router.map.shard_count if router.map else 0,
            "sockets": len(self.edge.conns),
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
            return json_response(None, 400, {"error": str(e)})
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

    async def cluster(self) -> Response:
        """The operator page's cluster panel: shards, edges, pending last-seen, flush backlog,
        PostgreSQL and Redis health, and the active counts of the usual windows."""
        router = self.edge.router
        clients = list(router.shards.values())
        stats = await asyncio.gather(*(c.stats(SHARD_TIMEOUT_S) for c in clients), return_exceptions=True)
        shards: list[dict[str, Any]] = []
        for client, st in zip(clients, stats, strict=True):
            if isinstance(st, ShardStats):
                keep = ("shard", "slots", "accounts", "online", "sockets", "edges", "pending_last_seen")
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
            return json_response(None, 404, {"error": "no such account"})
        return json_response(None, 200, view)

    async def metrics(self) -> Response:
        router = self.edge.router
        self.edge.metrics.sample_process()
        self.edge.metrics.set("open_connections", len(self.edge.conns))
        snapshots: list[tuple[dict[str, str], dict[str, Any]]] = [
            ({"edge": self.edge.edge_id}, self.edge.metrics.snapshot())
        ]
        stats = await asyncio.gather(
            *(client.stats(SHARD_TIMEOUT_S) for client in router.shards.values()), return_exceptions=True
        )
        for st in stats:
            if isinstance(st, ShardStats):
                labels = {"shard": str(st.shard)}
                gauges = [
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
        counters = [(f"flush_{k}_total", [], float(flush[k])) for k in FLUSH_COUNTERS if k in flush]
        gauges = [(f"flush_{k}", [], float(flush[k])) for k in FLUSH_GAUGES if k in flush]
        histograms = flush.get("metrics", {}).get("histograms", [])
        snapshots.append(({}, {"counters": counters, "gauges": gauges, "histograms": histograms}))
        text = render(snapshots)
        return _response(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
