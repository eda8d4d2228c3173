"""Limits of issues 7 and 14, without I/O: floods, sockets per account and per address,
handshakes and accepts per address, what a frame costs the account's lookup budget, hostile bytes
and odd ids, and how Settings reach them.

docs/protocol.md ("Limits and floods"): a per-socket token bucket answers a frame over it with
`rate_limited` and closes a socket that goes on with 1008; an edge admits at most
`max_sockets_per_account` sockets of one account and `max_sockets_per_ip` from one address (one
more is closed with 4029, before anything reaches an actor); per address, connections still
opening are capped and new ones rate-limited (dropped at once past either). Ids queried or newly
watched are charged to the account's lookup budget, which its shard keeps (test_budgets.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from actors.core import frames, ops
from actors.core.answers import Connected, Shown, Verdict
from actors.core.scan import SWEEP_AT_LEAST, SWEEP_CYCLE_S
from edge import protocol as p
from edge.session import (
    LOOKUP_CAREFUL_S,
    Admission,
    Charged,
    Close,
    Command,
    Limits,
    Reply,
    Session,
    TokenBucket,
)
from edge.tokens import mint_token

from .conftest import T0

SECRET = "session-limits-secret-long-enough-for-hs256"


def token(user: str, ttl: int = 3600, secret: str = SECRET) -> str:
    return mint_token(user, secret, ttl_s=ttl, now=T0)


def frame(**fields: Any) -> str:
    return json.dumps(fields)


def identify(user: str) -> str:
    return frame(type="identify", token=token(user))


def errors(cmds: list[Command]) -> list[str]:
    return [c.frame["code"] for c in cmds if isinstance(c, Reply) and c.frame.get("type") == "error"]


def closes(cmds: list[Command]) -> list[int]:
    return [c.code for c in cmds if isinstance(c, Close)]


def session(admission: Admission | None = None, ip: str | None = "10.0.0.1", **limits: Any) -> Session:
    lim = admission.limits if admission is not None else Limits(**limits)
    return Session(secret=SECRET, now=T0, limits=lim, admission=admission, ip=ip)


def authed(admission: Admission, user: str = "u1", ip: str = "10.0.0.1") -> Session:
    s = session(admission, ip)
    assert s.open() == []
    assert s.receive(identify(user), T0) == [ops.Connect(user, s.socket_id)]
    s.connected(Connected("online", "everyone"))
    return s


def query(ids: list[str]) -> str:
    return frame(type="presence.query", userIds=ids)


HB = frame(type="heartbeat")
ACK = [Reply({"type": "heartbeat.ack"})]


# ---------------------------------------------------------------------------- defaults


def test_defaults() -> None:
    lim = Limits()
    assert (lim.rate_per_s, lim.rate_burst, lim.flood_close_after) == (20.0, 60.0, 100)
    assert lim.max_sockets_per_account == 20
    assert lim.max_sockets_per_ip == 1_000
    assert lim.max_handshakes_per_ip == 100
    assert (lim.accepts_per_ip_per_s, lim.accepts_per_ip_burst) == (100.0, 1_000.0)
    assert p.CLOSE_TOO_MANY_CONNECTIONS == 4029


# ---------------------------------------------------------------------------- token bucket


class TestTokenBucket:
    def test_take_several(self) -> None:
        b = TokenBucket(rate_per_s=10, burst=600, tokens=600, at=T0)
        assert b.take(T0, 100)
        assert b.level(T0) == 500
        assert not b.take(T0, 501), "all or nothing"
        assert b.level(T0) == 500, "a refused take spends nothing"
        assert b.take(T0 + 1, 510)

    def test_never_above_burst(self) -> None:
        b = TokenBucket(rate_per_s=10, burst=5, tokens=0, at=T0)
        assert b.level(T0 + 1_000) == 5

    def test_clock_going_backwards_credits_nothing_twice(self) -> None:
        b = TokenBucket(rate_per_s=1, burst=100, tokens=0, at=T0)
        assert b.take(T0 + 10, 10)  # 10 s earned, 10 spent
        assert not b.take(T0 + 5)  # backwards: nothing
        # Back to T0 + 10: the seconds between T0 + 5 and T0 + 10 were already paid out.
        assert not b.take(T0 + 10)
        assert b.take(T0 + 11)


# ---------------------------------------------------------------------------- floods


class TestFlood:
    def test_sustained_flood_at_1000_per_s_is_closed_within_a_fraction_of_a_second(self) -> None:
        s = authed(Admission())
        for i in range(5_000):
            out = s.receive(HB, T0 + i / 1000)
            if closes(out):
                assert closes(out) == [1008]
                assert i < 300, f"closed only after {i} frames"
                return
        pytest.fail("a flood of 1000 frames/s was never closed")

    def test_flood_just_over_the_rate_is_closed_eventually(self) -> None:
        s = authed(Admission())
        # 25 frames/s against a refill of 20: 5 refused a second, never time to refill.
        for i in range(25 * 120):
            if closes(s.receive(HB, T0 + i / 25)):
                return
        pytest.fail("two minutes at 25 frames/s (limit 20) were never closed")

    def test_bursts_that_calm_down_are_forgiven(self) -> None:
        s = authed(Admission())
        now = T0
        for _ in range(20):  # 20 bursts of 90 frames (30 refused each): 600 refused in all
            for _ in range(90):
                assert not closes(s.receive(HB, now))
            now += 3.0  # 3 s refills the 60-frame bucket
        assert s.receive(HB, now) == ACK

    def test_rate_limited_first_then_every_20th_and_nothing_acted_upon(self) -> None:
        s = authed(Admission())
        for _ in range(59):  # identify took one token of 60
            assert s.receive(HB, T0) == ACK
        refused = [s.receive(frame(type="presence.subscribe", userIds=["x"]), T0) for _ in range(60)]
        codes = [errors(r) for r in refused]
        assert codes[0] == ["rate_limited"]
        assert [i + 1 for i, c in enumerate(codes) if c] == [1, 20, 40, 60]
        assert s.subscriptions == set()

    def test_configured_rate(self) -> None:
        s = authed(Admission(Limits(rate_per_s=100, rate_burst=5, flood_close_after=3)))
        for _ in range(4):
            assert s.receive(HB, T0) == ACK
        assert errors(s.receive(HB, T0)) == ["rate_limited"]
        s.receive(HB, T0)
        assert closes(s.receive(HB, T0)) == [1008]


# ---------------------------------------------------------------------------- sockets per account


class TestSocketsPerAccount:
    def test_the_21st_socket_is_closed_4029_before_anything_goes_upstream(self) -> None:
        adm = Admission()
        sockets = [authed(adm, "u1") for _ in range(20)]
        extra = session(adm)
        assert extra.open() == []
        out = extra.receive(identify("u1"), T0)
        assert closes(out) == [4029]
        assert not any(isinstance(c, ops.Connect) for c in out)
        assert extra.user_id is None and not extra.authenticated
        assert "too many connections" in next(c for c in out if isinstance(c, Close)).reason
        # Other accounts are not affected.
        assert authed(adm, "u2").user_id == "u2"
        # One goes; one more may come.
        sockets[0].gone()
        again = session(adm)
        again.open()
        assert again.receive(identify("u1"), T0) == [ops.Connect("u1", again.socket_id)]

    def test_header_authentication_is_limited_too(self) -> None:
        adm = Admission(Limits(max_sockets_per_account=1))
        first = session(adm)
        assert first.authenticate_header(f"Bearer {token('u1')}", T0) == [ops.Connect("u1", first.socket_id)]
        second = session(adm)
        assert closes(second.authenticate_header(f"Bearer {token('u1')}", T0)) == [4029]

    def test_refused_socket_releases_nothing_it_did_not_hold(self) -> None:
        adm = Admission(Limits(max_sockets_per_account=1))
        kept = authed(adm, "u1")
        refused = session(adm)
        refused.open()
        refused.receive(identify("u1"), T0)
        refused.gone()
        assert adm.by_account == {"u1": {kept.socket_id}}

    def test_gone_is_idempotent(self) -> None:
        adm = Admission()
        s = authed(adm, "u1")
        s.gone()
        s.gone()
        assert adm.by_account == {} and adm.by_ip == {}

    def test_bad_token_never_counts(self) -> None:
        adm = Admission(Limits(max_sockets_per_account=1))
        bad = session(adm)
        bad.open()
        assert closes(
            bad.receive(
                frame(type="identify", token=mint_token("u1", "another-key-of-at-least-32-bytes-long")), T0
            )
        ) == [4001]
        assert adm.by_account == {}


# ---------------------------------------------------------------------------- sockets per address


class TestSocketsPerAddress:
    def test_one_more_than_the_limit_is_closed_4029(self) -> None:
        adm = Admission(Limits(max_sockets_per_ip=3))
        held = [session(adm, "10.0.0.1") for _ in range(3)]
        assert all(s.open() == [] for s in held)
        extra = session(adm, "10.0.0.1")
        assert closes(extra.open()) == [4029]
        extra.gone()  # the refused socket held nothing
        assert adm.by_ip == {"10.0.0.1": 3}
        # Another address is not affected; unauthenticated sockets count.
        assert session(adm, "10.0.0.2").open() == []
        held[0].gone()
        assert session(adm, "10.0.0.1").open() == []

    def test_default_is_1000(self) -> None:
        adm = Admission()
        for _ in range(1_000):
            assert session(adm).open() == []
        assert closes(session(adm).open()) == [4029]

    def test_no_address_no_limit(self) -> None:
        adm = Admission(Limits(max_sockets_per_ip=0))
        assert session(adm, ip=None).open() == []


# ---------------------------------------------------------------------------- lookup budget (issue 14)
# The budget itself is the account's shard's (tests/unit/test_budgets.py); the session says what
# a frame costs and undoes what a refused frame did.


class TestLookupCharges:
    def test_subscribe_charges_only_ids_new_to_the_socket(self) -> None:
        s = authed(Admission(Limits(rate_burst=1_000)))
        [sub] = s.receive(frame(type="presence.subscribe", userIds=["a", "b", "a"]), T0)
        assert (
            isinstance(sub, Charged)
            and sub.charge == ops.Spend("u1", "lookups", 2)
            and sub.added == ("a", "b")
        )
        [sub] = s.receive(frame(type="presence.subscribe", userIds=["b", "c"]), T0)
        assert isinstance(sub, Charged) and sub.op.targets == ("b", "c") and sub.added == ("c",)
        assert sub.charge == ops.Spend("u1", "lookups", 1)
        [sub] = s.receive(frame(type="presence.subscribe", userIds=["a", "c", "x"]), T0)
        assert isinstance(sub, Charged) and sub.added == ("x",) and sub.op.targets == ("a", "c", "x")

    def test_a_subscription_to_ids_all_watched_already_is_answered_from_the_view(self) -> None:
        """Nothing new, nothing charged, nothing looked up: the sync is what the socket shows.
        Sent to the shards, 1,000 ids again and again cost them a full lookup each time, free of
        the account's budget (20 frames a second from each of its sockets)."""
        s = authed(Admission(Limits(rate_burst=1_000)))
        [sub] = s.receive(frame(type="presence.subscribe", userIds=["a", "b", "hidden"]), T0)
        assert isinstance(sub, Charged)
        s.synced([Shown("a", "online"), Shown("b", "offline")])  # "hidden" is outside its audience
        assert s.tell("b", "dnd")  # a change it was sent since
        [again] = s.receive(frame(type="presence.subscribe", userIds=["hidden", "b", "a", "b"]), T0)
        assert again == Reply(frames.sync([("b", "dnd"), ("a", "online")]))

    def test_unsubscribe_then_subscribe_is_new_again(self) -> None:
        s = authed(Admission(Limits(rate_burst=1_000)))
        s.receive(frame(type="presence.subscribe", userIds=["a"]), T0)
        s.receive(frame(type="presence.unsubscribe", userIds=["a"]), T0)
        [sub] = s.receive(frame(type="presence.subscribe", userIds=["a"]), T0)
        assert isinstance(sub, Charged) and sub.added == ("a",)

    def test_refused_subscribe_is_forgotten(self) -> None:
        s = authed(Admission(Limits(rate_burst=1_000)))
        s.receive(frame(type="presence.subscribe", userIds=["a"]), T0)
        [sub] = s.receive(frame(type="presence.subscribe", userIds=["a", "b"]), T0)
        assert isinstance(sub, Charged)
        reply = s.budget_refused(sub)
        assert reply.frame["code"] == "rate_limited" and "budget" in reply.frame["message"]
        assert s.subscriptions == {"a"}

    def test_query_names_each_id_once(self) -> None:
        s = authed(Admission(Limits(rate_burst=1_000)))
        [q] = s.receive(query(["a", "a", "b"] * 20), T0)
        assert isinstance(q, Charged) and q.op == ops.Query("u1", "everyone", ("a", "b"))
        assert q.charge == ops.Spend("u1", "lookups", 2)

    def test_refused_voice_join_leaves_the_session_out_of_the_roster(self) -> None:
        s = authed(Admission(Limits(rate_burst=1_000)))
        [join] = s.receive(frame(type="voice.join", channelId="c1"), T0)
        assert isinstance(join, ops.VoiceJoin)
        assert errors(s.channel_result(join, Verdict.RATE_LIMITED)) == ["rate_limited"]
        assert s.voice_channel is None


