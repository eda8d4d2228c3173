"""The per-socket state machine (no I/O): authentication, limits, frames → commands.

protocol.md: authenticate within 10 s (header or first `identify` frame) or be closed with 4001;
a bad or expired token closes with 4001; the account comes from the token only; a refused frame
is answered with an error and the socket stays open; too_many_ids over 100 query ids or past the
subscription cap; rate_limited, and 1008 for sustained floods; voice.join leaves any other roster.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jwt
import pytest

from actors.core import ops
from actors.core.answers import Connected, Shown, Verdict
from edge import protocol as p
from edge.session import (
    BAD_TOKEN,
    IDENTIFY_DEADLINE,
    Charged,
    Close,
    Command,
    Limits,
    Reply,
    Session,
    TokenBucket,
    new_socket_id,
)
from edge.tokens import mint_token

from .conftest import T0

SECRET = "session-test-secret-long-enough-for-hs256"


def token(user: str = "u1", ttl: int = 3600, now: float = T0, secret: str = SECRET) -> str:
    return mint_token(user, secret, ttl_s=ttl, now=now)


def frame(**fields: Any) -> str:
    return json.dumps(fields)


def identify(tok: str) -> str:
    return frame(type="identify", token=tok)


def authed(limits: Limits | None = None, user: str = "u1") -> Session:
    s = Session(secret=SECRET, now=T0, limits=limits or Limits())
    assert s.receive(identify(token(user)), T0) == [ops.Connect(user, s.socket_id)]
    s.connected(Connected("online", "everyone"))
    return s


def watched(cmds: list[Command]) -> tuple[str, ...]:
    """The ids of the one subscription `cmds` asks for (a Watch, charged first)."""
    (cmd,) = cmds
    assert isinstance(cmd, Charged) and isinstance(cmd.op, ops.Watch) and not cmd.together
    return cmd.op.targets


def unwatched(cmds: list[Command]) -> tuple[str, ...]:
    (cmd,) = cmds
    assert isinstance(cmd, ops.Unwatch)
    return cmd.targets


def charged_query(s: Session, ids: tuple[str, ...], visibility: str) -> Charged:
    assert s.user_id is not None
    return Charged(
        ops.Spend(s.user_id, "lookups", len(ids)), ops.Query(s.user_id, visibility, ids), together=True
    )


def errors(cmds: list[Command]) -> list[str]:
    return [c.frame["code"] for c in cmds if isinstance(c, Reply) and c.frame.get("type") == "error"]


def is_close(cmds: list[Command], code: int) -> bool:
    return len(cmds) == 1 and isinstance(cmds[0], Close) and cmds[0].code == code


# ---------------------------------------------------------------------------- authentication


class TestIdentify:
    def test_identify_frame(self) -> None:
        s = Session(secret=SECRET, now=T0)
        assert not s.authenticated
        assert s.receive(identify(token("alice")), T0 + 1) == [ops.Connect("alice", s.socket_id)]
        assert s.authenticated and s.user_id == "alice"

    def test_ready_frame(self) -> None:
        s = authed()
        ready = s.connected(Connected("invisible", "nobody")).frame
        assert ready == {
            "type": "ready",
            "userId": "u1",
            "socketId": s.socket_id,
            "status": "invisible",  # the real status, to the account itself
            "heartbeatIntervalMs": 30_000,
        }
        assert p.Ready.model_validate(ready)
        assert s.visibility == "nobody"

    def test_socket_ids_are_unique(self) -> None:
        ids = {new_socket_id() for _ in range(1000)}
        assert len(ids) == 1000
        assert all(i.startswith("s-") for i in ids)
        assert Session(secret=SECRET, now=T0).socket_id != Session(secret=SECRET, now=T0).socket_id

    @pytest.mark.parametrize("header", ["Bearer {t}", "bearer {t}", "BEARER {t}", "Bearer   {t}  "])
    def test_header(self, header: str) -> None:
        s = Session(secret=SECRET, now=T0)
        assert s.authenticate_header(header.format(t=token("bob")), T0) == [ops.Connect("bob", s.socket_id)]
        assert s.user_id == "bob"

    def test_no_header_waits_for_identify(self) -> None:
        s = Session(secret=SECRET, now=T0)
        assert s.authenticate_header(None, T0) == []
        assert s.authenticate_header("", T0) == []
        assert not s.authenticated

    def test_every_authorization_line_is_read_and_two_are_a_refused_token(self) -> None:
        one = Session(secret=SECRET, now=T0)
        assert one.authenticate_headers([f"Bearer {token('bob')}"], T0) == [ops.Connect("bob", one.socket_id)]
        assert Session(secret=SECRET, now=T0).authenticate_headers([], T0) == []
        two = Session(secret=SECRET, now=T0)
        both = [f"Bearer {token('bob')}", f"Bearer {token('carol')}"]
        assert two.authenticate_headers(both, T0) == [Close(4001, BAD_TOKEN)]
        assert not two.authenticated

    @pytest.mark.parametrize("header", ["Basic dTE6cHc=", "Bearer", "Bearer ", "Token abc", "{t}"])
    def test_malformed_header_closes_4001(self, header: str) -> None:
        s = Session(secret=SECRET, now=T0)
        assert is_close(s.authenticate_header(header.format(t=token()), T0), 4001)
        assert not s.authenticated

    @pytest.mark.parametrize(
        "tok",
        [
            token(secret="another-secret-that-is-long-enough-too"),  # other key
            token(ttl=60, now=T0 - 120),  # expired
            "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJ1MSIsImV4cCI6OTk5OTk5OTk5OX0.",  # alg none
            "not-a-token",
        ],
        ids=["other-key", "expired", "alg-none", "garbage"],
    )
    def test_bad_tokens_close_4001(self, tok: str) -> None:
        s = Session(secret=SECRET, now=T0)
        assert is_close(s.receive(identify(tok), T0), 4001)
        assert not s.authenticated
        s = Session(secret=SECRET, now=T0)
        assert is_close(s.authenticate_header(f"Bearer {tok}", T0), 4001)
        assert not s.authenticated

    @pytest.mark.parametrize(
        "tok",
        [
            token(secret="another-secret-that-is-long-enough-too"),
            token(ttl=60, now=T0 - 120),
            token(ttl=10 * 86400),  # lives too long
            jwt.encode({"sub": "bad\u200bid", "exp": int(T0) + 3600}, SECRET, algorithm="HS256"),
            "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJ1MSIsImV4cCI6OTk5OTk5OTk5OX0.",
            "not-a-token",
        ],
        ids=["other-key", "expired", "too-long-lived", "bad-sub", "alg-none", "garbage"],
    )
    def test_the_close_reason_says_bad_token_and_not_which_check_failed(self, tok: str) -> None:
        """Issue 29: the reason used to be the verifier's message (expired, signature, ...)."""
        for commands in (
            Session(secret=SECRET, now=T0).receive(identify(tok), T0),
            Session(secret=SECRET, now=T0).authenticate_header(f"Bearer {tok}", T0),
            Session(secret=SECRET, now=T0).authenticate_header("Token abc", T0),
        ):
            assert commands == [Close(4001, "bad token")]

    def test_token_expiring_during_the_wait(self) -> None:
        tok = token(ttl=5, now=T0)
        s = Session(secret=SECRET, now=T0)
        assert is_close(s.receive(identify(tok), T0 + 5), 4001)

    @pytest.mark.parametrize(
        "first",
        [
            frame(type="heartbeat"),
            frame(type="presence.subscribe", userIds=["u2"]),
            "not json",
            b"\xff",
            frame(type="identify", token=token(), userId="u2"),
            frame(type="identify"),
        ],
    )
    def test_first_frame_must_be_identify(self, first: str | bytes) -> None:
        s = Session(secret=SECRET, now=T0)
        assert is_close(s.receive(first, T0), 4001)
        assert not s.authenticated

    @pytest.mark.parametrize(
        "first",
        [
            frame(type="identify", token=token(), userId="u2"),
            frame(type="identify"),
            frame(type="identify", token=5),
            frame(type="identify", token="x" * 5000),
        ],
        ids=["a-field-beside-it", "no-token", "not-a-string", "over-4096"],
    )
    def test_an_identify_that_cannot_be_read_is_a_refused_token(self, first: str) -> None:
        """protocol.md: every refused token closes 4001 `bad token`; before, an identify whose token
        failed the frame's own checks closed as if it were no identify."""
        assert Session(secret=SECRET, now=T0).receive(first, T0) == [Close(4001, "bad token")]

    @pytest.mark.parametrize("first", [frame(type="heartbeat"), "not json", frame(type="nope")])
    def test_a_first_frame_that_is_no_identify_says_so(self, first: str) -> None:
        assert Session(secret=SECRET, now=T0).receive(first, T0) == [
            Close(4001, "the first frame must be identify")
        ]

    def test_identify_timeout(self) -> None:
        s = Session(secret=SECRET, now=T0)
        assert s.deadline() == T0 + 10
        assert s.expired(T0 + 9.999) is None
        # Its own reason, not BAD_TOKEN: the clients reconnect as usual on it (the token is fine).
        assert s.expired(T0 + 10) == Close(4001, IDENTIFY_DEADLINE)

    def test_identify_timeout_is_configurable(self) -> None:
        s = Session(secret=SECRET, now=T0, limits=Limits(identify_timeout_s=2))
        assert s.expired(T0 + 2) == Close(4001, s.expired(T0 + 2).reason)  # type: ignore[union-attr]

    def test_second_identify_is_bad_frame_and_keeps_the_account(self) -> None:
        s = authed()
        cmds = s.receive(identify(token("mallory")), T0)
        assert errors(cmds) == ["bad_frame"]
        assert s.user_id == "u1"


