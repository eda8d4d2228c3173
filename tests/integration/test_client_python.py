"""The Python client's connection handling against a scripted websocket server on loopback (no
cluster): a server that stops answering, close codes 4029 / 1008 / 4001 / 1000, answers matched
to requests by the heartbeat that follows them, outgoing pacing.

The live behaviour (a real edge killed under the client) is tests/integration/test_clients_live.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve

from edge.session import IDENTIFY_DEADLINE
from presence_client import (
    MAX_QUEUED_FRAMES,
    BackoffPolicy,
    PresenceClient,
    PresenceError,
    TokenContext,
    reconnect_delay,
)

from .wsclient import eventually

Script = Callable[[ServerConnection, int], Awaitable[None]]
FAST = BackoffPolicy(base_s=0.02, cap_s=0.1, throttled_base_s=0.4, throttled_cap_s=1.0)


class Scripted:
    """Serves connection number n (from 0) with script(ws, n); records what clients send."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.count = 0
        self.received: list[list[dict[str, Any]]] = []
        self.server: Server | None = None

    async def handler(self, ws: ServerConnection) -> None:
        n = self.count
        self.count += 1
        self.received.append([])
        await self.script(ws, n)

    @property
    def url(self) -> str:
        assert self.server is not None
        port = next(iter(self.server.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/ws/presence"

    async def recv(self, ws: ServerConnection, n: int) -> dict[str, Any]:
        frame: dict[str, Any] = json.loads(await ws.recv())
        self.received[n].append(frame)
        return frame


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[[Script], Awaitable[Scripted]]]:
    servers: list[Scripted] = []

    async def start(script: Script) -> Scripted:
        s = Scripted(script)
        s.server = await serve(s.handler, "127.0.0.1", 0)
        servers.append(s)
        return s

    yield start
    for s in servers:
        assert s.server is not None
        s.server.close()
        await s.server.wait_closed()


async def ready(
    s: Scripted, ws: ServerConnection, n: int, interval_ms: int = 30_000, status: str = "online"
) -> None:
    assert (await s.recv(ws, n))["type"] == "identify"
    await ws.send(json.dumps({"type": "ready", "userId": "me", "socketId": f"s-{n}", "status": status,
                              "heartbeatIntervalMs": interval_ms}))  # fmt: skip


async def requests(s: Scripted, ws: ServerConnection, n: int) -> AsyncIterator[dict[str, Any]]:
    """Connection n's frames as an edge reads them: each recorded, heartbeats acknowledged, the
    others handed to the script."""
    async for raw in ws:
        frame: dict[str, Any] = json.loads(raw)
        s.received[n].append(frame)
        if frame["type"] == "heartbeat":
            await ws.send('{"type":"heartbeat.ack"}')
        else:
            yield frame


async def refusing_then_ready(scripted: Any, reasons: list[str]) -> Scripted:
    """A server that reads connection n's identify and closes it with 4001 and `reasons[n]`, then
    answers the next one `ready` and keeps it."""

    async def script(ws: ServerConnection, n: int) -> None:
        if n < len(reasons):
            await s.recv(ws, n)
            await ws.close(4001, reasons[n])
            return
        await ready(s, ws, n)
        await ws.wait_closed()

    s: Scripted = await scripted(script)
    return s


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    await eventually(check, timeout, interval=0.01)


async def test_a_silent_server_is_dropped_and_the_client_reconnects(scripted: Any) -> None:
    answered: list[int] = []  # heartbeats answered on the second connection

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n, interval_ms=150)
        if n == 0:
            await ws.wait_closed()  # answers nothing: a dead path
        else:
            async for raw in ws:
                if json.loads(raw)["type"] == "heartbeat":
                    await ws.send('{"type":"heartbeat.ack"}')
                    answered.append(n)

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST)
    states: list[tuple[str, dict[str, Any]]] = []
    client.on("state", lambda state, info: states.append((state, info)))
    client.connect()
    # One interval to send the heartbeat, one more without an answer: dropped within ~0.3 s, and
    # within `until`'s 5 s however loaded the machine (the default interval would take 30 s).
    await until(lambda: s.count == 2 and client.state == "open")
    dropped = next(info for state, info in states if state == "reconnecting")
    assert dropped["code"] == 4000
    # The new connection answers: it stays, heartbeat after heartbeat.
    await until(lambda: len(answered) >= 3)
    assert client.state == "open" and s.count == 2
    await client.close()


@pytest.mark.parametrize("code", [4029, 1008])
async def test_throttling_close_codes_back_off_harder(scripted: Any, code: int) -> None:
    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        if n == 0:
            await ws.close(code, "slow down")
        else:
            await ws.wait_closed()

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST, random=lambda: 0.0)
    client.connect()
    await until(lambda: s.count == 2)
    assert client.reconnect_delays == [pytest.approx(FAST.throttled_base_s / 2)]
    await client.close()


