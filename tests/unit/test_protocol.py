"""Client frame parsing and the wire formats (protocol.md, docs/protocol.md).

Every client frame of the contract parses into its model; anything else (not JSON, not UTF-8, not
an object, unknown type, missing or extra fields, wrong types, ids that are empty, too long or
carry control characters) is a `FrameError`, which the session answers with `bad_frame`.
"""

from __future__ import annotations

import contextlib
import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.contract import iso_ms
from edge import protocol as p

VALID: list[tuple[dict[str, Any], type]] = [
    ({"type": "identify", "token": "abc.def.ghi"}, p.IdentifyFrame),
    ({"type": "heartbeat"}, p.HeartbeatFrame),
    ({"type": "presence.update", "status": "online"}, p.PresenceUpdateFrame),
    ({"type": "presence.update", "status": "idle"}, p.PresenceUpdateFrame),
    ({"type": "presence.update", "status": "dnd"}, p.PresenceUpdateFrame),
    ({"type": "presence.update", "status": "invisible"}, p.PresenceUpdateFrame),
    ({"type": "presence.subscribe", "userIds": ["u1", "u2"]}, p.PresenceSubscribeFrame),
    ({"type": "presence.subscribe", "userIds": []}, p.PresenceSubscribeFrame),
    ({"type": "presence.unsubscribe", "userIds": ["u1"]}, p.PresenceUnsubscribeFrame),
    ({"type": "presence.query", "userIds": ["u1"]}, p.PresenceQueryFrame),
    ({"type": "focus", "channelId": "c1"}, p.FocusFrame),
    ({"type": "focus", "channelId": None}, p.FocusFrame),
    ({"type": "channel.subscribe", "channelId": "c1"}, p.ChannelSubscribeFrame),
    ({"type": "channel.unsubscribe", "channelId": "c1"}, p.ChannelUnsubscribeFrame),
    ({"type": "typing.start", "channelId": "c1"}, p.TypingStartFrame),
    ({"type": "typing.stop", "channelId": "c1"}, p.TypingStopFrame),
    ({"type": "voice.join", "channelId": "c1"}, p.VoiceJoinFrame),
    ({"type": "voice.leave"}, p.VoiceLeaveFrame),
    ({"type": "settings.update", "lastSeenVisibility": "everyone"}, p.SettingsUpdateFrame),
    ({"type": "settings.update", "lastSeenVisibility": "friends"}, p.SettingsUpdateFrame),
    ({"type": "settings.update", "lastSeenVisibility": "nobody"}, p.SettingsUpdateFrame),
]


@pytest.mark.parametrize(
    ("frame", "model"), VALID, ids=[f"{f['type']}-{i}" for i, (f, _) in enumerate(VALID)]
)
def test_every_client_frame_parses(frame: dict[str, Any], model: type) -> None:
    raw = json.dumps(frame)
    for form in (raw, raw.encode()):  # binary frames are parsed like text frames
        parsed = p.parse_client_frame(form)
        assert type(parsed) is model
        assert parsed.model_dump() == frame


def test_every_contract_frame_type_is_covered() -> None:
    contract = {
        "identify",
        "heartbeat",
        "presence.update",
        "presence.subscribe",
        "presence.unsubscribe",
        "presence.query",
        "focus",
        "channel.subscribe",
        "channel.unsubscribe",
        "typing.start",
        "typing.stop",
        "voice.join",
        "voice.leave",
        "settings.update",
    }
    assert {f["type"] for f, _ in VALID} == contract
    assert {m.model_fields["type"].annotation.__args__[0] for m in p.CLIENT_FRAMES} == contract  # type: ignore[union-attr]
    assert set(p.CLIENT_FRAME_TYPES) == contract  # the edge's counters by type (edge/server.py)


@pytest.mark.parametrize(
    "raw",
    [
        '{"type":"heartbeat"}',
        '{"type": "heartbeat"}',
        ' {"type":"heartbeat"} ',
        '{ "type" : "heartbeat" }',
        b'{"type":"heartbeat"}',
    ],
)
def test_heartbeat_spellings(raw: str | bytes) -> None:
    assert isinstance(p.parse_client_frame(raw), p.HeartbeatFrame)


@pytest.mark.parametrize("raw", sorted(p.FAST_FRAMES))
def test_a_frame_recognised_by_its_text_is_what_the_validator_makes_of_it(raw: str) -> None:
    """The frames taken on the shortest road (heartbeats, status changes) are exactly what the
    full validator returns for the same text."""
    assert p.parse_client_frame(raw) == p.CLIENT_FRAME.validate_json(raw)
    assert p.parse_client_frame(raw.encode()) == p.CLIENT_FRAME.validate_json(raw)


