"""Active counts through real edges, shards and Redis: several sockets and edges count once,
invisible counts, departed accounts stay in their window, bad windows are refused, and a wiped
or restarted Redis is whole again (live accounts from the shards, history from PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any

import asyncpg
import pytest
import redis.asyncio as aioredis

from edge.server import Edge

from .conftest import Cluster, Ids, internal_request, internal_url, load
from .test_presence_ws import connect
from .wsclient import eventually, of_type

pytestmark = pytest.mark.integration


async def get(edge: Edge, path: str) -> tuple[int, Any]:
    def fetch() -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(internal_request(f"{internal_url(edge)}{path}"), timeout=5) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    return await asyncio.to_thread(fetch)


async def active(edge: Edge, hours: str, server: str | None = None) -> object:
    query = f"hours={hours}" + (f"&serverId={server}" if server else "")
    status, body = await get(edge, f"/api/v1/internal/presence/active?{query}")
    assert status == 200, body
    return body["active"]


async def counts_are(edge: Edge, server: str, expected: dict[str, object]) -> bool:
    return all([await active(edge, h, server) == n for h, n in expected.items()])


@pytest.mark.parametrize("hours", ["0", "721", "-1", "abc", "", "1e2", "nan"])
async def test_bad_window_is_400_with_a_short_json_error(edge: Edge, hours: str) -> None:
    status, body = await get(edge, f"/api/v1/internal/presence/active?hours={hours}")
    assert status == 400 and "hours" in body["error"] and len(body["error"]) < 80
    status, body = await get(edge, "/api/v1/internal/presence/active")
    assert status == 400 and "hours" in body["error"]


async def test_active_counts_survive_a_wipe_and_a_restart(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    _, redis_server = cluster.require_servers()
    g = ids("g")
    ann, ben, cat, dan, eli = (ids(n) for n in ("ann", "ben", "cat", "dan", "eli"))
    await load(
        conn,
        {
            "users": [{"id": u} for u in (ann, ben, cat, dan, eli)],
            "servers": [{"id": g, "members": [ann, ben, cat, dan]}],
        },
    )
    # dan was last here two hours ago (stored), eli is not a member.
    await conn.execute("UPDATE users SET last_seen_at = now() - interval '2 hours' WHERE id = $1", dan)

    a1 = await connect(cluster, edge, ann)
    a2 = await connect(cluster, second_edge, ann)  # one account, two edges: counted once
    b = await connect(cluster, edge, ben)
    await b.send({"type": "presence.update", "status": "invisible"})  # invisible counts
    await b.request({"type": "presence.query", "userIds": [ann]}, of_type("presence.changed"))
    e = await connect(cluster, edge, eli)
    await e.close()
    # Nothing has written dan's history yet (only a wipe refills from PostgreSQL): 2 in any window.
    await eventually(lambda: counts_are(edge, g, {"1": 2, "0.01": 2}), timeout=10)
    assert await active(second_edge, "720", g) == 2

    await b.close()  # ben left moments ago: still active in the last hour, whatever he chose
    await a1.close()  # ann still has a socket on the other edge
    await eventually(lambda: counts_are(edge, g, {"1": 2, "24": 2}), timeout=10)
    # Stored last-seen of ben's departure reaches PostgreSQL (the history a wipe refills from).
    await eventually(lambda: conn.fetchval("SELECT last_seen_at IS NOT NULL FROM users WHERE id = $1", ben))
    total = await active(edge, "1")
    assert isinstance(total, int) and total >= 3  # ann, ben, eli at least (other tests add more)

    # A wiped Redis: the live account comes back from the shards, the history from PostgreSQL.
    r = aioredis.Redis.from_url(cluster.redis_url)
    try:
        await r.flushall()
    finally:
        await r.aclose()
    await eventually(lambda: counts_are(edge, g, {"1": 2, "24": 3}), timeout=15)

    # A restarted (empty) Redis: null while away, then whole again.
    redis_server.stop()
    try:
        assert await active(edge, "24", g) is None
        assert await active(edge, "24") is None
        assert await active(edge, "24", ids("no-members")) is None  # unknown, not 0
    finally:
        redis_server.restart()
    await eventually(lambda: counts_are(edge, g, {"1": 2, "24": 3, "720": 3}), timeout=15)
    await a2.close()


async def test_report_sees_a_departure_flushed_and_active(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    from cluster.report import gather, render

    before = await gather(cluster.database_url, cluster.redis_url)
    assert before["stored"] is not None
    u = ids("reporter")
    c = await connect(cluster, edge, u)
    await c.close()
    await eventually(lambda: conn.fetchval("SELECT last_seen_at IS NOT NULL FROM users WHERE id = $1", u))
    stored_at = await conn.fetchval("SELECT last_seen_at FROM users WHERE id = $1", u)
    after = await gather(cluster.database_url, cluster.redis_url)
    assert after["stored"]["flushed_last_hour"] >= before["stored"]["flushed_last_hour"] + 1
    assert after["stored"]["newest_last_seen"] >= stored_at.isoformat(timespec="milliseconds")[:23]
    assert isinstance(after["pending_writes"]["shards"], int)
    assert isinstance(after["pending_writes"]["flusher"], int)
    assert after["active"]["1h"] >= 1 and after["active"]["168h"] >= after["active"]["1h"]
    text = render(after)
    assert "flushed in the last day:" in text and "active: 1h" in text and "unavailable" not in text
