"""Cross-shard online counts in Redis (the other thing kept there: held places, actors/held.py).

Idempotent structures, never counters: every key is a sorted set whose members are scored by the
time their owner last refreshed them, and every read counts only members refreshed within the
TTL. So a count cannot go negative, a crashed shard's members fall out of the count within the
TTL, and a wiped or restarted Redis is whole again after one refresh period.

    presence:online:<server>   member: account shown online, idle or dnd in that server
    presence:accounts          member: account shown online, idle or dnd (health page total)
    presence:sockets           member: <account>:<socket> (health page total)
    presence:active            member: account with a live socket now or in the last 720 h, scored
                               by when it left (ahead of now while live): actors/core/activity.py
    presence:active:mark:<shard>  set by each shard when it has written its live accounts; gone
                               after a wipe or an empty restart, so its absence means "write them
                               all again"
    presence:active:seeded     set by the one shard that filled `presence:active` with the
                               history PostgreSQL holds (stored last-seen) after such a wipe

When Redis is away presence keeps working: writes are dropped (the next refresh rewrites them)
and reads answer None.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from actors.core.count_writes import Write, coalesce

log = logging.getLogger("presence.counts")

ACCOUNTS_KEY = "presence:accounts"
SOCKETS_KEY = "presence:sockets"
ACTIVE_KEY = "presence:active"
ACTIVE_SEEDED_KEY = "presence:active:seeded"
# Accounts (and sockets) per pipeline of a refresh. A shard's whole refresh (5,000 accounts and
# their servers, built and encoded in one go) held its event loop for 57-100 ms every refresh
# period (measured), and every batch, pull and delivery of that shard waited behind it; a slice
# costs a few ms, and the loop runs between slices.
REFRESH_SLICE = 250
AMONG_CHUNK = 10_000
PIPELINE_MAX = 10_000
# How many of ARGV[2..] are scored at or after ARGV[1] in KEYS[1]: counted inside Redis, so a
# 10,000-member server costs one round trip and one integer back (bench/active_store.py).
COUNT_AMONG_LUA = """
local since = tonumber(ARGV[1])
local n = 0
for i = 2, #ARGV do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if s and tonumber(s) >= since then n = n + 1 end
end
return n
"""


def active_mark_key(shard: int) -> str:
    return f"presence:active:mark:{shard}"


def server_key(server_id: str) -> str:
    return f"presence:online:{server_id}"


def connect(url: str) -> aioredis.Redis:
    # Short timeouts: a Redis that hangs must cost a count, never a presence operation.
    return aioredis.Redis.from_url(
        url, socket_timeout=1.0, socket_connect_timeout=1.0, health_check_interval=10
    )


class OnlineCounts:
    """The shard side: queue membership changes, write them in pipelines, refresh periodically."""

    def __init__(self, url: str | None, ttl_s: float = 90.0, clock: Callable[[], float] = time.time) -> None:
        self.redis = connect(url) if url else None
        self.ttl_s = ttl_s
        self.clock = clock
        self.healthy = url is not None
        self._queue: list[Write] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        # Writes were dropped since the last `check_active`: live scores may have run out.
        self._active_lost = False

    def account(self, user_id: str, servers: Iterable[str], present: bool, now: float) -> None:
        for key in [ACCOUNTS_KEY, *(server_key(s) for s in servers)]:
            self._queue.append(Write("add" if present else "rem", key, user_id, now))
        self._kick()

    def socket(self, user_id: str, socket_id: str, alive: bool, now: float) -> None:
        self._queue.append(Write("add" if alive else "rem", SOCKETS_KEY, f"{user_id}:{socket_id}", now))
        self._kick()

    def active(self, entries: Iterable[tuple[str, float]]) -> None:
        """Active-count scores, written in the order given (after every change queued before)."""
        for user_id, score in entries:
            self._queue.append(Write("add", ACTIVE_KEY, user_id, score))
        self._kick()

    def active_history(self, entries: Iterable[tuple[str, float]]) -> None:
        """Stored last-seen values after a wipe: they only ever raise a score (ZADD GT), so a
        live account or a later departure written meanwhile is never moved back."""
        for user_id, score in entries:
            self._queue.append(Write("gt", ACTIVE_KEY, user_id, score))
        self._kick()

    async def check_active(self, shard: int, trim_before: float) -> tuple[bool, bool]:
        """Once a refresh period: trim the active set past the longest window, and tell whether
        this shard must write all its live accounts again (its mark is gone: Redis was wiped or
        restarted empty; or writes failed since the last check) and whether it is the one to
        refill the history from PostgreSQL. (False, False) when Redis is away."""
        if self.redis is None:
            return False, False
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.set(active_mark_key(shard), "1", nx=True)
            pipe.set(ACTIVE_SEEDED_KEY, "1", nx=True)
            pipe.zremrangebyscore(ACTIVE_KEY, "-inf", f"({trim_before}")
            mark_missing, seed, _ = await pipe.execute()
        except (RedisError, OSError) as e:
            self._note_failure(e)
            return False, False
        rewrite = bool(mark_missing) or self._active_lost
        self._active_lost = False
        return rewrite, bool(seed)

    async def forget_seeded(self) -> None:
        """Refilling failed (PostgreSQL away): let the next check try again."""
        if self.redis is not None:
            with contextlib.suppress(RedisError, OSError):
                await self.redis.delete(ACTIVE_SEEDED_KEY)

    def _kick(self) -> None:
        if self.redis is None:
            self._queue.clear()
            return
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        await asyncio.sleep(0.02)  # gather a few milliseconds of changes into one pipeline
        # Until the queue is empty: changes queued while a pipeline is under way are written
        # next, in order, by this same task (never left waiting for the next change).
        while self._queue and self.redis is not None:
            batch, self._queue = self._queue, []
            try:
                # One command per key and kind, not one per write (actors/core/count_writes.py).
                pipe = self.redis.pipeline(transaction=False)
                members = 0
                for command in coalesce(batch, PIPELINE_MAX):
                    if members >= PIPELINE_MAX:  # a refill may queue a month of accounts
                        await pipe.execute()
                        pipe = self.redis.pipeline(transaction=False)
                        members = 0
                    if command.kind == "rem":
                        pipe.zrem(command.key, *command.members)
                    else:
                        pipe.zadd(command.key, command.members, gt=command.kind == "gt")
                    members += len(command.members)
                await pipe.execute()
                self.healthy = True
            except (RedisError, OSError) as e:
                # Dropped on purpose: the next refresh rewrites every live member.
                self._note_failure(e)

    async def refresh(
        self, present: list[tuple[str, frozenset[str]]], sockets: list[tuple[str, str]]
    ) -> None:
        """Rewrite every member this shard owns with a fresh score; trim members past the TTL.
        In slices (`REFRESH_SLICE`): a reader meanwhile still counts the members not rewritten
        yet, as their previous scores are within the TTL."""
        if self.redis is None:
            return
        now = self.clock()
        touched = {ACCOUNTS_KEY, SOCKETS_KEY}
        try:
            for i in range(0, max(len(present), len(sockets)), REFRESH_SLICE):
                by_key: dict[str, dict[str, float]] = {}
                for user_id, servers in present[i : i + REFRESH_SLICE]:
                    by_key.setdefault(ACCOUNTS_KEY, {})[user_id] = now
                    for s in servers:
                        by_key.setdefault(server_key(s), {})[user_id] = now
                for user_id, socket_id in sockets[i : i + REFRESH_SLICE]:
                    by_key.setdefault(SOCKETS_KEY, {})[f"{user_id}:{socket_id}"] = now
                pipe = self.redis.pipeline(transaction=False)
                for key, members in by_key.items():
                    pipe.zadd(key, members)
                touched.update(by_key)
                await pipe.execute()
            keys = sorted(touched)
            for i in range(0, len(keys), REFRESH_SLICE):
                pipe = self.redis.pipeline(transaction=False)
                for key in keys[i : i + REFRESH_SLICE]:
                    pipe.zremrangebyscore(key, "-inf", now - self.ttl_s)
                await pipe.execute()
            self.healthy = True
        except (RedisError, OSError) as e:
            self._note_failure(e)

    def _note_failure(self, e: BaseException) -> None:
        self._active_lost = True
        if self.healthy:
            log.warning("Redis unavailable (%s); online counts unknown until it returns", type(e).__name__)
        self.healthy = False

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()


class CountReader:
    """The edge side: answer the internal API's count questions, None when Redis cannot."""

    def __init__(self, url: str | None, ttl_s: float = 90.0, clock: Callable[[], float] = time.time) -> None:
        self.redis = connect(url) if url else None
        self.ttl_s = ttl_s
        self.clock = clock
        # Loaded again by redis-py when Redis answers NOSCRIPT (after a wipe or a restart).
        self._count_among: Any = None
        if self.redis is not None:
            self._count_among = self.redis.register_script(COUNT_AMONG_LUA)  # type: ignore[no-untyped-call,unused-ignore]

    async def _count(self, key: str) -> int | None:
        if self.redis is None:
            return None
        try:
            return int(await self.redis.zcount(key, self.clock() - self.ttl_s, "+inf"))
        except (RedisError, OSError):
            return None

    async def active(self, since: float) -> int | None:
        """Accounts scored at or after `since` in the active set (actors/core/activity.py)."""
        if self.redis is None:
            return None
        try:
            return int(await self.redis.zcount(ACTIVE_KEY, since, "+inf"))
        except (RedisError, OSError):
            return None

    async def active_among(self, members: list[str], since: float) -> int | None:
        """The same, counting only `members` (a server's), inside Redis: one script call per
        10,000 members, each answering one integer (bench/RESULTS.md, "active counts")."""
        if self._count_among is None:
            return None
        try:
            if not members:  # still null, not 0, when Redis is away
                return 0 if await self._count_among(keys=[ACTIVE_KEY], args=[0]) == 0 else None
            total = 0
            for i in range(0, len(members), AMONG_CHUNK):
                chunk = members[i : i + AMONG_CHUNK]
                total += int(await self._count_among(keys=[ACTIVE_KEY], args=[since, *chunk]))
            return total
        except (RedisError, OSError):
            return None

    async def online_in_server(self, server_id: str) -> int | None:
        return await self._count(server_key(server_id))

    async def accounts_online(self) -> int | None:
        return await self._count(ACCOUNTS_KEY)

    async def sockets_online(self) -> int | None:
        return await self._count(SOCKETS_KEY)

    async def ping(self) -> bool:
        if self.redis is None:
            return False
        try:
            return bool(await self.redis.ping())
        except (RedisError, OSError):
            return False

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()
