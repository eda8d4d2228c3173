"""Live resizing of the pool, 2 → 6 → 3 shards, while clients keep connecting, changing status
and subscribing: every subscriber ends with the truth and never sees a transition that did not
happen (rapid ones may be coalesced away); rosters and unflushed last-seen survive."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
import urllib.request
from typing import Any

import asyncpg
import pytest

from actors import clients
from cluster.scale import resize
from edge.server import Edge

from .conftest import Cluster, Ids, internal_request, internal_url, load, ws_url
from .test_lastseen_ws import stored
from .wsclient import Client, eventually, of_type

pytestmark = pytest.mark.integration

DRIVERS = 16
WATCHERS = 4
# The late subscribers take turns among these accounts, each always on the same edge: one account
# for them all had its 21st socket on an edge closed (4029, `max_sockets_per_account`) once the
# resizes took over ~12 s (a loaded machine).
LATE_ACCOUNTS = 10


class Driver:
    """One account, driven step by step, keeping the truth of what others must see."""

    def __init__(self, user: str, url: str, token: str, seed: int) -> None:
        self.user, self.url, self.token = user, url, token
        self.rng = random.Random(seed)
        self.sockets: list[Client] = []
        self.idle: list[bool] = []
        self.chosen = "online"
        self.truth: list[str] = []  # visible statuses, one entry per real change

    def visible(self) -> str:
        if not self.sockets or self.chosen == "invisible":
            return "offline"
        if self.chosen == "dnd":
            return "dnd"
        return "idle" if all(self.idle) else "online"

    def _record(self) -> None:
        v = self.visible()
        if (self.truth[-1] if self.truth else "offline") != v:
            self.truth.append(v)

    async def open(self) -> None:
        self.sockets.append(await Client.connect(self.url, self.token))
        self.idle.append(False)
        self._record()

    async def step(self) -> None:
        if len(self.sockets) < 3 and self.rng.random() < 0.15:
            await self.open()
            return
        i = self.rng.randrange(len(self.sockets))
        status = self.rng.choice(["online", "idle", "idle", "dnd", "invisible"])
        await self.sockets[i].send({"type": "presence.update", "status": status})
        await self.sockets[i].roundtrip()  # applied before the next step
        if status == "idle":
            self.idle[i] = True
        else:
            self.chosen = status
            if status == "online":
                self.idle[i] = False
        self._record()

    async def close(self) -> None:
        for c in self.sockets:
            await c.close()
        self.sockets.clear()
        self._record()


def view_of(client: Client, user: str) -> str | None:
    """What a subscriber believes: its sync entry, then every change after it."""
    view = None
    for f in client.log:
        if f.get("type") == "presence.sync":
            view = next((u["status"] for u in f["users"] if u["userId"] == user), view)
        elif f.get("type") == "presence.changed" and f.get("userId") == user:
            view = f["status"]
    return view


def first_unmatched(part: list[str], whole: list[str]) -> tuple[int, int] | None:
    """Where `part` stops being a subsequence of `whole`: (the index in `part` with no match, the
    index in `whole` of the last item matched, -1 for none); None if it is one throughout."""
    rest, at = iter(enumerate(whole)), -1
    for i, x in enumerate(part):
        found = next((j for j, y in rest if y == x), None)
        if found is None:
            return i, at
        at = found
    return None


def in_order_within(part: list[str], whole: list[str]) -> bool:
    """Every item of `part` occurs in `whole`, in the same order (a subsequence)."""
    return first_unmatched(part, whole) is None


def _out_of_order(user: str, part: list[str], whole: list[str]) -> str:
    """The whole of both lists and where `part` left `whole` (a str: pytest shortens a tuple's
    repr, and the lists are what tells a race apart)."""
    where = first_unmatched(part, whole)
    said = "in order"
    if where is not None:
        i, after = where
        said = f"seen[{i}]={part[i]!r} has no match after truth[{after}]"
    return f"{user}: {said}\nseen:  {part}\ntruth: {whole}"


def cluster_panel(e: Edge) -> dict[str, Any]:
    with urllib.request.urlopen(
        internal_request(f"{internal_url(e)}/api/v1/internal/presence/cluster"), timeout=5
    ) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def seen(watcher: Client, user: str) -> list[str]:
    return [
        f["status"] for f in watcher.log if f.get("type") == "presence.changed" and f.get("userId") == user
    ]


async def test_resize_2_6_3_under_load(
    cluster: Cluster, edge: Edge, second_edge: Edge, conn: asyncpg.Connection, ids: Ids
) -> None:
    users = [ids(f"d{i}") for i in range(DRIVERS)]
    watchers_ids = [ids(f"w{i}") for i in range(WATCHERS + 2)]
    late_ids = [ids(f"late{i}") for i in range(LATE_ACCOUNTS)]
    server, channel = ids("g"), ids("voice")
    members = users + watchers_ids + late_ids
    await load(conn, {"servers": [{"id": server, "members": members, "channels": [channel]}]})
    summary = await resize(2, progress=lambda _: None)  # start from two shards
    assert summary["to"] == 2

    edges = [edge, second_edge]
    watchers = []
    for i, w in enumerate(watchers_ids[:WATCHERS]):
        c = await Client.connect(ws_url(edges[i % 2]), cluster.token(w))
        sync = await c.request({"type": "presence.subscribe", "userIds": users}, of_type("presence.sync"))
        assert {u["status"] for u in sync["users"]} == {"offline"}
        watchers.append(c)
    roster_watcher = await Client.connect(ws_url(edge), cluster.token(watchers_ids[-1]))
    await roster_watcher.request({"type": "channel.subscribe", "channelId": channel}, of_type("voice.roster"))

    drivers = [Driver(u, ws_url(edges[i % 2]), cluster.token(u), seed=i) for i, u in enumerate(users)]
    for d in drivers:
        await d.open()
    in_voice = [d.user for d in drivers[:5]]
    for d in drivers[:5]:
        await d.sockets[0].send({"type": "voice.join", "channelId": channel})
        await d.sockets[0].roundtrip()

    stop = asyncio.Event()

    async def drive(d: Driver) -> None:
        while not stop.is_set():
            await d.step()
            # The load's pace between a driver's steps.
            await asyncio.sleep(d.rng.uniform(0.02, 0.08))

    late: list[Client] = []

    async def late_subscribers() -> None:
        while not stop.is_set():
            n = len(late)
            c = await Client.connect(ws_url(edges[n % 2]), cluster.token(late_ids[n % LATE_ACCOUNTS]))
            await c.request({"type": "presence.subscribe", "userIds": users}, of_type("presence.sync"))
            late.append(c)
            # The pace of the late subscribers arriving during the resizes.
            await asyncio.sleep(0.3)

    tasks = [asyncio.create_task(drive(d)) for d in drivers] + [asyncio.create_task(late_subscribers())]
    try:
        # Load before, between and after the resizes: the scenario.
        await asyncio.sleep(1.0)
        grow = await resize(6, progress=lambda _: None, chunk=64)
        await asyncio.sleep(1.0)
        shrink = await resize(3, progress=lambda _: None, chunk=64)
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert grow["moved_slots"] == 2730 and shrink["moved_slots"] == 2047
    _, owners, count = await clients.DirectoryClient().get_map()
    assert count == 3 and set(owners) == {0, 1, 2}

    # Issue 29: the operator page and /cluster show exactly the shards of the map, never the
    # retired 3-5 as "did not answer"; each edge drops their clients once their mail is in.
    for e in edges:
        panel = await asyncio.to_thread(cluster_panel, e)
        assert [s["shard"] for s in panel["shards"]] == [0, 1, 2], panel["shards"]
        assert all("error" not in s for s in panel["shards"]), panel["shards"]

    async def retired_dropped() -> bool:
        return all(sorted(e.router.shards) == [0, 1, 2] for e in edges)

    await eventually(retired_dropped, timeout=20)

    def views_settled() -> bool:
        return all((seen(w, d.user) or ["offline"])[-1] == d.visible() for w in watchers for d in drivers)

    try:
        await eventually(views_settled, timeout=10, interval=0.2)
    except AssertionError:
        wrong = [
            (i, d.user, seen(w, d.user), d.truth)
            for i, w in enumerate(watchers)
            for d in drivers
            if (seen(w, d.user) or ["offline"])[-1] != d.visible()
        ]
        raise AssertionError(f"views differ from the truth: {wrong[:6]}") from None
    for w in watchers:
        for d in drivers:
            # Transitions that happened, in order, ending on the last: none invented. (Rapid ones
            # of one account are coalesced, 5 a second: some in between may be skipped.)
            assert in_order_within(seen(w, d.user), d.truth), _out_of_order(d.user, seen(w, d.user), d.truth)
            assert seen(w, d.user)[-1:] == d.truth[-1:], (d.user, seen(w, d.user), d.truth)
    for c in late:
        for d in drivers:
            assert view_of(c, d.user) == d.visible(), (d.user, view_of(c, d.user), d.visible())

    # Rosters moved with their channel: a new subscriber gets the same five.
    fresh = await Client.connect(ws_url(second_edge), cluster.token(watchers_ids[WATCHERS + 1]))
    roster = await fresh.request({"type": "channel.subscribe", "channelId": channel}, of_type("voice.roster"))
    assert sorted(roster["userIds"]) == sorted(in_voice)

    # Departures after the resize: everybody goes offline, and every last-seen is stored. A
    # socket's close is not ordered with its sibling's, so between the first close and the last
    # a watcher may see a real intermediate state (idle, when the remaining socket is idle).
    before = {d.user: len(d.truth) for d in drivers}
    visible_at_close = {d.user for d in drivers if d.visible() != "offline"}
    closed_at = time.time()
    for d in drivers:
        await d.close()
    await eventually(views_settled, timeout=15, interval=0.2)
    for w in watchers:
        for d in drivers:
            got = seen(w, d.user)
            # Before the closes, transitions that happened (some possibly coalesced away); then
            # at most two more, ending offline.
            assert in_order_within(got[:-2], d.truth[: before[d.user]]), (d.user, got, d.truth)
            assert (got or ["offline"])[-1] == "offline", (d.user, got)
            assert all(a != b for a, b in itertools.pairwise(got)), f"repeated status for {d.user}"

    async def departures_stored() -> bool:
        values = await _stored_all(conn, users)
        # Accounts invisible at the end froze their last-seen when they hid, earlier.
        return len(values) == len(users) and all(values[u] >= closed_at - 1.0 for u in visible_at_close)

    await eventually(departures_stored, timeout=10)
    for c in [*watchers, *late, roster_watcher, fresh]:
        await c.close()


async def _stored_all(conn: asyncpg.Connection, users: list[str]) -> dict[str, float]:
    return {u: v for u in users if (v := await stored(conn, u)) is not None}


async def test_a_directory_ray_restarts_serves_the_resized_map_again(cluster: Cluster) -> None:
    """Its node died, or the head came back with GCS fault tolerance: Ray restarts the directory
    with the arguments it was created with (the even map of the first pool size). It serves the
    map it last published instead, with a newer version (issue 25; before: the even map, version
    1, and every edge routed the resized pool's slots to the wrong shards)."""
    directory = clients.DirectoryClient()
    _, _, count = await directory.get_map()
    await resize(count + 1, progress=lambda _: None)
    version, owners, grown = await directory.get_map()
    assert grown == count + 1
    directory.kill(restart=True)

    async def restored() -> tuple[int, tuple[int, ...], int] | None:
        try:
            return await clients.DirectoryClient().get_map()
        except Exception:
            return None

    async def restored_after_the_kill() -> tuple[int, tuple[int, ...], int] | None:
        after = await restored()
        return after if after is not None and after[0] != version else None

    after = await eventually(restored_after_the_kill, timeout=30, interval=0.2)
    assert after[2] == count + 1 and tuple(after[1]) == tuple(owners) and after[0] > version
    await resize(count, progress=lambda _: None)
