"""The seed's Redis TTL presence design ("사용자 온라인/오프라인 상태 확인 시스템 설계: 순진한 폴링에서
Redis TTL까지", shared/seeds/004), ported faithfully so `bench query` can run it beside ours on the
same Redis, in the same run. A benchmark baseline, never product code: nothing in actors/, edge/
or cluster/ imports it.

The design, as the document shows it:

- every heartbeat: `SET presence:<id> 1 EX 30` (`mark_online`), one command per heartbeat, with
  redis-py's synchronous client, as its FastAPI handler does;
- "is this user online": `EXISTS presence:<id>` (`is_online`);
- many users at once: `are_online`, one pipeline of `EXISTS` per chunk of 500 ids, a single round
  trip for a friend list of 100;
- disconnect: `DEL presence:<id>` (`mark_offline`).

`PresenceService` below is the document's class, line for line (its `timedelta` TTL included).
`run_baseline` is the process `bench query` starts: it heartbeats every account every
`heartbeat_s` (spread evenly, one `mark_online` each, from one thread) and times `are_online` for
the same id lists, at the same rate, as our `presence.query` load (from another thread), for
the same window. Its latencies are measured around the Redis call inside the service process:
there is no HTTP hop or JSON in them, so they are a lower bound for that design as a client
would see it.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from typing import Any

import redis


class PresenceService:
    def __init__(self, redis_client: redis.Redis) -> None:
        self.redis = redis_client
        self.ttl = timedelta(seconds=30)

    def mark_online(self, user_id: str) -> None:
        self.redis.set(f"presence:{user_id}", "1", ex=self.ttl)

    def is_online(self, user_id: str) -> bool:
        return self.redis.exists(f"presence:{user_id}") == 1  # type: ignore[no-any-return]

    def mark_offline(self, user_id: str) -> None:
        self.redis.delete(f"presence:{user_id}")

    def are_online(self, user_ids: list[str], chunk_size: int = 500) -> dict[str, bool]:
        result = {}
        for i in range(0, len(user_ids), chunk_size):
            chunk = user_ids[i : i + chunk_size]
            pipe = self.redis.pipeline()
            for uid in chunk:
                pipe.exists(f"presence:{uid}")
            exists_flags = pipe.execute()
            result.update(dict(zip(chunk, map(bool, exists_flags), strict=True)))
        return result


def run_baseline(
    redis_url: str,
    accounts: list[str],
    queries: list[list[str]],
    start_at: float,
    seconds: float,
    query_rate: float,
    heartbeat_s: float,
    out: Connection,
) -> None:
    """Process entry: heartbeats and timed `are_online` calls from `start_at` (monotonic) for
    `seconds`; sends back latencies (seconds) and counts."""
    try:
        out.send(_run(redis_url, accounts, queries, start_at, seconds, query_rate, heartbeat_s))
    except Exception as e:  # the benchmark reports it rather than hanging
        out.send({"error": f"{type(e).__name__}: {e}"})


def _heartbeats(
    service: PresenceService, accounts: list[str], start_at: float, end: float, heartbeat_s: float,
    errors: list[str], sent: list[int],
) -> None:  # fmt: skip
    """Every account's heartbeat (`mark_online`) every `heartbeat_s`, spread evenly, from
    `start_at` to `end`; how many were sent goes to `sent`."""
    rate = len(accounts) / heartbeat_s
    k = 0
    time.sleep(max(0.0, start_at - time.monotonic()))
    t0 = time.monotonic()
    while time.monotonic() < end:
        due = int((time.monotonic() - t0) * rate) + 1
        while k < due:
            try:
                service.mark_online(accounts[k % len(accounts)])
            except redis.RedisError as e:
                errors.append(str(e))
            k += 1
        time.sleep(max(0.0, min(end, t0 + k / rate) - time.monotonic()))
    sent.append(k)


def _ask(
    service: PresenceService, queries: list[list[str]], start_at: float, end: float, query_rate: float,
    errors: list[str],
) -> dict[str, Any]:  # fmt: skip
    """`are_online` for the id lists in turn at `query_rate` from `start_at` to `end`, timed."""
    latencies: list[float] = []
    online = asked = k = 0
    time.sleep(max(0.0, start_at - time.monotonic()))
    t0 = time.monotonic()
    while time.monotonic() < end:
        due = int((time.monotonic() - t0) * query_rate) + 1
        while k < due:
            ids = queries[k % len(queries)]
            t = time.perf_counter()
            try:
                answer = service.are_online(ids)
            except redis.RedisError as e:
                errors.append(str(e))
            else:
                latencies.append(time.perf_counter() - t)
                online += sum(answer.values())
                asked += len(ids)
            k += 1
        time.sleep(max(0.0, min(end, t0 + k / query_rate) - time.monotonic()))
    return {"latencies": latencies, "ids_asked": asked, "ids_online": online}


def _run(
    redis_url: str,
    accounts: list[str],
    queries: list[list[str]],
    start_at: float,
    seconds: float,
    query_rate: float,
    heartbeat_s: float,
) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    service = PresenceService(client)
    # Everybody is connected before the window opens: each has sent a first heartbeat.
    pipe = client.pipeline(transaction=False)
    for uid in accounts:
        pipe.set(f"presence:{uid}", "1", ex=service.ttl)
    pipe.execute()
    end = start_at + seconds
    errors: list[str] = []
    sent: list[int] = []
    beats = threading.Thread(
        target=_heartbeats, args=(service, accounts, start_at, end, heartbeat_s, errors, sent), daemon=True
    )
    beats.start()
    asked = _ask(service, queries, start_at, end, query_rate, errors)
    beats.join(10)
    client.close()
    return {
        "latencies": asked["latencies"],
        "heartbeats": sent[0] if sent else 0,
        "ids_asked": asked["ids_asked"],
        "ids_online": asked["ids_online"],
        "errors": errors[:20],
        "error_count": len(errors),
    }