@pytest.mark.parametrize("code", [1012, 1011])
async def test_restart_close_codes_come_back_at_once(scripted: Any, code: int) -> None:
    """1012 (the edge drains) and 1011: back at once, within the small jittered restart window,
    whatever the backoff had grown to; a failure after that starts from the first window."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        if n < 2:
            await ws.close(1001, "going away")  # young deaths: the backoff grows
        elif n == 2:
            await ws.close(code, "service restart; reconnect")
        else:
            await ws.wait_closed()

    s = await scripted(script)
    policy = BackoffPolicy(base_s=0.2, cap_s=1.0, restart_window_s=0.1)
    client = PresenceClient(s.url, "T", backoff=policy, random=lambda: 0.5)
    states: list[tuple[str, dict[str, Any]]] = []
    client.on("state", lambda state, info: states.append((state, info)))
    client.connect()
    await until(lambda: s.count == 4)
    assert client.reconnect_delays == [pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.05)]
    last = [info for state, info in states if state == "reconnecting"][-1]
    assert last["code"] == code and last["attempt"] == 0 and last["throttled"] is False
    await client.close()


async def test_back_awake_on_a_resumed_idle_place_says_online(scripted: Any) -> None:
    """A drained socket's place is resumed with its idle flag, and the `online` the client sent
    just before the close may never have been read: back with `ready` idle while awake, the
    client says `online`; back with `ready` online, it sends nothing. Failed on the old client,
    which restored only an idle socket (its account stayed idle although it was active)."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n, interval_ms=100, status="idle" if n == 1 else "online")
        while (await s.recv(ws, n))["type"] != "heartbeat":
            pass  # what the client restores comes at once, before its first heartbeat
        if n < 2:
            await ws.close(1012, "service restart; reconnect")
        else:
            await ws.wait_closed()

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=BackoffPolicy(restart_window_s=0.05))
    client.connect()
    await until(lambda: s.count == 3 and any(f["type"] == "heartbeat" for f in s.received[2]))
    restored = [[f for f in frames if f["type"] == "presence.update"] for frames in s.received]
    assert restored == [[], [{"type": "presence.update", "status": "online"}], []]
    await client.close()


async def test_4001_asks_the_provider_again_and_1000_stops(scripted: Any) -> None:
    asked: list[TokenContext] = []

    def token(ctx: TokenContext) -> str:
        asked.append(ctx)
        return f"T{len(asked)}"

    async def script(ws: ServerConnection, n: int) -> None:
        if n == 0:
            await s.recv(ws, n)
            await ws.close(4001, "bad token")
            return
        await ready(s, ws, n)
        await ws.close(1000, "bye")

    s = await scripted(script)
    client = PresenceClient(s.url, token, backoff=FAST)
    client.connect()
    await until(lambda: client.state == "closed")
    assert [(c.attempt, c.rejected) for c in asked] == [(0, False), (1, True)]
    assert [r[0]["token"] for r in s.received] == ["T1", "T2"]
    # A window for a retry that must not come (after 1000): nothing marks its absence.
    await asyncio.sleep(0.3)
    assert s.count == 2  # 1000: nothing retried


async def test_a_fixed_token_refused_stops(scripted: Any) -> None:
    async def script(ws: ServerConnection, n: int) -> None:
        await s.recv(ws, n)
        await ws.close(4001, "bad token")

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST)
    errors: list[str] = []
    client.on("error", lambda e: errors.append(e.code))
    client.connect()
    await until(lambda: client.state == "closed")
    assert errors == ["unauthorized"] and s.count == 1


async def test_a_provider_handing_back_the_token_just_refused_stops(scripted: Any) -> None:
    """A fresh token after a 4001 is tried; the very token just refused, handed back, is not: the
    client stops as with a fixed token. The old client retried it for ever."""
    asked: list[TokenContext] = []

    def token(ctx: TokenContext) -> str:
        asked.append(ctx)
        return "T1" if len(asked) == 1 else "T2"  # T2 for good: refused, then handed back

    async def script(ws: ServerConnection, n: int) -> None:
        await s.recv(ws, n)
        await ws.close(4001, "bad token")

    s = await scripted(script)
    client = PresenceClient(s.url, token, backoff=FAST)
    errors: list[PresenceError] = []
    client.on("error", errors.append)
    client.connect()
    async with asyncio.timeout(5):
        with pytest.raises(PresenceError) as refused:
            await client.wait_open()
    assert refused.value.code == "unauthorized" and client.state == "closed"
    assert [e.code for e in errors] == ["unauthorized"]
    assert "just refused" in str(errors[0])
    assert [(c.attempt, c.rejected) for c in asked] == [(0, False), (1, True), (2, True)]
    assert [r[0]["token"] for r in s.received] == ["T1", "T2"]  # the repeat never sent


