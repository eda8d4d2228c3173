"""Frames a socket's hold could not keep: a socket waiting for a reply that must come first (its
`ready`, a sync, a resync) keeps the frames meant for it meanwhile, at most `HELD_CAP`
(edge/server.py); what came past that was dropped, and a watcher showed those accounts as they
were until each changed again. Now its views are looked at afresh when the hold ends."""

from __future__ import annotations

import asyncpg
import pytest

from edge import server as server_module
from edge.server import Edge

from .conftest import Cluster, Ids
from .test_presence_ws import connect, social
from .wsclient import changed, of_type

pytestmark = pytest.mark.integration


async def test_frames_past_the_held_cap_are_made_up_for_when_the_hold_ends(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_module, "HELD_CAP", 2)
    alice, bob, carol, *_ = await social(conn, ids)  # alice, bob and carol share a server
    held = await connect(cluster, edge, alice)
    other = await connect(cluster, edge, alice)  # alice's second socket, never held
    for w in (held, other):
        await w.request({"type": "presence.subscribe", "userIds": [bob, carol]}, of_type("presence.sync"))
    b = await connect(cluster, edge, bob)
    c = await connect(cluster, edge, carol)
    for w in (held, other):
        await w.expect(changed(bob, "online"))
        await w.expect(changed(carol, "online"))
    assert held.ready is not None
    held_conn = edge.conns[held.ready["socketId"]]
    held_conn.hold += 1  # as while a reply that must come first is being made
    try:
        await b.send({"type": "presence.update", "status": "idle"})
        await c.send({"type": "presence.update", "status": "idle"})
        await other.expect(changed(bob, "idle"), timeout=15)
        await other.expect(changed(carol, "idle"), timeout=15)
        await b.send({"type": "presence.update", "status": "dnd"})
        await other.expect(changed(bob, "dnd"), timeout=15)
        # The same publications reached the held socket in the same passes: two kept, the third
        # dropped.
        assert len(held_conn.held) == 2
    finally:
        edge._release(held_conn)
    await held.expect(changed(bob, "idle"))
    await held.expect(changed(carol, "idle"))
    await held.expect(changed(bob, "dnd"), timeout=15)
    for client in (held, other, b, c):
        await client.close()


async def test_an_overflow_makes_up_for_the_own_status_and_the_voice_roster_it_dropped(
    cluster: Cluster, edge: Edge, conn: asyncpg.Connection, ids: Ids, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not only presence.changed: a held socket that dropped a `presence.self` and a
    `voice.roster` is sent its account's status and the channel's roster as they are when the
    hold ends (before, it showed both as they were until each changed again)."""
    monkeypatch.setattr(server_module, "HELD_CAP", 0)  # every frame for a held socket is dropped
    alice, bob, *_ = await social(conn, ids)  # alice and bob share a server and its channel
    channel = ids("c")
    held = await connect(cluster, edge, alice)
    other = await connect(cluster, edge, alice)  # alice's second socket, never held
    for w in (held, other):
        await w.request({"type": "channel.subscribe", "channelId": channel}, of_type("voice.roster"))
    b = await connect(cluster, edge, bob)
    assert held.ready is not None
    held_conn = edge.conns[held.ready["socketId"]]
    held_conn.hold += 1  # as while a reply that must come first is being made
    try:
        await other.send({"type": "presence.update", "status": "dnd"})
        await other.expect(
            lambda f: f.get("type") == "presence.self" and f.get("status") == "dnd", timeout=15
        )
        await b.send({"type": "voice.join", "channelId": channel})
        await other.expect(
            lambda f: f.get("type") == "voice.roster" and f.get("userIds") == [bob], timeout=15
        )
        assert held_conn.held == []  # both dropped
    finally:
        edge._release(held_conn)
    await held.expect(lambda f: f.get("type") == "presence.self" and f.get("status") == "dnd", timeout=15)
    await held.expect(lambda f: f.get("type") == "voice.roster" and f.get("userIds") == [bob], timeout=15)
    for client in (held, other, b):
        await client.close()
