"""The designs users would otherwise pick for last-seen, ported faithfully so benchmarks can run them
beside ours on the same PostgreSQL and Redis (design.md, "Baselines for benchmarks").

1. `WriteThrough`: `UPDATE users SET last_seen = now() WHERE id = $1` on every heartbeat, one
   autocommitted statement each.
2. `CoarseRedisBatched`: the seed document's coarse + Redis + batched design ("Tracking last-seen
   timestamps at scale"), a line-by-line port of its TypeScript: a per-node coarsening map
   (10 min), `ZADD lastseen:ts` + `SADD lastseen:dirty` in one MULTI on a coarse touch and on the
   last disconnect, and a flusher doing `SPOP dirty 1000`, `ZMSCORE`, one
   `UPDATE … FROM unnest … GREATEST` per batch, every 30 s or at once after a full batch.

These are benchmark baselines, never product code: nothing in actors/, edge/ or cluster/ imports
them. Both run on a virtual clock passed in by the caller (`now_ms`), as the benchmark compresses
time; everything they send to PostgreSQL and Redis is real and counted.

Redis client. The seed uses node-redis, which pipelines the commands issued in one event-loop tick
onto one connection ("auto-pipelining"): the touches of many sockets handled in the same tick go
out in one write, each still its own MULTI … EXEC transaction. `RespClient` below does exactly
that, and only that, with the Redis wire protocol (RESP2): `send` queues a command, `flush` writes
everything queued and reads the replies in order. redis-py would send the same commands, but costs
about 50 µs of Python per command on this machine, which would make the client, not the design,
the thing measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import unquote, urlsplit

import asyncpg

# -------------------------------------------------------------------------------------- Redis


class RedisReplyError(RuntimeError):
    """Redis answered a command with an error reply."""


class _Incomplete(Exception):
    pass


RespValue = bytes | int | None | list["RespValue"] | RedisReplyError


def _parse(buf: bytes, pos: int) -> tuple[RespValue, int]:
    """One RESP2 reply from `buf` at `pos`; raises _Incomplete when more bytes are needed."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    if kind == 43:  # '+' simple string
        return buf[pos + 1 : end], end + 2
    if kind == 58:  # ':' integer
        return int(buf[pos + 1 : end]), end + 2
    if kind == 45:  # '-' error
        return RedisReplyError(buf[pos + 1 : end].decode(errors="replace")), end + 2
    n = int(buf[pos + 1 : end])
    pos = end + 2
    if kind == 36:  # '$' bulk string
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            raise _Incomplete
        return buf[pos : pos + n], pos + n + 2
    if kind == 42:  # '*' array
        if n < 0:
            return None, pos
        items: list[RespValue] = []
        for _ in range(n):
            item, pos = _parse(buf, pos)
            items.append(item)
        return items, pos
    raise RedisReplyError(f"unexpected RESP type byte {chr(kind)!r}")


