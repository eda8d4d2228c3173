"""The shard shell (`actors.presence.PresenceShard`) around its pure state: ordering and failure
handling, deterministically, with a store whose every call waits at a gate the test opens
(tests/unit/fake_store.py). No Ray, no PostgreSQL, no Redis; the clock is the test's.

The rules:
- one edge's batches apply in the order they arrive, even when an earlier one waits on a load and
  a later one needs nothing loaded (a disconnect never overtakes its connect);
- batches of different edges do not wait for each other;
- a load that fails answers UNAVAILABLE only to the operations that needed it; the rest of the
  batch applies (presence keeps working on what is in memory);
- a failed save is retried, and a value chosen meanwhile wins over the one being retried;
- `drain` gives up at its deadline and says how much it left.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core import ops
from actors.core.answers import Verdict
from actors.core.audience import Relations
from actors.core.contract import UNAVAILABLE, AccountRow
from actors.core.ops import Operation
from actors.core.shard import AUDIENCE
from actors.core.slots import slot_of
from actors.presence import PresenceShard, ShardConfig
from tests.unit.conftest import Clock
from tests.unit.fake_store import FakeStore

FRIENDS = {
    "alice": Relations(frozenset({"bob"}), frozenset(), "everyone"),
    "bob": Relations(frozenset({"alice"}), frozenset(), "everyone"),
}


class Flushes:
    """Where the FlushActor would take last-seen values; can be made to fail."""

    def __init__(self) -> None:
        self.written: list[tuple[str, float]] = []
        self.failing = False

    async def __call__(self, entries: list[tuple[str, float]]) -> None:
        if self.failing:
            raise ConnectionError("flush actor away")
        self.written.extend(entries)


@pytest.fixture
def store() -> FakeStore:
    return FakeStore(relations=FRIENDS)


@pytest.fixture
def flushes() -> Flushes:
    return Flushes()


@pytest.fixture
def shard(store: FakeStore, flushes: Flushes, clock: Clock) -> PresenceShard:
    # Not started: no background duty runs unless a test starts it (see `running`).
    return PresenceShard(ShardConfig(0, "postgresql://unused", None), flushes, store=store, clock=clock)


@pytest.fixture
async def running(shard: PresenceShard) -> AsyncIterator[PresenceShard]:
    await shard.start()
    yield shard
    for task in shard._tasks:
        task.cancel()
    await asyncio.gather(*shard._tasks, return_exceptions=True)


async def still_pending(task: asyncio.Task[object], within_s: float = 0.05) -> bool:
    """True if `task` has not finished within `within_s` (it waits on something held)."""
    done, _ = await asyncio.wait({task}, timeout=within_s)
    return not done


# ---------------------------------------------------------------------------- ordering


async def test_a_disconnect_never_overtakes_its_connect_that_waits_on_a_load(
    shard: PresenceShard, store: FakeStore
) -> None:
    store.held = True
    connect = asyncio.create_task(shard.apply("edge-a", [ops.Connect("alice", "s1")]))
    load = await store.next_held()  # the connect waits on the store
    # Needs nothing loaded: without the per-edge order it would apply at once, before the
    # connect, and leave the socket registered for ever.
    disconnect = asyncio.create_task(shard.apply("edge-a", [ops.Disconnect("alice", "s1")]))
    assert await still_pending(disconnect)
    store.held = False
    load.open()
    (_, [connected]), (_, [disconnected]) = await asyncio.gather(connect, disconnect)
    assert connected == ("online", "everyone") and disconnected is None
    assert shard.state.socket_count() == 0
    assert shard.state.real_status_of("alice") == "offline"


async def test_the_lanes_immediate_road_waits_behind_a_batch_of_the_same_edge_that_waits_on_a_load(
    shard: PresenceShard, store: FakeStore
) -> None:
    """`apply_and_collect_now` (the lane's road without a task) applies at once only when the
    edge has no batch still in progress; otherwise it declines and the batch takes its turn."""
    await shard.apply("edge-b", [ops.Connect("bob", "s2")])  # bob is in memory now
    store.held = True
    connect = asyncio.create_task(shard.apply_and_collect("edge-a", [ops.Connect("alice", "s1")], None, 0))
    load = await store.next_held()
    assert shard.apply_and_collect_now("edge-a", [ops.Disconnect("alice", "s1")], None, 0) is None
    # Another edge's batch that needs nothing loaded goes at once.
    now = shard.apply_and_collect_now("edge-b", [ops.SetStatus("bob", "s2", "dnd")], None, 0)
    assert now is not None and now[1] == ["dnd"]
    store.held = False
    load.open()
    await connect
    # The connect's turn is over: the disconnect now goes at once, after it.
    later = shard.apply_and_collect_now("edge-a", [ops.Disconnect("alice", "s1")], None, 0)
    assert later is not None and later[1] == [None]
    assert shard.state.socket_count() == 1  # bob's


async def test_mail_a_batchs_reply_carries_does_not_wake_the_edges_pull(shard: PresenceShard) -> None:
    """The reply of `apply_and_collect` takes the frames its batch caused; the edge's waiting pull
    is woken only for mail left for it (a wake for nothing costs a turn of the loop per change)."""
    await shard.apply_and_collect("edge-a", [ops.Connect("alice", "s1"), ops.Connect("bob", "s2")], None, 0)
    await shard.apply_and_collect("edge-a", [ops.Watch("bob", "s2", ("alice",))], None, 0)
    box = shard.mail["edge-a"]
    box.event.clear()
    _, _, (_, _, items) = await shard.apply_and_collect(
        "edge-a", [ops.SetStatus("alice", "s1", "dnd")], shard.incarnation, 0
    )
    assert items  # bob's publication and alice's own frames, in the reply
    assert not box.event.is_set()
    # A change made through another edge is mail for edge-a that no reply of edge-a carries.
    await shard.apply("edge-b", [ops.Connect("alice", "s3")])
    await shard.apply("edge-b", [ops.SetStatus("alice", "s3", "online")])
    assert box.event.is_set() and box.unhanded()


async def test_batches_of_different_edges_do_not_wait_for_each_other(
    shard: PresenceShard, store: FakeStore
) -> None:
    await shard.apply("edge-b", [ops.Connect("bob", "s2")])  # bob is in memory now
    store.held = True
    slow = asyncio.create_task(shard.apply("edge-a", [ops.Connect("alice", "s1")]))
    held = await store.next_held()
    _, [status] = await shard.apply("edge-b", [ops.SetStatus("bob", "s2", "dnd")])
    assert status == "dnd" and not slow.done()
    store.held = False
    held.open()
    _, [connected] = await slow
    assert connected == ("online", "everyone")


async def test_a_batch_needing_nothing_loaded_never_touches_the_store(
    shard: PresenceShard, store: FakeStore
) -> None:
    await shard.apply("edge-a", [ops.Connect("alice", "s1")])
    before = len(store.calls)
    await shard.apply(
        "edge-a", [ops.SetStatus("alice", "s1", "idle"), ops.Focus("alice", "s1", None), ops.PING]
    )
    assert len(store.calls) == before


async def test_a_query_of_friends_only_waits_for_no_load_of_the_readers_relations(
    shard: PresenceShard, store: FakeStore
) -> None:
    """A shard that does not own the reader: its first query about accounts that name it a friend
    applies at once, on the lane's immediate road; about anyone else it loads the reader first."""
    store.rels["carol"] = Relations(frozenset(), frozenset({"g1"}), "everyone")
    store.rels["bob"] = Relations(frozenset({"alice"}), frozenset({"g1"}), "everyone")
    await shard.apply("edge-a", [ops.Connect("alice", "s1"), ops.Connect("carol", "s3")])
    assert "bob" not in shard.state.relations
    before = len(store.calls)
    now = shard.apply_and_collect_now("edge-b", [ops.Query("bob", "everyone", ("alice",))], None, 0)
    assert now is not None, "waited for a load"
    assert now[1] == [[("alice", "online", None)]]
    assert len(store.calls) == before and "bob" not in shard.state.relations
    # carol shares a server with bob but is no friend: bob's servers decide, so they load.
    both = ops.Query("bob", "everyone", ("alice", "carol"))
    assert shard.apply_and_collect_now("edge-b", [both], None, 0) is None
    _, [found] = await shard.apply("edge-b", [both])
    assert found == [("alice", "online", None), ("carol", "online", None)]
    assert [c.args for c in store.calls[before:] if c.kind == "relations"] == [(("bob",),)]


# ---------------------------------------------------------------------------- failures


async def test_a_bug_in_the_state_is_not_taken_for_a_missing_load(
    shard: PresenceShard, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only `NotLoaded` answers UNAVAILABLE. A KeyError inside the state is a bug: the call fails
    (the lane or Ray logs it with its traceback), instead of closing the socket with "presence is
    restarting" as if the store were away."""
    await shard.apply("edge-a", [ops.Connect("alice", "s1")])

    def buggy(*_args: object, **_kwargs: object) -> str:
        raise KeyError("a bug")

    monkeypatch.setattr(shard.state, "set_status", buggy)
    with pytest.raises(KeyError, match="a bug"):
        await shard.apply("edge-a", [ops.SetStatus("alice", "s1", "dnd")])


async def test_a_load_failure_answers_unavailable_only_to_the_operations_that_needed_it(
    shard: PresenceShard, store: FakeStore
) -> None:
    await shard.apply("edge-a", [ops.Connect("alice", "s1")])
    store.down = True
    _, results = await shard.apply(
        "edge-a",
        [
            ops.SetStatus("alice", "s1", "dnd"),  # in memory: applies
            ops.Connect("carol", "s3"),  # must be loaded: refused, nothing of it applied
            ops.Watch("alice", "s1", ("bob",)),  # bob's relations are not in memory
            ops.PING,
        ],
    )
    assert results == ["dnd", UNAVAILABLE, UNAVAILABLE, None]
    assert shard.state.real_status_of("alice") == "dnd"
    assert not shard.state.has_account("carol")
    counters = {name for name, _, _ in shard.metrics.snapshot()["counters"]}
    assert "shard_preload_failures_total" in counters  # counted and logged, not raised
    # Once the store is back, the same operation goes through.
    store.down = False
    _, [connected] = await shard.apply("edge-a", [ops.Connect("carol", "s3")])
    assert connected == ("online", "everyone")


async def test_a_failed_save_is_retried_and_a_value_chosen_meanwhile_wins(
    shard: PresenceShard, store: FakeStore
) -> None:
    await shard.apply("edge-a", [ops.Connect("alice", "s1"), ops.SetStatus("alice", "s1", "dnd")])
    assert shard.persist_status == {"alice": ("dnd", shard.clock())}
    store.held = True
    saving = asyncio.create_task(shard._persist_once())
    write = await store.next_held("persist")
    assert write.args[0] == (("alice", "dnd", shard.clock()),)
    assert shard.unsaved() == {"alice"}  # being written is not saved yet
    # Chosen while the first write is in flight, then that write fails.
    await shard.apply("edge-a", [ops.SetStatus("alice", "s1", "invisible")])
    write.open(fail=True)
    with pytest.raises(store.errors):
        await saving
    # The newer value, not the retried one (chosen at the same clock reading: the later wins).
    assert shard.persist_status == {"alice": ("invisible", shard.clock())}
    store.held = False
    await shard._persist_once()
    assert store.saved_chosen == {"alice": "invisible"} and shard.unsaved() == set()


async def test_the_save_loop_retries_until_the_store_is_back(
    running: PresenceShard, store: FakeStore
) -> None:
    await running.apply("edge-a", [ops.Connect("alice", "s1")])
    store.down = True
    await running.apply("edge-a", [ops.Settings("alice", "nobody")])
    async with asyncio.timeout(5):
        while store.kinds().count("persist") < 1:  # the first attempt failed
            # The polling interval (inside a timeout).
            await asyncio.sleep(0.01)
    store.down = False
    async with asyncio.timeout(10):  # the retry comes after its backoff (0.5 s at first)
        while store.saved_visibility != {"alice": "nobody"}:
            # The polling interval (inside a timeout).
            await asyncio.sleep(0.01)
    assert store.kinds().count("persist") >= 2 and running.unsaved() == set()


async def test_drain_gives_up_at_its_deadline_and_says_what_it_left(
    shard: PresenceShard, store: FakeStore, flushes: Flushes, clock: Clock
) -> None:
    await shard.apply("edge-a", [ops.Connect("alice", "s1"), ops.SetStatus("alice", "s1", "dnd")])
    clock.advance(5)
    await shard.apply("edge-a", [ops.Disconnect("alice", "s1")])  # a last-seen to flush
    assert shard.state.pending_last_seen
    store.down, flushes.failing = True, True
    async with asyncio.timeout(5):
        left = await shard.drain(timeout_s=0.3)
    assert left == 2  # alice's last-seen and her chosen status
    store.down, flushes.failing = False, False
    assert await shard.drain(timeout_s=5) == 0
    assert store.saved_chosen == {"alice": "dnd"} and [u for u, _ in flushes.written] == ["alice"]


async def test_an_account_unsaved_is_reloaded_with_its_pending_setting(
    running: PresenceShard, store: FakeStore
) -> None:
    """An audience reload that reads the store while a setting is not yet saved keeps the
    setting (the store still has the older value)."""
    await running.apply("edge-a", [ops.Connect("alice", "s1")])
    store.held = True
    await running.apply("edge-a", [ops.Settings("alice", "nobody")])
    write = await store.next_held("persist")  # the save is in flight
    assert store.events is not None
    before = running.state.relations["alice"]
    store.events.on_user("alice")  # somebody changed alice's friends meanwhile
    reload = await store.next_held("relations")
    reload.open()
    async with asyncio.timeout(5):
        while running.state.relations["alice"] is before:  # replaced by the reload
            # The polling interval (inside a timeout).
            await asyncio.sleep(0.01)
    assert running.state.relations["alice"].last_seen_visibility == "nobody"
    store.held = False
    write.open()


async def test_a_held_back_change_goes_out_once_its_window_admits_it_and_the_loop_sleeps_after(
    store: FakeStore, flushes: Flushes, clock: Clock
) -> None:
    """The publication loop ticks only while a change is held back (a shard at rest does not
    wake 20 times a second for nothing); a held change still goes out when its window admits it."""
    shard = PresenceShard(
        ShardConfig(0, "postgresql://unused", None, status_publications=2), flushes, store=store, clock=clock
    )
    await shard.start()
    try:
        await shard.apply("edge-a", [ops.Connect("alice", "s1"), ops.Connect("bob", "s2")])
        await shard.apply("edge-a", [ops.Watch("bob", "s2", ("alice",))])
        # The window's second publication (the connect was its first).
        await shard.apply("edge-a", [ops.SetStatus("alice", "s1", "dnd")])
        assert not shard._held_back.is_set()
        shard.mail["edge-a"].hand_out()
        await shard.apply("edge-a", [ops.SetStatus("alice", "s1", "online")])  # held back
        assert shard._held_back.is_set() and shard.state.next_publication_due() is not None
        clock.advance(2.0)
        async with asyncio.timeout(5):
            while shard.state.next_publication_due() is not None:
                # The polling interval (inside a timeout).
                await asyncio.sleep(0.01)
        _, _, items = shard.mail["edge-a"].hand_out()
        assert any('"online"' in payload for _, payload in items)
        async with asyncio.timeout(5):
            while shard._held_back.is_set():  # nothing held any more: the loop goes to sleep
                await asyncio.sleep(0.01)
    finally:
        for task in shard._tasks:
            task.cancel()
        await asyncio.gather(*shard._tasks, return_exceptions=True)


async def test_the_operator_view_reads_the_store_without_creating_anything(
    shard: PresenceShard, store: FakeStore
) -> None:
    store.rows["bob"] = AccountRow("dnd", "friends", 1_700_000_000.0)
    view = await shard.operator_view("bob")
    assert view is not None and view["chosenStatus"] == "dnd" and view["sockets"] == 0
    assert await shard.operator_view("nobody-here") is None
    assert "nobody-here" not in store.rows


async def test_last_seen_waits_for_the_accounts_unsaved_choice(
    shard: PresenceShard, store: FakeStore, flushes: Flushes, clock: Clock
) -> None:
    """The FlushActor's statement freezes an invisible account's last-seen at its stored hide
    moment: it must read a chosen status no older than the one the shard set the time under.
    So a last-seen value is handed on only once the account's choices are saved."""
    await shard.apply("edge-a", [ops.Connect("alice", "s1"), ops.Connect("bob", "s2")])
    await shard.apply("edge-a", [ops.SetStatus("alice", "s1", "dnd")])
    clock.advance(5)
    await shard.apply("edge-a", [ops.Disconnect("alice", "s1"), ops.Disconnect("bob", "s2")])
    await shard._flush_once()
    assert [u for u, _ in flushes.written] == ["bob"]  # alice's dnd is not saved yet
    await shard._persist_once()
    await shard._flush_once()
    assert [u for u, _ in flushes.written] == ["bob", "alice"]


# ---------------------------------------------------------------------------- the sweep and loads


async def test_a_sweep_while_a_subscribe_waits_on_its_channel_keeps_the_relations_it_loaded(
    shard: PresenceShard, store: FakeStore, clock: Clock
) -> None:
    """A member's subscribe was answered not_allowed (test_resize, once in ~20 runs): its batch
    had loaded the account's relations and was waiting on the channel's server when the periodic
    sweep came, found those relations referenced by nothing here (the account's sockets live on
    another shard) and dropped them; the membership test then read them as no servers at all."""
    store.rels["carol"] = Relations(servers=frozenset({"g"}))
    store.channel_map["voice"] = "g"
    store.held = True
    subscribe = ops.ChannelSubscribe("voice", "carol", "s1")
    subscribing = asyncio.create_task(shard.apply("edge-a", [subscribe]))
    (await store.next_held("relations")).open()
    channel = await store.next_held("channel_servers")
    clock.advance(shard.state.relations_sweep_s)  # the relations' round is due
    shard._sweep_once()
    store.held = False
    channel.open()
    _, [verdict] = await subscribing
    assert subscribe.read(verdict) is Verdict.ALLOWED


async def test_a_sweep_while_a_subscribe_waits_on_relations_keeps_the_channel_it_found(
    shard: PresenceShard, store: FakeStore
) -> None:
    """The channel was in memory, empty since the previous sweep, when the batch found it there
    and went to load the account's relations: the next sweep must not forget it meanwhile."""
    store.rels["carol"] = Relations(servers=frozenset({"g"}))
    store.channel_map["voice"] = "g"
    refused = ops.ChannelSubscribe("voice", "bob", "s9")  # not a member: the channel stays empty
    _, [verdict] = await shard.apply("edge-a", [refused])
    assert refused.read(verdict) is Verdict.NOT_ALLOWED and shard.state.channels.knows("voice")
    shard._sweep_once()  # empty now: the next sweep forgets it, unless it is in use
    store.held = True
    subscribe = ops.ChannelSubscribe("voice", "carol", "s1")
    subscribing = asyncio.create_task(shard.apply("edge-a", [subscribe]))
    relations = await store.next_held("relations")
    shard._sweep_once()
    store.held = False
    relations.open()
    _, [verdict] = await subscribing
    assert subscribe.read(verdict) is Verdict.ALLOWED


async def test_a_sweep_while_an_import_loads_relations_keeps_those_it_found(
    shard: PresenceShard, store: FakeStore, flushes: Flushes, clock: Clock
) -> None:
    """Slots moving in (a resize): the importing shard loads the relations it lacks for the
    accounts and watchers that arrive, and decides again what each watcher sees. A sweep during
    that load must not drop the relations it already had (referenced by nothing here yet), or a
    watcher in the audience is reclassified as an outsider and stops hearing the account."""
    store.rels["alice"] = Relations(servers=frozenset({"g"}))
    store.rels["bob"] = Relations(servers=frozenset({"g"}))
    assert slot_of("alice") != slot_of("bob")
    await shard.apply("edge-a", [ops.Connect("alice", "s1"), ops.Connect("bob", "s2")])
    await shard.apply("edge-a", [ops.Watch("bob", "s2", ("alice",))])
    export = await shard.export_slots([slot_of("alice")])
    other = PresenceShard(ShardConfig(1, "postgresql://unused", None), flushes, store=store, clock=clock)
    # bob's relations are in memory there, from an earlier batch, and referenced by nothing.
    await other.apply("edge-a", [ops.ChannelSubscribe("elsewhere", "bob", "s2")])
    assert other.state.missing_relations(["alice", "bob"]) == ["alice"]
    store.held = True
    importing = asyncio.create_task(other.import_slots(export))
    load = await store.next_held("relations")
    clock.advance(other.state.relations_sweep_s)  # the relations' round is due
    other._sweep_once()
    store.held = False
    load.open()
    await importing
    assert other.state.watchers["alice"]["s2"].sees == AUDIENCE


async def test_a_pull_woken_after_its_edge_died_is_no_word_from_that_edge(
    shard: PresenceShard, clock: Clock
) -> None:
    """Ray's verdict on a dead node departs its edge's sockets as of when the shard last heard
    from that edge. A pull of that edge's, waiting when the node died and woken later by mail for
    it, is no word from it: it renewed the lease when it returned, and the departures were dated
    then (the testbed's node death: an abandoned account's last-seen 2.8 s late, when the changes
    of the clients reconnecting elsewhere woke the dead edge's pull)."""
    await shard.apply("edge-a", [ops.Connect("alice", "s1")])
    await shard.apply("edge-b", [ops.Connect("bob", "s2")])
    await shard.apply("edge-a", [ops.Watch("alice", "s1", ("bob",))])
    incarnation, (_, handed, _) = await shard.pull("edge-a", None, 0, 0)  # what there was so far
    last_heard = clock()
    pulling = asyncio.create_task(shard.pull("edge-a", incarnation, handed, 30.0))
    await asyncio.sleep(0)  # it waits for mail
    assert not pulling.done()
    clock.advance(3.0)  # the node dies meanwhile, silently
    await shard.apply("edge-b", [ops.SetStatus("bob", "s2", "dnd")])  # mail for alice's socket
    _, (_, _, items) = await asyncio.wait_for(pulling, 5)
    assert items  # woken by it
    clock.advance(10.0)  # Ray's verdict
    assert shard.edges_died(["edge-a"]) == ["edge-a"]
    assert shard.state.pending_last_seen["alice"] == last_heard


async def test_a_pull_that_does_not_know_the_incarnation_is_answered_at_once(shard: PresenceShard) -> None:
    """An edge pulling with an incarnation that is not its box's name (this shard restarted, or
    forgot it) is answered at once, mail or not: the name is the news, on which it registers again.
    Before, it waited for mail first, so an edge learnt of an actor `presence rollout` had replaced
    only once its slots were back, and registered all their sockets again under load."""
    await shard.apply("edge-a", [ops.Connect("alice", "s1")])
    incarnation, _ = await asyncio.wait_for(shard.pull("edge-a", "an earlier incarnation", 7, 30.0), 1)
    assert incarnation == shard.mail["edge-a"].incarnation
    pulling = asyncio.create_task(shard.pull("edge-a", incarnation, 0, 30.0))
    assert await still_pending(pulling)  # knowing the name, it waits for mail as before
    pulling.cancel()


async def test_an_edge_counts_as_registered_again_once_it_calls_with_its_boxs_name(
    shard: PresenceShard,
) -> None:
    """`edges_registered`: what `presence rollout` waits for before it gives a replaced shard its
    slots back. An edge calls with the new name only after registering its sockets again."""
    await shard.apply_and_collect("edge-a", [ops.PING], None, 0)  # a call under an older name
    incarnation, _ = await shard.pull("edge-b", None, 0, 0)
    assert await shard.edges_registered() == []
    await shard.apply_and_collect("edge-a", [ops.PING], shard.mail["edge-a"].incarnation, 0)
    assert await shard.edges_registered() == ["edge-a"]
    pulling = asyncio.create_task(shard.pull("edge-b", incarnation, 0, 30.0))
    await asyncio.sleep(0)
    assert await shard.edges_registered() == ["edge-a", "edge-b"]
    pulling.cancel()


def test_a_new_shard_exports_its_counters_by_operation_and_event_at_zero(shard: PresenceShard) -> None:
    """Before the first operation or event of a kind, so that rate() and increase() see it."""
    counters = {(name, tuple(labels)): v for name, labels, v in shard.metrics.snapshot()["counters"]}
    for op in ("connect", "status", "query", "voice_leave", "drop_socket"):
        assert counters[("shard_ops_total", (("op", op),))] == 0, op
    for frame_type in ("presence.changed", "presence.self", "typing", "voice.roster"):
        assert counters[("events_total", (("type", frame_type),))] == 0, frame_type


# ---------------------------------------------------------------- what a batch needs loaded

_NAMES = ("alice", "bob", "carol")
_CHANNELS = ("c1", "c2")
_names = st.sampled_from(_NAMES)
_some_names = st.lists(_names, max_size=3).map(tuple)
_batch_ops = st.one_of(
    st.builds(ops.SetStatus, _names, st.just("s1"), st.sampled_from(("idle", "online"))),
    st.builds(ops.Connect, _names, st.just("s1")),
    st.builds(ops.Disconnect, _names, st.just("s1")),
    st.builds(ops.Watch, _names, st.just("s1"), _some_names),
    st.builds(ops.ChannelSubscribe, st.sampled_from(_CHANNELS), _names, st.just("s1")),
    st.builds(ops.Query, _names, st.just("everyone"), _some_names),
)


@given(
    relations=st.sets(_names),
    accounts=st.sets(_names),
    channels=st.sets(st.sampled_from(_CHANNELS)),
    batch=st.lists(_batch_ops, max_size=5),
)
def test_the_quick_check_that_a_batch_is_in_memory_agrees_with_the_long_way(
    relations: set[str], accounts: set[str], channels: set[str], batch: list[Operation[object]]
) -> None:
    """`_missing` first asks `_all_in_memory`, which builds no lists: it may say "in memory" only
    where the long way (`_gather_missing`) finds nothing missing, or a batch would apply without
    what it needs; and it should say so wherever the long way does (a query excepted, which it
    leaves to the long way), or every status change would pay for the long way again."""
    config = ShardConfig(0, "postgresql://unused", None)
    shard = PresenceShard(config, Flushes(), store=FakeStore(), clock=Clock())
    for user_id in relations:
        shard.state.set_relations(user_id, Relations(frozenset(), frozenset(), "everyone"), 0.0)
    for user_id in accounts:
        shard.state.load_account(user_id, AccountRow(), 0.0)
    for channel_id in channels:
        shard.state.channels.load_channel(channel_id, None)
    quick = shard._all_in_memory(batch)
    nothing_missing = shard._gather_missing(batch) is None
    if any(isinstance(op, ops.Query) for op in batch):
        assert not quick
    else:
        assert quick == nothing_missing
    assert (shard._missing(batch) is None) == nothing_missing
