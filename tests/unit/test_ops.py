"""The edge → shard operations (actors/core/ops.py): routing keys, what each needs loaded, their
wire form, and that the shard shell dispatches every kind (no Ray, no PostgreSQL: the shell's
state is filled by hand, as its `_missing` and `_load` would)."""

from __future__ import annotations

import pickle
import typing

import pytest

from actors.core import ops
from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.core.shard import Claim
from actors.core.slots import channel_key
from actors.presence import PresenceShard, ShardConfig
from tests.unit.conftest import T0
from tests.unit.fake_store import FakeStore

ALL: list[ops.Op] = [
    ops.Connect("alice", "s1"),
    ops.Connect("alice", "s1", idle=True, claim=Claim("dnd", T0, "friends", T0)),
    ops.Disconnect("alice", "s1"),
    ops.Disconnect("alice", "s1", at=T0),
    ops.Departed("alice", T0),
    ops.SetStatus("alice", "s1", "dnd"),
    ops.Settings("alice", "nobody"),
    ops.Focus("alice", "s1", "c1"),
    ops.Spend("alice", "lookups", 3),
    ops.Watch("alice", "s1", ("bob", "carol")),
    ops.Unwatch("s1", ("bob", "carol")),
    ops.Query("alice", "everyone", ("bob", "carol")),
    ops.ChannelSubscribe("c1", "alice", "s1"),
    ops.ChannelUnsubscribe("c1", "s1"),
    ops.TypingStart("c1", "alice"),
    ops.TypingStop("c1", "alice"),
    ops.VoiceJoin("c1", "alice", "s1", own=True),
    ops.VoiceLeave("c1", "s1"),
    ops.DropSocket("s1", ("c1", "c2")),
    ops.PING,
]


def test_every_kind_is_listed_once_with_its_own_name() -> None:
    kinds = typing.get_args(ops.Op)
    assert {type(op) for op in ALL} == set(kinds)
    assert set(ops.KIND) == set(kinds)
    assert len(set(ops.KIND.values())) == len(kinds)


@pytest.mark.parametrize("op", ALL, ids=repr)
def test_operations_cross_a_process_boundary_unchanged(op: ops.Op) -> None:
    back = pickle.loads(pickle.dumps(op, protocol=5))
    assert back == op and type(back) is type(op)


@pytest.mark.parametrize("op", ALL, ids=repr)
def test_the_wire_form_makes_the_same_operation_again(op: ops.Op) -> None:
    """Wire version 3: a batch crosses as plain tuples (`to_wire`), which the shard makes typed
    again (`from_wire`) after the pickle."""
    (wire,) = pickle.loads(pickle.dumps(ops.to_wire([op]), protocol=5))
    assert type(wire) is tuple
    (back,) = ops.from_wire([wire])
    assert back == op and type(back) is type(op)


def test_a_batch_in_the_wire_form_names_no_operation_class() -> None:
    """What the plain form buys: nothing of ours looked up by name on either end (a claim, rare,
    rides inside a connect as it is)."""
    plain = [op for op in ALL if not (isinstance(op, ops.Connect) and op.claim is not None)]
    data = pickle.dumps(ops.to_wire(plain), protocol=5)
    assert b"actors" not in data
    assert b"actors.core.ops" in pickle.dumps(plain, protocol=5)


def test_typed_operations_pass_the_shards_reading_unchanged() -> None:
    """A version 2 edge's batch (typed), and one mixing both forms, read alike."""
    assert ops.from_wire(ALL) == ALL
    mixed = [op if i % 2 else ops.to_wire([op])[0] for i, op in enumerate(ALL)]
    back = ops.from_wire(mixed)
    assert back == ALL and [type(op) for op in back] == [type(op) for op in ALL]


def test_the_wire_codes_never_change() -> None:
    """A kind's code is part of wire version 3: adjacent releases read each other's batches, so a
    kind keeps its code and a new one takes the next (append here, never reorder)."""
    assert [ops.KIND[kind] for kind in ops.WIRE_KINDS] == [
        "connect", "disconnect", "departed", "status", "settings", "focus", "spend", "watch",
        "unwatch", "query", "ch_sub", "ch_unsub", "typing_start", "typing_stop", "voice_join",
        "voice_leave", "drop_socket", "ping",
    ]  # fmt: skip
    assert set(ops.WIRE_KINDS) == set(typing.get_args(ops.Op))


