"""Typed answers (actors/core/answers.py): the core builds one per operation (actors/core/apply.py),
it crosses the internal wire in the plain form of wire version 1, and the operation reads it back
(`Operation.read`) into the same typed answer. The plain form is the compatibility promise with
the previous release's edges and shards: no class of the answers module may cross."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core import ops
from actors.core.answers import Answer, Connected, Found, Shown, Verdict, wire
from actors.core.apply import apply
from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.core.loaded import NotLoaded
from actors.core.shard import ShardState
from actors.core.status import STATUSES

from .conftest import T0

status = st.sampled_from(STATUSES)
ident = st.text(min_size=1, max_size=8)


def world() -> ShardState:
    """alice and bob, friends, in server g1 with channel c1; alice is connected on e1."""
    s = ShardState()
    for user, friend in (("alice", "bob"), ("bob", "alice")):
        s.set_relations(user, Relations(frozenset({friend}), frozenset({"g1"}), "friends"), T0)
        s.load_account(user, AccountRow(), T0)
    s.channels.load_channel("c1", "g1")
    apply(s, "e1", ops.Connect("alice", "a1"), T0)
    return s


def round_trip(op: ops.Operation[object], answer: Answer) -> object:
    """What the edge reads of `answer` after it crossed the wire (pickled in its plain form)."""
    return op.read(pickle.loads(pickle.dumps(wire(answer), protocol=5)))


def test_each_operation_gets_its_typed_answer_from_the_core() -> None:
    s = world()
    assert apply(s, "e2", ops.Connect("bob", "b1"), T0) == Connected("online", "friends")
    assert apply(s, "e2", ops.Watch("bob", "b1", ("alice",)), T0) == [Shown("alice", "online")]
    assert apply(s, "e1", ops.SetStatus("alice", "a1", "dnd"), T0) == "dnd"
    (found,) = apply(s, "e2", ops.Query("bob", "friends", ("alice",)), T0)
    assert found == Found("alice", "dnd", None)  # present: no last-seen
    assert apply(s, "e2", ops.Spend("bob", "lookups", 1), T0) is True
    assert apply(s, "e2", ops.ChannelSubscribe("c1", "bob", "b1"), T0) is Verdict.ALLOWED
    assert apply(s, "e2", ops.TypingStart("c1", "bob"), T0) is Verdict.ALLOWED
    assert apply(s, "e2", ops.VoiceJoin("c1", "bob", "b1", own=True), T0) is Verdict.ALLOWED
    assert apply(s, "e2", ops.Settings("bob", "everyone"), T0) is None


def test_a_channel_of_another_server_is_not_allowed_and_a_spent_voice_budget_is_rate_limited() -> None:
    s = world()
    s.channels.load_channel("c2", "g2")
    assert apply(s, "e1", ops.ChannelSubscribe("c2", "alice", "a1"), T0) is Verdict.NOT_ALLOWED
    answers = [apply(s, "e1", ops.VoiceJoin("c1", "alice", f"a{i}", own=True), T0) for i in range(30)]
    assert answers[0] is Verdict.ALLOWED
    assert answers[-1] is Verdict.RATE_LIMITED


def test_what_was_not_loaded_still_raises_not_loaded() -> None:
    with pytest.raises(NotLoaded):
        apply(ShardState(), "e1", ops.Connect("nobody", "s1"), T0)


def test_the_wire_form_is_version_1s_plain_form() -> None:
    """An edge or shard of the previous release reads exactly what it always read."""
    assert wire(Connected("idle", "nobody")) == ("idle", "nobody")
    assert wire([Shown("a", "dnd")]) == [("a", "dnd")]
    assert wire([Found("a", "offline", "2026-12-02T08:47:00.123Z"), Found("b", "online", None)]) == [
        ("a", "offline", "2026-12-02T08:47:00.123Z"),
        ("b", "online", None),
    ]
    assert [wire(v) for v in Verdict] == [True, False, "rate_limited"]
    assert [wire(a) for a in ("online", True, False, None)] == ["online", True, False, None]


@given(status, st.sampled_from(["everyone", "friends", "nobody"]))
def test_a_connect_answer_reads_back_by_name(real: str, visibility: str) -> None:
    answer = Connected(real, visibility)
    assert round_trip(ops.Connect("u", "s"), answer) == answer
    assert b"actors.core.answers" not in pickle.dumps(wire(answer), protocol=5)


@given(st.lists(st.tuples(ident, status, st.none() | ident)))
def test_watch_and_query_answers_read_back_by_name(rows: list[tuple[str, str, str | None]]) -> None:
    shown = [Shown(u, s) for u, s, _ in rows]
    found = [Found(u, s, seen) for u, s, seen in rows]
    assert round_trip(ops.Watch("w", "s", ("t",)), shown) == shown
    assert round_trip(ops.Query("r", "everyone", ("t",)), found) == found
    assert b"actors.core.answers" not in pickle.dumps([wire(shown), wire(found)], protocol=5)


def test_every_kind_reads_its_answer() -> None:
    """Each operation kind reads the plain form the core gives it (None for the silent ones)."""
    silent: list[ops.Operation[object]] = [
        ops.Disconnect("u", "s"),
        ops.Departed("u", 1.0),
        ops.Settings("u", "nobody"),
        ops.Focus("u", "s", None),
        ops.Unwatch("s", ("t",)),
        ops.ChannelUnsubscribe("c", "s"),
        ops.TypingStop("c", "u"),
        ops.VoiceLeave("c", "s"),
        ops.DropSocket("s", ("c",)),
        ops.PING,
    ]
    assert all(op.read(None) is None for op in silent)
    assert ops.SetStatus("u", "s", "idle").read("idle") == "idle"
    assert ops.Spend("u", "lookups", 1).read(False) is False
    for verdict in Verdict:
        for op in (
            ops.ChannelSubscribe("c", "u", "s"),
            ops.TypingStart("c", "u"),
            ops.VoiceJoin("c", "u", "s"),
        ):
            assert op.read(verdict.value) is verdict
    kinds = {type(op) for op in silent} | {
        ops.Connect,
        ops.SetStatus,
        ops.Spend,
        ops.Watch,
        ops.Query,
        ops.ChannelSubscribe,
        ops.TypingStart,
        ops.VoiceJoin,
    }
    assert kinds == set(ops.KIND)


def test_a_status_that_is_none_of_the_contracts_is_refused() -> None:
    with pytest.raises(ValueError, match="not a status"):
        ops.SetStatus("u", "s", "away").read("away")