def _encode(args: Sequence[bytes | str | int | float]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        if isinstance(arg, bytes):
            data = arg
        elif isinstance(arg, str):
            data = arg.encode()
        elif isinstance(arg, float) and arg.is_integer():
            data = b"%d" % int(arg)
        else:
            data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


class RespClient:
    """One connection to Redis; commands are queued with `send` and pipelined by `flush`.

    Counts every command it sends (`commands`) and every network write (`round_trips`).
    """

    def __init__(self) -> None:
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._queued: list[bytes] = []
        self._buf = b""
        self.commands = 0
        self.round_trips = 0

    async def connect(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "redis":
            raise ValueError(f"only redis:// URLs are supported by the benchmark client, got {url!r}")
        self._reader, self._writer = await asyncio.open_connection(
            parts.hostname or "127.0.0.1", parts.port or 6379
        )
        if parts.password is not None:
            auth = (
                [unquote(parts.username), unquote(parts.password)]
                if parts.username
                else [unquote(parts.password)]
            )
            await self.call("AUTH", *auth)
        db = parts.path.lstrip("/")
        if db and db != "0":
            await self.call("SELECT", db)
        self.commands = self.round_trips = 0

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
            self._writer = self._reader = None

    def send(self, *args: bytes | str | int | float) -> None:
        self._queued.append(_encode(args))

    async def flush(self) -> list[RespValue]:
        """Write every queued command at once; return their replies in order."""
        if not self._queued:
            return []
        assert self._reader is not None and self._writer is not None
        n = len(self._queued)
        self._writer.write(b"".join(self._queued))
        self._queued.clear()
        self.commands += n
        self.round_trips += 1
        await self._writer.drain()
        replies: list[RespValue] = []
        buf, pos = self._buf, 0
        while len(replies) < n:
            try:
                reply, pos = _parse(buf, pos)
            except _Incomplete:
                chunk = await self._reader.read(1 << 20)
                if not chunk:
                    raise ConnectionError("Redis closed the connection") from None
                buf, pos = buf[pos:] + chunk, 0
                continue
            replies.append(reply)
        self._buf = buf[pos:]
        return replies

    async def call(self, *args: bytes | str | int | float) -> RespValue:
        self.send(*args)
        (reply,) = await self.flush()
        if isinstance(reply, RedisReplyError):
            raise reply
        return reply

    async def command_calls(self) -> dict[str, int]:
        """Calls per command since the server started (`INFO commandstats`), lower-case names."""
        info = await self.call("INFO", "commandstats")
        assert isinstance(info, bytes)
        out: dict[str, int] = {}
        for line in info.decode().splitlines():
            if line.startswith("cmdstat_"):
                name, _, fields = line[len("cmdstat_") :].partition(":")
                for item in fields.split(","):
                    key, _, value = item.partition("=")
                    if key == "calls":
                        out[name.lower()] = int(value)
        return out


# -------------------------------------------------------------------------------------- shared


@dataclass
class PgCounts:
    """What a design sent to PostgreSQL, counted on the client."""

    statements: int = 0
    rows_sent: int = 0  # rows in the statements' parameters
    rows_updated: int = 0  # from the command tags ("UPDATE 998")
    exec_seconds: float = 0.0  # wall-clock time spent waiting for statements


def _tag_rows(status: str) -> int:
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


# -------------------------------------------------------------------------------------- 1. write-through

WRITE_THROUGH_SQL = "UPDATE users SET last_seen = now() WHERE id = $1"
WRITE_THROUGH_TABLE = "CREATE TABLE users (id text PRIMARY KEY, last_seen timestamptz)"


class WriteThrough:
    """Every heartbeat is one autocommitted `UPDATE … WHERE id = $1`, spread over a small pool
    (as a web tier would: each request handler runs its own statement)."""

    def __init__(self, pool: asyncpg.Pool, concurrency: int) -> None:
        self.pool = pool
        self.concurrency = concurrency
        self.counts = PgCounts()

    async def heartbeats(self, user_ids: Sequence[str]) -> None:
        """Write through every heartbeat of one simulated second; returns when all committed."""
        if not user_ids:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()

        async def worker(chunk: Sequence[str]) -> int:
            rows = 0
            async with self.pool.acquire() as conn:
                for uid in chunk:
                    rows += _tag_rows(await conn.execute(WRITE_THROUGH_SQL, uid))
            return rows

        k = min(self.concurrency, len(user_ids))
        rows = await asyncio.gather(*(worker(user_ids[i::k]) for i in range(k)))
        self.counts.statements += len(user_ids)
        self.counts.rows_sent += len(user_ids)
        self.counts.rows_updated += sum(rows)
        self.counts.exec_seconds += loop.time() - started


# -------------------------------------------------------------------------------------- 3. the seed's design

COARSE_INTERVAL_MS = 10 * 60 * 1000  # record activity at most every 10 min per user
FLUSH_INTERVAL_MS = 30_000
FLUSH_BATCH = 1_000
SEED_TABLE = "CREATE TABLE users (id text PRIMARY KEY, last_seen timestamptz)"
# The seed's flush statement, verbatim (its column is `last_seen`).
SEED_FLUSH_SQL = (
    "UPDATE users u SET last_seen = GREATEST(u.last_seen, v.ts) "
    "FROM unnest($1::text[], $2::timestamptz[]) AS v(id, ts) WHERE u.id = v.id"
)


@dataclass
class SeedCounts:
    pg: PgCounts = field(default_factory=PgCounts)
    redis_transactions: int = 0  # MULTI … EXEC blocks (touches and offlines recorded)
    coarse_skips: int = 0  # heartbeats the coarsening map answered locally
    flush_passes: int = 0  # SPOP calls


class CoarseRedisBatched:
    """The seed's `touch`, `onUserOffline` and `flushLoop`, on a virtual clock.

    `touch` and `on_user_offline` queue their MULTI on the Redis connection exactly where the seed
    awaits it; `send()` is the end of the event-loop tick that writes them out. `flush_due(now_ms)`
    runs the flusher's iterations that are due by `now_ms`: SPOP; ZMSCORE and one UPDATE if it got
    ids; then at once again after a full batch, else after 30 s.

    `dirty_key`/`seen_key` default to the seed's names; a benchmark on a shared Redis prefixes them.
    """

    def __init__(
        self,
        redis: RespClient,
        db: asyncpg.Connection,
        *,
        seen_key: str = "lastseen:ts",
        dirty_key: str = "lastseen:dirty",
        coarse_interval_ms: int = COARSE_INTERVAL_MS,
        flush_interval_ms: int = FLUSH_INTERVAL_MS,
        flush_batch: int = FLUSH_BATCH,
    ) -> None:
        self.redis = redis
        self.db = db
        self.seen_key = seen_key
        self.dirty_key = dirty_key
        self.coarse_interval_ms = coarse_interval_ms
        self.flush_interval_ms = flush_interval_ms
        self.flush_batch = flush_batch
        self.last_recorded: dict[str, int] = {}  # per node, per user
        self.next_flush_ms: int | None = None  # the flusher starts at once
        self.counts = SeedCounts()

    # Called on heartbeats and messages. Cheap: one local check, rarely a Redis write.
    def touch(self, user_id: str, now_ms: int) -> None:
        prev = self.last_recorded.get(user_id, 0)
        if now_ms - prev < self.coarse_interval_ms:
            self.counts.coarse_skips += 1
            return  # coarse: skip until the interval passes
        self.last_recorded[user_id] = now_ms
        self._record(user_id, now_ms)

    # Called when the user's LAST connection closes: the value that actually gets displayed.
    def on_user_offline(self, user_id: str, now_ms: int) -> None:
        self.last_recorded.pop(user_id, None)
        self._record(user_id, now_ms)

    def _record(self, user_id: str, now_ms: int) -> None:
        r = self.redis
        r.send("MULTI")
        r.send("ZADD", self.seen_key, now_ms, user_id)
        r.send("SADD", self.dirty_key, user_id)
        r.send("EXEC")
        self.counts.redis_transactions += 1

    async def send(self) -> None:
        """Write out the transactions queued in this tick and check that every one committed."""
        replies = await self.redis.flush()
        for reply in replies[3::4]:  # the EXEC replies
            if not isinstance(reply, list) or any(isinstance(x, RedisReplyError) for x in reply):
                raise RedisReplyError(f"a last-seen MULTI failed: {reply!r}")

    # Background flusher: move dirty users to the database in bulk.
    async def flush_due(self, now_ms: int) -> None:
        if self.next_flush_ms is None:
            self.next_flush_ms = now_ms
        while self.next_flush_ms <= now_ms:
            n = await self._flush_once()
            self.next_flush_ms = now_ms if n == self.flush_batch else now_ms + self.flush_interval_ms

    async def drain(self) -> None:
        """Run the flusher until the dirty set is empty (the benchmark's shutdown)."""
        while await self._flush_once():
            pass

    async def _flush_once(self) -> int:
        ids_reply = await self.redis.call(
            "SPOP", self.dirty_key, self.flush_batch
        )  # atomically claim a batch
        self.counts.flush_passes += 1
        assert isinstance(ids_reply, list)
        ids = [i.decode() for i in ids_reply if isinstance(i, bytes)]
        if ids:
            scores = await self.redis.call("ZMSCORE", self.seen_key, *ids)
            assert isinstance(scores, list)
            rows: list[tuple[str, datetime]] = []
            for uid, score in zip(ids, scores, strict=True):
                ms = float(score) if isinstance(score, bytes) else math.nan
                if not math.isnan(ms):  # .filter(([, d]) => !isNaN(+d))
                    rows.append((uid, datetime.fromtimestamp(ms / 1000, tz=UTC)))
            # One statement for the whole batch; GREATEST keeps a newer DB value from being overwritten.
            loop = asyncio.get_running_loop()
            started = loop.time()
            status = await self.db.execute(SEED_FLUSH_SQL, [r[0] for r in rows], [r[1] for r in rows])
            pg = self.counts.pg
            pg.exec_seconds += loop.time() - started
            pg.statements += 1
            pg.rows_sent += len(rows)
            pg.rows_updated += _tag_rows(status)
        return len(ids)