async def test_a_missed_identify_deadline_does_not_stop_a_fixed_token(scripted: Any) -> None:
    """A 4001 for an identify that reached the edge too late (its IDENTIFY_DEADLINE reason: a
    loaded edge, its opening gate) refused no token: the client reconnects with the usual backoff,
    not the throttled one, and opens with the same token. The old client took every 4001 for a
    refused token and stopped for good (`unauthorized`)."""

    s = await refusing_then_ready(scripted, [IDENTIFY_DEADLINE])  # the identify, too late
    client = PresenceClient(s.url, "T", backoff=FAST, random=lambda: 0.5)
    errors: list[PresenceError] = []
    client.on("error", errors.append)
    states: list[tuple[str, dict[str, Any]]] = []
    client.on("state", lambda state, info: states.append((state, info)))
    client.connect()
    await client.wait_open(timeout=5)
    assert errors == [] and s.count == 2
    assert [r[0]["token"] for r in s.received] == ["T", "T"]
    assert client.reconnect_delays == [pytest.approx(reconnect_delay(0, False, FAST, lambda: 0.5))]
    [info] = [info for state, info in states if state == "reconnecting"]
    assert info["code"] == 4001 and info["reason"] == IDENTIFY_DEADLINE
    assert info["attempt"] == 0 and info["throttled"] is False
    await client.close()


async def test_a_missed_identify_deadline_is_no_rejection_for_a_token_provider(scripted: Any) -> None:
    """The provider is not told its token was refused after a missed identify deadline, and the
    token is not taken for one just refused: handed back, it is sent again. The old client told
    the provider `rejected` and stopped when it handed the same token back."""
    asked: list[TokenContext] = []

    def token(ctx: TokenContext) -> str:
        asked.append(ctx)
        return "T"

    s = await refusing_then_ready(scripted, [IDENTIFY_DEADLINE])
    client = PresenceClient(s.url, token, backoff=FAST)
    client.connect()
    await client.wait_open(timeout=5)
    assert [(c.attempt, c.rejected) for c in asked] == [(0, False), (1, False)]
    assert [r[0]["token"] for r in s.received] == ["T", "T"]
    await client.close()


async def test_a_missed_identify_deadline_after_a_refusal_leaves_the_refused_token_as_it_was(
    scripted: Any,
) -> None:
    """T1 refused (`bad token`), the fresh T2 closed for its late identify, T2 handed back: it is
    tried and opens (only T1 was refused), the provider still told of T1's refusal until a ready.
    The old client took T2 for the token just refused and stopped."""
    asked: list[TokenContext] = []

    def token(ctx: TokenContext) -> str:
        asked.append(ctx)
        return "T1" if len(asked) == 1 else "T2"

    s = await refusing_then_ready(scripted, ["bad token", IDENTIFY_DEADLINE])
    client = PresenceClient(s.url, token, backoff=FAST)
    client.connect()
    await client.wait_open(timeout=5)
    assert [r[0]["token"] for r in s.received] == ["T1", "T2", "T2"]
    assert [(c.attempt, c.rejected) for c in asked] == [(0, False), (1, True), (2, True)]
    await client.close()


