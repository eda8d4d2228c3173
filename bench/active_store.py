"""Where the active counts live, by measured cost (one quick run, not a benchmark suite).

    python -m bench.active_store [--accounts 400000] [--members 10000]

1. Writes per second the sorted set adds at the `bench lastseen` load (400,000 connected
   accounts, 1 % leaving and 1 % arriving per minute, 10-minute refresh interval): the real pure
   shard state (`ShardState`) is driven through 30 simulated minutes at a tenth of the accounts
   (rates scale linearly with accounts), counting what the shell would write: one score per
   arrival, per departure, and per account in the rolling refresh. A per-server sorted set would
   write each of these once per server the account is in (`--servers-per-account`).
2. The time of a 24 h count for a server of 10,000 members among 400,000 accounts, on real Redis
   and real PostgreSQL (embedded, in a temporary directory): the global set with ZMSCORE of the
   members (pipelined, 1,000 a command) after reading the members from PostgreSQL, a per-server
   sorted set (ZCOUNT), and PostgreSQL alone (stored last-seen, joined with the members).

Prints a table and the lines for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import redis.asyncio as aioredis

from actors.core.activity import live_until, window_start
from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.core.effects import Activity
from actors.core.shard import ShardState
from actors.counts import COUNT_AMONG_LUA as COUNT_LUA  # the script the edge runs
from cluster import db
from cluster.embedded import EmbeddedPostgres, EmbeddedRedis

T0 = 1_800_000_000.0
# The same script as actors/counts.py uses (kept here so the figures are of exactly this).


def simulate_writes(accounts: int, minutes: float, refresh_s: float, churn: float) -> dict[str, float]:
    s = ShardState(checkpoint_interval_s=refresh_s, socket_timeout_s=1e9)
    online = [f"u{i}" for i in range(accounts)]
    spare = [f"v{i}" for i in range(accounts)]
    for u in online + spare:
        s.set_relations(u, Relations(), T0)
        s.load_account(u, AccountRow(), T0)
    for u in online:
        s.connect(u, "s-" + u, "e", T0)
    s.outbox.drain()
    rng = random.Random(1)
    per_s = accounts * churn / 60.0
    now, carry = T0, 0.0
    arrivals = departures = refreshed = 0
    steps = round(minutes * 60)
    for step in range(steps):
        now += 1.0
        carry += per_s
        n, carry = int(carry), carry - int(carry)
        for _ in range(n):
            gone = online.pop(rng.randrange(len(online)))
            s.disconnect(gone, "s-" + gone, now)
            spare.append(gone)
            come = spare.pop(rng.randrange(len(spare)))
            s.connect(come, "s-" + come, "e", now)
            online.append(come)
        chunk = len(s.activity_chunk(now))
        if step >= refresh_s:  # steady state: the first round begins one interval in
            refreshed += chunk
        for e in s.outbox.drain():
            if isinstance(e, Activity):
                arrivals += e.live
                departures += not e.live
    secs = float(steps)
    return {
        "arrivals": arrivals / secs,
        "departures": departures / secs,
        "refresh": refreshed / (secs - refresh_s),
    }


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def _population(now: float, accounts: int, members: int) -> tuple[dict[str, float], list[str]]:
    """Scores over 30 days (a third of the accounts were here in the last 24 h, a tenth are live)
    and the members of the one server counted."""
    rng = random.Random(2)
    scores = {}
    for i in range(accounts):
        x = rng.random()
        scores[f"u{i}"] = (
            live_until(now, 600)
            if x < 0.1
            else now - rng.uniform(0, 86_400)
            if x < 0.33
            else now - rng.uniform(86_400, 30 * 86_400)
        )
    return scores, sorted(rng.sample(sorted(scores), members))


async def _fill(
    r: aioredis.Redis, pg_url: str, scores: dict[str, float], member_ids: list[str], now: float
) -> asyncpg.Connection:
    """The same population in Redis (the global set and the server's) and in PostgreSQL."""
    items = list(scores.items())
    pipe = r.pipeline(transaction=False)
    for i in range(0, len(items), 5_000):
        pipe.zadd("presence:active", dict(items[i : i + 5_000]))
    pipe.zadd("presence:active:g", {m: scores[m] for m in member_ids})
    await pipe.execute()
    conn = await asyncpg.connect(pg_url)
    await db.migrate(conn)
    await conn.execute(
        "INSERT INTO users (id, last_seen_at) "
        "SELECT u, to_timestamp(t) FROM unnest($1::text[], $2::float8[]) AS x(u, t)",
        [u for u, _ in items],
        [min(t, now) for _, t in items],
    )
    await conn.execute("INSERT INTO servers (id) VALUES ('g')")
    await conn.executemany(
        "INSERT INTO server_members (server_id, user_id) VALUES ('g', $1)", [(m,) for m in member_ids]
    )
    await conn.execute("ANALYZE")
    return conn


async def _count_once(
    r: aioredis.Redis, conn: asyncpg.Connection, count_script: Any, since: float, expected: int,
    out: dict[str, list[float]],
) -> None:  # fmt: skip
    """Each way of counting the server's members active since `since`, timed once."""
    t = time.perf_counter()
    ids = await db.server_member_ids(conn, "g")
    out["pg_members"].append(time.perf_counter() - t)
    t = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for i in range(0, len(ids), 1_000):
        pipe.zmscore("presence:active", ids[i : i + 1_000])
    got = sum(1 for chunk in await pipe.execute() for s in chunk if s is not None and s >= since)
    out["zmscore"].append(time.perf_counter() - t)
    assert got == expected, (got, expected)
    t = time.perf_counter()
    assert await count_script(keys=["presence:active"], args=[since, *ids]) == expected
    out["lua_zscore"].append(time.perf_counter() - t)
    t = time.perf_counter()
    assert await r.zcount("presence:active:g", since, "+inf") == expected
    out["per_server_zcount"].append(time.perf_counter() - t)
    t = time.perf_counter()
    await r.zcount("presence:active", since, "+inf")
    out["global_zcount"].append(time.perf_counter() - t)
    t = time.perf_counter()
    await conn.fetchval(
        "SELECT count(*) FROM server_members m JOIN users u ON u.id = m.user_id "
        "WHERE m.server_id = 'g' AND u.last_seen_at >= to_timestamp($1)",
        since,
    )
    out["pg_only"].append(time.perf_counter() - t)


async def count_times(
    pg_url: str, redis_url: str, accounts: int, members: int, runs: int
) -> dict[str, float]:
    now = time.time()
    scores, member_ids = _population(now, accounts, members)
    r = aioredis.Redis.from_url(redis_url)
    conn = await _fill(r, pg_url, scores, member_ids, now)
    since = window_start(now, 24)
    kinds = ("lua_zscore", "pg_members", "zmscore", "per_server_zcount", "global_zcount", "pg_only")
    out: dict[str, list[float]] = {k: [] for k in kinds}
    count_script = r.register_script(COUNT_LUA)  # type: ignore[no-untyped-call]
    expected = sum(1 for m in member_ids if scores[m] >= since)
    for _ in range(runs):
        await _count_once(r, conn, count_script, since, expected, out)
    await conn.close()
    await r.aclose()
    return {k: median_ms(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accounts", type=int, default=400_000)
    ap.add_argument("--members", type=int, default=10_000)
    ap.add_argument("--scale", type=float, default=0.1, help="share of the accounts simulated for writes")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--servers-per-account", type=float, default=5.0)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    started = time.perf_counter()
    sim = simulate_writes(round(args.accounts * args.scale), args.minutes, 600.0, 0.01)
    writes = {k: v / args.scale for k, v in sim.items()}
    total = sum(writes.values())
    print(
        f"writes/s at {args.accounts:,} accounts: arrivals {writes['arrivals']:.0f}, departures "
        f"{writes['departures']:.0f}, refresh {writes['refresh']:.0f}: total {total:.0f} "
        f"(per-server sets at {args.servers_per_account:g} servers an account: "
        f"{total * (1 + args.servers_per_account):.0f}) [{time.perf_counter() - started:.0f} s]"
    )
    with tempfile.TemporaryDirectory(prefix="active-store-") as d:
        pg, rd = EmbeddedPostgres(), EmbeddedRedis()
        try:
            pg_url = pg.start(Path(d))
            redis_url = rd.start(Path(d))
            times = asyncio.run(count_times(pg_url, redis_url, args.accounts, args.members, args.runs))
        finally:
            rd.stop()
            pg.stop()
    print(
        f"24 h count, {args.members:,}-member server among {args.accounts:,} accounts "
        f"(median of {args.runs}):"
    )
    for k, v in times.items():
        print(f"  {k:>18}: {v:8.2f} ms")
    print(f"  global set + members: {times['pg_members'] + times['zmscore']:.2f} ms")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
