"""Mail from a shard to an edge by two roads (actors.core.contract.MailChunk): in the reply of the
edge's own `apply` (`PresenceShard.apply_and_collect`) and by its long-poll `pull`. Each item is
handed out once, stays until acknowledged, and is handed out again on `resend`; the edge's `Inbox`
(edge/router.py) puts chunks back in order, skips what it delivered, and asks again when a reply
was lost or a gap stays open. No Ray: the shard shell with the fake store, the clock the test's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from actors.core import ops
from actors.core.audience import Relations
from actors.core.contract import MailChunk, MailItem
from actors.core.slots import SlotMap
from actors.presence import PresenceShard, ShardConfig
from edge.router import Inbox, Router
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


async def test_an_edge_the_shard_forgot_is_told_a_new_incarnation_and_its_mail_starts_over(
    shard: PresenceShard,
) -> None:
    """The shard forgot a live edge (its lease ran out: the edge stalled; or its node was declared
    dead), and the edge's sockets with it. The edge's next call is answered under a new
    incarnation, so it registers again (as after a restart) and its inbox starts over: the new
    mailbox's numbers restart at 1, and under the old name the edge skipped them as delivered."""
    inc = await watched(shard)
    inbox = Inbox(inc, shard.mail["edge-a"].handed)  # the edge's, in step with the shard
    for status in ("dnd", "online"):
        _, _, chunk = await shard.apply_and_collect(
            "edge-a", [ops.SetStatus("alice", "s1", status)], inc, inbox.delivered
        )
        inbox.receive(inc, chunk)
    assert inbox.delivered >= 4
    assert shard.edges_died(["edge-a"]) == ["edge-a"]
    assert "edge-a" not in shard.mail
    # The edge, not told, sends its next batch (its registration again, as after a restart).
    again, _, chunk = await shard.apply_and_collect(
        "edge-a",
        [ops.Connect("alice", "s1"), ops.Connect("bob", "s2"), ops.Watch("bob", "s2", ("alice",)),
         ops.SetStatus("alice", "s1", "dnd")],
        inbox.incarnation, inbox.delivered,
    )  # fmt: skip
    assert again != inc and again.startswith(shard.incarnation)
    assert chunk[0] == 0 and chunk[2], "the new mailbox, from its start"
    assert inbox.receive(again, chunk) == chunk[2]  # every item delivered, none skipped
    assert inbox.pull_args() == (again, chunk[1], False)


@pytest.mark.parametrize("road", ["apply", "pull"])
async def test_an_edge_back_after_its_lease_ran_out_is_told_a_new_incarnation_by_its_next_call(
    shard: PresenceShard, clock: Clock, road: str
) -> None:
    """The stalled edge's own call finds its lease run out: the call that renews it is the one
    that drops what the edge registered, and must already answer under the new name."""
    inc = await watched(shard)
    handed = shard.mail["edge-a"].handed
    clock.advance(shard.config.socket_timeout_s + 1)
    if road == "apply":
        again, _, chunk = await shard.apply_and_collect("edge-a", [ops.PING], inc, handed)
    else:
        again, chunk = await shard.pull("edge-a", inc, handed, 0.0)
    assert again != inc and chunk[0] == 0
    assert shard.state.edges == {"edge-a": clock()}
    assert not shard.state.watchers  # bob's watch went with the lease: the edge registers it again


async def test_a_pull_waiting_while_the_shard_forgets_its_edge_answers_under_the_new_incarnation(
    shard: PresenceShard,
) -> None:
    inc = await watched(shard)
    pull = asyncio.create_task(shard.pull("edge-a", inc, shard.mail["edge-a"].handed, 0.05))
    await asyncio.sleep(0)  # the pull runs until it waits for mail
    shard.edges_died(["edge-a"])
    again, chunk = await pull
    assert again != inc and chunk == (0, 0, [])
    # The new name holds from then on, by either road.
    assert (await shard.apply_and_collect("edge-a", [ops.PING], again, 0))[0] == again
    assert (await shard.pull("edge-a", again, 0, 0.0))[0] == again


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


# ---------------------------------------------------------------------------- fan-out per edge


async def test_a_change_reaches_the_edge_once_and_its_index_expands_it(shard: PresenceShard) -> None:
    """The wire of fan-out per edge, end to end without sockets: the watch's `_audience` note and
    the publication travel in the same ordered mail, and an edge's `WatchIndex` kept by the notes
    expands the one publication to exactly the sockets in the audience (carol, a stranger, is
    registered but never listed)."""
    from actors.core.contract import publication
    from actors.core.frames import AudienceNote, internal_note
    from edge.watch_index import WatchIndex

    shard.store = FakeStore(relations={**FRIENDS, "carol": Relations(frozenset(), frozenset(), "everyone")})
    index = WatchIndex()
    owner = {"s2": "bob", "s3": "bob", "s4": "carol"}

    def edge_reads(chunk: tuple[int, int, list[MailItem]]) -> list[tuple[str, ...]]:
        """What the edge does with its mail: notes kept, publications expanded."""
        reached = []
        for address, payload in chunk[2]:
            watched = publication(address)
            if watched is not None:
                reached.append(tuple(index.watchers(*watched)))
                continue
            note = internal_note(payload)
            if isinstance(note, AudienceNote):
                for sid in address:
                    index.see(sid, owner[sid], note.inside, note.outside)
        return reached

    inc, _, chunk = await shard.apply_and_collect(
        "edge-a",
        [
            ops.Connect("alice", "s1"),
            ops.Watch("bob", "s2", ("alice",)),
            ops.Watch("bob", "s3", ("alice",)),
            ops.Watch("carol", "s4", ("alice",)),
        ],
        None, 0,
    )  # fmt: skip
    assert edge_reads(chunk) == []
    _, _, chunk = await shard.apply_and_collect(
        "edge-a", [ops.SetStatus("alice", "s1", "dnd")], inc, chunk[1]
    )
    publications = [(a, p) for a, p in chunk[2] if publication(a) is not None]
    assert len(publications) == 1, "one item for the edge, however many of its sockets watch"
    assert type(publications[0][0]) is tuple, "wire version 3: a plain pair, no class pickled"
    assert edge_reads(chunk) == [("s2", "s3")]