async def test_answers_matched_by_the_following_heartbeat(scripted: Any) -> None:
    """Two query chunks in flight at once: each gets its own answers, a broadcast in between is
    taken as the newer word, an id outside the audience is silent."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        async for frame in requests(s, ws, n):
            if frame["type"] == "presence.query":
                for u in frame["userIds"]:
                    if u != "u7":
                        answer = {"type": "presence.changed", "userId": u, "status": "offline"}
                        if u == "u1":
                            answer["lastSeenAt"] = "2026-12-02T08:47:00.000Z"
                        await ws.send(json.dumps(answer))
                if "u150" in frame["userIds"]:
                    await ws.send(
                        json.dumps({"type": "presence.changed", "userId": "u150", "status": "online"})
                    )

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST)
    client.connect()
    await client.wait_open()
    answers = await client.query([f"u{i}" for i in range(160)])
    queries = [f for f in s.received[0] if f["type"] == "presence.query"]
    assert [len(q["userIds"]) for q in queries] == [100, 60]
    assert len(answers) == 159 and "u7" not in answers
    assert list(answers)[:8] == ["u0", "u1", "u2", "u3", "u4", "u5", "u6", "u8"]
    assert answers["u1"].last_seen_at == "2026-12-02T08:47:00.000Z"
    assert answers["u150"].status == "online" and answers["u150"].last_seen_at is None
    await client.close()
    with pytest.raises(PresenceError) as e:
        await client.query(["u1"])
    assert e.value.code == "not_connected"


async def test_outgoing_frames_are_paced(scripted: Any) -> None:
    arrivals: list[float] = []

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        async for _ in ws:
            arrivals.append(time.monotonic())

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST, rate_burst=5, rate_per_s=20)
    client.connect()
    await client.wait_open()
    for i in range(15):
        client.subscribe_channel(f"c{i}")  # frames no later one supersedes
    await until(lambda: len(arrivals) == 15)
    # 5 at once, then 10 at 20/s: about half a second, never faster.
    assert arrivals[-1] - arrivals[0] >= 0.45
    await client.close()


async def test_frames_called_in_a_loop_are_merged_in_place_and_choices_restored_from_the_last_word(
    scripted: Any,
) -> None:
    """An application calling set_status, set_focus, typing and a setting in a loop: the old
    client queued every frame (21,000 here), drained at the pacing's 15 a second. Each frame now
    takes the place of the queued ones it supersedes, so what reaches the edge is the last word,
    in an order that tells the edge the same; the choices sent again after a close are the last."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n, interval_ms=30_000 if n == 0 else 100)
        last = "voice.join" if n == 0 else "heartbeat"
        while (await s.recv(ws, n))["type"] != last:
            pass
        if n == 0:  # no heartbeat answered: the choices may not have been read
            await ws.close(1012, "service restart; reconnect")
        else:
            await ws.wait_closed()

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=BackoffPolicy(restart_window_s=0.05))
    client.connect()
    await client.wait_open()
    client.subscribe_channel("c1")
    for i in range(3_000):  # nothing is written before the loop ends: all of it is queued
        client.set_status("idle")
        client.set_status("online")
        client.set_status("dnd")
        client.set_focus(f"c{i}")
        client.typing("c1")
        client.stop_typing("c1")
        client.set_last_seen_visibility("friends" if i % 2 else "nobody")
    client.join_voice("c1")
    client.set_status("invisible")
    assert len(client._queue) == 8
    await until(lambda: s.count == 2 and any(f["type"] == "heartbeat" for f in s.received[1]))
    assert s.received[0][1:] == [
        {"type": "channel.subscribe", "channelId": "c1"},
        {"type": "presence.update", "status": "online"},  # the socket woke: invisible keeps that
        {"type": "focus", "channelId": "c2999"},
        {"type": "typing.start", "channelId": "c1"},
        {"type": "settings.update", "lastSeenVisibility": "friends"},
        {"type": "presence.update", "status": "invisible"},
        {"type": "typing.stop", "channelId": "c1"},
        {"type": "voice.join", "channelId": "c1"},
    ]
    assert [f for f in s.received[1] if f["type"] in ("presence.update", "settings.update")] == [
        {"type": "presence.update", "status": "invisible"},
        {"type": "settings.update", "lastSeenVisibility": "friends"},
    ]
    await client.close()


async def test_nothing_moves_past_a_request_and_its_heartbeat(scripted: Any) -> None:
    """A setting queued before a query and another after it: the later one does not take the
    earlier one's place, which would move it before the query (whose answer depends on it: an
    account whose setting is `nobody` gets no last-seen times), nor disturb the query's window."""
    visibility = ["everyone"]

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        async for frame in requests(s, ws, n):
            if frame["type"] == "settings.update":
                visibility[0] = frame["lastSeenVisibility"]
            elif frame["type"] == "presence.query":
                answer = {"type": "presence.changed", "userId": "a", "status": "offline"}
                if visibility[0] != "nobody":
                    answer["lastSeenAt"] = "2026-12-02T08:47:00.000Z"
                await ws.send(json.dumps(answer))

    pacing_held = [True]
    s = await scripted(script)
    client = PresenceClient(
        s.url,
        "T",
        backoff=FAST,
        rate_burst=1,
        rate_per_s=1_000,
        # The pacing's clock stands still while held: past the one frame of the burst, frames wait.
        clock=lambda: 0.0 if pacing_held[0] else time.monotonic(),
    )
    client.connect()
    await client.wait_open()
    client.subscribe_channel("warm-up")  # the burst's one frame: what follows waits
    await until(lambda: len(s.received[0]) == 2)
    client.set_last_seen_visibility("nobody")
    asking = asyncio.create_task(client.query(["a"]))
    await until(lambda: len(client._queue) == 3)  # the setting, the query, its heartbeat
    client.set_last_seen_visibility("everyone")
    assert len(client._queue) == 4
    pacing_held[0] = False
    async with asyncio.timeout(5):
        answers = await asking
    assert answers["a"].last_seen_at is None  # asked while the setting was nobody
    await until(lambda: len(s.received[0]) == 6)
    assert [f["type"] for f in s.received[0]] == [
        "identify",
        "channel.subscribe",
        "settings.update",
        "presence.query",
        "heartbeat",
        "settings.update",
    ]
    assert visibility == ["everyone"]
    await client.close()


