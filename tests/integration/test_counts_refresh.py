"""A shard's periodic count refresh (actors/counts.py `OnlineCounts.refresh`) against a real Redis:
every member rewritten and stale ones trimmed, in slices that let the shard's loop run between
them (a refresh built and sent in one go held it for 57-100 ms)."""

from __future__ import annotations

import re

import pytest
import redis.asyncio as aioredis

from actors.counts import ACCOUNTS_KEY, ACTIVE_KEY, REFRESH_SLICE, SOCKETS_KEY, OnlineCounts, server_key

pytestmark = pytest.mark.integration

T = 1_900_000_000.0


def _own_database(url: str) -> str:
    """The session's Redis, database 9: this test trims keys other tests count on."""
    return re.sub(r"/\d*$", "", url) + "/9"


async def test_a_refresh_rewrites_every_member_trims_the_stale_and_yields_between_slices(
    redis_url: str,
) -> None:
    url = _own_database(redis_url)
    direct = aioredis.from_url(url)
    await direct.flushdb()
    await direct.zadd(ACCOUNTS_KEY, {"left-long-ago": T - 1_000})
    counts = OnlineCounts(url, ttl_s=90.0, clock=lambda: T)
    n = 3 * REFRESH_SLICE + 7
    present = [(f"u{i}", frozenset({f"srv{i % 3}", "all"})) for i in range(n)]
    sockets = [(f"u{i}", f"s{i}") for i in range(n)]

    assert counts.redis is not None
    pipelines = 0
    make_pipeline = counts.redis.pipeline

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal pipelines
        pipelines += 1
        return make_pipeline(*args, **kwargs)  # type: ignore[arg-type]

    counts.redis.pipeline = counted  # type: ignore[method-assign, assignment]
    await counts.refresh(present, sockets)

    assert await direct.zcard(ACCOUNTS_KEY) == n  # "left-long-ago" trimmed
    assert await direct.zcard(SOCKETS_KEY) == n
    assert await direct.zcard(server_key("all")) == n
    assert sum([await direct.zcard(server_key(f"srv{k}")) for k in range(3)]) == n
    scored = await direct.zrange(ACCOUNTS_KEY, 0, -1, withscores=True)
    assert {float(pair[1]) for pair in scored} == {T}
    # Four slices of members and one of trims, each awaited: the loop runs between them.
    assert pipelines == 5
    assert counts.healthy
    await direct.flushdb()
    await direct.aclose()
    await counts.close()


async def test_queued_writes_go_out_as_one_command_per_key_and_land_as_written(redis_url: str) -> None:
    """A storm of connects and a few departures: every member ends as the writes in order say,
    in one pipeline of one ZADD per key (plus the ZREMs), not one command per write."""
    url = _own_database(redis_url)
    direct = aioredis.from_url(url)
    await direct.flushdb()
    await direct.zadd(ACCOUNTS_KEY, {"gone": T - 5})
    await direct.zadd(ACTIVE_KEY, {"u0": T + 500})
    counts = OnlineCounts(url, ttl_s=90.0, clock=lambda: T)
    assert counts.redis is not None
    sent: list[int] = []
    make_pipeline = counts.redis.pipeline

    def counted(*args: object, **kwargs: object) -> object:
        pipe = make_pipeline(*args, **kwargs)  # type: ignore[arg-type]
        execute = pipe.execute

        async def execute_counted(*a: object, **k: object) -> object:
            sent.append(len(pipe.command_stack))
            return await execute(*a, **k)  # type: ignore[arg-type]

        pipe.execute = execute_counted  # type: ignore[method-assign, assignment]
        return pipe

    counts.redis.pipeline = counted  # type: ignore[method-assign, assignment]
    for i in range(200):
        counts.account(f"u{i}", ["srv"], True, T)
        counts.socket(f"u{i}", f"s{i}", True, T)
    counts.account("gone", [], False, T)
    counts.socket("u7", "s7", False, T)
    counts.active_history([("u0", T + 100), ("u1", T + 100)])  # raises u1 only
    assert counts._writer is not None
    await counts._writer

    assert sent == [6]  # ZADD accounts, the server, sockets; ZREM accounts, sockets; ZADD GT active
    assert await direct.zcard(ACCOUNTS_KEY) == 200
    assert await direct.zcard(server_key("srv")) == 200
    assert await direct.zcard(SOCKETS_KEY) == 199
    assert await direct.zscore(SOCKETS_KEY, "u7:s7") is None
    assert await direct.zscore(ACTIVE_KEY, "u0") == T + 500
    assert await direct.zscore(ACTIVE_KEY, "u1") == T + 100
    await direct.flushdb()
    await direct.aclose()
    await counts.close()