class TestLiveness:
    def test_silent_socket_closed_after_90s(self) -> None:
        s = authed()
        assert s.deadline() == T0 + 90
        assert s.expired(T0 + 89.9) is None
        c = s.expired(T0 + 90)
        assert isinstance(c, Close) and c.code == p.CLOSE_SILENT

    def test_any_frame_refreshes_liveness(self) -> None:
        s = authed()
        for i, raw in enumerate([frame(type="heartbeat"), "garbage", frame(type="focus", channelId=None)]):
            s.receive(raw, T0 + 60 * (i + 1))
            assert s.deadline() == T0 + 60 * (i + 1) + 90
        assert s.expired(T0 + 200) is None


# ---------------------------------------------------------------------------- frames


class TestFrames:
    def test_heartbeat(self) -> None:
        s = authed()
        assert s.receive(frame(type="heartbeat"), T0) == [Reply({"type": "heartbeat.ack"})]
        assert s.receive(b'{"type":"heartbeat"}', T0) == [Reply({"type": "heartbeat.ack"})]

    @pytest.mark.parametrize(
        "raw",
        [
            "not json",
            b"\xc3\x28",
            "[]",
            frame(type="nope"),
            frame(type="heartbeat", x=1),
            frame(type="presence.subscribe", userIds=[""]),
            frame(type="presence.query", userIds=["x" * 129]),
            frame(type="typing.start", channelId="a\x00b"),
            frame(type="focus", channelId="\x1b[31m"),
            frame(type="presence.update", status="offline"),
        ],
    )
    def test_bad_frame_keeps_the_socket(self, raw: str | bytes) -> None:
        s = authed()
        cmds = s.receive(raw, T0)
        assert errors(cmds) == ["bad_frame"]
        assert not any(isinstance(c, Close) for c in cmds)
        assert s.receive(frame(type="heartbeat"), T0) == [Reply({"type": "heartbeat.ack"})]

    def test_bad_frame_message_is_a_string(self) -> None:
        (reply,) = authed().receive("{", T0)
        assert isinstance(reply, Reply)
        assert p.Error.model_validate(reply.frame)

    @pytest.mark.parametrize("status", ["online", "idle", "dnd", "invisible"])
    def test_presence_update(self, status: str) -> None:
        s = authed()
        assert s.receive(frame(type="presence.update", status=status), T0) == [
            ops.SetStatus("u1", s.socket_id, status)
        ]

    def test_idle_flag_follows_idle_and_online_only(self) -> None:
        s = authed()
        s.receive(frame(type="presence.update", status="idle"), T0)
        assert s.idle
        s.receive(frame(type="presence.update", status="dnd"), T0)
        assert s.idle, "dnd chooses for the account; it does not wake this socket"
        s.receive(frame(type="presence.update", status="online"), T0)
        assert not s.idle

    def test_focus(self) -> None:
        s = authed()
        assert s.receive(frame(type="focus", channelId="c1"), T0) == [ops.Focus("u1", s.socket_id, "c1")]
        assert s.focus == "c1"
        assert s.receive(frame(type="focus", channelId=None), T0) == [ops.Focus("u1", s.socket_id, None)]
        assert s.focus is None

    def test_settings_update_applies_to_the_next_query(self) -> None:
        s = authed()
        assert s.receive(frame(type="settings.update", lastSeenVisibility="nobody"), T0) == [
            ops.Settings("u1", "nobody")
        ]
        assert s.receive(frame(type="presence.query", userIds=["u2"]), T0) == [
            charged_query(s, ("u2",), "nobody")
        ]