async def test_past_the_bound_the_applications_frames_are_refused_until_the_queue_drains(
    scripted: Any,
) -> None:
    """The old queue took every frame; past MAX_QUEUED_FRAMES a call now raises queue_full with
    nothing queued or remembered, and works again once the pacing has drained the queue."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        await serve_requests(s, ws, n, sync=[])

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST, rate_burst=MAX_QUEUED_FRAMES, rate_per_s=1_000)
    client.connect()
    await client.wait_open()
    for i in range(MAX_QUEUED_FRAMES):
        client.subscribe_channel(f"c{i}")
    with pytest.raises(PresenceError) as full:
        await client.query(["a"])
    assert full.value.code == "queue_full"
    with pytest.raises(PresenceError) as full:
        await client.subscribe(["a"])
    assert full.value.code == "queue_full" and client.watched == []
    with pytest.raises(PresenceError) as full:
        client.typing("c1")
    assert full.value.code == "queue_full"
    await until(lambda: len(client._queue) == 0)
    async with asyncio.timeout(5):
        assert client.typing("c1")
        await client.subscribe(["a"])
        await client.query(["a"])
    assert len(s.received[0]) == 1 + MAX_QUEUED_FRAMES + 1 + 2 + 2
    await client.close()


async def serve_requests(s: Scripted, ws: ServerConnection, n: int, sync: list[dict[str, Any]]) -> None:
    """Answer as an edge would: heartbeats acknowledged, a subscribe with `sync`, a query with
    each asked id offline."""
    async for frame in requests(s, ws, n):
        if frame["type"] == "presence.subscribe":
            await ws.send(json.dumps({"type": "presence.sync", "users": sync}))
        elif frame["type"] == "presence.query":
            for u in frame["userIds"]:
                await ws.send(json.dumps({"type": "presence.changed", "userId": u, "status": "offline"}))


async def test_a_roster_that_arrives_after_unsubscribe_channel_is_not_kept(scripted: Any) -> None:
    """The edge may send a roster before it reads the unsubscribe: not ours any more, as typing
    is not (a roster filled in again for a channel the application left)."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        await ws.send(json.dumps({"type": "voice.roster", "channelId": "c1", "userIds": ["me"]}))
        async for raw in ws:
            if json.loads(raw)["type"] == "channel.unsubscribe":
                break
        await ws.send(json.dumps({"type": "voice.roster", "channelId": "c1", "userIds": ["me", "bob"]}))
        await ws.send(json.dumps({"type": "typing", "channelId": "c1", "userId": "bob"}))
        await serve_requests(s, ws, n, sync=[])

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST)
    rosters: list[tuple[str, list[str]]] = []
    client.on("roster", lambda channel, users: rosters.append((channel, users)))
    client.subscribe_channel("c1")
    client.connect()
    await until(lambda: client.roster("c1") == ["me"])
    client.unsubscribe_channel("c1")
    async with asyncio.timeout(5):
        await client.query(["a"])  # answered after the frames sent before it
    assert client.roster("c1") == [] and client.typers("c1") == []
    assert rosters == [("c1", ["me"])]
    await client.close()


async def test_a_malformed_frame_is_dropped_and_the_client_carries_on(scripted: Any) -> None:
    """One frame of a known type that cannot be applied (users: [null], userIds: null) ended the
    connection's task on the old client: its state stayed open, nothing reconnected, a query
    never returned. It is dropped whole (nothing of it applied), reported, and the rest read."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        for bad in (
            {"type": "presence.sync", "users": [{"userId": "a", "status": "online"}, None]},
            {"type": "voice.roster", "channelId": "c1", "userIds": None},
            {"type": "presence.changed", "userId": "a"},
        ):
            await ws.send(json.dumps(bad))
        await ws.send(json.dumps({"type": "voice.roster", "channelId": "c1", "userIds": ["me"]}))
        await serve_requests(s, ws, n, sync=[{"userId": "a", "status": "offline"}])

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST)
    errors: list[str] = []
    client.on("error", lambda e: errors.append(e.code))
    await client.subscribe(["a"])  # remembered: subscribed on connect
    client.subscribe_channel("c1")
    client.connect()
    async with asyncio.timeout(5):
        await client.wait_synced()
        answers = await client.query(["a"])
    assert answers["a"].status == "offline"
    assert errors == ["malformed_frame"] * 3
    entry = client.get("a")
    assert entry is not None and entry.status == "offline"
    assert client.roster("c1") == ["me"] and client.state == "open" and s.count == 1
    await client.close()


async def test_subscribe_while_connecting_returns_once_the_sync_after_open_is_applied(scripted: Any) -> None:
    """As in the JavaScript client: `await subscribe()` right after connect() waits for the sync
    after the socket opens. The old client returned at once, still connecting, bob unknown."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        await serve_requests(s, ws, n, sync=[{"userId": "bob", "status": "online"}])

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST)
    client.connect()  # not open yet: its task has not even run
    async with asyncio.timeout(5):
        await client.subscribe(["bob"])
    assert client.state == "open" and client.synced
    entry = client.get("bob")
    assert entry is not None and entry.status == "online"
    assert [f for f in s.received[0] if f["type"] == "presence.subscribe"] == [
        {"type": "presence.subscribe", "userIds": ["bob"]}
    ]
    await client.close()


