"""`presence status`: what the running cluster is doing, from any terminal."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg

from actors import clients
from actors.counts import CountReader
from cluster.config import Settings
from cluster.runtime import cluster_info_or_exit, ray_reachable_or_exit

# Version of the layout of `presence status --json`, described by docs/status.schema.json.
STATUS_SCHEMA = 1
# What the per-shard account column counts: a shard loads an account from PostgreSQL when it is
# first used (a socket, a watch, a query), so right after `presence load` it says 0.
ACCOUNTS_LEGEND = (
    "in memory: accounts a shard holds, loaded when first used since it started "
    "(not the accounts stored: `presence load` adds none here)"
)


async def _gather(info_db: str, redis_url: str | None) -> dict[str, Any]:
    directory = clients.DirectoryClient()
    version, _owners, count = await directory.get_map()
    shards: list[Any] = []
    for i in range(count):
        try:
            shards.append((await clients.ShardClient(i).stats(timeout_s=5)).as_dict())
        except Exception as e:
            shards.append({"shard": i, "error": type(e).__name__})
    try:
        flush = await clients.flush_stats(timeout_s=5)
    except Exception as e:
        flush = {"error": type(e).__name__}
    edges = await directory.list_edges()
    reader = CountReader(redis_url)
    redis_ok = await reader.ping()
    accounts = await reader.accounts_online()
    sockets = await reader.sockets_online()
    await reader.close()
    try:
        conn = await asyncio.wait_for(asyncpg.connect(info_db), 5)
        await conn.fetchval("SELECT 1")
        await conn.close()
        pg_ok = True
    except Exception:
        pg_ok = False
    return {
        "schema": STATUS_SCHEMA,
        "map_version": version,
        "shards": shards,
        "flush": flush,
        "edges": edges,
        "redis": redis_ok,
        "postgres": pg_ok,
        "accounts_online": accounts,
        "sockets_online": sockets,
    }


def status(settings: Settings, as_json: bool = False) -> int:
    info = cluster_info_or_exit(settings)
    ray_reachable_or_exit(info.ray_address, "status")
    clients.connect(info.ray_address, info.ray_namespace)
    try:
        report = asyncio.run(_gather(info.database_url, info.redis_url))
    finally:
        clients.shutdown()
    if as_json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    print(f"slot map version {report['map_version']}")
    print(
        f"{'shard':>5} {'node':>15} {'slots':>6} {'in memory':>9} {'online':>7} {'sockets':>8} {'edges':>6} "
        f"{'pending':>8}"
    )
    for st in report["shards"]:
        if "error" in st:
            print(f"{st['shard']:>5} unavailable ({st['error']})")
            continue
        slots = st.get("slots") if st.get("slots") is not None else "?"
        print(
            f"{st['shard']:>5} {st.get('node_ip') or '?':>15} {slots:>6} {st['accounts']:>9} "
            f"{st['online']:>7} {st['sockets']:>8} "
            f"{st['edges']:>6} {st['pending_last_seen']:>8}"
        )
    print(f"edges: {len(report['edges'])}")
    for edge_id, e in report["edges"].items():
        ports = f"ws :{e.get('ws_port')}  internal :{e.get('internal_port')}"
        print(f"  {edge_id}  {ports}  sockets {e.get('sockets')}")
    total_sockets = sum(st.get("sockets", 0) for st in report["shards"])
    total_online = sum(st.get("online", 0) for st in report["shards"])
    print(f"sockets: {total_sockets}   accounts online: {total_online}")
    print(ACCOUNTS_LEGEND)
    fl = report["flush"]
    in_shards = sum(st.get("pending_last_seen", 0) for st in report["shards"])
    in_flusher = fl["error"] if "error" in fl else fl.get("pending_rows", 0) + fl.get("in_flight_rows", 0)
    print(f"pending last-seen writes: shards {in_shards}, flusher {in_flusher}")
    health = {name: "ok" if report[name] else "UNREACHABLE" for name in ("postgres", "redis")}
    print(f"postgres: {health['postgres']}   redis: {health['redis']}")
    return 0