class TestSubscriptions:
    def test_subscribe_dedupes_and_answers_every_id_of_the_frame(self) -> None:
        s = authed()
        assert watched(s.receive(frame(type="presence.subscribe", userIds=["a", "b", "a"]), T0)) == ("a", "b")
        assert watched(s.receive(frame(type="presence.subscribe", userIds=["b", "c"]), T0)) == ("b", "c")
        assert s.subscriptions == {"a", "b", "c"}

    def test_unsubscribe_only_what_is_subscribed(self) -> None:
        s = authed()
        s.receive(frame(type="presence.subscribe", userIds=["a", "b"]), T0)
        assert unwatched(s.receive(frame(type="presence.unsubscribe", userIds=["b", "z", "b"]), T0)) == ("b",)
        assert s.receive(frame(type="presence.unsubscribe", userIds=["z"]), T0) == []
        assert s.subscriptions == {"a"}

    def test_subscription_cap_refuses_the_whole_frame(self) -> None:
        s = authed(Limits(max_subscriptions=5))
        assert watched(s.receive(frame(type="presence.subscribe", userIds=["a", "b", "c", "d"]), T0)) == (
            "a",
            "b",
            "c",
            "d",
        )
        assert errors(s.receive(frame(type="presence.subscribe", userIds=["e", "f"]), T0)) == ["too_many_ids"]
        assert s.subscriptions == {"a", "b", "c", "d"}, "nothing of a refused frame applies"
        # Ids already subscribed do not count again; exactly at the cap is fine.
        assert watched(s.receive(frame(type="presence.subscribe", userIds=["a", "b", "e"]), T0)) == (
            "a",
            "b",
            "e",
        )
        assert errors(s.receive(frame(type="presence.subscribe", userIds=["f"]), T0)) == ["too_many_ids"]
        # Unsubscribing makes room.
        s.receive(frame(type="presence.unsubscribe", userIds=["a"]), T0)
        assert watched(s.receive(frame(type="presence.subscribe", userIds=["f"]), T0)) == ("f",)

    def test_default_cap(self) -> None:
        s = authed()
        ids = [f"u{i}" for i in range(1000)]
        assert watched(s.receive(frame(type="presence.subscribe", userIds=ids), T0 + 10)) == tuple(ids)
        assert errors(s.receive(frame(type="presence.subscribe", userIds=["one-more"]), T0 + 10)) == [
            "too_many_ids"
        ]

    def test_query_at_most_100_ids(self) -> None:
        s = authed()
        ids = [f"u{i}" for i in range(100)]
        assert s.receive(frame(type="presence.query", userIds=ids), T0) == [
            charged_query(s, tuple(ids), "everyone")
        ]
        cmds = s.receive(frame(type="presence.query", userIds=[*ids, "u100"]), T0)
        assert errors(cmds) == ["too_many_ids"]
        assert not any(isinstance(c, Charged) for c in cmds)

    def test_query_dedupes_in_order(self) -> None:
        s = authed()
        assert s.receive(frame(type="presence.query", userIds=["b", "a", "b"]), T0) == [
            charged_query(s, ("b", "a"), "everyone")
        ]