BAD: list[str | bytes] = [
    # not JSON, not UTF-8, not an object
    "",
    "{",
    "heartbeat",
    "{'type': 'heartbeat'}",
    "[]",
    "null",
    "42",
    '"heartbeat"',
    b"\xff\xfe\x00",
    b'{"type":"typing.start","channelId":"\xc3"}',
    # no type, unknown type, type of the wrong kind
    "{}",
    '{"type":"presence.unknown"}',
    '{"type":"ready"}',
    '{"type":"heartbeat.ack"}',
    '{"type":1}',
    '{"type":null}',
    '{"type":"HEARTBEAT"}',
    # extra fields (the account id comes from the token, never from a frame)
    '{"type":"heartbeat","x":1}',
    '{"type":"identify","token":"t","userId":"u1"}',
    '{"type":"voice.leave","channelId":"c1"}',
    # missing fields
    '{"type":"identify"}',
    '{"type":"presence.update"}',
    '{"type":"presence.subscribe"}',
    '{"type":"focus"}',
    '{"type":"typing.start"}',
    '{"type":"settings.update"}',
    # wrong types and values
    '{"type":"presence.update","status":"offline"}',
    '{"type":"presence.update","status":"Online"}',
    '{"type":"presence.update","status":1}',
    '{"type":"presence.subscribe","userIds":"u1"}',
    '{"type":"presence.subscribe","userIds":["u1",2]}',
    '{"type":"presence.subscribe","userIds":[null]}',
    '{"type":"presence.subscribe","userIds":{"u1":true}}',
    '{"type":"presence.query","userIds":[["u1"]]}',
    '{"type":"channel.subscribe","channelId":7}',
    '{"type":"channel.subscribe","channelId":null}',
    '{"type":"channel.subscribe","channelId":true}',
    '{"type":"settings.update","lastSeenVisibility":"all"}',
    '{"type":"identify","token":""}',
    '{"type":"identify","token":5}',
    # bad ids: empty, too long, control characters
    '{"type":"presence.subscribe","userIds":[""]}',
    json.dumps({"type": "presence.query", "userIds": ["x" * 129]}),
    json.dumps({"type": "channel.subscribe", "channelId": "c" * 129}),
    json.dumps({"type": "focus", "channelId": ""}),
    json.dumps({"type": "typing.start", "channelId": "a\nb"}),
    json.dumps({"type": "typing.start", "channelId": "ab\n"}),
    json.dumps({"type": "voice.join", "channelId": "\x00"}),
    json.dumps({"type": "presence.subscribe", "userIds": ["ok", "tab\there"]}),
    json.dumps({"type": "presence.subscribe", "userIds": ["del\x7f"]}),
    json.dumps({"type": "presence.subscribe", "userIds": ["\x1f"]}),
    # absurd lists
    json.dumps({"type": "presence.subscribe", "userIds": ["u"] * (p.MAX_LIST + 1)}),
    # an over-long token
    json.dumps({"type": "identify", "token": "t" * 4097}),
    # lone surrogate
    '{"type":"typing.start","channelId":"\\ud800"}',
]


@pytest.mark.parametrize("raw", BAD, ids=[f"bad-{i}" for i in range(len(BAD))])
def test_bad_frames_raise_frame_error(raw: str | bytes) -> None:
    with pytest.raises(p.FrameError) as e:
        p.parse_client_frame(raw)
    assert isinstance(e.value, ValueError)
    assert 0 < len(str(e.value)) <= 200


def test_error_messages_say_what_is_wrong() -> None:
    def msg(raw: str | bytes) -> str:
        with pytest.raises(p.FrameError) as e:
            p.parse_client_frame(raw)
        return str(e.value)

    assert msg("{") == "frame is not valid JSON"
    assert msg('{"type":"nope"}') == "unknown frame type"
    assert msg("{}") == "frame has no type"
    assert "status" in msg('{"type":"presence.update","status":"offline"}')


def test_error_messages_do_not_echo_input() -> None:
    secret = "s3cr3t-token-value"
    with pytest.raises(p.FrameError) as e:
        p.parse_client_frame(json.dumps({"type": "identify", "token": secret, "extra": secret}))
    assert secret not in str(e.value)


@pytest.mark.parametrize("n", [1, 127, 128])
def test_id_lengths_accepted(n: int) -> None:
    assert p.parse_client_frame(json.dumps({"type": "channel.subscribe", "channelId": "c" * n}))


@pytest.mark.parametrize("cid", ["é", "日本語", "a b", "emoji-😀", "#general", "x/y:z"])
def test_printable_unicode_ids_accepted(cid: str) -> None:
    frame = p.parse_client_frame(json.dumps({"type": "voice.join", "channelId": cid}))
    assert frame.channelId == cid  # type: ignore[union-attr]


@pytest.mark.parametrize("cid", ["a\x85b", "\x9b31m", "\x80", "\x9f", "line\u2028sep", "para\u2029sep"])
def test_c1_controls_and_unicode_line_separators_are_refused(cid: str) -> None:
    """No control characters: C1 (U+0080-U+009F, e.g. NEL and CSI) too, and no line separators."""
    with pytest.raises(p.FrameError):
        p.parse_client_frame(json.dumps({"type": "channel.subscribe", "channelId": cid}))
    with pytest.raises(p.FrameError):
        p.parse_client_frame(json.dumps({"type": "presence.subscribe", "userIds": ["ok", cid]}))