async def test_subscribe_while_connecting_raises_when_the_client_gives_up_and_at_once_when_not_started(
    scripted: Any,
) -> None:
    """Waiting for the sync after open ends with the reason when the client closes first: close()
    (disconnected), a refused token (unauthorized), a refused resubscribe (rate_limited). Before
    connect() and after close(), subscribe() returns at once: the ids are subscribed on connect."""

    async def script(ws: ServerConnection, n: int) -> None:
        identify = await s.recv(ws, n)
        if identify["token"] == "refused":
            await ws.close(4001, "bad token")
        elif identify["token"] == "silent":
            await ws.wait_closed()  # never ready: the client stays connecting
        else:
            await ws.send(json.dumps({"type": "ready", "userId": "me", "socketId": "s", "status": "online",
                                      "heartbeatIntervalMs": 30_000}))  # fmt: skip
            async for raw in ws:
                if json.loads(raw)["type"] == "heartbeat":
                    await ws.send('{"type":"error","code":"rate_limited","message":"slow down"}')
                    await ws.send('{"type":"heartbeat.ack"}')

    s = await scripted(script)
    async with asyncio.timeout(5):
        closed = PresenceClient(s.url, "silent", backoff=FAST)
        await closed.subscribe(["a"])  # not started: at once
        closed.connect()
        waiting = asyncio.create_task(closed.subscribe(["b"]))
        await until(lambda: s.count == 1)
        assert not waiting.done()
        await closed.close()
        with pytest.raises(PresenceError) as disconnected:
            await waiting
        assert disconnected.value.code == "disconnected"
        await closed.subscribe(["c"])  # closed: at once
        assert closed.watched == ["a", "b", "c"]

        refused = PresenceClient(s.url, "refused", backoff=FAST)
        refused.connect()
        with pytest.raises(PresenceError) as unauthorized:
            await refused.subscribe(["a"])
        assert unauthorized.value.code == "unauthorized"

        limited = PresenceClient(s.url, "T", backoff=FAST)
        limited.connect()
        with pytest.raises(PresenceError) as rate_limited:
            await limited.subscribe(["a"])
        assert rate_limited.value.code == "rate_limited"
        assert limited.state == "open" and not limited.synced
        await limited.close()


async def test_a_ready_with_a_bad_heartbeat_interval_opens_with_the_contracts_30_s(scripted: Any) -> None:
    """A non-numeric heartbeatIntervalMs raised in the old client's ready handling: its task
    died, it stayed `connecting` for good."""

    async def script(ws: ServerConnection, n: int) -> None:
        assert (await s.recv(ws, n))["type"] == "identify"
        await ws.send(json.dumps({"type": "ready", "userId": "me", "socketId": "s", "status": "online",
                                  "heartbeatIntervalMs": "soon"}))  # fmt: skip
        await serve_requests(s, ws, n, sync=[])

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST)
    client.connect()
    async with asyncio.timeout(5):
        await client.wait_open()
        assert await client.query(["a"]) != {}
    assert client._heartbeat_s == 30.0
    await client.close()


