"""Faults under load, checked on a recorded history (tests/integration/history.py).

Each test runs a small load (accounts connecting, subscribing, changing status, querying and
leaving, on two edges) against the real pool, injects one fault in the middle, lets the load
finish and the aging pass, and then checks the whole history: no ghost online accounts, every
departure's last-seen stored and never moved backwards, counts never negative and right once
quiet, and no invisible status, last-seen time or audience-private fact in any frame.

The mechanics of each fault are those of test_failures.py / test_outages.py (an edge process
killed with SIGKILL, a shard or the FlushActor killed through Ray, the embedded PostgreSQL and
Redis stopped and restarted); this module adds the load and the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
import websockets

from actors import clients
from actors.clients import DirectoryClient, ShardClient
from actors.core.slots import slot_of
from edge.server import Edge

from .conftest import SOCKET_TIMEOUT_S, Cluster, Ids, internal_url, load, ws_url
from .history import Graph, SocketLife, check, stale_views
from .recorder import (
    RecordedClient,
    Recorder,
    Sampler,
    answering,
    no_pending_last_seen,
    operator_view,
    read_count,
    read_last_seen,
)
from .test_failures import start_edge_process
from .wsclient import eventually, of_type

pytestmark = pytest.mark.integration

LOAD_S = 3.0  # load before the fault, and again after it
# A socket closed this long before its edge was killed may not have had its departure handed to
# the shards yet (the edge batches it; a loaded machine delays it): it may age out with the lease.
UNTOLD_S = 2.0


@dataclass
class World:
    graph: Graph
    server: str
    members: list[str]
    invisible: str
    outsider: str
    # Connected through the whole run, subscribed to everybody: its view is checked at the end.
    watcher: str


async def make_world(conn: asyncpg.Connection, ids: Ids, n: int = 8) -> World:
    """n members of one server (one invisible throughout, one `friends`, one `nobody`), a friend
    from outside the server, and an outsider who knows nobody."""
    members = [ids(f"m{i}") for i in range(n)]
    friend, outsider, watcher = ids("friend"), ids("outsider"), ids("watcher")
    server = ids("g")
    invisible = members[-1]
    visibility = {members[1]: "friends", members[2]: "nobody"}
    await load(
        conn,
        {
            "users": [{"id": u, "lastSeenVisibility": visibility.get(u, "everyone")} for u in members]
            + [{"id": friend}, {"id": outsider}, {"id": watcher}],
            "friendships": [[members[0], friend], [members[1], members[3]]] + [[watcher, u] for u in members],
            "servers": [{"id": server, "members": members, "channels": [ids("c")]}],
        },
    )
    # Invisible before anything of this run happens (no shard has loaded the account yet).
    await conn.execute("UPDATE users SET chosen_status = 'invisible' WHERE id = $1", invisible)
    graph = Graph(
        users=frozenset([*members, friend, outsider, watcher]),
        friends=frozenset(
            {frozenset((members[0], friend)), frozenset((members[1], members[3]))}
            | {frozenset((watcher, u)) for u in members}
        ),
        servers={server: frozenset(members)},
        visibility=visibility,
        invisible=frozenset({invisible}),
    )
    return World(graph, server, members, invisible, outsider, watcher)


@dataclass
class Load:
    """Accounts that connect, act and leave, over and over, on the edges they are given."""

    cluster: Cluster
    recorder: Recorder
    world: World
    urls: list[str]
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    live: dict[str, tuple[RecordedClient, str]] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    retired: set[str] = field(default_factory=set)
    connecting: dict[str, str] = field(default_factory=dict)  # user → edge url, while connecting
    # (client, edge url, when its close ended) of the sockets closed lately, newest last.
    closed: list[tuple[RecordedClient, str, float]] = field(default_factory=list)

    def start(self) -> None:
        others = self.world.graph.users - {*self.world.members, self.world.watcher}
        users = [*self.world.members, *sorted(others)]
        for i, user in enumerate(users):
            self.tasks.append(asyncio.create_task(self._worker(user, random.Random(i))))

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks)

    def on(self, url: str) -> list[RecordedClient]:
        return [c for c, u in self.live.values() if u == url]

    def told_upstream_maybe_not(self, url: str, now: float) -> list[RecordedClient]:
        """Sockets of that edge that are live, closing, or closed within `UNTOLD_S`: an edge killed
        now may not have handed their departures to the shards yet, which then age them out with
        its lease instead."""
        recent = [c for c, u, ended in self.closed if u == url and now - ended <= UNTOLD_S]
        return [*self.on(url), *recent]

    async def retire(self, n: int) -> list[str]:
        """Make `n` connected accounts leave for good now, so that their last departure is the one
        made around the fault (a later one would cover up a departure the fault lost)."""
        candidates = sorted({c.user for c, _ in self.live.values()} - self.retired - {self.world.invisible})
        chosen = candidates[:n]
        self.retired.update(chosen)
        await asyncio.gather(*(c.close() for c, _ in list(self.live.values()) if c.user in chosen))
        return chosen

    async def _worker(self, user: str, rng: random.Random) -> None:
        everyone = sorted(self.world.graph.users)
        while not self.stop.is_set() and user not in self.retired:
            url = rng.choice(self.urls)
            self.connecting[user] = url
            try:
                client = await self.recorder.connect(url, user, self.cluster.token(user), timeout=12)
            except (OSError, AssertionError, websockets.InvalidHandshake, TimeoutError) as e:
                self.errors.append(f"{user}: connect to {url}: {type(e).__name__}")
                # The load's pace: a moment before connecting again after a refused connect.
                await asyncio.sleep(0.3)
                continue
            finally:
                self.connecting.pop(user, None)
            self.live[client.name] = (client, url)
            try:
                await client.send({"type": "presence.subscribe", "userIds": rng.sample(everyone, 4)})
                for _ in range(rng.randint(2, 8)):
                    if self.stop.is_set() or client.close_code is not None or user in self.retired:
                        break
                    await client.send(self._frame(rng, everyone, user == self.world.invisible))
                    # The load's pace between an account's frames.
                    await asyncio.sleep(rng.uniform(0.05, 0.3))
            except websockets.ConnectionClosed:
                pass
            finally:
                await client.close()
                self.live.pop(client.name, None)
                self.closed.append((client, url, time.time()))
                del self.closed[:-200]

    @staticmethod
    def _frame(rng: random.Random, everyone: list[str], hidden: bool) -> dict[str, Any]:
        kind = rng.random()
        if kind < 0.4:
            # The invisible account stays invisible: it only idles (or says so again).
            choices = ["idle", "invisible"] if hidden else ["online", "dnd", "idle", "online"]
            return {"type": "presence.update", "status": rng.choice(choices)}
        if kind < 0.6:
            return {"type": "presence.query", "userIds": rng.sample(everyone, 3)}
        if kind < 0.7:
            return {"type": "presence.unsubscribe", "userIds": rng.sample(everyone, 2)}
        return {"type": "heartbeat"}


async def run_with_fault(
    cluster: Cluster,
    edges: list[Edge],
    conn: asyncpg.Connection,
    ids: Ids,
    fault: Callable[[Load], Awaitable[float]],
    extra_urls: list[str] | None = None,
) -> Recorder:
    """Load, `fault(load)` (returns how long the aging must wait after it), load, finish, check."""
    world = await make_world(conn, ids)
    recorder = Recorder(world.graph)
    users = sorted(world.graph.users)
    recorder.history.stored_before = await read_last_seen(cluster.database_url, users) or {}
    internal = internal_url(edges[0])
    load_ = Load(cluster, recorder, world, [ws_url(e) for e in edges] + (extra_urls or []))
    watcher = await recorder.connect(ws_url(edges[0]), world.watcher, cluster.token(world.watcher))
    recorder.history.watchers.add(watcher.name)
    others = [u for u in users if u != world.watcher]
    await watcher.request({"type": "presence.subscribe", "userIds": others}, of_type("presence.sync"))
    async with Sampler(recorder, cluster.database_url, internal, [world.server]):
        # The scenario's own time: load before the fault and after it, then the aging the fault
        # asked for (a dead edge's lease) on the real clock the shards age by.
        load_.start()
        await asyncio.sleep(LOAD_S)
        aging_until = time.monotonic() + await fault(load_)
        await asyncio.sleep(LOAD_S)
        await load_.finish()
        await asyncio.sleep(max(0.0, aging_until - time.monotonic()))
        h = recorder.history

        async def all_offline() -> bool:
            for u in users:
                view = await operator_view(internal, u)
                h.final_status[u], h.final_sockets[u] = view["status"], view["sockets"]
            return all(h.final_status[u] == "offline" and h.final_sockets[u] == 0 for u in users)

        async def watcher_converged() -> bool:
            # Everybody but the watcher is gone: it must show each of them offline, unprompted.
            h.final_status.update({u: "offline" for u in users if u != world.watcher})
            h.final_status[world.watcher] = "online"
            return not stale_views(h)

        with contextlib.suppress(AssertionError):  # the checker names what stayed stale
            await eventually(watcher_converged, timeout=10, interval=0.5)
        await watcher.close()
        with contextlib.suppress(AssertionError):  # the checker names the ghosts
            await eventually(all_offline, timeout=10, interval=0.5)
        # Longer than the FlushActor's retry backoff cap (30 s) plus its interval: a fault may
        # have pushed a batch into backoff, and a loaded machine stretches every step.
        await eventually(no_pending_last_seen, timeout=60, interval=0.3)
        h.stored_after = await read_last_seen(cluster.database_url, users) or {}
        with contextlib.suppress(AssertionError):
            await eventually(lambda: _count_is(internal, world.server, 0), timeout=10)
        h.quiet_counts[world.server] = (0, await read_count(internal, world.server))
    violations = check(h)
    assert not violations, "\n".join(violations[:30])
    opened = len(h.sockets)
    assert opened >= 3 * len(users), f"the load was too thin to mean anything ({opened} sockets)"
    return recorder


async def _count_is(internal: str, server: str, expected: int) -> bool:
    return await read_count(internal, server) == expected


# --------------------------------------------------------------------------- the faults


async def test_edge_killed_with_sigkill(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    proc, url = start_edge_process(cluster)

    async def kill(load: Load) -> float:
        await eventually(lambda: len(load.on(url)) >= 2, timeout=10)
        # No new sockets there, and none half-open: a connect in flight at the kill would be
        # registered upstream without its client knowing, and depart at the lease's end unseen.
        load.urls.remove(url)
        await eventually(lambda: url not in load.connecting.values(), timeout=15)
        at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        # Its sockets go when the edge's lease on the shards runs out: within the socket timeout
        # of its last renewal (at most 1 s before the kill here), never before the kill.
        killed = load.told_upstream_maybe_not(url, at)
        load.recorder.killed(killed, at, at + SOCKET_TIMEOUT_S + 1.0)
        load.retired.update(c.user for c in killed)  # their last departure is the edge's death
        load.recorder.fault("edge SIGKILL")
        proc.wait(10)
        return SOCKET_TIMEOUT_S + 2.0

    try:
        await run_with_fault(cluster, [edge], conn, ids, kill, extra_urls=[url])
    finally:
        if proc.poll() is None:
            proc.kill()


async def test_presence_actor_killed_under_load(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    async def kill(load: Load) -> float:
        _, owners, _ = await DirectoryClient().get_map()
        shard = owners[slot_of(load.world.members[0])]
        await load.retire(2)  # departures still on their way to PostgreSQL when the shard dies
        load.recorder.fault(f"shard {shard} killed")
        ShardClient(shard).kill(restart=True)
        await load.retire(2)  # departures while the shard restarts
        return 0.0

    await run_with_fault(cluster, [edge, second_edge], conn, ids, kill)


async def test_flush_actor_killed_with_departures_pending(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    async def kill(load: Load) -> float:
        for _ in range(2):
            await load.retire(1)
            load.recorder.fault("FlushActor killed")
            clients.FlushClient().kill(restart=True)
            await load.retire(1)
            # Back before the next kill.
            await eventually(lambda: answering(lambda: clients.flush_stats(5)), timeout=30, interval=0.2)
        return 0.0

    await run_with_fault(cluster, [edge, second_edge], conn, ids, kill)


async def test_postgres_restarted_mid_flush(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    pg, _ = cluster.require_servers()

    async def restart(load: Load) -> float:
        load.recorder.fault("PostgreSQL restart")
        restarting = asyncio.create_task(asyncio.to_thread(pg.restart))
        await load.retire(2)  # departures while PostgreSQL goes and comes back
        await restarting
        return 0.0

    await run_with_fault(cluster, [edge, second_edge], conn, ids, restart)


async def test_redis_wiped_and_restarted(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    _, redis = cluster.require_servers()

    async def restart(load: Load) -> float:
        load.recorder.fault("Redis wiped and restarted")
        restarting = asyncio.create_task(asyncio.to_thread(redis.restart))  # no persistence: empty
        await load.retire(2)
        await restarting
        return 0.0

    await run_with_fault(cluster, [edge, second_edge], conn, ids, restart)


async def storm(
    cluster: Cluster, conn: asyncpg.Connection, ids: Ids, edge: Edge, accounts: int, per_account: int
) -> None:
    """`accounts * per_account` sockets connect as fast as they can to an edge process of their
    own, then all drop at once (no close frame); recorded watchers see it all."""
    members = [ids(f"s{i}") for i in range(accounts)]
    server = ids("storm")
    await load(conn, {"servers": [{"id": server, "members": members, "channels": []}]})
    watchers = members[:3]
    graph = Graph(users=frozenset(members), servers={server: frozenset(members)})
    recorder = Recorder(graph)
    h = recorder.history
    h.stored_before = await read_last_seen(cluster.database_url, members) or {}
    # Every storm socket comes from 127.0.0.1: let one address open them all at once.
    per_address = str(accounts * per_account + 100)
    proc, url = start_edge_process(
        cluster,
        {
            "PRESENCE_MAX_SOCKETS_PER_IP": per_address,
            "PRESENCE_MAX_HANDSHAKES_PER_IP": per_address,
            "PRESENCE_ACCEPTS_PER_IP_BURST": per_address,
        },
    )
    try:
        watching = [await recorder.connect(ws_url(edge), u, cluster.token(u)) for u in watchers]
        for w in watching:
            await w.send({"type": "presence.subscribe", "userIds": members[:1000]})
        tokens = {u: cluster.token(u) for u in members}

        async def dial() -> Any:
            # As the client libraries do: a connection the edge's opening gate dropped (its line
            # waited past `opening_queue_s` on a loaded machine: no answer, EOF) is tried again.
            for attempt in range(20):
                try:
                    return await websockets.connect(url, open_timeout=60, max_queue=None)
                except (OSError, EOFError, websockets.exceptions.InvalidHandshake):
                    if attempt == 19:
                        raise
                    # The clients' backoff between tries (a dropped connection has no event).
                    await asyncio.sleep(0.2 + 0.1 * attempt)
            raise AssertionError("unreachable")

        async def one(user: str, k: int) -> tuple[str, Any]:
            ws = await dial()
            await ws.send(f'{{"type":"identify","token":"{tokens[user]}"}}')
            while True:  # ready, then maybe presence.self of the account's other sockets
                frame = await asyncio.wait_for(ws.recv(), 60)
                if '"ready"' in frame:
                    break
            name = f"{user}#storm{k}"
            h.sockets[name] = SocketLife(user, time.time())
            return name, ws

        started = time.monotonic()
        sockets = await asyncio.gather(*(one(u, k) for k in range(per_account) for u in members))
        took = time.monotonic() - started
        recorder.fault(f"storm: {len(sockets)} sockets in {took:.1f} s")
        async with Sampler(recorder, cluster.database_url, internal_url(edge), [server], interval=0.5):
            await eventually(lambda: _count_is(internal_url(edge), server, accounts), timeout=30)
            h.quiet_counts[server] = (accounts, await read_count(internal_url(edge), server))
            dropped = time.time()
            for name, ws in sockets:
                h.sockets[name].gone_after = dropped
                ws.transport.abort()
            for name, _ in sockets:
                h.sockets[name].gone_before = time.time() + 5.0  # the edge notices within moments
            # The watchers are members too, and still here.
            await eventually(lambda: _count_is(internal_url(edge), server, len(watchers)), timeout=30)
            # Every watcher saw the storm go (and no frame of it was dropped on the way).
            others = set(members) - set(watchers)
            for w in watching:
                await eventually(lambda w=w: _offline(w) >= others, timeout=30)
            for w in watching:
                await w.close()
            await eventually(lambda: _count_is(internal_url(edge), server, 0), timeout=10)

            async def all_offline() -> bool:
                views = await asyncio.gather(*(operator_view(internal_url(edge), u) for u in members))
                for u, view in zip(members, views, strict=True):
                    h.final_status[u], h.final_sockets[u] = view["status"], view["sockets"]
                return all(v["status"] == "offline" and v["sockets"] == 0 for v in views)

            with contextlib.suppress(AssertionError):
                await eventually(all_offline, timeout=20, interval=1.0)
            # Longer than the FlushActor's retry backoff cap (30 s) plus its interval.
            await eventually(no_pending_last_seen, timeout=60, interval=0.3)
            h.stored_after = await read_last_seen(cluster.database_url, members) or {}
        violations = check(h)
        assert not violations, "\n".join(violations[:30])
    finally:
        proc.kill()
        proc.wait(10)


def _offline(w: RecordedClient) -> set[str]:
    return {
        f["userId"] for f in w.log if f.get("type") == "presence.changed" and f.get("status") == "offline"
    }


async def test_connection_storm(cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids) -> None:
    await storm(cluster, conn, ids, edge, accounts=1_000, per_account=2)


@pytest.mark.slow
async def test_connection_storm_large(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    await storm(cluster, conn, ids, edge, accounts=2_000, per_account=4)
