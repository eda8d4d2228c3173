"""`presence report`: the sanity check after a rollout (seed 000), from any terminal.

How many accounts had their last-seen flushed in the last hour and day, the newest and oldest
stored last-seen, the last-seen writes still pending (in the shards and in the FlushActor), and
the active counts for 1 h, 24 h and 7 days. Each part that cannot be reached is `null` in
`--json` and `unavailable` in the text, and the others are still reported.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

import asyncpg

from actors import clients
from actors.core.activity import REPORT_WINDOWS_H, window_start
from actors.counts import CountReader
from cluster.config import Settings
from cluster.runtime import cluster_info_or_exit, ray_unreachable

REPORT_SCHEMA = 1
STORED_SQL = """
SELECT count(*) FILTER (WHERE last_seen_at > now() - interval '1 hour') AS flushed_last_hour,
       count(*) FILTER (WHERE last_seen_at > now() - interval '1 day') AS flushed_last_day,
       max(last_seen_at) AS newest,
       min(last_seen_at) AS oldest
FROM users
"""


def _iso(ts: datetime | None) -> str | None:
    return (
        None if ts is None else ts.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    )


async def _stored(database_url: str) -> dict[str, Any] | None:
    try:
        conn = await asyncio.wait_for(asyncpg.connect(database_url), 5)
    except Exception:
        return None
    try:
        row = await asyncio.wait_for(conn.fetchrow(STORED_SQL), 10)
    except Exception:
        return None
    finally:
        await conn.close()
    assert row is not None
    return {
        "flushed_last_hour": row["flushed_last_hour"],
        "flushed_last_day": row["flushed_last_day"],
        "newest_last_seen": _iso(row["newest"]),
        "oldest_last_seen": _iso(row["oldest"]),
    }


async def _pending() -> dict[str, Any]:
    shards: int | None = 0
    try:
        _version, _owners, count = await clients.DirectoryClient().get_map()
        for i in range(count):
            st = await clients.ShardClient(i).stats(timeout_s=5)
            shards = None if shards is None else shards + st.pending_last_seen
    except Exception:
        shards = None
    try:
        fl = await clients.flush_stats(timeout_s=5)
        flusher: int | None = int(fl["pending_rows"]) + int(fl["in_flight_rows"])
    except Exception:
        flusher = None
    return {"shards": shards, "flusher": flusher}


async def gather(database_url: str, redis_url: str | None, ray: bool = True) -> dict[str, Any]:
    reader = CountReader(redis_url)
    now = time.time()
    try:
        active = await asyncio.gather(*(reader.active(window_start(now, h)) for h in REPORT_WINDOWS_H))
    finally:
        await reader.close()
    return {
        "schema": REPORT_SCHEMA,
        "stored": await _stored(database_url),
        "pending_writes": await _pending() if ray else {"shards": None, "flusher": None},
        "active": {f"{h:g}h": n for h, n in zip(REPORT_WINDOWS_H, active, strict=True)},
    }


def render(report: dict[str, Any]) -> str:
    def shown(v: object) -> str:
        return "unavailable" if v is None else f"{v:,}" if isinstance(v, int) else str(v)

    stored = report["stored"]
    lines = []
    if stored is None:
        lines.append("stored last-seen: unavailable (PostgreSQL did not answer)")
    else:
        lines += [
            f"flushed in the last hour: {shown(stored['flushed_last_hour'])}",
            f"flushed in the last day:  {shown(stored['flushed_last_day'])}",
            f"newest stored last-seen:  {stored['newest_last_seen'] or 'none'}",
            f"oldest stored last-seen:  {stored['oldest_last_seen'] or 'none'}",
        ]
    pending = report["pending_writes"]
    lines.append(
        f"pending last-seen writes: shards {shown(pending['shards'])}, flusher {shown(pending['flusher'])}"
    )
    lines.append("active: " + "   ".join(f"{k} {shown(v)}" for k, v in report["active"].items()))
    return "\n".join(lines)


def report(settings: Settings, as_json: bool = False) -> int:
    info = cluster_info_or_exit(settings)
    away = ray_unreachable(info.ray_address, "report")
    if away is not None:
        # The parts Ray holds are unavailable; the stores' are still reported (joining a Ray
        # that is away retried for minutes, and the report never came).
        print(away, file=sys.stderr, flush=True)
        result = asyncio.run(gather(info.database_url, info.redis_url, ray=False))
    else:
        clients.connect(info.ray_address, info.ray_namespace)
        try:
            result = asyncio.run(gather(info.database_url, info.redis_url))
        finally:
            clients.shutdown()
    print(json.dumps(result, indent=2) if as_json else render(result))
    return 0
