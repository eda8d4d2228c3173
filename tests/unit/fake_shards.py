"""A fake pool for the router (edge/router.py `Shards`): the Router receives it as it receives
`actors.clients.ShardClients` in an edge, so its unit tests run without Ray and patch nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from actors.core import ops
from actors.core.contract import ApplyReply, Mail, MailChunk, ShardStats
from actors.core.slots import SlotMap

NO_MAIL: MailChunk = (0, 0, [])
# Answers a batch: the shard's index and its operations → an answer per operation.
ApplyBatch = Callable[[int, list[ops.Op]], Awaitable[list[object]]]


class FakeShard:
    """One shard: `apply` answers each batch; its long-poll waits until the router closes it."""

    def __init__(self, index: int, apply: ApplyBatch) -> None:
        self.index = index
        self.apply = apply
        self.incarnation = "inc-1"
        self._closed = asyncio.Event()

    async def apply_and_collect(
        self, edge_id: str, batch: list[ops.Op], incarnation: str | None, acked_seq: int
    ) -> ApplyReply:
        return self.incarnation, await self.apply(self.index, batch), NO_MAIL

    async def pull(
        self, edge_id: str, incarnation: str | None, acked_seq: int, wait_s: float, resend: bool = False
    ) -> Mail:
        await self._closed.wait()
        raise ConnectionError("closed")

    async def stats(self, timeout_s: float) -> ShardStats:
        raise ConnectionError("a fake shard has no figures")

    def close_lane(self) -> None:
        self._closed.set()


class FakeShards:
    """The directory's map (`published`, flipped by the tests) and a `FakeShard` per index."""

    def __init__(self, count: int, apply: ApplyBatch) -> None:
        self.published = SlotMap.even(count)
        self.apply = apply
        self.made: dict[int, FakeShard] = {}

    async def get_map(self) -> tuple[int, tuple[int, ...], int]:
        m = self.published
        return m.version, m.owners, m.shard_count

    def shard(self, index: int) -> FakeShard:
        return self.made.setdefault(index, FakeShard(index, self.apply))

    def flip(self, owners: tuple[int, ...], count: int) -> None:
        self.published = SlotMap(self.published.version + 1, owners, count)