# ---------------------------------------------------------------------------- handshakes per address


class TestHandshakes:
    def test_concurrent_handshakes_per_address_are_capped(self) -> None:
        adm = Admission(Limits(max_handshakes_per_ip=3))
        assert [adm.handshake_begin("1.2.3.4", T0) for _ in range(3)] == [None] * 3
        refused = adm.handshake_begin("1.2.3.4", T0)
        assert refused is not None and "opening" in refused
        assert adm.handshake_begin("5.6.7.8", T0) is None, "addresses are independent"
        adm.handshake_end("1.2.3.4")
        assert adm.handshake_begin("1.2.3.4", T0) is None
        for _ in range(3):
            adm.handshake_end("1.2.3.4")
        assert "1.2.3.4" not in adm.handshakes

    def test_accepts_per_address_are_rate_limited(self) -> None:
        adm = Admission(Limits(max_handshakes_per_ip=1_000, accepts_per_ip_per_s=2, accepts_per_ip_burst=5))
        for _ in range(5):
            assert adm.handshake_begin("1.2.3.4", T0) is None
            adm.handshake_end("1.2.3.4")
        refused = adm.handshake_begin("1.2.3.4", T0)
        assert refused is not None and "new connections" in refused
        assert "1.2.3.4" not in adm.handshakes, "a refused connection is not counted"
        assert adm.handshake_begin("1.2.3.4", T0 + 0.5) is None  # 2 a second come back
        assert adm.handshake_begin("1.2.3.4", T0 + 0.5) is not None

    def test_sweep_forgets_refilled_accept_buckets(self) -> None:
        adm = Admission(Limits(accepts_per_ip_per_s=1, accepts_per_ip_burst=5))
        adm.handshake_begin("1.2.3.4", T0)
        adm.sweep(T0 + 0.5)
        assert "1.2.3.4" in adm.accepts
        adm.sweep(T0 + 1)
        assert "1.2.3.4" not in adm.accepts

    def test_many_accept_buckets_are_forgotten_a_slice_a_sweep_all_within_a_cycle(self) -> None:
        """A reconnect storm from 20,000 addresses: the sweep a second looks at a rolling slice of
        their buckets (actors/core/scan.py), and all of them are gone within a cycle."""
        adm = Admission(Limits(accepts_per_ip_per_s=1, accepts_per_ip_burst=5))
        n = SWEEP_AT_LEAST * 20
        for i in range(n):
            adm.handshake_begin(f"10.0.{i // 256}.{i % 256}", T0)
        adm.sweep(T0 + 1.0)  # every bucket refilled
        assert 0 < len(adm.accepts) < n, "one sweep looked at a slice, not at all"
        for k in range(2, int(SWEEP_CYCLE_S) + 2):
            adm.sweep(T0 + k)
        assert adm.accepts == {}


