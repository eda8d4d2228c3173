"""The internal HTTP API, served on its own port by every edge (never behind the public balancer).

    GET /api/v1/internal/presence/focus?userId=U&channelId=C   {"focused": bool}
    GET /api/v1/internal/presence/online?serverId=G            {"online": N | null}
    GET /api/v1/internal/presence/users/U                      operator view
    GET /healthz                                               200 when every shard answers
    GET /metrics                                               Prometheus text

Served through websockets' `process_request` hook, so the edge needs no second HTTP stack.
"""

from __future__ import annotations

import asyncio
import http
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import orjson
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from actors.metrics import render
from actors.ray_api import flush_stats

if TYPE_CHECKING:
    from websockets.asyncio.server import ServerConnection

    from edge.server import Edge

PREFIX = "/api/v1/internal/presence"
# FlushActor figures exported by /metrics: statements and rows written, and what still waits.
FLUSH_COUNTERS = ("statements", "rows_written", "errors", "retries")
FLUSH_GAUGES = ("pending_rows", "in_flight_rows", "oldest_pending_age_s")
SHARD_TIMEOUT_S = 1.5


def _response(status: int, body: bytes, content_type: str) -> Response:
    phrase = http.HTTPStatus(status).phrase
    headers = Headers(
        [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Connection", "close")]
    )
    return Response(status, phrase, headers, body)


def json_response(connection: ServerConnection | None, status: int, payload: Any) -> Response:
    del connection
    return _response(status, orjson.dumps(payload), "application/json")


class InternalApi:
    def __init__(self, edge: Edge) -> None:
        self.edge = edge

    async def handle(self, connection: ServerConnection, request: Request) -> Response:
        url = urlsplit(request.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        path = url.path
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
        except TimeoutError:
            return json_response(None, 503, {"error": "a shard did not answer in time"})
        except Exception as e:
            return json_response(None, 503, {"error": f"{type(e).__name__}: {e}"[:300]})
        return json_response(None, 404, {"error": f"no route {path}"})

    async def healthz(self) -> Response:
        router = self.edge.router
        ok = router.healthy()
        body = {
            "ok": ok,
            "edge": self.edge.edge_id,
            "shards": router.map.shard_count if router.map else 0,
            "sockets": len(self.edge.conns),
        }
        return json_response(None, 200 if ok else 503, body)

    async def focus(self, query: dict[str, str]) -> Response:
        user, channel = query.get("userId"), query.get("channelId")
        if not user or not channel:
            return json_response(None, 400, {"error": "userId and channelId are required"})
        shard = self.edge.router.shards[self.edge.router.shard_of_user(user)]
        return json_response(None, 200, {"focused": await shard.is_focused(user, channel, SHARD_TIMEOUT_S)})

    async def online(self, query: dict[str, str]) -> Response:
        server = query.get("serverId")
        if not server:
            return json_response(None, 400, {"error": "serverId is required"})
        return json_response(None, 200, {"online": await self.edge.counts.online_in_server(server)})

    async def user(self, user_id: str) -> Response:
        if not user_id:
            return json_response(None, 400, {"error": "a user id is required"})
        shard = self.edge.router.shards[self.edge.router.shard_of_user(user_id)]
        return json_response(None, 200, await shard.operator_view(user_id, SHARD_TIMEOUT_S))

    async def metrics(self) -> Response:
        router = self.edge.router
        snapshots: list[tuple[dict[str, str], dict[str, Any]]] = [
            ({"edge": self.edge.edge_id}, self.edge.metrics.snapshot())
        ]
        stats = await asyncio.gather(
            *(client.stats(SHARD_TIMEOUT_S) for client in router.shards.values()), return_exceptions=True
        )
        for st in stats:
            if isinstance(st, dict):
                labels = {"shard": str(st["shard"])}
                gauges = [
                    (k, [], float(st[k]))
                    for k in ("accounts", "sockets", "online", "edges", "pending_last_seen")
                ]
                snap = dict(st["metrics"])
                snap["gauges"] = [*snap.get("gauges", []), *[(f"shard_{n}", lab, v) for n, lab, v in gauges]]
                snapshots.append((labels, snap))
        try:
            flush = await flush_stats(SHARD_TIMEOUT_S)
        except Exception:  # a missing FlushActor shows as missing series
            flush = {}
        counters = [(f"flush_{k}_total", [], float(flush[k])) for k in FLUSH_COUNTERS if k in flush]
        gauges = [(f"flush_{k}", [], float(flush[k])) for k in FLUSH_GAUGES if k in flush]
        snapshots.append(({}, {"counters": counters, "gauges": gauges}))
        text = render(snapshots)
        return _response(200, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
