"""The edge's road to the shards: batched operations up, batched events down.

Operations are queued per shard and leave as one Ray call when the batch is `window_ms` old or
`max_ops` long, whichever comes first: one call per frame would cap the edge at a few thousand
frames a second. Events come back through one long-poll per shard (`pull`), at-least-once with
sequence numbers. A shard that answers with a new incarnation has restarted and lost its memory;
the router tells the server, which registers its live sockets there again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from actors.core import ops
from actors.core.backoff import Backoff, retry
from actors.core.contract import PULL_BATCH
from actors.core.slots import SlotMap, channel_key
from actors.metrics import Metrics
from actors.ray_api import DirectoryClient, Mail, ShardClient

log = logging.getLogger("presence.router")

Deliver = Callable[[tuple[str, ...], str], None]
OnRestart = Callable[[int], Awaitable[None]]

# A failed pull is retried within at most a second: a restarted shard is noticed (and registered
# again) within about a second of coming back, which the watchers' resync counts on. Jittered, so
# that the edges do not all call the new incarnation in the same instant.
PULL_RETRY = Backoff(first_s=0.2, cap_s=1.0)


class Router:
    def __init__(
        self,
        edge_id: str,
        deliver: Deliver,
        on_restart: OnRestart,
        metrics: Metrics,
        window_ms: float = 2.0,
        max_ops: int = 500,
        pull_wait_s: float = 5.0,
        pull_gather_ms: float = 0.0,
    ) -> None:
        self.edge_id = edge_id
        self.deliver = deliver
        self.on_restart = on_restart
        self.metrics = metrics
        self.window_s = window_ms / 1000
        self.max_ops = max_ops
        self.pull_wait_s = pull_wait_s
        self.pull_gather_s = pull_gather_ms / 1000
        self.directory = DirectoryClient()
        self.map: SlotMap | None = None
        self.shards: dict[int, ShardClient] = {}
        self.incarnations: dict[int, str] = {}
        self.last_contact: dict[int, float] = {}
        self._pending: dict[int, list[tuple[ops.Op, asyncio.Future[Any]]]] = {}
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._pullers: dict[int, asyncio.Task[None]] = {}
        self._closed = False

    async def start(self) -> None:
        await self.refresh_map()
        # One round trip to every shard: learns their incarnations, takes their leases and
        # makes /healthz true as soon as the edge can really reach its actors.
        await asyncio.gather(*(self.call(i, ops.PING) for i in self.shards))

    async def refresh_map(self) -> None:
        version, owners, count = await self.directory.get_map()
        if self.map is not None and self.map.version == version:
            return
        self.map = SlotMap(version, tuple(owners), count)
        for i in range(count):
            self.shards.setdefault(i, ShardClient(i))
            puller = self._pullers.get(i)
            # A shard index may come back after a shrink retired it (its puller has ended).
            if puller is None or puller.done():
                self._pullers[i] = asyncio.create_task(self._pull_loop(i))
                if self.incarnations:  # a shard added by a resize: take its lease at once
                    self.call(i, ops.PING).add_done_callback(lambda f: f.exception())

    async def close(self) -> None:
        self._closed = True
        for t in self._pullers.values():
            t.cancel()
        for timer in self._timers.values():
            timer.cancel()

    # ------------------------------------------------------------------ addressing

    def shard_of_user(self, user_id: str) -> int:
        assert self.map is not None
        return self.map.shard_of(user_id)

    def shard_of_channel(self, channel_id: str) -> int:
        assert self.map is not None
        return self.map.shard_of(channel_key(channel_id))

    async def wait_for_map_after(self, version: int, deadline: float) -> bool:
        """Wait until the directory publishes a map newer than `version` (a slot flip)."""
        while time.monotonic() < deadline:
            await self.refresh_map()
            assert self.map is not None
            if self.map.version != version:
                return True
            await asyncio.sleep(0.01)
        return False

    def healthy(self, max_silence_s: float = 15.0) -> bool:
        """Every shard answered a pull recently."""
        if self.map is None:
            return False
        now = time.monotonic()
        return all(now - self.last_contact.get(i, 0.0) < max_silence_s for i in range(self.map.shard_count))

    # ------------------------------------------------------------------ operations, batched

    def call(self, shard: int, op: ops.Op) -> asyncio.Future[Any]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        queue = self._pending.setdefault(shard, [])
        queue.append((op, fut))
        if len(queue) >= self.max_ops:
            self._send_now(shard)
        elif shard not in self._timers:
            self._timers[shard] = loop.call_later(self.window_s, self._send_now, shard)
        return fut

    def _send_now(self, shard: int) -> None:
        timer = self._timers.pop(shard, None)
        if timer is not None:
            timer.cancel()
        batch = self._pending.pop(shard, [])
        if batch:
            asyncio.get_running_loop().create_task(self._send(shard, batch))

    async def _send(self, shard: int, batch: list[tuple[ops.Op, asyncio.Future[Any]]]) -> None:
        started = time.perf_counter()
        self.metrics.observe("edge_batch_ops", len(batch))
        try:
            incarnation, results = await self.shards[shard].apply(self.edge_id, [op for op, _ in batch])
        except Exception as e:
            self.metrics.inc("edge_call_errors_total", shard=str(shard))
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        self.metrics.observe("edge_actor_call_seconds", time.perf_counter() - started)
        self.last_contact[shard] = time.monotonic()
        for (_, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)
        await self._check_incarnation(shard, incarnation)

    async def _check_incarnation(self, shard: int, incarnation: str) -> None:
        known = self.incarnations.get(shard)
        self.incarnations[shard] = incarnation
        if known is not None and known != incarnation:
            log.warning(
                "shard %d restarted (incarnation %s → %s); registering sockets again",
                shard,
                known,
                incarnation,
            )
            self.metrics.inc("edge_shard_restarts_total", shard=str(shard))
            await self.on_restart(shard)

    # ------------------------------------------------------------------ events, long-polled

    async def _still_alive(self, shard: int) -> bool:
        try:
            await self.shards[shard].stats(timeout_s=2.0)
        except Exception:
            return False
        return True

    async def _pull_loop(self, shard: int) -> None:
        acked = 0
        seen: str | None = None  # the incarnation our `acked` counts in

        async def pull() -> Mail | None:
            """The next mail, or None once there is none to collect any more."""
            if self._closed:
                return None
            if self.map is not None and shard >= self.map.shard_count and not await self._still_alive(shard):
                return None  # retired by a shrink, its mail all collected
            return await self.shards[shard].pull(self.edge_id, seen, acked, self.pull_wait_s)

        def failed(e: BaseException, wait: float) -> None:
            log.info("pull from shard %d failed (%s); retrying", shard, type(e).__name__)

        while True:
            pulled = await retry(pull, PULL_RETRY, on_retry=failed)
            if pulled is None:
                return
            incarnation, last, items = pulled
            self.last_contact[shard] = time.monotonic()
            seen, acked = incarnation, last
            if items:
                started = time.perf_counter()
                for socket_ids, payload in items:
                    self.deliver(socket_ids, payload)
                self.metrics.observe("edge_delivery_seconds", time.perf_counter() - started)
            self.metrics.observe("edge_pull_items", len(items))
            await self._check_incarnation(shard, incarnation)
            if 0 < len(items) < PULL_BATCH and self.pull_gather_s > 0:
                await asyncio.sleep(self.pull_gather_s)  # the next call carries more; a backlog goes at once
