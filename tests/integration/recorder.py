"""Records a `history.History` around `wsclient.Client`: every frame sent and received, with times,
and the window of every socket's departure; plus readers of what PostgreSQL, the online counts
and the operator view hold."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
import websockets

from actors.pgstore import PostgresStore

from .conftest import internal_request
from .history import CountSample, Event, Graph, History, SocketLife
from .wsclient import Client, Frame


class RecordedClient(Client):
    """A `Client` whose every received frame also lands in the history."""

    def __init__(self, ws: Any, recorder: Recorder, name: str, user: str) -> None:
        self.recorder, self.name, self.user = recorder, name, user
        super().__init__(ws)

    def _received(self, frame: Frame) -> None:
        self.recorder.history.events.append(Event(time.time(), self.name, self.user, "recv", frame))
        super()._received(frame)

    def _ended(self) -> None:
        events = self.recorder.history.events
        events.append(Event(time.time(), self.name, self.user, "closed", code=self.close_code))
        life = self.recorder.history.sockets.get(self.name)
        if life is not None and life.gone_before is None:
            # Closed by the server (or the connection broke): it went before now.
            life.gone_before = time.time()
            if life.gone_after is None:
                life.gone_after = self.recorder.last_word.get(self.name, life.opened_at)

    async def send(self, frame: Frame | str | bytes) -> None:
        parsed = frame if isinstance(frame, dict) else accepted(frame)
        self.recorder.last_word[self.name] = time.time()
        self.recorder.history.events.append(Event(time.time(), self.name, self.user, "send", parsed))
        await super().send(frame)

    async def close(self) -> None:
        life = self.recorder.history.sockets.get(self.name)
        if life is not None and life.gone_after is None:
            life.gone_after = time.time()
        with contextlib.suppress(TimeoutError, websockets.ConnectionClosed, OSError):
            await super().close()
        if life is not None and life.gone_before is None:
            life.gone_before = time.time()

    def abort(self) -> None:
        """Drop the connection without a close frame (the edge sees the TCP connection go)."""
        life = self.recorder.history.sockets.get(self.name)
        if life is not None and life.gone_after is None:
            life.gone_after = time.time()
        transport = self.ws.transport
        if transport is not None:
            transport.abort()


class Recorder:
    def __init__(self, graph: Graph, **history: Any) -> None:
        self.history = History(graph, **history)
        self.last_word: dict[str, float] = {}
        self._names = itertools.count()

    async def connect(self, url: str, user: str, token: str, timeout: float = 15) -> RecordedClient:
        name = f"{user}#{next(self._names)}"
        ws = await websockets.connect(url, open_timeout=timeout)
        client = RecordedClient(ws, self, name, user)
        await client.send({"type": "identify", "token": token})
        client.ready = await client.expect(lambda f: f.get("type") == "ready", timeout=timeout)
        self.history.sockets[name] = SocketLife(user, opened_at=time.time())
        return client

    def killed(self, clients: list[RecordedClient], at: float, by: float) -> None:
        """These sockets' edge died at `at`; their departures are stamped by `by` at the latest (a
        socket whose close began earlier keeps that beginning: the edge may have told it)."""
        for c in clients:
            life = self.history.sockets[c.name]
            life.gone_after = at if life.gone_after is None else min(life.gone_after, at)
            life.gone_before = by

    def fault(self, name: str) -> None:
        self.history.faults.append((time.time(), name))


# --------------------------------------------------------------------------- readers


async def read_last_seen(url: str, users: list[str]) -> dict[str, float] | None:
    """last_seen_at per account (NULL left out), or None while PostgreSQL is away."""
    try:
        conn = await asyncpg.connect(url, timeout=2)
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return None
    try:
        rows = await conn.fetch("SELECT id, last_seen_at FROM users WHERE id = ANY($1::text[])", users)
    except PostgresStore.errors:  # what the shards count as PostgreSQL away, restarts included
        return None
    finally:
        await conn.close()
    return {r["id"]: r["last_seen_at"].timestamp() for r in rows if r["last_seen_at"] is not None}


async def answering(call: Callable[[], Awaitable[object]]) -> bool:
    """Whether `call()` (one call to an actor) reaches a live incarnation: an actor Ray restarts
    is unavailable for a moment, then runs calls again, even if only to raise (a shard that cannot
    start while PostgreSQL is away says so from inside)."""
    import ray

    from actors import clients

    try:
        await call()
    except ray.exceptions.RayTaskError:
        return True
    except (TimeoutError, *clients.ActorDied):
        return False
    return True


@dataclass(frozen=True)
class Pending:
    """The departures not yet in PostgreSQL: per shard, and in the FlushActor. True when there are
    none; its repr is what a failed wait prints (`eventually`'s last value), so that the failure
    says where they wait and what the FlushActor last did."""

    in_shards: list[int]
    flush_pending_rows: int
    flush_in_flight_rows: int
    flush_consecutive_failures: int

    def __bool__(self) -> bool:
        return not any(self.in_shards) and not self.flush_pending_rows and not self.flush_in_flight_rows


async def no_pending_last_seen() -> Pending:
    """No departure waits in a shard or in the FlushActor: every last-seen is in PostgreSQL."""
    from actors import clients

    _, _, count = await clients.DirectoryClient().get_map()
    in_shards = [(await clients.ShardClient(i).stats(timeout_s=5)).pending_last_seen for i in range(count)]
    flush = await clients.flush_stats(5)
    return Pending(in_shards, flush["pending_rows"], flush["in_flight_rows"], flush["consecutive_failures"])


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(internal_request(url), timeout=3) as r:
        return json.loads(r.read())


async def read_count(internal: str, server: str) -> int | None:
    answer = await asyncio.to_thread(
        _get_json, f"{internal}/api/v1/internal/presence/online?serverId={server}"
    )
    value = answer["online"]
    return None if value is None else int(value)


async def operator_view(internal: str, user: str) -> dict[str, Any]:
    return await asyncio.to_thread(_get_json, f"{internal}/api/v1/internal/presence/users/{user}")  # type: ignore[no-any-return]


class Sampler:
    """Reads PostgreSQL's last-seen and the online counts every `interval` while a run goes on."""

    def __init__(
        self, recorder: Recorder, database_url: str, internal: str, servers: list[str], interval: float = 0.3
    ) -> None:
        self.recorder, self.database_url, self.internal = recorder, database_url, internal
        self.servers, self.interval = servers, interval
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Sampler:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        h = self.recorder.history
        users = sorted(h.graph.users)
        while True:
            values = await read_last_seen(self.database_url, users)
            if values is not None:
                h.stored_samples.append((time.time(), values))
            for server in self.servers:
                with contextlib.suppress(OSError):  # the edge answering may be the one a fault took away
                    h.counts.append(CountSample(time.time(), server, await read_count(self.internal, server)))
            # The sampling interval.
            await asyncio.sleep(self.interval)


def accepted(raw: str | bytes) -> Frame | None:
    """A raw frame as the edge reads it: its JSON when the edge's parser accepts it (text or
    binary), else None. A valid query sent raw is still a query, and its answers carry lastSeenAt."""
    from edge.protocol import FrameError, parse_client_frame

    try:
        parse_client_frame(raw)
        value = json.loads(raw)
    except (FrameError, ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None
