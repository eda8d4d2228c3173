"""Cross-shard online counts in Redis: the only thing Redis is used for.

Idempotent structures, never counters: every key is a sorted set whose members are scored by the
time their owner last refreshed them, and every read counts only members refreshed within the
TTL. So a count cannot go negative, a crashed shard's members fall out of the count within the
TTL, and a wiped or restarted Redis is whole again after one refresh period.

    presence:online:<server>   member: account shown online, idle or dnd in that server
    presence:accounts          member: account shown online, idle or dnd (health page total)
    presence:sockets           member: <account>:<socket> (health page total)

When Redis is away presence keeps working: writes are dropped (the next refresh rewrites them)
and reads answer None.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

log = logging.getLogger("presence.counts")

ACCOUNTS_KEY = "presence:accounts"
SOCKETS_KEY = "presence:sockets"
CHUNK = 1_000


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
        self._queue: list[tuple[str, str, str, float | None]] = []  # (op, key, member, score)
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None

    def account(self, user_id: str, servers: Iterable[str], present: bool, now: float) -> None:
        for key in [ACCOUNTS_KEY, *(server_key(s) for s in servers)]:
            self._queue.append(("add" if present else "rem", key, user_id, now))
        self._kick()

    def socket(self, user_id: str, socket_id: str, alive: bool, now: float) -> None:
        self._queue.append(("add" if alive else "rem", SOCKETS_KEY, f"{user_id}:{socket_id}", now))
        self._kick()

    def _kick(self) -> None:
        if self.redis is None:
            self._queue.clear()
            return
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        await asyncio.sleep(0.02)  # gather a few milliseconds of changes into one pipeline
        batch, self._queue = self._queue, []
        if not batch or self.redis is None:
            return
        try:
            pipe = self.redis.pipeline(transaction=False)
            for op, key, member, score in batch:
                if op == "add":
                    pipe.zadd(key, {member: score or self.clock()})
                else:
                    pipe.zrem(key, member)
            await pipe.execute()
            self.healthy = True
        except (RedisError, OSError) as e:
            # Dropped on purpose: the next refresh rewrites every live member.
            self._note_failure(e)

    async def refresh(
        self, present: list[tuple[str, frozenset[str]]], sockets: list[tuple[str, str]]
    ) -> None:
        """Rewrite every member this shard owns with a fresh score; trim members past the TTL."""
        if self.redis is None:
            return
        now = self.clock()
        by_key: dict[str, dict[str, float]] = {ACCOUNTS_KEY: {}, SOCKETS_KEY: {}}
        for user_id, servers in present:
            by_key[ACCOUNTS_KEY][user_id] = now
            for s in servers:
                by_key.setdefault(server_key(s), {})[user_id] = now
        for user_id, socket_id in sockets:
            by_key[SOCKETS_KEY][f"{user_id}:{socket_id}"] = now
        try:
            pipe = self.redis.pipeline(transaction=False)
            for key, members in by_key.items():
                items = list(members.items())
                for i in range(0, len(items), CHUNK):
                    pipe.zadd(key, dict(items[i : i + CHUNK]))
                pipe.zremrangebyscore(key, "-inf", now - self.ttl_s)
            await pipe.execute()
            self.healthy = True
        except (RedisError, OSError) as e:
            self._note_failure(e)

    def _note_failure(self, e: BaseException) -> None:
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

    async def _count(self, key: str) -> int | None:
        if self.redis is None:
            return None
        try:
            return int(await self.redis.zcount(key, self.clock() - self.ttl_s, "+inf"))
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
