"""The core presence rules through real websockets, real edges, a real Ray pool, PostgreSQL and Redis."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
import websockets

from edge.server import Edge
from tests.timing import patience

from .conftest import Cluster, Ids, internal_url, load, ws_url
from .recorder import operator_view
from .wsclient import Client, changed, eventually, of_type

pytestmark = pytest.mark.integration


async def social(conn: asyncpg.Connection, ids: Ids) -> tuple[str, str, str, str, str]:
    """alice, bob and carol share a server; alice and dave are friends; eve knows nobody."""
    alice, bob, carol, dave, eve = (ids(n) for n in ("alice", "bob", "carol", "dave", "eve"))
    await load(
        conn,
        {
            "users": [{"id": u} for u in (alice, bob, carol, dave, eve)],
            "friendships": [[alice, dave]],
            "servers": [{"id": ids("g"), "members": [alice, bob, carol], "channels": [ids("c")]}],
        },
    )
    return alice, bob, carol, dave, eve


async def connect(cluster: Cluster, edge: Edge, user: str, via: str = "identify") -> Client:
    return await Client.connect(ws_url(edge), cluster.token(user), via=via)


async def test_ready_by_identify_and_by_header(cluster: Cluster, edge: Edge, ids: Ids) -> None:
    for via in ("identify", "header"):
        c = await connect(cluster, edge, ids("u"), via=via)
        assert c.ready is not None
        assert c.ready["userId"] == ids("u")
        assert c.ready["socketId"].startswith("s-")
        assert c.ready["status"] == "online"
        assert c.ready["heartbeatIntervalMs"] == 30_000
        await c.close()


@pytest.mark.parametrize("token", ["not-a-token", "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0."])
async def test_bad_tokens_close_4001(edge: Edge, token: str) -> None:
    ws = await websockets.connect(ws_url(edge))
    await ws.send(f'{{"type": "identify", "token": "{token}"}}')
    with pytest.raises(websockets.ConnectionClosed):
        await asyncio.wait_for(ws.recv(), patience(5))
    assert ws.close_code == 4001


async def test_other_key_and_expired_tokens_close_4001(cluster: Cluster, edge: Edge) -> None:
    from edge.tokens import mint_token

    for token in (mint_token("x", "another-secret"), cluster.token("x", ttl_s=-10)):
        ws = await websockets.connect(ws_url(edge), additional_headers={"Authorization": f"Bearer {token}"})
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), patience(5))
        assert ws.close_code == 4001


async def test_no_identify_in_time_closes_4001(cluster: Cluster) -> None:
    from edge.session import Limits

    e = Edge(cluster.edge_config(limits=Limits(identify_timeout_s=1.0)))
    await e.start()
    try:
        ws = await websockets.connect(ws_url(e))
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), patience(5))
        assert ws.close_code == 4001
    finally:
        await e.stop()


async def test_heartbeat_ack_and_bad_frames_keep_the_socket(cluster: Cluster, edge: Edge, ids: Ids) -> None:
    c = await connect(cluster, edge, ids("u"))
    for junk in (
        "{not json",
        '{"type": "no.such"}',
        '{"type": "presence.update", "status": "sleepy"}',
        '{"type": "heartbeat", "extra": 1}',
        '{"type": "presence.subscribe", "userIds": [""]}',
    ):
        await c.send(junk)
        err = await c.expect(of_type("error"))
        assert err["code"] == "bad_frame", err
    await c.roundtrip()
    await c.close()


async def test_subscriber_sees_online_idle_dnd_offline(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, *_ = await social(conn, ids)
    a = await connect(cluster, edge, alice)
    sync = await a.request({"type": "presence.subscribe", "userIds": [bob]}, of_type("presence.sync"))
    assert sync["users"] == [{"userId": bob, "status": "offline"}]
    b = await connect(cluster, edge, bob)
    await a.expect(changed(bob, "online"))
    await b.send({"type": "presence.update", "status": "idle"})
    await a.expect(changed(bob, "idle"))
    await b.send({"type": "presence.update", "status": "dnd"})
    await a.expect(changed(bob, "dnd"))
    await b.expect(lambda f: f == {"type": "presence.self", "status": "dnd"})
    await b.close()
    await a.expect(changed(bob, "offline"))
    await a.close()


async def test_account_offline_only_when_its_last_socket_goes(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, *_ = await social(conn, ids)
    a = await connect(cluster, edge, alice)
    await a.request({"type": "presence.subscribe", "userIds": [bob]}, of_type("presence.sync"))
    b1 = await connect(cluster, edge, bob)
    b2 = await connect(cluster, second_edge, bob)  # the same account on another edge
    await a.expect(changed(bob, "online"))
    await b1.close()
    await eventually(lambda: _shard_counts_sockets(edge, bob, 1))  # its shard removed b1
    # A marker on the same road as a wrong "offline" would take (bob's shard, then a's edge, in
    # order): once it is here, anything said about b1's departure is here too.
    await b2.send({"type": "presence.update", "status": "dnd"})
    await a.expect(changed(bob, "dnd"))
    assert [f["status"] for f in a.about(bob) if f["type"] == "presence.changed"] == ["online", "dnd"]
    await b2.close()
    await a.expect(changed(bob, "offline"))
    await a.close()


async def _shard_counts_sockets(e: Edge, user: str, n: int) -> bool:
    return (await operator_view(internal_url(e), user))["sockets"] == n


async def test_change_on_one_edge_reaches_subscriber_on_another(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, *_ = await social(conn, ids)
    a = await connect(cluster, edge, alice)
    await a.request({"type": "presence.subscribe", "userIds": [bob]}, of_type("presence.sync"))
    b = await connect(cluster, second_edge, bob)
    await a.expect(changed(bob, "online"))
    await b.send({"type": "presence.update", "status": "dnd"})
    await a.expect(changed(bob, "dnd"))
    await b.close()
    await a.expect(changed(bob, "offline"))
    await a.close()


async def test_idle_only_when_every_socket_is_idle(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, *_ = await social(conn, ids)
    a = await connect(cluster, edge, alice)
    await a.request({"type": "presence.subscribe", "userIds": [bob]}, of_type("presence.sync"))
    b1 = await connect(cluster, edge, bob)
    b2 = await connect(cluster, edge, bob)
    await a.expect(changed(bob, "online"))
    await b1.send({"type": "presence.update", "status": "idle"})
    await b1.roundtrip()
    await b2.send({"type": "presence.update", "status": "idle"})
    await a.expect(changed(bob, "idle"))
    await b1.expect(lambda f: f == {"type": "presence.self", "status": "idle"})
    await b2.send({"type": "presence.update", "status": "online"})
    await a.expect(changed(bob, "online"))
    assert [f["status"] for f in a.about(bob) if f["type"] == "presence.changed"] == [
        "online",
        "idle",
        "online",
    ]
    for c in (a, b1, b2):
        await c.close()


async def test_invisible_is_durable_and_never_leaks(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, *_ = await social(conn, ids)
    a = await connect(cluster, edge, alice)
    await a.request({"type": "presence.subscribe", "userIds": [bob]}, of_type("presence.sync"))
    b = await connect(cluster, edge, bob)
    await a.expect(changed(bob, "online"))
    await b.send({"type": "presence.update", "status": "invisible"})
    await a.expect(changed(bob, "offline"))
    await b.expect(lambda f: f == {"type": "presence.self", "status": "invisible"})

    # Saved soon after the acknowledgement (asynchronously): wait for the value itself.
    async def saved() -> bool:
        return await conn.fetchval("SELECT chosen_status FROM users WHERE id = $1", bob) == "invisible"

    await eventually(saved, timeout=5)
    await b.close()
    # Reconnecting while invisible: the account's own socket sees the truth, nobody else a flash.
    b2 = await connect(cluster, edge, bob)
    assert b2.ready is not None and b2.ready["status"] == "invisible"
    await b2.roundtrip()
    await a.roundtrip()
    query = await a.request({"type": "presence.query", "userIds": [bob]}, lambda f: f.get("userId") == bob)
    assert query["status"] == "offline"
    assert all(f.get("status") != "invisible" for f in a.log), a.log
    assert [f["status"] for f in a.about(bob) if f["type"] == "presence.changed"] == [
        "online",
        "offline",
        "offline",
    ]
    await b2.send({"type": "presence.update", "status": "online"})
    await a.expect(changed(bob, "online"))
    await a.close()
    await b2.close()


async def test_outsiders_get_silence_and_no_errors(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    alice, bob, _, _, eve = await social(conn, ids)
    b = await connect(cluster, edge, bob)
    e = await connect(cluster, edge, eve)
    sync = await e.request({"type": "presence.subscribe", "userIds": [bob, alice]}, of_type("presence.sync"))
    assert sync["users"] == []
    await e.send({"type": "presence.query", "userIds": [bob, alice, ids("nobody")]})
    await b.send({"type": "presence.update", "status": "dnd"})
    await b.roundtrip()
    await e.roundtrip()
    # A window for a wrong frame: no marker can reach an outsider on the same road.
    await asyncio.sleep(0.3)
    assert [f for f in e.log if f["type"] not in ("ready", "heartbeat.ack", "presence.sync")] == []
    await b.close()
    await e.close()


async def test_subscription_cap_and_query_cap(cluster: Cluster, edge: Edge, ids: Ids) -> None:
    c = await connect(cluster, edge, ids("u"))
    err = await c.request(
        {"type": "presence.query", "userIds": [f"x{i}" for i in range(101)]}, of_type("error")
    )
    assert err["code"] == "too_many_ids"
    many = [f"x{i}" for i in range(1001)]
    err = await c.request({"type": "presence.subscribe", "userIds": many}, of_type("error"))
    assert err["code"] == "too_many_ids"
    await c.request({"type": "presence.subscribe", "userIds": many[:1000]}, of_type("presence.sync"))
    err = await c.request({"type": "presence.subscribe", "userIds": ["one-more"]}, of_type("error"))
    assert err["code"] == "too_many_ids"
    await c.close()


async def test_new_friendship_takes_effect_for_existing_subscription(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    _, _, carol, _, eve = await social(conn, ids)
    e = await connect(cluster, edge, eve)
    sync = await e.request({"type": "presence.subscribe", "userIds": [carol]}, of_type("presence.sync"))
    assert sync["users"] == []
    c = await connect(cluster, edge, carol)
    await c.roundtrip()
    await load(conn, {"friendships": [[eve, carol]]})
    # Already online when the audience widened: eve is told without asking.
    await e.expect(changed(carol, "online"), timeout=10)
    await c.send({"type": "presence.update", "status": "dnd"})
    await e.expect(changed(carol, "dnd"))
    await load(conn, {"removedFriendships": [[eve, carol]]})
    await eventually(lambda: _query_is_silent(e, carol), timeout=10)
    await c.send({"type": "presence.update", "status": "online"})
    await c.roundtrip()
    # A window for a wrong frame: no marker can reach an outsider on the same road.
    await asyncio.sleep(0.3)
    assert not [f for f in e.frames if f.get("userId") == carol], e.frames
    await c.close()
    await e.close()


async def test_an_account_removed_from_a_server_leaves_its_voice_rosters(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    """A voice roster names members only: after bob is removed from the server, a subscriber's
    roster no longer names him, a fresh subscribe does not, and his going tells nobody anything
    (before, the roster kept him and announced his disconnect to every subscriber)."""
    alice, bob, carol, *_ = await social(conn, ids)
    channel = ids("c")
    a = await connect(cluster, edge, alice)
    await a.request({"type": "channel.subscribe", "channelId": channel}, of_type("voice.roster"))
    b = await connect(cluster, edge, bob)
    await b.send({"type": "voice.join", "channelId": channel})
    await a.expect(lambda f: f.get("type") == "voice.roster" and f["userIds"] == [bob])
    await load(conn, {"servers": [{"id": ids("g"), "members": [alice, carol], "channels": [channel]}]})
    await a.expect(lambda f: f.get("type") == "voice.roster" and f["userIds"] == [], timeout=10)
    c = await connect(cluster, edge, carol)
    fresh = await c.request({"type": "channel.subscribe", "channelId": channel}, of_type("voice.roster"))
    assert fresh["userIds"] == []
    await b.close()
    # A marker after bob's departure on the same road: carol joins; nothing came in between.
    await c.send({"type": "voice.join", "channelId": channel})
    await a.expect(lambda f: f.get("type") == "voice.roster" and f["userIds"] == [carol])
    assert [f["userIds"] for f in a.log if f.get("type") == "voice.roster"] == [[], [bob], [], [carol]]
    for x in (a, c):
        await x.close()


async def test_a_readers_own_nobody_set_by_the_host_reaches_its_open_socket(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    """The reciprocal `nobody` rule for a reader whose setting changed outside the websocket (the
    host application's UPDATE): its open socket's queries stop showing last-seen (before, the
    socket kept reading everybody's while its own was hidden)."""
    alice, bob, *_ = await social(conn, ids)
    b = await connect(cluster, edge, bob)
    await b.close()
    a = await connect(cluster, edge, alice)

    async def bob_seen_at() -> object:
        """The `lastSeenAt` of alice's query answer about bob (alice watches nobody: the only
        `presence.changed` about him she gets is that answer)."""
        answer = await a.request({"type": "presence.query", "userIds": [bob]}, changed(bob, "offline"))
        return answer.get("lastSeenAt")

    async def shown() -> bool:
        return await bob_seen_at() is not None

    async def hidden() -> bool:
        return await bob_seen_at() is None

    await eventually(shown, timeout=10)  # bob's departure has reached his shard
    await load(conn, {"users": [{"id": alice, "lastSeenVisibility": "nobody"}]})
    await eventually(hidden, timeout=10)
    await a.close()


async def _query_is_silent(c: Client, user: str) -> bool:
    c.frames.clear()
    await c.send({"type": "presence.query", "userIds": [user]})
    await c.roundtrip()
    # A window for a wrong answer (eventually asks again): silence has no event.
    await asyncio.sleep(0.05)
    return not [f for f in c.frames if f.get("userId") == user]


async def test_joining_a_big_server_takes_effect_for_existing_subscription(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    """eve joins a server of more than 1,000 members in one load: the database sends one `a:`
    notification instead of one per member (schema.sql), and the shards reload every account they
    hold, so eve's subscription to carol widens as a single join's would (issue 28 item 3)."""
    _, _, carol, _, eve = await social(conn, ids)
    e = await connect(cluster, edge, eve)
    sync = await e.request({"type": "presence.subscribe", "userIds": [carol]}, of_type("presence.sync"))
    assert sync["users"] == []
    c = await connect(cluster, edge, carol)
    await c.roundtrip()
    crowd = [ids(f"member{i}") for i in range(1_001)]
    await load(conn, {"servers": [{"id": ids("big"), "members": [eve, carol, *crowd]}]})
    await e.expect(changed(carol, "online"), timeout=10)
    await c.close()
    await e.close()