async def test_last_seen_still_wanted_after_a_close_during_the_gathering_wait_is_asked_on_the_next_socket(
    scripted: Any,
) -> None:
    """Two watched accounts go offline, and the socket closes within the 0.25 s the client gathers
    them for one query. The old client kept them wanted but asked again only when the set went
    from empty to one id: no last-seen query was ever sent again. (The JS client's timer does it.)"""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        if n == 1:
            await serve_requests(s, ws, n, sync=[{"userId": u, "status": "offline"} for u in ("a", "b")])
            return
        async for raw in ws:
            frame = json.loads(raw)
            s.received[n].append(frame)
            if frame["type"] == "presence.subscribe":
                await ws.send(json.dumps({"type": "presence.sync", "users": [
                    {"userId": "a", "status": "online"}, {"userId": "b", "status": "online"}]}))  # fmt: skip
            elif frame["type"] == "heartbeat":
                await ws.send('{"type":"heartbeat.ack"}')  # the sync is applied: both go away
                for u in ("a", "b"):
                    await ws.send(json.dumps({"type": "presence.changed", "userId": u, "status": "offline"}))
                await ws.close(1012, "service restart; reconnect")

    s = await scripted(script)
    client = PresenceClient(s.url, "T", track_last_seen=True, backoff=BackoffPolicy(restart_window_s=0.05))
    await client.subscribe(["a", "b"])
    client.connect()
    await until(lambda: s.count == 2 and any(f["type"] == "presence.query" for f in s.received[1]))
    assert not any(f["type"] == "presence.query" for f in s.received[0])  # closed while gathering
    (query,) = [f for f in s.received[1] if f["type"] == "presence.query"]
    assert sorted(query["userIds"]) == ["a", "b"]
    await client.close()


async def test_the_connections_finished_tasks_are_not_kept(scripted: Any) -> None:
    """Each last-seen query (and resubscribe retry) runs in a task of the connection; the old
    client kept every one until the connection ended, so a long one grew without bound."""
    queries: list[dict[str, Any]] = []

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        async for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "presence.subscribe":
                await ws.send(
                    json.dumps({"type": "presence.sync", "users": [{"userId": "a", "status": "online"}]})
                )
            elif frame["type"] == "presence.query":
                queries.append(frame)
                seen = f"2026-12-02T08:4{len(queries)}:00.000Z"
                answer = {"type": "presence.changed", "userId": "a", "status": "offline", "lastSeenAt": seen}
                await ws.send(json.dumps(answer))
            elif frame["type"] == "heartbeat":
                await ws.send('{"type":"heartbeat.ack"}')
                if len(queries) < 3:  # a request answered: a comes and goes again, to be asked again
                    for status in ("online", "offline"):
                        await ws.send(
                            json.dumps({"type": "presence.changed", "userId": "a", "status": status})
                        )

    s = await scripted(script)
    client = PresenceClient(s.url, "T", track_last_seen=True, backoff=FAST)
    await client.subscribe(["a"])
    client.connect()

    def asked_three_times() -> bool:
        entry = client.get("a")
        return len(queries) == 3 and entry is not None and entry.last_seen_known

    await until(asked_three_times)
    # Left: the connection's sender and heartbeat, nothing finished.
    await until(lambda: len(client._aux) == 2)
    assert sorted(t.get_name() for t in client._aux) == ["presence-client-heartbeat", "presence-client-send"]
    await client.close()


async def test_async_with_a_refused_token_raises_unauthorized_at_once(scripted: Any) -> None:
    """The old client closed itself within a moment, but `async with` waited out wait_open's
    30 s and raised TimeoutError, not why."""

    async def script(ws: ServerConnection, n: int) -> None:
        await s.recv(ws, n)
        await ws.close(4001, "bad token")

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST)
    async with asyncio.timeout(5):
        with pytest.raises(PresenceError) as refused:
            async with client:
                pytest.fail("opened with a refused token")
    assert refused.value.code == "unauthorized"
    assert client.state == "closed" and s.count == 1


async def test_a_failed_async_with_leaves_nothing_reconnecting(scripted: Any) -> None:
    """A server that never says ready: `async with` fails (here cancelled by the caller's
    timeout; wait_open's own 30 s takes the same road). __aexit__ is not called then, and the old
    client's task went on reconnecting for good."""

    async def script(ws: ServerConnection, n: int) -> None:
        await s.recv(ws, n)
        await ws.wait_closed()

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST, connect_timeout_s=0.1)
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5), client:
                pytest.fail("opened without a ready")
        assert client.state == "closed"
        assert client._task is None  # its connection task ended, not left reconnecting
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("shown", "restored"), [("idle", ["idle"]), ("online", ["idle"]), ("dnd", ["online", "idle"])]
)
async def test_an_idle_socket_back_from_a_drain_does_not_wake_to_repeat_online(
    scripted: Any, shown: str, restored: list[str]
) -> None:
    """`online` chosen, then the socket idle, and a drain before a heartbeat confirmed the choice
    (within 30 s of it): the old client sent `online` again after the next ready, which woke the
    idle socket, then `idle`, and the account's watchers saw it online, then idle (seen live
    through `presence drain`). A ready showing online chosen already (`idle`, `online`) leaves
    only the idle flag to restore; one showing something else (the choice never read) still gets
    the choice first."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n, status="online" if n == 0 else shown)
        if n == 0:
            while (await s.recv(ws, n)) != {"type": "presence.update", "status": "idle"}:
                pass
            await ws.close(1012, "service restart; reconnect")  # before any heartbeat was answered
        else:
            # What the client restores comes first, then the test's marker (its queue keeps order).
            while (await s.recv(ws, n)).get("channelId") != "marker":
                pass
            await ws.wait_closed()

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=BackoffPolicy(restart_window_s=0.05))
    client.connect()
    await client.wait_open()
    client.set_status("online")
    client.set_status("idle")
    await until(lambda: s.count == 2 and client.state == "open")
    client.subscribe_channel("marker")  # queued after everything the ready restored
    await until(lambda: any(f.get("channelId") == "marker" for f in s.received[1]))
    assert [f["status"] for f in s.received[1] if f["type"] == "presence.update"] == restored
    await client.close()


async def test_a_pending_status_and_the_idle_flag_are_both_restored(scripted: Any) -> None:
    """Chosen while disconnected: invisible, then idle. The old client remembered only the last
    frame (idle: invisible lost) and, with a pending dnd or invisible, did not restore idle."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        await serve_requests(s, ws, n, sync=[])

    s = await scripted(script)
    client = PresenceClient(s.url, "T", backoff=FAST)
    client.set_status("invisible")
    client.set_status("idle")
    client.connect()
    async with asyncio.timeout(5):
        await client.wait_open()
        await client.query(["x"])  # answered after what was restored: the edge reads in order
    assert [f for f in s.received[0] if f["type"] == "presence.update"] == [
        {"type": "presence.update", "status": "invisible"},
        {"type": "presence.update", "status": "idle"},
    ]
    await client.close()