class TestChannels:
    @pytest.mark.parametrize(
        ("frame_type", "operation"),
        [
            ("channel.subscribe", lambda sid: ops.ChannelSubscribe("c1", "u1", sid)),
            ("channel.unsubscribe", lambda sid: ops.ChannelUnsubscribe("c1", sid)),
            ("typing.start", lambda sid: ops.TypingStart("c1", "u1")),
            ("typing.stop", lambda sid: ops.TypingStop("c1", "u1")),
            ("voice.join", lambda sid: ops.VoiceJoin("c1", "u1", sid, own=True)),
        ],
    )
    def test_channel_frames(self, frame_type: str, operation: Callable[[str], ops.ChannelOp]) -> None:
        s = authed()
        assert s.receive(frame(type=frame_type, channelId="c1"), T0) == [operation(s.socket_id)]

    def test_subscribe_recorded_only_when_allowed(self) -> None:
        s = authed()
        (cmd,) = s.receive(frame(type="channel.subscribe", channelId="c1"), T0)
        assert isinstance(cmd, ops.ChannelSubscribe)
        assert errors(s.channel_result(cmd, Verdict.NOT_ALLOWED)) == ["not_allowed"]
        assert s.channels == set()
        assert s.channel_result(cmd, Verdict.ALLOWED) == []
        assert s.channels == {"c1"}
        s.receive(frame(type="channel.unsubscribe", channelId="c1"), T0)
        assert s.channels == set()

    @pytest.mark.parametrize("kind", ["typing.start", "voice.join"])
    def test_not_allowed(self, kind: str) -> None:
        s = authed()
        (cmd,) = s.receive(frame(type=kind, channelId="c1"), T0)
        assert errors(s.channel_result(cmd, Verdict.NOT_ALLOWED)) == ["not_allowed"]
        assert s.voice_channel is None

    def test_voice_join_of_another_channel_leaves_the_old_one(self) -> None:
        s = authed()
        (join,) = s.receive(frame(type="voice.join", channelId="c1"), T0)
        s.channel_result(join, Verdict.ALLOWED)
        assert s.voice_channel == "c1"
        (join2,) = s.receive(frame(type="voice.join", channelId="c2"), T0)
        assert join2 == ops.VoiceJoin("c2", "u1", s.socket_id, own=True)
        # The old roster is left once the new join is accepted.
        assert s.channel_result(join2, Verdict.ALLOWED) == [ops.VoiceLeave("c1", s.socket_id)]
        assert s.voice_channel == "c2"
        assert s.channel_result(ops.VoiceLeave("c1", s.socket_id), None) == []
        assert s.voice_channel == "c2"
        # Joining the same channel again leaves nothing.
        assert s.receive(frame(type="voice.join", channelId="c2"), T0) == [
            ops.VoiceJoin("c2", "u1", s.socket_id, own=True)
        ]

    @pytest.mark.parametrize("verdict", [Verdict.NOT_ALLOWED, Verdict.RATE_LIMITED])
    def test_a_refused_voice_join_leaves_the_socket_in_its_roster(self, verdict: Verdict) -> None:
        s = authed()
        (join,) = s.receive(frame(type="voice.join", channelId="c1"), T0)
        s.channel_result(join, Verdict.ALLOWED)
        (refused,) = s.receive(frame(type="voice.join", channelId="c2"), T0)
        answer = s.channel_result(refused, verdict)
        assert errors(answer) == ["not_allowed" if verdict is Verdict.NOT_ALLOWED else "rate_limited"]
        assert not any(isinstance(c, ops.VoiceLeave) for c in answer)
        assert s.voice_channel == "c1"

    def test_voice_leave(self) -> None:
        s = authed()
        assert s.receive(frame(type="voice.leave"), T0) == []
        (join,) = s.receive(frame(type="voice.join", channelId="c1"), T0)
        s.channel_result(join, Verdict.ALLOWED)
        (leave,) = s.receive(frame(type="voice.leave"), T0)
        assert leave == ops.VoiceLeave("c1", s.socket_id)
        s.channel_result(leave, Verdict.ALLOWED)
        assert s.voice_channel is None

    def test_touched_channels(self) -> None:
        s = authed()
        for c in ("c3", "c1"):
            (cmd,) = s.receive(frame(type="channel.subscribe", channelId=c), T0)
            s.channel_result(cmd, Verdict.ALLOWED)
        (join,) = s.receive(frame(type="voice.join", channelId="c2"), T0)
        s.channel_result(join, Verdict.ALLOWED)
        assert s.touched_channels() == ["c1", "c2", "c3"]