@pytest.mark.parametrize("cid", ["\xa0nbsp", "\xa1", "\u2027", "\u2030", "\u200a"])
def test_neighbours_of_the_forbidden_ranges_pass(cid: str) -> None:
    assert p.parse_client_frame(json.dumps({"type": "channel.subscribe", "channelId": cid}))


@pytest.mark.parametrize("cid", ["a\u200bb", "admin\u202e", "\u2066x", "\ufeffx", "a\u00adb", "x\U000e0041"])
def test_format_characters_break_the_id_rule(cid: str) -> None:
    """Zero-width and bidirectional-override characters spoof names in rosters: `bad_frame`."""
    with pytest.raises(p.FrameError, match="id"):
        p.parse_client_frame(json.dumps({"type": "voice.join", "channelId": cid}))
    with pytest.raises(p.FrameError):
        p.parse_client_frame(json.dumps({"type": "presence.query", "userIds": ["ok", cid]}))


def test_frames_are_immutable() -> None:
    frame = p.parse_client_frame('{"type":"presence.subscribe","userIds":["a"]}')
    with pytest.raises(ValueError):
        frame.userIds = ["b"]  # type: ignore[misc, union-attr]


@given(st.binary(max_size=64) | st.text(max_size=64))
def test_any_input_parses_or_raises_frame_error(raw: str | bytes) -> None:
    """Nothing a client sends makes the parser fail any other way."""
    with contextlib.suppress(p.FrameError):
        p.parse_client_frame(raw)


# ---------------------------------------------------------------------------- times

ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.mark.parametrize(
    ("ts", "text"),
    [
        (datetime(2026, 12, 2, 8, 47, tzinfo=UTC).timestamp() + 0.123, "2026-12-02T08:47:00.123Z"),
        (datetime(2026, 12, 2, 8, 47, tzinfo=UTC).timestamp(), "2026-12-02T08:47:00.000Z"),
        (0.0, "1970-01-01T00:00:00.000Z"),
        (1_800_000_000.5, "2027-01-15T08:00:00.500Z"),
        (1_800_000_000.0004, "2027-01-15T08:00:00.000Z"),
        (1_800_000_059.9996, "2027-01-15T08:01:00.000Z"),  # rounds to the millisecond, carrying over
    ],
)
def test_iso_ms(ts: float, text: str) -> None:
    assert iso_ms(ts) == text


@given(st.floats(0, 4_102_444_800))
def test_iso_ms_shape_and_round_trip(ts: float) -> None:
    text = iso_ms(ts)
    assert ISO.match(text), text
    back = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    assert abs(back - ts) <= 0.0005 + 1e-6


# ---------------------------------------------------------------------------- server frames


@pytest.mark.parametrize(
    ("model", "frame"),
    [
        (
            p.Ready,
            {
                "type": "ready",
                "userId": "u1",
                "socketId": "s-1",
                "status": "invisible",
                "heartbeatIntervalMs": 30000,
            },
        ),
        (p.HeartbeatAck, {"type": "heartbeat.ack"}),
        (p.PresenceSync, {"type": "presence.sync", "users": [{"userId": "u1", "status": "offline"}]}),
        (p.PresenceChanged, {"type": "presence.changed", "userId": "u1", "status": "idle"}),
        (
            p.PresenceChanged,
            {
                "type": "presence.changed",
                "userId": "u1",
                "status": "offline",
                "lastSeenAt": "2026-12-02T08:47:00.000Z",
            },
        ),
        (p.PresenceSelf, {"type": "presence.self", "status": "dnd"}),
        (p.TypingEvent, {"type": "typing", "channelId": "c1", "userId": "u1"}),
        (p.VoiceRoster, {"type": "voice.roster", "channelId": "c1", "userIds": ["u1"]}),
        (p.Error, {"type": "error", "code": "rate_limited", "message": "slow down"}),
    ],
)
def test_server_frame_models_accept_the_contracts_frames(model: type, frame: dict[str, Any]) -> None:
    assert model.model_validate(frame).model_dump(exclude_none=True) == frame  # type: ignore[attr-defined]


@pytest.mark.parametrize("code", ["bad_frame", "too_many_ids", "rate_limited", "not_allowed"])
def test_error_codes(code: str) -> None:
    assert p.Error(code=code, message="m")  # type: ignore[arg-type]


def test_error_codes_are_closed() -> None:
    with pytest.raises(ValueError):
        p.Error(code="oops", message="m")  # type: ignore[arg-type]


def test_close_codes_fixed_by_the_contract() -> None:
    assert (p.CLOSE_AUTH, p.CLOSE_POLICY, p.CLOSE_TOO_BIG) == (4001, 1008, 1009)