# ---------------------------------------------------------------------------- hostile bytes, odd ids


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe\xfd",  # a binary frame that is not UTF-8
        b'{"type":"heartbeat","x":"\xc3\x28"}',
        "[" * 10_000 + "]" * 10_000,  # deeper than the JSON parser goes
        '{"type":"presence.query","userIds":' + "[" * 500 + "]" * 500 + "}",
        frame(type="presence.query", userIds=["x"] * 10_001),  # absurdly long list
        frame(type="presence.subscribe", userIds=[["nested"]]),
        frame(type="heartbeat", extra=True),
        frame(type="presence.update", status="offline"),
        frame(type=None),
        "null",
        "",
        b"",
    ],
)
def test_hostile_bytes_are_bad_frame_and_the_socket_stays(raw: str | bytes) -> None:
    s = authed(Admission(Limits(rate_burst=1_000)))
    assert errors(s.receive(raw, T0)) == ["bad_frame"]
    assert s.receive(HB, T0) == ACK


@pytest.mark.parametrize(
    "odd",
    [
        "",
        "x" * 129,
        "a\x00b",
        "tab\there",
        "nl\n",
        "del\x7f",
        "nel\x85",
        "csi\x9b31m",
        "ls\u2028",
        "ps\u2029",
    ],
)
@pytest.mark.parametrize(
    "make",
    [
        lambda i: {"type": "presence.subscribe", "userIds": ["ok", i]},
        lambda i: {"type": "presence.unsubscribe", "userIds": [i]},
        lambda i: {"type": "presence.query", "userIds": [i]},
        lambda i: {"type": "focus", "channelId": i},
        lambda i: {"type": "channel.subscribe", "channelId": i},
        lambda i: {"type": "typing.start", "channelId": i},
        lambda i: {"type": "voice.join", "channelId": i},
    ],
)
def test_odd_ids_are_refused_at_the_edge(odd: str, make: Any) -> None:
    s = authed(Admission(Limits(rate_burst=1_000)))
    assert errors(s.receive(json.dumps(make(odd)), T0)) == ["bad_frame"]
    assert s.subscriptions == set() and s.focus is None


