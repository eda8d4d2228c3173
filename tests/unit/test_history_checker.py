"""The history checker (tests/integration/history.py) on hand-made histories: a clean one passes,
and each invariant, broken on purpose, is reported, so the fault tests can fail."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration import history as hist
from tests.integration.history import CountSample, Event, Graph, History, SocketLife

T = 1_800_000_000.0
GRAPH = Graph(
    users=frozenset({"a", "b", "c", "d", "x", "hid"}),
    friends=frozenset({frozenset(("a", "d"))}),
    servers={"g": frozenset({"a", "b", "c", "hid"})},
    visibility={"b": "friends", "c": "nobody"},
    invisible=frozenset({"hid"}),
)


def recv(socket: str, user: str, frame: dict[str, Any], t: float = T + 1) -> Event:
    return Event(t, socket, user, "recv", frame)


def send(socket: str, user: str, frame: dict[str, Any], t: float = T + 0.5) -> Event:
    return Event(t, socket, user, "send", frame)


def clean() -> History:
    """a and b come and go; a watches and queries; everything as the contract says."""
    h = History(GRAPH)
    h.sockets = {
        "a#0": SocketLife("a", T, T + 10, T + 10.1),
        "b#0": SocketLife("b", T, T + 5, T + 5.1),
    }
    h.events = [
        recv("a#0", "a", {"type": "ready", "userId": "a", "socketId": "s-1", "status": "online"}, T),
        send("a#0", "a", {"type": "presence.subscribe", "userIds": ["b", "hid", "x"]}),
        recv("a#0", "a", {"type": "presence.sync", "users": [{"userId": "b", "status": "online"}]}),
        recv("a#0", "a", {"type": "presence.sync", "users": [{"userId": "hid", "status": "offline"}]}),
        recv("a#0", "a", {"type": "presence.changed", "userId": "b", "status": "offline"}, T + 5.2),
        send("a#0", "a", {"type": "presence.query", "userIds": ["d", "b"]}, T + 6),
        recv(
            "a#0",
            "a",
            {
                "type": "presence.changed",
                "userId": "d",
                "status": "offline",
                "lastSeenAt": "2027-01-15T08:00:00.000Z",
            },
            T + 6.1,
        ),
        recv("a#0", "a", {"type": "presence.changed", "userId": "b", "status": "offline"}, T + 6.1),
        recv("b#0", "b", {"type": "presence.self", "status": "dnd"}, T + 2),
        recv("b#0", "b", {"type": "error", "code": "bad_frame", "message": "x"}, T + 2),
    ]
    h.stored_before = {"a": T - 100, "hid": T - 500}
    h.stored_samples = [(T + 6, {"a": T - 100, "b": T + 5.05, "hid": T - 500})]
    h.stored_after = {"a": T + 10.05, "b": T + 5.05, "hid": T - 500}
    h.final_status = {"a": "offline", "b": "offline"}
    h.final_sockets = {"a": 0, "b": 0}
    h.counts = [CountSample(T + 1, "g", 2), CountSample(T + 6, "g", 1), CountSample(T + 7, "g", None)]
    h.quiet_counts = {"g": (0, 0)}
    return h


def test_a_clean_history_passes() -> None:
    assert hist.check(clean()) == []


def only(h: History, check: Any) -> list[str]:
    out = hist.check(h)
    assert out, "the violation was not found"
    assert out == check(h), f"other checks complained too: {out}"
    return out


def test_invisible_shown_to_another_account() -> None:
    h = clean()
    h.events.append(recv("a#0", "a", {"type": "presence.changed", "userId": "b", "status": "invisible"}))
    assert "invisible" in only(h, hist.invisible_leaks)[0]


def test_invisible_account_shown_present() -> None:
    h = clean()
    h.events.append(
        recv("a#0", "a", {"type": "presence.sync", "users": [{"userId": "hid", "status": "online"}]})
    )
    assert "hid" in only(h, hist.invisible_leaks)[0]


def test_own_invisible_status_is_fine() -> None:
    h = clean()
    h.events.append(recv("b#0", "b", {"type": "presence.self", "status": "invisible"}))
    h.events.append(recv("b#0", "b", {"type": "presence.changed", "userId": "b", "status": "invisible"}))
    assert hist.check(h) == []


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "presence.changed", "userId": "x", "status": "online"},
        {"type": "presence.sync", "users": [{"userId": "d", "status": "online"}]},  # b and d share nothing
        {"type": "typing", "channelId": "c1", "userId": "x"},
        {"type": "voice.roster", "channelId": "c1", "userIds": ["a", "x"]},
    ],
)
def test_frame_outside_the_audience(frame: dict[str, Any]) -> None:
    h = clean()
    h.events.append(recv("b#0", "b", frame))
    assert "outside its audience" in only(h, hist.audience_leaks)[0]


def test_last_seen_in_a_sync() -> None:
    h = clean()
    h.events.append(
        recv(
            "a#0",
            "a",
            {
                "type": "presence.sync",
                "users": [{"userId": "b", "status": "offline", "lastSeenAt": "2027-01-15T08:00:00.000Z"}],
            },
        )
    )
    assert "presence.sync carries lastSeenAt" in only(h, hist.last_seen_leaks)[0]


def test_last_seen_in_a_broadcast() -> None:
    h = clean()
    frame = {
        "type": "presence.changed",
        "userId": "a",
        "status": "offline",
        "lastSeenAt": "2027-01-15T08:00:00.000Z",
    }
    h.events.append(recv("b#0", "b", frame))  # b never asked
    assert "outside any query answer" in only(h, hist.last_seen_leaks)[0]


def _answer(h: History, target: str, reader: str = "a", sock: str = "a#0", **extra: Any) -> list[str]:
    h.events.append(send(sock, reader, {"type": "presence.query", "userIds": [target]}, T + 7))
    frame = {
        "type": "presence.changed",
        "userId": target,
        "status": "offline",
        "lastSeenAt": "2027-01-15T08:00:00.000Z",
    }
    h.events.append(recv(sock, reader, {**frame, **extra}, T + 7.1))
    return hist.last_seen_leaks(h)


def test_query_answer_with_last_seen_is_fine() -> None:
    h = clean()
    assert _answer(h, "d") == []


def test_last_seen_of_a_present_account() -> None:
    assert "shown online" in _answer(clean(), "d", status="online")[0]


def test_last_seen_not_truncated() -> None:
    assert "precision" in _answer(clean(), "d", lastSeenAt="2027-01-15T08:00:12.345Z")[0]


def test_last_seen_withheld_by_friends_setting() -> None:
    assert "setting" in _answer(clean(), "b")[0]  # b: friends only; a is not b's friend


def test_last_seen_withheld_by_nobody_setting() -> None:
    assert "setting" in _answer(clean(), "c")[0]


def test_reader_with_nobody_gets_no_last_seen() -> None:
    h = clean()
    h.sockets["c#0"] = SocketLife("c", T, T + 10, T + 10.1)
    h.stored_after["c"] = T + 10.05
    h.final_status["c"], h.final_sockets["c"] = "offline", 0
    out = _answer(h, "a", reader="c", sock="c#0")
    assert any("reader with setting nobody" in v for v in out)


def test_settings_change_is_followed() -> None:
    h = clean()
    h.events.append(send("b#0", "b", {"type": "settings.update", "lastSeenVisibility": "everyone"}, T + 3))
    assert _answer(h, "b") == []  # long after b said everyone


def test_last_seen_of_invisible_account_moved() -> None:
    out = _answer(clean(), "hid")  # stored before: T - 500; the answer says 2027-01-15 08:00 (later)
    assert any("invisible" in v for v in out)


def test_foreign_frame() -> None:
    h = clean()
    h.events.append(recv("a#0", "a", {"type": "_settings", "lastSeenVisibility": "nobody"}))
    assert "not in the contract" in only(h, hist.foreign_frames)[0]


def test_ghost() -> None:
    h = clean()
    h.final_status["b"], h.final_sockets["b"] = "online", 1
    assert "ghost" in only(h, hist.ghosts)[0]


def test_missing_final_status() -> None:
    h = clean()
    del h.final_status["b"]
    assert "no final status" in only(h, hist.ghosts)[0]


def test_departure_not_stored() -> None:
    h = clean()
    del h.stored_after["b"]
    assert "no last-seen is stored" in only(h, hist.departures_stored)[0]


def test_departure_stored_too_early() -> None:
    h = clean()
    h.stored_after["b"] = T + 2  # an earlier departure's value: the last one was lost
    h.stored_samples = []
    assert "but last-seen stored is" in only(h, hist.departures_stored)[0]


def test_departure_stored_too_late() -> None:
    h = clean()
    h.stored_after["a"] = T + 14
    assert "but last-seen stored is" in only(h, hist.departures_stored)[0]


def test_departure_of_the_last_socket_counts() -> None:
    h = clean()
    h.sockets["a#1"] = SocketLife("a", T, T + 3, T + 3.1)  # a's other socket left earlier
    assert hist.check(h) == []


def test_open_socket_has_no_departure() -> None:
    h = clean()
    h.sockets["b#1"] = SocketLife("b", T + 4)
    h.stored_after["b"] = T + 5.05
    assert hist.departures_stored(h) == []


def test_invisible_account_last_seen_moved() -> None:
    h = clean()
    h.sockets["hid#0"] = SocketLife("hid", T, T + 4, T + 4.1)
    h.final_status["hid"], h.final_sockets["hid"] = "offline", 0
    h.stored_after["hid"] = T + 4.05
    assert "invisible throughout" in only(h, hist.departures_stored)[0]


def test_last_seen_went_backwards() -> None:
    h = clean()
    h.stored_samples.append((T + 7, {"b": T + 1}))
    assert "went back" in only(h, hist.last_seen_backwards)[0]


def test_negative_count() -> None:
    h = clean()
    h.counts.append(CountSample(T + 3, "g", -1))
    assert "was -1" in only(h, hist.bad_counts)[0]


def test_count_above_members() -> None:
    h = clean()
    h.counts.append(CountSample(T + 3, "g", 5))
    assert "was 5" in only(h, hist.bad_counts)[0]


def test_wrong_quiet_count() -> None:
    h = clean()
    h.quiet_counts["g"] = (0, 1)
    assert "once quiet" in only(h, hist.bad_counts)[0]


def test_parse_time() -> None:
    assert hist.parse_time("2027-01-15T08:00:00.000Z") == pytest.approx(
        1_800_000_000.0 - 1_800_000_000.0 % 1 + 0.0, abs=3e7
    )
    assert hist.parse_time("yesterday") is None
    assert hist.parse_time(12) is None
