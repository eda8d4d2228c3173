"""Mail from a shard to an edge by two roads (actors.core.contract.MailChunk): in the reply of the
edge's own `apply` (`PresenceShard.apply_and_collect`) and by its long-poll `pull`. Each item is
handed out once, stays until acknowledged, and is handed out again on `resend`; the edge's `Inbox`
(edge/router.py) puts chunks back in order, skips what it delivered, and asks again when a reply
was lost or a gap stays open. No Ray: the shard shell with the fake store, the clock the test's.
"""

from __future__ import annotations

import asyncio

import pytest

from actors.core import ops
from actors.core.audience import Relations
from actors.core.contract import MailItem
from actors.presence import PresenceShard, ShardConfig
from edge.router import Inbox
from tests.unit.conftest import Clock
from tests.unit.fake_store import FakeStore

FRIENDS = {
    "alice": Relations(frozenset({"bob"}), frozenset(), "everyone"),
    "bob": Relations(frozenset({"alice"}), frozenset(), "everyone"),
}


async def _no_flush(_entries: list[tuple[str, float]]) -> None:
    return None


@pytest.fixture
def shard(clock: Clock) -> PresenceShard:
    return PresenceShard(
        ShardConfig(0, "postgresql://unused", None),
        _no_flush,
        store=FakeStore(relations=FRIENDS),
        clock=clock,
    )


def frames(chunk: tuple[int, int, list[MailItem]]) -> list[str]:
    return [payload for _, payload in chunk[2]]


async def watched(shard: PresenceShard) -> str:
    """alice and bob connected on edge-a, bob watching alice; everything so far handed out and
    acknowledged. Returns the incarnation."""
    inc, _, _ = await shard.apply_and_collect(
        "edge-a", [ops.Connect("alice", "s1"), ops.Connect("bob", "s2"), ops.Watch("bob", "s2", ("alice",))],
        None, 0,
    )  # fmt: skip
    box = shard.mail["edge-a"]
    await shard.apply_and_collect("edge-a", [ops.PING], inc, box.handed)
    assert not box.items
    return inc


async def test_the_reply_of_apply_carries_the_mail_its_batch_caused(shard: PresenceShard) -> None:
    inc = await watched(shard)
    handed = shard.mail["edge-a"].handed
    _, [status], chunk = await shard.apply_and_collect(
        "edge-a", [ops.SetStatus("alice", "s1", "dnd")], inc, handed
    )
    assert status == "dnd"
    prev, last, _ = chunk
    assert prev == handed and last > prev
    assert any('"userId":"alice","status":"dnd"' in f for f in frames(chunk))  # bob's view
    # Handed out once: a pull finds nothing new and waits its time out.
    _, again = await shard.pull("edge-a", inc, handed, 0.01)
    assert again == (last, last, [])


async def test_a_pull_hands_out_what_no_reply_took(shard: PresenceShard) -> None:
    inc = await watched(shard)
    box = shard.mail["edge-a"]
    pull = asyncio.create_task(shard.pull("edge-a", inc, box.handed, 5.0))
    # A window in which the pull must stay waiting: nothing marks that it did not end.
    await asyncio.sleep(0.01)
    assert not pull.done()
    # Another edge's batch causes mail for edge-a: the waiting pull takes it.
    await shard.apply_and_collect("edge-b", [ops.Connect("alice", "s9")], None, 0)
    shard.state.set_status("alice", "s1", "dnd", shard.clock())
    shard._carry_out()
    _, chunk = await asyncio.wait_for(pull, 1.0)
    assert any('"status":"dnd"' in f for f in frames(chunk))


async def test_items_stay_until_acknowledged_and_resend_hands_them_out_again(shard: PresenceShard) -> None:
    inc = await watched(shard)
    acked = shard.mail["edge-a"].handed
    _, _, lost = await shard.apply_and_collect("edge-a", [ops.SetStatus("alice", "s1", "dnd")], inc, acked)
    assert lost[2]
    # The edge never saw that reply: it asks again from what it acknowledged.
    _, again = await shard.pull("edge-a", inc, acked, 0.0, resend=True)
    assert again == lost
    # Acknowledged (here by the next apply), the items go.
    await shard.apply_and_collect("edge-a", [ops.PING], inc, lost[1])
    assert not shard.mail["edge-a"].items


async def test_an_older_incarnations_acknowledgement_acknowledges_nothing(shard: PresenceShard) -> None:
    inc = await watched(shard)
    _, _, chunk = await shard.apply_and_collect("edge-a", [ops.SetStatus("alice", "s1", "dnd")], inc, 0)
    await shard.apply_and_collect("edge-a", [ops.PING], "an-older-one", chunk[1])
    assert shard.mail["edge-a"].items  # still there
    _, again = await shard.pull("edge-a", "an-older-one", chunk[1], 0.0)
    assert again[0] == 0 and again[2][-len(chunk[2]) :] == chunk[2]  # everything, again


# ---------------------------------------------------------------------------- the edge's inbox


def items(*seqs: int) -> list[MailItem]:
    return [((f"s{n}",), f"frame {n}") for n in seqs]


def test_chunks_in_order_are_delivered_at_once() -> None:
    box = Inbox()
    assert box.receive("i1", (0, 2, items(1, 2))) == items(1, 2)
    assert box.receive("i1", (2, 3, items(3))) == items(3)
    assert box.delivered == 3


def test_a_chunk_that_overtook_the_one_before_it_waits_for_it() -> None:
    box = Inbox()
    assert box.receive("i1", (2, 4, items(3, 4))) == []
    assert box.pull_args() == ("i1", 0, True)  # a gap open when a pull leaves: ask again
    assert box.receive("i1", (0, 2, items(1, 2))) == items(1, 2, 3, 4)
    assert box.pull_args() == ("i1", 4, False)


def test_what_was_delivered_is_never_delivered_twice() -> None:
    box = Inbox()
    box.receive("i1", (0, 3, items(1, 2, 3)))
    assert box.receive("i1", (1, 4, items(2, 3, 4))) == items(4)  # sent again after a lost reply
    assert box.receive("i1", (0, 4, items(1, 2, 3, 4))) == []
    assert box.receive("i1", (4, 4, [])) == []


def test_mail_the_shard_dropped_leaves_a_gap_that_does_not_block() -> None:
    box = Inbox()
    box.receive("i1", (0, 1, items(1)))
    # The shard dropped 2..5 (an edge far behind): the next chunk follows 1 and starts at 6.
    assert box.receive("i1", (1, 7, items(6, 7))) == items(6, 7)
    assert box.delivered == 7


def test_a_new_incarnation_starts_over() -> None:
    box = Inbox()
    box.receive("i1", (0, 9, items(*range(1, 10))))
    box.receive("i1", (12, 13, items(13)))  # waiting for 10..12, which died with i1
    assert box.receive("i2", (0, 1, items(1))) == items(1)
    assert box.early == {} and box.pull_args() == ("i2", 1, False)


def test_a_failed_call_makes_the_next_pull_ask_again() -> None:
    box = Inbox()
    box.receive("i1", (0, 2, items(1, 2)))
    box.resend = True
    assert box.pull_args() == ("i1", 2, True)
    assert box.pull_args() == ("i1", 2, False)