def test_routing_keys() -> None:
    assert ops.Connect("alice", "s1").slot_keys() == ("alice",)
    assert ops.Watch("alice", "s1", ("bob", "carol")).slot_keys() == ("bob", "carol")
    assert ops.Unwatch("s1", ("bob",)).slot_keys() == ("bob",)
    assert ops.Query("alice", "everyone", ("bob",)).slot_keys() == ("bob",)
    assert ops.VoiceJoin("c1", "alice", "s1").slot_keys() == (channel_key("c1"),)
    assert ops.DropSocket("s1", ("c1", "c2")).slot_keys() == (channel_key("c1"), channel_key("c2"))
    assert ops.PING.slot_keys() == ()


def test_what_each_needs_loaded() -> None:
    def needs(
        relations: tuple[str, ...] = (), accounts: tuple[str, ...] = (), channels: tuple[str, ...] = ()
    ) -> ops.Needs:
        return relations, accounts, channels

    assert ops.Connect("a", "s").needs() == needs(relations=("a",), accounts=("a",))
    assert ops.SetStatus("a", "s", "dnd").needs() == needs(relations=("a",), accounts=("a",))
    assert ops.Settings("a", "nobody").needs() == needs(relations=("a",), accounts=("a",))
    # Departures need nothing loaded: recorded without the row (no outage can hold one back).
    assert ops.Disconnect("a", "s").needs() is ops.NOTHING
    assert ops.Disconnect("a", "s", at=T0).needs() is ops.NOTHING
    assert ops.Departed("a", T0).needs() is ops.NOTHING
    assert ops.Watch("a", "s", ("b",)).needs() == needs(relations=("a", "b"))
    assert ops.Query("a", "everyone", ("b",)).needs() == needs(relations=("a", "b"))
    for op in (ops.ChannelSubscribe("c", "a", "s"), ops.TypingStart("c", "a"), ops.VoiceJoin("c", "a", "s")):
        assert op.needs() == needs(relations=("a",), channels=("c",))
    for op in (ops.Unwatch("s", ("b",)), ops.Focus("a", "s", None), ops.Spend("a", "lookups", 1), ops.PING):
        assert op.needs() is ops.NOTHING


def _loaded_shard() -> PresenceShard:
    async def flush_write(_: list[tuple[str, float]]) -> None:
        return None

    shard = PresenceShard(
        ShardConfig(0, "postgresql://unused", None), flush_write, store=FakeStore(), clock=lambda: T0
    )
    for user in ("alice", "bob", "carol"):
        shard.state.set_relations(user, Relations(frozenset(), frozenset({"srv"}), "everyone"), T0)
        shard.state.load_account(user, AccountRow(), T0)
    for channel in ("c1", "c2"):
        shard.state.channels.load_channel(channel, "srv")
    return shard


async def test_the_shell_dispatches_every_kind() -> None:
    shard = _loaded_shard()
    _, results = await shard.apply("edge-a", ALL)
    answers = dict(zip([ops.KIND[type(op)] for op in ALL], results, strict=False))
    assert results[0] == ("online", "everyone")
    assert answers["watch"] == [("bob", "offline"), ("carol", "offline")]
    assert answers["query"] == [("bob", "offline", None), ("carol", "offline", None)]
    assert answers["ch_sub"] is True and answers["typing_start"] is True
    assert answers["voice_join"] is True and answers["spend"] is True
    assert "__unavailable__" not in results


async def test_the_shell_answers_a_batch_in_the_wire_form_as_the_typed_one() -> None:
    typed, plain = _loaded_shard(), _loaded_shard()
    _, expected = await typed.apply("edge-a", ALL)
    _, results = await plain.apply("edge-a", ops.to_wire(ALL))
    assert results == expected


async def test_a_voice_join_is_charged_only_when_it_is_the_clients_own() -> None:
    shard = _loaded_shard()
    await shard.apply("edge-a", [ops.Connect("alice", "s1")])
    # Joins that change the roster, over and over (a leave in between each).
    again = [op for _ in range(50) for op in (ops.VoiceJoin("c1", "alice", "s1"), ops.VoiceLeave("c1", "s1"))]
    _, results = await shard.apply("edge-a", again)
    assert "rate_limited" not in results  # registrations after a restart are never charged
    own = [
        op
        for _ in range(50)
        for op in (ops.VoiceJoin("c1", "alice", "s1", own=True), ops.VoiceLeave("c1", "s1"))
    ]
    _, results = await shard.apply("edge-a", own)
    assert "rate_limited" in results
