"""A `ShardStore` in memory whose every call can be held at a gate the test opens, or made to
fail: the shard shell's ordering and failure rules, tested without PostgreSQL and without timing
(the idea of Ray Serve's `MockReplicaActorWrapper`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.store import AudienceEvents


class StoreDown(ConnectionError):
    """What the fake raises while `down`: the store is away."""


@dataclass
class Call:
    """One call to the store, waiting at its gate while the store is `held`."""

    kind: str  # relations, accounts, channel_servers, persist, ...
    args: tuple[object, ...]
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    fail: bool = False  # set before opening the gate: the call raises StoreDown

    def open(self, fail: bool = False) -> None:
        self.fail = fail
        self.gate.set()


class FakeStore:
    errors: tuple[type[BaseException], ...] = (StoreDown,)

    def __init__(
        self,
        accounts: dict[str, AccountRow] | None = None,
        relations: dict[str, Relations] | None = None,
        channels: dict[str, str | None] | None = None,
    ) -> None:
        # What the store holds.
        self.rows = dict(accounts or {})
        self.rels = dict(relations or {})
        self.channel_map = dict(channels or {})
        self.saved_chosen: dict[str, str] = {}
        self.saved_visibility: dict[str, str] = {}
        self.saved_at: dict[tuple[int, str], float] = {}
        self.held = False  # calls wait at their gate until the test opens it
        self.down = False  # calls fail at once
        self.calls: list[Call] = []  # every call, in order
        self.waiting: list[Call] = []  # held calls whose gate is still closed
        self._arrived = asyncio.Condition()
        self.events: AudienceEvents | None = None

    # -- driving it from a test

    async def next_held(self, kind: str | None = None, timeout_s: float = 5.0) -> Call:
        """The oldest held call (of `kind`) still waiting, once there is one."""

        def found() -> Call | None:
            return next((c for c in self.waiting if kind is None or c.kind == kind), None)

        async with asyncio.timeout(timeout_s), self._arrived:
            await self._arrived.wait_for(lambda: found() is not None)
        call = found()
        assert call is not None
        return call

    async def _enter(self, kind: str, *args: object) -> None:
        call = Call(kind, args)
        self.calls.append(call)
        if self.down:
            raise StoreDown(kind)
        if self.held:
            self.waiting.append(call)
            async with self._arrived:
                self._arrived.notify_all()
            try:
                await call.gate.wait()
            finally:
                self.waiting.remove(call)
            if call.fail:
                raise StoreDown(kind)

    def kinds(self) -> list[str]:
        return [c.kind for c in self.calls]

    # -- actors.store.ShardStore

    async def start(self, events: AudienceEvents) -> None:
        self.events = events

    async def stop(self) -> None:
        return None

    @asynccontextmanager
    async def loading(self) -> AsyncIterator[FakeStore]:
        yield self

    # actors.store.Loads (`loading` yields the store itself)

    async def relations(self, user_ids: list[str]) -> dict[str, Relations]:
        await self._enter("relations", tuple(user_ids))
        return {u: self.rels.get(u, Relations()) for u in user_ids}

    async def accounts(self, user_ids: list[str]) -> dict[str, AccountRow]:
        await self._enter("accounts", tuple(user_ids))
        for u in user_ids:
            self.rows.setdefault(u, AccountRow())
        return {u: self.rows[u] for u in user_ids}

    async def channel_servers(self, channel_ids: list[str]) -> dict[str, str | None]:
        await self._enter("channel_servers", tuple(channel_ids))
        return {c: self.channel_map.get(c) for c in channel_ids}

    async def read_accounts(self, user_ids: list[str]) -> dict[str, AccountRow]:
        await self._enter("read_accounts", tuple(user_ids))
        return {u: self.rows[u] for u in user_ids if u in self.rows}

    async def server_members(self, server_id: str) -> list[str]:
        await self._enter("server_members", server_id)
        return sorted(u for u, rel in self.rels.items() if server_id in rel.servers)

    async def last_seen_since(self, since: float) -> AsyncIterator[list[tuple[str, float]]]:
        await self._enter("last_seen_since", since)
        rows = [(u, r.last_seen_at) for u, r in self.rows.items() if r.last_seen_at is not None]
        yield [(u, t) for u, t in rows if t >= since]

    async def persist(
        self, chosen: list[tuple[str, str, float]], visibility: list[tuple[str, str, float]]
    ) -> None:
        await self._enter("persist", tuple(chosen), tuple(visibility))
        # Newest wins, as in PostgreSQL (actors/pgstore.py _save_setting).
        for store, items in ((self.saved_chosen, chosen), (self.saved_visibility, visibility)):
            for user_id, value, at in items:
                if self.saved_at.get((id(store), user_id), float("-inf")) < at:
                    store[user_id] = value
                    self.saved_at[(id(store), user_id)] = at

    async def healthy(self, timeout_s: float) -> bool:
        return not self.down