# ---------------------------------------------------------------------------- rate limits


class TestRateLimit:
    def test_burst_then_rate_limited_then_1008(self) -> None:
        s = authed()
        hb = frame(type="heartbeat")
        for _ in range(59):  # the burst of 60, less the identify frame
            assert s.receive(hb, T0) == [Reply({"type": "heartbeat.ack"})]
        replies = [s.receive(hb, T0) for _ in range(99)]
        assert errors(replies[0]) == ["rate_limited"]
        assert all(not any(isinstance(c, Close) for c in r) for r in replies), (
            "the socket stays open meanwhile"
        )
        # Not one error per refused frame (that would be a flood of our own).
        assert sum(len(errors(r)) for r in replies) <= 6
        assert is_close(s.receive(hb, T0), 1008)

    def test_pings_share_the_bucket_and_a_ping_flood_is_closed_1008(self) -> None:
        """A ping or pong is a frame: charged like any (a ping flood was answered without limit)."""
        s = authed()
        assert [s.control(T0) for _ in range(59)] == [[]] * 59  # the burst, less the identify
        assert all(s.control(T0) == [] for _ in range(99)), "answered, never an error frame"
        assert s.control(T0) == [Close(1008, "sustained flood")]
        # Pings spend what frames would use: a heartbeat now is refused too.
        t = authed()
        for _ in range(59):
            t.control(T0)
        assert errors(t.receive(frame(type="heartbeat"), T0)) == ["rate_limited"]

    def test_a_ping_keeps_the_socket_alive(self) -> None:
        """protocol.md: any frame refreshes the socket's liveness (a client whose library pings
        for it, sending no heartbeat, was closed 4000 after 90 s)."""
        s = authed(Limits(socket_timeout_s=90))
        assert s.deadline() == T0 + 90
        s.control(T0 + 60)
        assert s.deadline() == T0 + 150
        assert s.expired(T0 + 120) is None

    def test_refill_at_the_configured_rate(self) -> None:
        s = authed(Limits(rate_per_s=20, rate_burst=60))
        for _ in range(59):  # identify took one
            s.receive(frame(type="heartbeat"), T0)
        assert errors(s.receive(frame(type="heartbeat"), T0)) == ["rate_limited"]
        # 1 s later: 20 more frames pass.
        passed = sum(
            s.receive(frame(type="heartbeat"), T0 + 1) == [Reply({"type": "heartbeat.ack"})]
            for _ in range(30)
        )
        assert passed == 20

    def test_a_burst_that_calms_down_is_not_closed(self) -> None:
        s = authed()
        now = T0
        for _ in range(10):
            for _ in range(80):  # 60 pass, 20 refused
                assert not is_close(s.receive(frame(type="heartbeat"), now), 1008)
            now += 10  # then quiet: the bucket refills
        assert s.receive(frame(type="heartbeat"), now) == [Reply({"type": "heartbeat.ack"})]

    def test_within_the_rate_forever(self) -> None:
        s = authed()
        for i in range(2000):  # 20 frames/s for 100 s
            assert s.receive(frame(type="heartbeat"), T0 + i / 20) == [Reply({"type": "heartbeat.ack"})]

    def test_refused_frames_are_not_parsed_or_acted_upon(self) -> None:
        s = authed(Limits(rate_burst=1, rate_per_s=0.001))  # identify took the only token
        assert errors(s.receive(frame(type="presence.subscribe", userIds=["x"]), T0)) == ["rate_limited"]
        assert s.subscriptions == set()