@pytest.mark.parametrize(
    "fine", ["x" * 128, "é日本語", "a b", "\u00a0nbsp", "emoji-😀", "'; DROP TABLE users; --"]
)
def test_unusual_but_valid_ids_pass(fine: str) -> None:
    s = authed(Admission(Limits(rate_burst=1_000)))
    [q] = s.receive(query([fine]), T0)
    assert isinstance(q, Charged) and q.op == ops.Query("u1", "everyone", (fine,))


@pytest.mark.parametrize("sub", ["nel\x85", "ls\u2028", "x" * 129, ""])
def test_tokens_naming_odd_accounts_close_4001(sub: str) -> None:
    import jwt

    tok = jwt.encode({"sub": sub, "exp": int(T0) + 60}, SECRET, algorithm="HS256")
    s = session(Admission())
    assert closes(s.receive(frame(type="identify", token=tok), T0)) == [4001]


def test_alg_none_closes_4001() -> None:
    import base64

    def b64(d: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

    tok = b64({"alg": "none", "typ": "JWT"}) + "." + b64({"sub": "u1", "exp": int(T0) + 60}) + "."
    s = session(Admission())
    assert closes(s.receive(frame(type="identify", token=tok), T0)) == [4001]
    assert s.user_id is None


# ---------------------------------------------------------------------------- configuration


def test_settings_reach_the_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    from cluster.config import Settings
    from cluster.edge_process import edge_config

    env = {
        "PRESENCE_SOCKET_RATE_PER_S": "7",
        "PRESENCE_SOCKET_RATE_BURST": "11",
        "PRESENCE_FLOOD_CLOSE_AFTER": "13",
        "PRESENCE_MAX_SOCKETS_PER_ACCOUNT": "3",
        "PRESENCE_MAX_SOCKETS_PER_IP": "17",
        "PRESENCE_MAX_HANDSHAKES_PER_IP": "19",
        "PRESENCE_ACCEPTS_PER_IP_PER_S": "23",
        "PRESENCE_ACCEPTS_PER_IP_BURST": "29",
        "PRESENCE_MAX_FRAME_BYTES": "4096",
        "PRESENCE_SEND_BUFFER_BYTES": "65536",
        "PRESENCE_CLIENT_IP_HEADER": "X-Forwarded-For",
    }
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    config = edge_config(Settings(), "secret", None)
    lim = config.limits
    assert (lim.rate_per_s, lim.rate_burst, lim.flood_close_after) == (7, 11, 13)
    assert (lim.max_sockets_per_account, lim.max_sockets_per_ip) == (3, 17)
    assert (lim.max_handshakes_per_ip, lim.accepts_per_ip_per_s, lim.accepts_per_ip_burst) == (19, 23, 29)
    assert (config.max_frame_bytes, config.send_buffer_bytes) == (4096, 65536)
    assert config.client_ip_header == "X-Forwarded-For"


def test_default_settings_give_default_limits() -> None:
    from cluster.config import Settings
    from cluster.edge_process import edge_config

    lim = edge_config(Settings(), "secret", None).limits
    assert lim == Limits()


def test_a_query_is_charged_beside_its_lookup_until_a_charge_is_refused() -> None:
    """The charge and the lookup leave together (one round trip), until the account's budget
    refuses one: then, for a minute, this socket waits for each charge before looking up."""
    s = authed(Admission(Limits(rate_burst=1_000)))
    (q,) = s.receive(query(["a"]), T0)
    assert isinstance(q, Charged) and q.together
    s.budget_refused(q, T0)
    (careful,) = s.receive(query(["a"]), T0 + 1)
    assert isinstance(careful, Charged) and not careful.together
    (later,) = s.receive(query(["a"]), T0 + LOOKUP_CAREFUL_S + 0.1)
    assert isinstance(later, Charged) and later.together


def test_a_refused_subscribe_does_not_make_queries_careful() -> None:
    s = authed(Admission(Limits(rate_burst=1_000)))
    (sub,) = s.receive(frame(type="presence.subscribe", userIds=["a"]), T0)
    assert isinstance(sub, Charged)
    s.budget_refused(sub, T0)
    (q,) = s.receive(query(["a"]), T0 + 1)
    assert isinstance(q, Charged) and q.together