def router_of(
    shards: int,
    deliver: Callable[[object, object], object],
    forget: Callable[[Callable[[str], bool]], object],
) -> Router:
    """A router over fake shards that answer nothing, its deliveries and forgets handed to the test."""
    from actors.metrics import Metrics
    from tests.unit.fake_shards import FakeShards

    async def no_restart(_: int) -> None:
        return None

    async def nothing(_shard: int, _batch: list[ops.Op]) -> list[object]:
        return []

    return Router("edge-t", deliver, no_restart, Metrics(), FakeShards(shards, nothing), forget=forget)


def test_a_restarted_shards_decisions_are_forgotten_before_its_new_mail() -> None:
    """The router tells the edge that a shard came back empty before it delivers the first mail of
    the new incarnation, so no publication is expanded on the dead incarnation's decisions."""
    events: list[object] = []
    router = router_of(
        1, lambda address, payload: events.append(payload), lambda lost: events.append("forget")
    )
    router._deliver_mail(0, "inc-1", (0, 1, [(("s1",), "a")]))
    router._deliver_mail(0, "inc-1", (1, 2, [(("s1",), "b")]))
    router._deliver_mail(0, "inc-2", (0, 1, [(("s1",), "c")]))
    assert events == ["a", "b", "forget", "c"]


def router_forgetting(shards: int) -> tuple[Router, list[Callable[[str], bool]]]:
    """A router whose edge records what each new incarnation makes it forget."""
    told: list[Callable[[str], bool]] = []
    return router_of(shards, lambda address, payload: None, told.append), told


def users_of(slot_map: SlotMap, shard: int, n: int = 20) -> list[str]:
    return [u for u in (f"user-{i}" for i in range(2_000)) if slot_map.shard_of(u) == shard][:n]


EMPTY: MailChunk = (0, 0, [])


def test_a_shard_that_died_owning_its_slots_has_their_decisions_forgotten() -> None:
    """A crash (or the shard forgot this edge): the map never changed, every account it owns goes."""
    router, told = router_forgetting(2)
    router.map = SlotMap.even(2)
    router._deliver_mail(0, "inc-1", EMPTY)
    router._deliver_mail(0, "inc-2", EMPTY)
    [lost] = told
    assert all(lost(u) for u in users_of(router.map, 0))
    assert not any(lost(u) for u in users_of(router.map, 1))


def test_a_shard_replaced_after_handing_its_slots_away_forgets_nothing() -> None:
    """`presence rollout`: shard 0 hands every slot to shard 1 (the edge hears from it under that
    map), is replaced, and is given its slots back with their watchers and decisions. Forgetting
    those by the current map, as before, left their watchers told nothing until the resync."""
    router, told = router_forgetting(2)
    before = SlotMap.even(2)
    router.map = before
    router._deliver_mail(0, "inc-1", EMPTY)
    router.map = SlotMap(2, tuple(1 for _ in before.owners), 2)  # shard 0 emptied
    router._deliver_mail(0, "inc-1", EMPTY)  # a pull of the old incarnation returns
    router.map = SlotMap(3, before.owners, 2)  # replaced, its slots given back
    router._deliver_mail(0, "inc-2", EMPTY)
    [lost] = told
    assert not any(lost(u) for u in users_of(before, 0) + users_of(before, 1))


def test_an_edge_that_heard_last_on_an_older_map_forgets_only_what_the_shard_still_owns() -> None:
    """Heard from last while it still owned slots it has handed away since: those are decided
    elsewhere now, and stay."""
    router, told = router_forgetting(2)
    before = SlotMap.even(2)
    router.map = before
    router._deliver_mail(0, "inc-1", EMPTY)
    half = tuple(owner if slot % 4 == 0 else 1 for slot, owner in enumerate(before.owners))
    router.map = SlotMap(2, half, 2)  # shard 0 keeps a quarter of the slots
    router._deliver_mail(0, "inc-2", EMPTY)
    [lost] = told
    kept = users_of(router.map, 0)
    moved = [u for u in users_of(before, 0, 200) if router.map.shard_of(u) == 1]
    assert kept and moved
    assert all(lost(u) for u in kept) and not any(lost(u) for u in moved)
