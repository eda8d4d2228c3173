"""Active counts, pure side: the hours rule, trimming, and a model check that the scores a shard
writes count exactly the accounts that had a live socket at some moment of any window."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.core.activity import (
    MAX_HOURS,
    SPREAD,
    BadWindow,
    RollingRefresh,
    lead_s,
    live_until,
    parse_hours,
    trim_before,
    window_start,
)
from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.core.effects import Activity
from actors.core.shard import ShardState

T0 = 1_800_000_000.0


@pytest.mark.parametrize(
    ("raw", "hours"), [("1", 1.0), ("24", 24.0), ("0.5", 0.5), ("720", 720.0), ("168", 168.0)]
)
def test_hours_accepted(raw: str, hours: float) -> None:
    assert parse_hours(raw) == hours


@pytest.mark.parametrize(
    "raw",
    [None, "", "0", "0.0", "-1", "720.5", "721", "1e2", "nan", "inf", " 1", "1 ", "٣", "1_0", "0x10", "1."],
)
def test_hours_refused_with_a_short_reason(raw: str | None) -> None:
    with pytest.raises(BadWindow) as e:
        parse_hours(raw)
    assert "hours" in str(e.value) and len(str(e.value)) < 60


def test_windows_and_trimming() -> None:
    assert window_start(T0, 24) == T0 - 86_400
    assert trim_before(T0) == T0 - MAX_HOURS * 3600
    assert window_start(T0, MAX_HOURS) == trim_before(T0)  # nothing a window needs is trimmed
    assert live_until(T0, 600) == T0 + lead_s(600) > T0 + 600 * (1 + SPREAD)


def count_active(scores: Iterable[float | None], since: float) -> int:
    """The model of Redis's `ZCOUNT key since +inf` over the active scores (None: no member)."""
    return sum(1 for s in scores if s is not None and math.isfinite(s) and s >= since)


def test_count_active_skips_non_members() -> None:
    assert count_active([None, T0 - 10, T0 + 5, T0 - 100, float("nan")], T0 - 50) == 2


def test_first_round_one_interval_after_start_then_even_slices() -> None:
    r = RollingRefresh(100.0)
    live = [f"u{i:03d}" for i in range(800)]
    assert r.chunk(live, 0.0) == []
    assert all(r.chunk(live, float(t)) == [] for t in range(1, 100))
    sizes = [len(r.chunk(live, float(t))) for t in range(100, 200)]
    assert sum(sizes) == 800 and max(sizes) == 10 and sizes[81:] == [0] * 19
    assert r.rounds == 1


def shard(users: list[str], interval: float) -> ShardState:
    s = ShardState(checkpoint_interval_s=interval, socket_timeout_s=1e9)
    for u in users:
        s.set_relations(u, Relations(), T0)
        s.load_account(u, AccountRow(), T0)
    return s


def test_several_sockets_are_one_member() -> None:
    s = shard(["a"], 600.0)
    s.connect("a", "s1", "e1", T0)
    s.connect("a", "s2", "e2", T0 + 1)
    s.set_status("a", "s1", "invisible", T0 + 2)  # invisible still counts: an operator figure
    s.disconnect("a", "s1", T0 + 3)
    acts = [e for e in s.outbox.drain() if isinstance(e, Activity)]
    assert acts == [Activity("a", True, T0)]
    s.disconnect("a", "s2", T0 + 4)
    assert [e for e in s.outbox.drain() if isinstance(e, Activity)] == [Activity("a", False, T0 + 4)]


event = st.tuples(
    st.integers(0, 5), st.sampled_from(["connect", "disconnect", "invisible"]), st.floats(1, 150)
)


@settings(max_examples=50, deadline=None)
@given(events=st.lists(event, max_size=30), interval=st.sampled_from([30.0, 100.0]))
def test_written_scores_count_exactly_who_was_live_in_any_window(
    events: list[tuple[int, str, float]], interval: float
) -> None:
    """Replay what the shell would write (arrivals, departures, refresh slices once a second) into
    a model of the sorted set; at every second, for windows short and long, the count equals the
    accounts that had a live socket at some moment of the window."""
    users = [f"u{i}" for i in range(6)]
    s = shard(users, interval)
    scores: dict[str, float] = {}
    live_spans: dict[str, list[list[float]]] = {u: [] for u in users}  # [start, end or inf]
    sockets: dict[str, int] = dict.fromkeys(users, 0)
    now = T0

    def write(effects: list[Any]) -> None:
        for e in effects:
            if isinstance(e, Activity):
                scores[e.user_id] = live_until(e.at, interval) if e.live else e.at

    def check() -> None:
        for hours in (interval / 3600 / 4, interval / 3600, 1.0, 24.0):
            since = window_start(now, hours)
            expected = {u for u, spans in live_spans.items() if any(b >= since for _, b in spans)}
            assert count_active(scores.values(), since) == len(expected), (hours, now)

    for i, kind, dt in events:
        for _ in range(int(dt)):  # one second at a time, as the shard's loop runs
            now += 1.0
            write([Activity(u, True, now) for u in s.activity_chunk(now)])
            check()
        u = users[i]
        if kind == "connect":
            s.connect(u, f"s{sockets[u]}", "e", now)
            if not any(b == float("inf") for _, b in live_spans[u]):
                live_spans[u].append([now, float("inf")])
            sockets[u] += 1
        elif kind == "disconnect" and sockets[u]:
            sockets[u] -= 1
            s.disconnect(u, f"s{sockets[u]}", now)
            if sockets[u] == 0:
                live_spans[u][-1][1] = now
        elif kind == "invisible" and sockets[u]:
            s.set_status(u, f"s{sockets[u] - 1}", "invisible", now)
        write(s.outbox.drain())
        check()