def test_token_bucket() -> None:
    b = TokenBucket(rate_per_s=2, burst=3, tokens=3, at=T0)
    assert [b.take(T0) for _ in range(4)] == [True, True, True, False]
    assert b.take(T0 + 0.5)  # one token back after half a second
    assert not b.take(T0 + 0.5)
    assert [b.take(T0 + 100) for _ in range(4)] == [True, True, True, False], "never above the burst"
    assert not b.take(T0 + 50), "a clock going backwards adds nothing"


# ---------------------------------------------------------------------------- the socket's view


def test_view_drops_repeats_and_forgets_unsubscribed_accounts() -> None:
    s = authed()
    s.receive(frame(type="presence.subscribe", userIds=["a", "b"]), T0)
    s.synced([Shown("a", "online"), Shown("b", "offline")])
    assert not s.tell("a", "online")  # already shown: noise
    assert s.tell("a", "dnd")
    assert not s.tell("a", "dnd")
    s.receive(frame(type="presence.unsubscribe", userIds=["a"]), T0)
    assert "a" not in s.view
    assert s.tell("zzz", "online")  # not watched: not part of the view, never held back


def test_differences_bring_the_view_to_a_fresh_answer() -> None:
    s = authed()
    s.receive(frame(type="presence.subscribe", userIds=["a", "b", "c"]), T0)
    s.synced([Shown("a", "online"), Shown("b", "online"), Shown("c", "idle")])
    frames = s.differences([Shown("a", "online"), Shown("b", "offline"), Shown("c", "dnd")])
    assert frames == [
        {"type": "presence.changed", "userId": "b", "status": "offline"},
        {"type": "presence.changed", "userId": "c", "status": "dnd"},
    ]
    assert s.view == {"a": "online", "b": "offline", "c": "dnd"}
    assert s.differences([Shown("a", "online"), Shown("b", "offline"), Shown("c", "dnd")]) == []


