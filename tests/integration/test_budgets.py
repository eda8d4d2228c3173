"""Per-account budgets through real edges (issue 14, "Abuse of the audience").

protocol.md ("Audience and privacy"): one account's rapid status changes reach its watchers as at
most 5 `presence.changed` frames per second, and the last state always arrives; ids newly watched
through `presence.subscribe` are charged like queried ids, past the budget the answer is
`rate_limited`, and budgets hold across reconnects and across edges. docs/protocol.md
("Budgets"): `typing.stop` does not reset the typing throttle; voice joins are budgeted; and
connections still opening are capped per client address.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import asyncpg
import pytest
import websockets
from websockets.asyncio.client import ClientConnection

from edge.server import Edge
from edge.session import Limits
from tests.timing import patience

from .conftest import Cluster, Ids, load, ws_url
from .hostile import shard_ops
from .test_presence_ws import connect, social
from .wsclient import Client, changed, eventually, of_type

pytestmark = pytest.mark.integration


class TimedClient(Client):
    """A client that also notes when each frame arrived."""

    def __init__(self, ws: ClientConnection) -> None:
        self.times: list[tuple[float, dict[str, Any]]] = []
        super().__init__(ws)

    def _received(self, frame: dict[str, Any]) -> None:
        self.times.append((time.monotonic(), frame))
        super()._received(frame)

    def changes_about(self, user: str) -> list[tuple[float, str]]:
        return [
            (t, f["status"])
            for t, f in self.times
            if f.get("type") == "presence.changed" and f.get("userId") == user
        ]


async def timed(cluster: Cluster, edge: Edge, user: str) -> TimedClient:
    c = await TimedClient.connect(ws_url(edge), cluster.token(user))
    assert isinstance(c, TimedClient)
    return c


def compact(frame: dict[str, Any]) -> str:
    return json.dumps(frame, separators=(",", ":"))


def most_in(times: list[float], window: float) -> int:
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        best = max(best, i - j + 1)
    return best


async def pair(conn: asyncpg.Connection, ids: Ids) -> tuple[str, str, str]:
    """Two accounts sharing a server (and its channel)."""
    a, b, c = ids("toggler"), ids("watcher"), ids("c")
    await load(
        conn,
        {"users": [{"id": a}, {"id": b}], "servers": [{"id": ids("g"), "members": [a, b], "channels": [c]}]},
    )
    return a, b, c


async def test_58_toggles_reach_a_watcher_as_at_most_5_frames_a_second_and_the_last_arrives(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    toggler, watcher, _ = await pair(conn, ids)
    w = await timed(cluster, second_edge, watcher)  # the watcher sits on another edge
    await w.request({"type": "presence.subscribe", "userIds": [toggler]}, of_type("presence.sync"))
    t = await timed(cluster, edge, toggler)
    await w.expect(lambda f: f.get("userId") == toggler and f.get("status") == "online")
    await asyncio.sleep(1.1)  # the connect's own publication leaves the window
    statuses = ["dnd" if i % 2 == 0 else "online" for i in range(57)] + ["dnd"]
    sent_at = time.monotonic()
    for status in statuses:  # 58 toggles, as fast as the socket sends them
        await t.send({"type": "presence.update", "status": status})
    await t.roundtrip()
    applied_at = time.monotonic()  # every toggle has been applied (frames are handled in order)
    assert not [f for f in t.log if f.get("type") == "error"], "within the socket's own rate limit"

    def settled() -> bool:
        got = w.changes_about(toggler)
        return bool(got) and got[-1][1] == "dnd" and got[-1][0] > sent_at

    await eventually(settled, timeout=5)
    # Past one window (and the tick) after the last toggle nothing more may come.
    await asyncio.sleep(max(0.0, applied_at + 1.6 - time.monotonic()))
    got = [(at, st) for at, st in w.changes_about(toggler) if at > sent_at]
    times = [at for at, _ in got]
    # The toggles take a while to pass the edge one by one (each waits for its shard); however
    # long, the watcher gets at most 5 frames in any second (0.1 s slack for delivery jitter).
    assert most_in(times, 0.9) <= 5, times
    assert len(got) <= 5 * (1 + int((applied_at - sent_at) / 1.05)) + 1, f"58 toggles became {len(got)}"
    assert got[-1][1] == "dnd", "the last state arrives"
    # ... promptly: within one window (1.05 s) of the last toggle, plus the shard's tick and delivery.
    assert times[-1] - applied_at < 1.05 + 0.45, (times, applied_at)
    # The account's own socket gets presence.self coalesced the same way, ending on the truth.
    selfs = [at for at, f in t.times if f.get("type") == "presence.self"]
    assert (
        most_in(selfs, 0.9) <= 5
        and [f for _, f in t.times if f.get("type") == "presence.self"][-1]["status"] == "dnd"
    )
    for c in (t, w):
        await c.close()


async def test_subscribe_churn_past_the_budget_is_rate_limited_across_reconnects_and_edges(
    cluster: Cluster, edge: Edge, second_edge: Edge, ids: Ids
) -> None:
    churner = ids("churner")
    targets = [ids(f"t{i}") for i in range(2_500)]  # 500 more than the burst: ~25 s of refill
    c = await Client.connect(ws_url(edge), cluster.token(churner))
    # One full per-socket cap at once always fits; the default budget holds two (2,000 ids).
    for chunk in (targets[:1_000], targets[1_000:2_000]):
        await c.send(compact({"type": "presence.subscribe", "userIds": chunk}))  # under 16 KiB
        await c.expect(of_type("presence.sync"), timeout=20)
        await c.send(compact({"type": "presence.unsubscribe", "userIds": chunk}))
    await c.roundtrip()
    assert not [f for f in c.log if f.get("type") == "error"]
    watched = await shard_ops("watch")
    more = targets[2_000:]
    err = await c.request({"type": "presence.subscribe", "userIds": more}, of_type("error"))
    assert err["code"] == "rate_limited"
    # A query's lookup leaves beside its charge; refused, its answers are thrown away (the churner
    # itself is in its own audience: an answer would be about it). The socket then waits for each
    # charge before looking anything up: nothing more is looked up at all.
    asked = [churner, *more[:99]]
    for discarded, looked_up in (("true", True), ("false", False)):
        queries = await shard_ops("query")
        # The session's edge counts for every module before this one (test_hostile's floods
        # refuse lookups too): this query's own refusal is the difference.
        key = ("edge_lookups_refused_total", (("discarded", discarded),))
        refused_before = edge.metrics.counters.get(key, 0)
        err = await c.request({"type": "presence.query", "userIds": asked}, of_type("error"))
        assert err["code"] == "rate_limited", "queries spend the same budget"
        assert edge.metrics.counters.get(key, 0) - refused_before == 1, edge.metrics.counters
        assert (await shard_ops("query") > queries) == looked_up  # one op per shard asked
    await c.roundtrip()
    assert not [f for f in c.log if f.get("type") == "presence.changed"], "a refused query answers nothing"
    await c.close()
    # A new socket, on this edge and on another one: the same account, the same budget.
    for e in (edge, second_edge):
        again = await Client.connect(ws_url(e), cluster.token(churner))
        err = await again.request({"type": "presence.subscribe", "userIds": more}, of_type("error"))
        assert err["code"] == "rate_limited"
        assert not [f for f in again.log if f.get("type") == "presence.sync"]
        await again.close()
    assert await shard_ops("watch") == watched, "nothing of a refused frame was looked up"
    # Somebody else is not affected.
    other = await Client.connect(ws_url(second_edge), cluster.token(ids("other")))
    await other.request({"type": "presence.subscribe", "userIds": more}, of_type("presence.sync"))
    await other.close()


async def test_typing_stop_start_pairs_do_not_defeat_the_throttle(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    typist, watcher, channel = await pair(conn, ids)
    w = await timed(cluster, second_edge, watcher)
    await w.request({"type": "channel.subscribe", "channelId": channel}, of_type("voice.roster"))
    t = await Client.connect(ws_url(edge), cluster.token(typist))
    for _ in range(10):
        await t.send({"type": "typing.start", "channelId": channel})
        await t.send({"type": "typing.stop", "channelId": channel})
    await t.close()  # and reconnecting buys nothing either: the throttle is the channel's shard's
    t = await Client.connect(ws_url(second_edge), cluster.token(typist))
    await t.send({"type": "typing.start", "channelId": channel})
    await t.roundtrip()
    await w.expect(of_type("typing"))
    await asyncio.sleep(0.3)  # anything more would have arrived by now
    typings = [f for _, f in w.times if f.get("type") == "typing"]
    assert len(typings) == 1, typings
    for c in (t, w):
        await c.close()


async def test_voice_churn_is_bounded_and_the_roster_stays_right(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    joiner, watcher, channel = await pair(conn, ids)
    w = await Client.connect(ws_url(edge), cluster.token(watcher))
    await w.request({"type": "channel.subscribe", "channelId": channel}, of_type("voice.roster"))
    refused = 0
    for e in (edge, second_edge):  # a second socket on another edge shares the budget
        j = await Client.connect(ws_url(e), cluster.token(joiner))
        for _ in range(8):
            await j.send({"type": "voice.join", "channelId": channel})
            await j.send({"type": "voice.leave"})
        await j.roundtrip()
        codes = [f["code"] for f in j.log if f.get("type") == "error"]
        assert set(codes) <= {"rate_limited"}
        refused += len(codes)
        await j.close()
    assert 5 <= refused <= 6, "16 joins against a burst of 10 (30 a minute come back)"

    # Every join that passed changed the roster twice (in, out); a refused one not at all, and
    # the watcher's last roster is the truth: nobody is in voice.
    def rosters() -> list[list[str]]:
        return [f["userIds"] for f in w.log if f.get("type") == "voice.roster"][1:]

    await eventually(lambda: len(rosters()) >= 2 * (16 - refused))
    # A window in which nothing more may arrive: its absence has no event.
    await asyncio.sleep(0.2)
    assert len(rosters()) == 2 * (16 - refused)
    assert rosters()[-1] == []
    await w.close()


@pytest.mark.parametrize("refusal", ["not_allowed", "rate_limited"])
async def test_a_refused_voice_join_leaves_the_joiner_in_the_roster_it_was_in(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids, refusal: str
) -> None:
    """protocol.md: `voice.join` joins C's roster "leaving any other"; a refused join joins
    nothing, so it leaves nothing either (a subscriber saw the joiner's roster emptied before)."""
    joiner, watcher, channel = await pair(conn, ids)
    other = ids("c-other")
    await load(conn, {"servers": [{"id": ids("g-other"), "members": [joiner], "channels": [other]}]})
    w = await Client.connect(ws_url(edge), cluster.token(watcher))
    await w.request({"type": "channel.subscribe", "channelId": channel}, of_type("voice.roster"))
    j = await Client.connect(ws_url(edge), cluster.token(joiner))
    await j.send({"type": "voice.join", "channelId": channel})
    await w.expect(lambda f: f.get("type") == "voice.roster" and f["userIds"] == [joiner])
    spender = await Client.connect(ws_url(edge), cluster.token(joiner))
    if refusal == "not_allowed":
        target = ids("c-not-a-member")
    else:  # the account's voice budget (shared by its sockets) spent by another socket of it
        target = other
        for _ in range(20):
            await spender.send({"type": "voice.join", "channelId": other})
            await spender.send({"type": "voice.leave"})
            await spender.roundtrip()
            if any(f.get("code") == "rate_limited" for f in spender.log if f.get("type") == "error"):
                break
        else:
            raise AssertionError("the voice budget was never spent")
    await j.send({"type": "voice.join", "channelId": target})
    await j.expect(lambda f: f.get("type") == "error" and f.get("code") == refusal)
    # A marker after the refusal: the watcher joins; the roster that says so lists both.
    await w.send({"type": "voice.join", "channelId": channel})
    await w.expect(lambda f: f.get("type") == "voice.roster" and watcher in f["userIds"])
    rosters = [f["userIds"] for f in w.log if f.get("type") == "voice.roster"]
    assert rosters == [[], [joiner], [joiner, watcher]]
    for c in (w, j, spender):
        await c.close()


async def test_connections_still_opening_are_capped_per_address(cluster: Cluster, ids: Ids) -> None:
    narrow = Edge(cluster.edge_config(limits=Limits(max_handshakes_per_ip=5)))
    await narrow.start()
    held: list[socket.socket] = []
    try:
        loop = asyncio.get_running_loop()
        for _ in range(5):  # half-open upgrades: a request line and nothing more
            s = socket.socket()
            s.setblocking(False)
            await loop.sock_connect(s, ("127.0.0.1", narrow.ws_port))
            await loop.sock_sendall(s, b"GET /ws/presence HTTP/1.1\r\n")
            held.append(s)
        await eventually(lambda: narrow.admission.handshakes.get("127.0.0.1") == 5)
        with pytest.raises((OSError, websockets.InvalidHandshake, TimeoutError, EOFError)):
            await Client.connect(ws_url(narrow), cluster.token(ids("late")))
        assert narrow.metrics.counters.get(("handshakes_refused_total", ()), 0) >= 1
        held.pop().close()
        await eventually(lambda: narrow.admission.handshakes.get("127.0.0.1") == 4)
        ok = await Client.connect(ws_url(narrow), cluster.token(ids("ok")))
        # Authenticated, it no longer counts as opening.
        assert narrow.admission.handshakes.get("127.0.0.1") == 4
        await ok.close()
    finally:
        for s in held:
            s.close()
        await narrow.stop()


async def test_idle_connections_from_a_few_addresses_do_not_keep_a_client_out(
    cluster: Cluster, ids: Ids
) -> None:
    """edge/opening.py's shares: two addresses hold every place of the gate with upgraded sockets
    that never identify (each under its own per-address cap); a client from a third address
    waits, the address holding more than its share gives up its oldest idle place, and the client
    opens. Before, it waited until it was dropped (or until the idle ones' identify timeout)."""
    gated = Edge(
        cluster.edge_config(
            limits=Limits(
                max_opening=4,
                opening_queue_s=8.0,
                opening_share_per_ip=1,
                opening_idle_evict_s=0.5,
                identify_timeout_s=60.0,
            )
        )
    )
    await gated.start()
    held: list[socket.socket] = []
    try:
        for address in ("127.0.1.1", "127.0.1.1", "127.0.1.2", "127.0.1.2"):
            held.append(await asyncio.to_thread(_upgraded_from, address, gated.ws_port))
        await eventually(lambda: len(gated.opening.active) == 4)
        started = time.monotonic()
        client = await Client.connect(ws_url(gated), cluster.token(ids("outsider-of-the-attack")))
        assert client.ready is not None and client.ready["type"] == "ready"
        assert time.monotonic() - started < 8.0, "opened before its wait in line ran out"
        assert gated.metrics.counters.get(("opening_evicted_total", ()), 0) >= 1
        await client.close()
    finally:
        for sock in held:
            sock.close()
        await gated.stop()


def _upgraded_from(address: str, port: int) -> socket.socket:
    """A connection from `address` past the upgrade (101 read), that then says nothing."""
    sock = socket.socket()
    sock.bind((address, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    sock.sendall(
        f"GET /ws/presence HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n".encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 101"), answer
    return sock


async def test_connections_past_the_opening_gate_wait_their_turn_then_open(
    cluster: Cluster, ids: Ids
) -> None:
    """edge/opening.py: at most `max_opening` connections opening at once on an edge; the next
    waits unread (no upgrade answer) until a place comes free, then opens normally; past the
    queue a connection is dropped at once."""
    gated = Edge(
        cluster.edge_config(limits=Limits(max_opening=2, max_opening_queued=1, opening_queue_s=30.0))
    )
    await gated.start()
    held: list[socket.socket] = []
    try:
        loop = asyncio.get_running_loop()
        for _ in range(2):  # half-open upgrades take both places
            s = socket.socket()
            s.setblocking(False)
            await loop.sock_connect(s, ("127.0.0.1", gated.ws_port))
            await loop.sock_sendall(s, b"GET /ws/presence HTTP/1.1\r\n")
            held.append(s)
        await eventually(lambda: len(gated.opening.active) == 2)
        waiting = asyncio.create_task(Client.connect(ws_url(gated), cluster.token(ids("waits"))))
        await eventually(lambda: len(gated.opening.waiting) == 1)
        # The queue (one place) is full: the next is dropped at accept.
        with pytest.raises((OSError, websockets.InvalidHandshake, TimeoutError, EOFError)):
            await Client.connect(ws_url(gated), cluster.token(ids("dropped")))
        assert gated.metrics.counters.get(("opening_refused_total", ()), 0) >= 1
        # A window in which nothing more may arrive: its absence has no event.
        await asyncio.sleep(0.2)
        assert not waiting.done(), "a waiting connection is not upgraded before its turn"
        held.pop().close()
        client = await asyncio.wait_for(waiting, patience(10))
        assert client.ready is not None and client.ready["type"] == "ready"
        # Authenticated, it left the gate: one half-open upgrade holds a place, nobody waits.
        await eventually(lambda: len(gated.opening.active) == 1 and not gated.opening.waiting)
        await client.close()
    finally:
        for s in held:
            s.close()
        await gated.stop()


async def test_subscribing_again_to_watched_ids_is_answered_by_the_edge_alone(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    """Only new ids are charged to the lookup budget; a frame naming ids the socket watches
    already was still looked up by their shards each time: 1,000 ids sent again 20 times a
    second from each of an account's 20 sockets, for free (against `presence up`, two sockets at
    19 frames a second: its four shards 0.6 of a core). The sync now is the socket's own view:
    the same answer, and nothing reaches a shard."""
    alice, bob, carol, _, eve = await social(conn, ids)
    watcher = await connect(cluster, edge, alice)
    b = await connect(cluster, edge, bob)
    subscribe = {"type": "presence.subscribe", "userIds": [bob, carol, eve]}
    first = await watcher.request(subscribe, of_type("presence.sync"))
    assert first["users"] == [{"userId": bob, "status": "online"}, {"userId": carol, "status": "offline"}]
    watches = await shard_ops("watch")
    again = await watcher.request(subscribe, of_type("presence.sync"))
    assert again == first, "the same answer; eve, outside alice's audience, is still not named"
    await b.send({"type": "presence.update", "status": "dnd"})
    await watcher.expect(changed(bob, "dnd"))
    third = await watcher.request({**subscribe, "userIds": [carol, bob]}, of_type("presence.sync"))
    assert third["users"] == [{"userId": carol, "status": "offline"}, {"userId": bob, "status": "dnd"}]
    assert await shard_ops("watch") == watches, "no shard was asked"
    await watcher.close()
    await b.close()