async def test_choices_queued_or_unconfirmed_at_a_close_are_sent_again_after_the_next_ready(
    scripted: Any,
) -> None:
    """invisible and a last-seen setting queued behind the client's pacing when a drain closes
    the socket: the old client dropped the queue, and the account stayed online. Kept pending
    now, and sent after the next ready; sent again after a close that came before any heartbeat
    after them was answered; not after one that came after (read: durable upstream)."""

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n, interval_ms=30_000 if n == 0 else 100)
        if n == 0:
            for _ in range(3):
                await s.recv(ws, n)  # the burst; the rest waits for the pacing
        else:
            while (await s.recv(ws, n))["type"] != "heartbeat":
                pass
            if n == 1:  # a close before the answer
                await ws.close(1012, "service restart; reconnect")
                return
            await ws.send('{"type":"heartbeat.ack"}')
            if n == 3:
                await ws.wait_closed()
                return
        await ws.close(1012, "service restart; reconnect")

    s = await scripted(script)
    client = PresenceClient(
        s.url, "T", rate_burst=3, rate_per_s=5, backoff=BackoffPolicy(restart_window_s=0.05)
    )
    client.connect()
    await client.wait_open()
    for channel in ("a", "b", "c"):
        client.subscribe_channel(channel)  # the burst
    client.set_status("invisible")
    client.set_last_seen_visibility("nobody")
    await until(lambda: s.count == 4 and any(f["type"] == "heartbeat" for f in s.received[3]))
    choices = [
        [f for f in frames if f["type"] in ("presence.update", "settings.update")] for frames in s.received
    ]
    restored = [
        {"type": "presence.update", "status": "invisible"},
        {"type": "settings.update", "lastSeenVisibility": "nobody"},
    ]
    assert choices == [[], restored, restored, []]
    await client.close()


async def test_stopping_a_listener_twice_does_nothing_the_second_time() -> None:
    """As in the JavaScript client; it raised ValueError (a review, 2026-12-05)."""
    client = PresenceClient("ws://127.0.0.1:9/ws/presence", "T")
    heard: list[str] = []
    stop = client.on("state", lambda state, info: heard.append(state))
    client.on("state", lambda state, info: heard.append("other"))
    stop()
    stop()
    client._emit("state", "open", {})
    assert heard == ["other"]


async def test_a_token_provider_that_never_answers_is_given_up_on_and_asked_again(scripted: Any) -> None:
    """The connect timeout covers the provider too: one that hung left the client "connecting"
    for good (a review, 2026-12-05)."""
    asked: list[TokenContext] = []

    async def token(ctx: TokenContext) -> str:
        asked.append(ctx)
        if len(asked) == 1:
            await asyncio.Event().wait()  # never answers
        return "T2"

    async def script(ws: ServerConnection, n: int) -> None:
        await ready(s, ws, n)
        await ws.wait_closed()

    s = await scripted(script)
    client = PresenceClient(s.url, token, backoff=FAST, connect_timeout_s=0.3)
    errors: list[str] = []
    client.on("error", lambda e: errors.append(str(e)))
    client.connect()
    await until(lambda: client.state == "open")
    assert len(asked) == 2 and [r[0]["token"] for r in s.received] == ["T2"]
    assert errors == ["token: no token within 0.3 s"]
    await client.close()