def test_a_setting_that_arrives_before_the_ready_answer_is_kept() -> None:
    # Another socket of the account changed the setting after this one was registered but
    # before the registration's answer came back (carrying the older value).
    s = Session(secret=SECRET, now=T0)
    s.receive(identify(token()), T0)
    s.note_visibility("nobody", T0 + 1)
    s.connected(Connected("online", "everyone"))
    assert s.visibility == "nobody"
    assert s.receive(frame(type="presence.query", userIds=["x"]), T0 + 2) == [
        charged_query(s, ("x",), "nobody")
    ]


def test_the_claim_is_the_latest_choice_known() -> None:
    s = authed()
    assert s.claim() == ("online", 0.0, "everyone", 0.0)
    s.note_chosen("invisible", T0 + 5)
    s.note_chosen("dnd", T0 + 3)  # older: ignored
    s.note_visibility("friends", T0 + 4)
    assert s.claim() == ("invisible", T0 + 5, "friends", T0 + 4)


def test_a_repeated_choice_keeps_the_moment_it_was_made() -> None:
    """An account invisible since an unknown moment (chosen_at 0) that says `invisible` again
    claims no hide moment: a restarted shard would persist it and store a last-seen at it for an
    account that never showed itself (test_faults_history's shard kill, m7, under load)."""
    s = Session(secret=SECRET, now=T0)
    s.receive(identify(token()), T0)
    s.connected(Connected("invisible", "everyone"))
    s.acknowledged("invisible", T0 + 1)
    s.acknowledged("idle", T0 + 2)
    assert s.claim()[:2] == ("invisible", 0.0)
    s.acknowledged("online", T0 + 3)  # a real change is claimed at once
    s.acknowledged("online", T0 + 4)
    assert s.claim()[:2] == ("online", T0 + 3)
