"""The Python client's pure parts: the reconnect policy (against the cases shared with the
JavaScript client), chunking, the picture's reconciliation and query merging, typing lapses."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge import session
from presence_client.backoff import (
    DEFAULT_BACKOFF,
    RESTART_CLOSE_CODES,
    THROTTLING_CLOSE_CODES,
    BackoffPolicy,
    reconnect_delay,
    restart_delay,
)
from presence_client.client import IDENTIFY_DEADLINE, MAX_QUEUED_FRAMES, PresenceClient, _Window
from presence_client.picture import (
    Entry,
    Frame,
    Picture,
    PresenceError,
    QueryAnswer,
    Typing,
    chunk_ids,
    malformed,
    merge_query,
)

HERE = Path(__file__).parent
CASES: list[dict[str, Any]] = json.loads((HERE / "backoff_cases.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[f"{c['attempt']}-{c['throttled']}-{c['random']}" for c in CASES])
def test_shared_backoff_case(case: dict[str, Any]) -> None:
    got = reconnect_delay(case["attempt"], case["throttled"], DEFAULT_BACKOFF, lambda: case["random"])
    assert got * 1000 == pytest.approx(case["delay_ms"], abs=1e-6)


RESTART_CASES: list[dict[str, Any]] = json.loads((HERE / "backoff_cases.json").read_text())["restart_cases"]


@pytest.mark.parametrize("case", RESTART_CASES, ids=[str(c["random"]) for c in RESTART_CASES])
def test_shared_restart_case(case: dict[str, Any]) -> None:
    """After 1012 (a drain) or 1011: back at once, within a jittered second."""
    got = restart_delay(DEFAULT_BACKOFF, lambda: case["random"])
    assert got * 1000 == pytest.approx(case["delay_ms"], abs=1e-6)


def test_restart_codes_are_not_throttling() -> None:
    assert {1011, 1012} == RESTART_CLOSE_CODES
    assert not RESTART_CLOSE_CODES & THROTTLING_CLOSE_CODES


def test_both_clients_know_the_edges_identify_deadline_reason() -> None:
    """Both clients tell a 4001 for an identify that came too late (reconnect as usual) from a
    refused token by its reason: each holds a copy of the edge's text (presence_client does not
    import the edge), and a copy that drifted would make every late identify stop a fixed-token
    client with `unauthorized` again."""
    assert session.IDENTIFY_DEADLINE != session.BAD_TOKEN
    assert IDENTIFY_DEADLINE == session.IDENTIFY_DEADLINE
    js = (HERE.parents[1] / "clients" / "js" / "src" / "client.js").read_text()
    copies = re.findall(r"^const IDENTIFY_DEADLINE = (\"[^\"]*\");$", js, re.M)
    assert copies == [json.dumps(session.IDENTIFY_DEADLINE)]


@given(st.integers(-5, 200), st.booleans(), st.floats(0, 1, exclude_max=True))
def test_delay_stays_in_its_window(attempt: int, throttled: bool, r: float) -> None:
    p = DEFAULT_BACKOFF
    n = max(0, attempt)
    delay = reconnect_delay(attempt, throttled, p, lambda: r)
    if throttled:
        window = min(p.throttled_cap_s, p.throttled_base_s * 2.0 ** min(n, 52))
        assert window / 2 <= delay <= window
    else:
        assert 0 <= delay <= min(p.cap_s, p.base_s * 2.0 ** min(n, 52))


def test_full_jitter_spreads_a_herd() -> None:
    """10,000 clients losing one edge at once: their first retries spread over the whole window,
    not bunched at its end (what a fixed or "equal jitter" wait would do)."""
    rng = random.Random(7)
    delays = [reconnect_delay(0, False, BackoffPolicy(base_s=1.0), rng.random) for _ in range(10_000)]
    per_tenth = [0] * 10
    for d in delays:
        per_tenth[min(int(d * 10), 9)] += 1
    assert max(per_tenth) < 1_150 and min(per_tenth) > 850, per_tenth


def test_chunks_by_count_and_bytes() -> None:
    assert chunk_ids(["a", "b", "a", "c"], 2) == [["a", "b"], ["c"]]
    assert [len(c) for c in chunk_ids([f"u{i}" for i in range(250)])] == [100, 100, 50]
    long = [f"{i}".ljust(128, "é") for i in range(100)]
    chunks = chunk_ids(long)
    assert len(chunks) > 1
    for chunk in chunks:
        assert (
            len(json.dumps({"type": "presence.query", "userIds": chunk}, ensure_ascii=False).encode())
            < 16 * 1024
        )


def test_reconcile_leaves_no_ghost() -> None:
    pic = Picture()
    pic.watch(["a", "b", "c"])
    pic.apply(
        {
            "type": "presence.sync",
            "users": [{"userId": "a", "status": "online"}, {"userId": "b", "status": "dnd"}],
        }
    )
    assert pic.entries == {"a": Entry("online"), "b": Entry("dnd")}
    # After a reconnect: a went offline, b left the audience, c arrived in it.
    fresh = [
        {"type": "presence.sync", "users": [{"userId": "a", "status": "offline"}]},
        {"type": "presence.changed", "userId": "c", "status": "online"},
    ]
    changes = [*pic.apply(fresh[0]), *pic.apply(fresh[1]), *pic.reconcile(["a", "b", "c"], fresh)]
    assert pic.entries == {"a": Entry("offline"), "c": Entry("online")}
    assert [(c.user_id, c.entry) for c in changes] == [
        ("a", Entry("offline")),
        ("c", Entry("online")),
        ("b", None),
    ]


def test_reconcile_of_a_refused_chunk_forgets_it() -> None:
    pic = Picture()
    pic.watch(["a"])
    pic.set("a", "online")
    assert [c.user_id for c in pic.reconcile(["a"], [{"type": "error", "code": "rate_limited"}])] == ["a"]
    assert pic.entries == {}


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "presence.sync", "users": [None]},
        {"type": "presence.sync", "users": [{"userId": "a", "status": "online"}, {"userId": "b"}]},
        {"type": "presence.sync", "users": None},
        {"type": "presence.sync"},
        {"type": "presence.changed", "userId": "a"},
        {"type": "presence.changed", "userId": 7, "status": "online"},
        {"type": "presence.self", "status": None},
        {"type": "typing", "channelId": "c1"},
        {"type": "voice.roster", "channelId": "c1"},
        {"type": "voice.roster", "channelId": "c1", "userIds": None},
        {"type": "voice.roster", "channelId": "c1", "userIds": ["a", None]},
        {"type": "voice.roster", "userIds": []},
    ],
)
def test_malformed_frames_of_known_types_are_told(frame: dict[str, Any]) -> None:
    """Each of these ended the client's connection task (users: [null] in Picture.apply,
    userIds: null in the roster); the client drops what `malformed` names, whole."""
    assert malformed(frame) is not None


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "presence.sync", "users": []},
        {"type": "presence.sync", "users": [{"userId": "a", "status": "online", "new": 1}]},
        {"type": "presence.changed", "userId": "a", "status": "offline", "lastSeenAt": "T"},
        {"type": "presence.self", "status": "dnd"},
        {"type": "typing", "channelId": "c1", "userId": "a"},
        {"type": "voice.roster", "channelId": "c1", "userIds": []},
        {"type": "heartbeat.ack"},
        {"type": "something.newer", "users": None},  # unknown types are not this check's
    ],
)
def test_well_formed_frames_pass(frame: dict[str, Any]) -> None:
    assert malformed(frame) is None


def test_frames_about_unwatched_accounts_are_ignored() -> None:
    pic = Picture()
    assert pic.apply({"type": "presence.changed", "userId": "z", "status": "online"}) == []
    assert pic.entries == {}


def test_last_seen_kept_while_away_and_dropped_when_present() -> None:
    pic = Picture()
    pic.watch(["a"])
    pic.set("a", "offline", "2026-12-02T08:47:00.000Z", last_seen_known=True)
    assert pic.apply({"type": "presence.sync", "users": [{"userId": "a", "status": "offline"}]}) == []
    assert pic.entries["a"].last_seen_at == "2026-12-02T08:47:00.000Z"
    pic.apply({"type": "presence.changed", "userId": "a", "status": "online"})
    assert pic.entries["a"] == Entry("online")
    pic.apply({"type": "presence.changed", "userId": "a", "status": "offline"})
    assert pic.entries["a"] == Entry("offline")  # a new departure: the time is unknown again


def test_merge_query_in_order_asked() -> None:
    chunks = [["a", "b", "x"], ["c"]]
    windows = [
        [
            {"type": "presence.changed", "userId": "b", "status": "online"},  # a broadcast first
            {"type": "presence.changed", "userId": "a", "status": "offline", "lastSeenAt": "T1"},
            {"type": "presence.changed", "userId": "b", "status": "offline"},
            {"type": "presence.changed", "userId": "q", "status": "online"},  # not asked
        ],
        [{"type": "presence.changed", "userId": "c", "status": "invisible", "lastSeenAt": "T2"}],
    ]
    answers = merge_query(chunks, windows)
    assert list(answers) == ["a", "b", "c"]
    assert answers["a"] == QueryAnswer("offline", "T1")
    assert answers["b"] == QueryAnswer("offline", None)
    assert answers["c"] == QueryAnswer("invisible", "T2")
    with pytest.raises(PresenceError) as refused:
        merge_query([["a"]], [[{"type": "error", "code": "rate_limited", "message": "slow down"}]])
    assert refused.value.code == "rate_limited"


def test_query_answers_settle_watched_last_seen() -> None:
    pic = Picture()
    pic.watch(["a", "b"])
    pic.set("a", "offline")
    pic.set("b", "online")
    changes = pic.settle_answers({"a": QueryAnswer("offline", None), "b": QueryAnswer("offline", "T")})
    assert [c.user_id for c in changes] == ["a"]
    assert pic.entries["a"] == Entry("offline", None, True)
    assert pic.entries["b"] == Entry("online")  # the answer is older than what the picture holds


def test_typing_lapses_after_ten_seconds() -> None:
    t = Typing()
    t.typing("c1", "zed", 100.0)
    t.typing("c1", "amy", 103.0)
    assert t.typers("c1", 105.0) == ["amy", "zed"]
    assert t.next_lapse() == 110.0
    assert t.expire(110.0) == ["c1"]
    assert t.typers("c1", 110.0) == ["amy"]
    assert t.expire(113.0) == ["c1"]
    assert t.until == {}


STATUS = st.sampled_from(["online", "idle", "dnd", "offline", "invisible"])
IDS = [f"u{i}" for i in range(8)]


@given(
    before=st.lists(st.tuples(st.sampled_from(IDS), STATUS), max_size=20),
    truth=st.dictionaries(st.sampled_from(IDS), STATUS),
    later=st.lists(st.tuples(st.sampled_from(IDS), STATUS), max_size=6),
)
def test_after_a_resync_the_picture_is_the_truth(
    before: list[tuple[str, str]], truth: dict[str, str], later: list[tuple[str, str]]
) -> None:
    """Whatever the picture held before a reconnect, after the fresh sync (the truth: the visible
    ids and their statuses), and broadcasts that follow it, it holds exactly that."""
    pic = Picture()
    pic.watch(IDS)
    for user_id, status in before:
        pic.apply({"type": "presence.changed", "userId": user_id, "status": status})
    sync = {"type": "presence.sync", "users": [{"userId": u, "status": s} for u, s in truth.items()]}
    window: list[dict[str, Any]] = [sync]
    window += [{"type": "presence.changed", "userId": u, "status": s} for u, s in later]
    for f in window:
        pic.apply(f)
    pic.reconcile(IDS, window)
    expected = {**truth, **dict(later)}
    assert {u: e.status for u, e in pic.entries.items()} == expected


# ---------------------------------------------------------------- the outgoing queue's coalescing

CHANNELS = ["c1", "c2"]
MERGEABLE = st.one_of(
    st.builds(
        lambda s: {"type": "presence.update", "status": s},
        st.sampled_from(["online", "idle", "dnd", "invisible"]),
    ),
    st.builds(
        lambda v: {"type": "settings.update", "lastSeenVisibility": v},
        st.sampled_from(["everyone", "nobody"]),
    ),
    st.builds(lambda c: {"type": "focus", "channelId": c}, st.sampled_from([*CHANNELS, None])),
    st.builds(
        lambda kind, c: {"type": kind, "channelId": c},
        st.sampled_from(["channel.subscribe", "channel.unsubscribe", "typing.start", "typing.stop"]),
        st.sampled_from(CHANNELS),
    ),
)
NEVER_MERGED = st.one_of(
    st.just({"type": "heartbeat"}),  # a periodic one: no request's
    st.builds(lambda c: {"type": "voice.join", "channelId": c}, st.sampled_from(CHANNELS)),
    st.just({"type": "voice.leave"}),
    st.just({"type": "presence.unsubscribe", "userIds": ["u1"]}),
)
REQUEST = st.just({"type": "presence.query", "userIds": ["u1"]})  # sent with its heartbeat, in a window


def edge_reading(frames: list[Frame]) -> tuple[list[Any], list[Frame]]:
    """What an edge makes of `frames` read in order: its state for the socket at each request
    (what the request's answer may depend on) and at the end, with the channels that had a
    typing.start (a broadcast) since the request before; and the frames never merged, in order."""
    state: dict[str, Any] = {"idle": None, "chosen": None, "visibility": None, "focus": "unset"}
    channels: dict[str, bool] = {}
    typing: dict[str, bool] = {}
    broadcast: set[str] = set()
    at_requests: list[Any] = []
    others: list[Frame] = []

    def snapshot() -> Any:
        return (sorted(state.items()), sorted(channels.items()), sorted(typing.items()), sorted(broadcast))

    for f in frames:
        kind = f["type"]
        if kind == "presence.update":
            if f["status"] in ("idle", "online"):
                state["idle"] = f["status"] == "idle"
            if f["status"] != "idle":
                state["chosen"] = f["status"]
        elif kind == "settings.update":
            state["visibility"] = f["lastSeenVisibility"]
        elif kind == "focus":
            state["focus"] = f["channelId"]
        elif kind in ("channel.subscribe", "channel.unsubscribe"):
            channels[f["channelId"]] = kind == "channel.subscribe"
        elif kind in ("typing.start", "typing.stop"):
            typing[f["channelId"]] = kind == "typing.start"
            if kind == "typing.start":
                broadcast.add(f["channelId"])
        else:
            others.append(f)
            if kind == "presence.query":
                at_requests.append(snapshot())
                broadcast = set()
    at_requests.append(snapshot())
    return at_requests, others


def kind_of(frame: Frame) -> tuple[str, str | None]:
    """channel and typing frames by channel; the others by type."""
    family = frame["type"].split(".")[0]
    if family in ("channel", "typing"):
        return family, frame["channelId"]
    return frame["type"], None


@given(st.lists(st.one_of(*[MERGEABLE] * 6, NEVER_MERGED, REQUEST), max_size=80))
def test_the_coalesced_queue_tells_the_edge_what_every_frame_would(frames: list[Frame]) -> None:
    """Whatever the application sends while frames wait for the pacing, what the queue holds
    brings the edge to the same state at each request and at the end (and shows the same typing
    broadcasts), and keeps every frame never merged in order, while holding between two requests
    at most three status frames, two typing frames per channel and one of each other kind (per
    channel)."""
    loop = asyncio.new_event_loop()
    try:
        client = PresenceClient("ws://127.0.0.1:9/ws/presence", "T")
        client._ws = cast(Any, object())  # a socket whose sender has not run yet: every frame waits
        every: list[Frame] = []
        for frame in frames:
            if frame["type"] == "presence.query":
                window = _Window(loop.create_future())
                for part in (frame, {"type": "heartbeat"}):
                    client._send(part, window)
                    every.append(part)
            else:
                assert client._send(frame)
                every.append(frame)
        queued = [entry[0] for entry in client._queue]
        assert edge_reading(queued) == edge_reading(every)
        spans: list[list[Frame]] = [[]]
        for entry in client._queue:
            if entry[1] is None:
                spans[-1].append(entry[0])
            else:
                spans.append([])
        most = {"presence.update": 3, "settings.update": 1, "focus": 1, "channel": 1, "typing": 2}
        for span in spans:
            held = Counter(kind_of(f) for f in span if kind_of(f)[0] in most)
            for (kind, channel), count in held.items():
                assert count <= most[kind], (kind, channel, span)
    finally:
        loop.close()


def test_a_loop_of_choices_keeps_one_queued_status_per_part_and_the_last_word() -> None:
    """The old queue grew by every call (20,000 frames here); the pacing drains 15 a second."""
    client = PresenceClient("ws://127.0.0.1:9/ws/presence", "T")
    client._ws = cast(Any, object())
    for i in range(5_000):
        client.set_status("idle")
        client.set_status("dnd" if i % 2 else "invisible")
        client.set_focus(f"c{i}")
        client.set_last_seen_visibility("friends")
    assert [entry[0] for entry in client._queue] == [
        {"type": "presence.update", "status": "idle"},
        {"type": "presence.update", "status": "dnd"},
        {"type": "focus", "channelId": "c4999"},
        {"type": "settings.update", "lastSeenVisibility": "friends"},
    ]
    # The choices to send again should the socket close before the edge confirms them.
    assert {kind: frame for kind, (frame, _) in client._unconfirmed.items()} == {
        "presence.update": {"type": "presence.update", "status": "dnd"},
        "settings.update": {"type": "settings.update", "lastSeenVisibility": "friends"},
    }


def test_past_the_bound_a_frame_is_refused_and_nothing_remembered() -> None:
    client = PresenceClient("ws://127.0.0.1:9/ws/presence", "T")
    client._ws = cast(Any, object())
    for i in range(MAX_QUEUED_FRAMES):
        client.subscribe_channel(f"c{i}")
    refusals: list[Callable[[], None]] = [
        lambda: client.subscribe_channel("one more"),
        lambda: client.join_voice("c1"),
        lambda: client.set_focus("c1"),
        lambda: client.set_status("dnd"),
    ]
    for refused in refusals:
        with pytest.raises(PresenceError) as full:
            refused()
        assert full.value.code == "queue_full"
    assert "one more" not in client._channels and client._voice is None and client._focus is None
    assert "presence.update" not in client._unconfirmed and client._pending_status is None
    assert len(client._queue) == MAX_QUEUED_FRAMES
    # A frame that supersedes a queued one takes its place: accepted, the queue no longer.
    client.unsubscribe_channel("c7")
    assert "c7" not in client._channels and len(client._queue) == MAX_QUEUED_FRAMES
    assert client._queue[7][0] == {"type": "channel.unsubscribe", "channelId": "c7"}
