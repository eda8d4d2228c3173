"""The router's batching underneath every call (edge/router.py `Router.call`): operations for one
shard leave together once the window passes or the batch is full, and at most `max_in_flight`
calls per shard are out at a time; what arrives meanwhile leaves as one batch when a call comes
back (so under load the batches grow instead of the number of calls). The router is given a fake
pool (tests/unit/fake_shards.py) whose shard's `apply` waits for the test: no Ray."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from actors.core import ops
from actors.metrics import Metrics
from edge.router import Router
from tests.unit.fake_shards import FakeShards


class GatedShard:
    """A shard whose every `apply` waits until the test opens its gate (`broken`: fails at once)."""

    def __init__(self) -> None:
        self.batches: list[list[ops.Op]] = []
        self.gates: list[asyncio.Event] = []
        self.broken = False

    async def apply(self, _index: int, batch: list[ops.Op]) -> list[object]:
        if self.broken:
            raise ConnectionError("shard away")
        gate = asyncio.Event()
        self.batches.append(batch)
        self.gates.append(gate)
        await gate.wait()
        return [None] * len(batch)


MakeRouter = Callable[..., Awaitable[tuple[Router, GatedShard]]]


@pytest.fixture
async def router() -> AsyncIterator[MakeRouter]:
    """A router on a one-shard fake pool, closed after the test."""
    made: list[Router] = []

    async def make(
        max_in_flight: int, max_ops: int = 500, connect_window_ms: float = 0.0
    ) -> tuple[Router, GatedShard]:
        async def no_restart(_: int) -> None:
            return None

        shard = GatedShard()
        r = Router(
            "edge-t", lambda _i, _p: None, no_restart, Metrics(), FakeShards(1, shard.apply), window_ms=1.0,
            max_ops=max_ops, max_in_flight=max_in_flight, connect_window_ms=connect_window_ms,
        )  # fmt: skip
        await r.refresh_map()
        made.append(r)
        return r, shard

    yield make
    for r in made:
        await r.close()


async def settle() -> None:
    for _ in range(5):
        # Turns of the loop with real time passing: what the batching window must not wait for.
        await asyncio.sleep(0.005)


def pings(n: int) -> list[ops.Op]:
    return [ops.Spend(f"u{i}", "lookups", 1) for i in range(n)]


async def test_what_arrives_while_the_calls_are_out_leaves_as_one_batch(router: MakeRouter) -> None:
    r, shard = await router(max_in_flight=1)
    first = [r.call(0, op) for op in pings(2)]
    await settle()
    assert [len(b) for b in shard.batches] == [2]
    later = [r.call(0, op) for op in pings(7)]
    await settle()  # the window passed, but the one call allowed is still out
    assert [len(b) for b in shard.batches] == [2]
    shard.gates[0].set()
    await asyncio.gather(*first)
    await settle()
    assert [len(b) for b in shard.batches] == [2, 7]  # everything that waited, in one call
    shard.gates[1].set()
    await asyncio.gather(*later)


async def test_a_waiting_queue_leaves_in_batches_of_at_most_max_ops_in_order(router: MakeRouter) -> None:
    r, shard = await router(max_in_flight=1, max_ops=3)
    sent = pings(8)
    futures = [r.call(0, op) for op in sent]
    for _ in range(3):
        await settle()
        shard.gates[-1].set()
    await asyncio.gather(*futures)
    assert [len(b) for b in shard.batches] == [3, 3, 2]
    assert [op for b in shard.batches for op in b] == sent


async def test_up_to_max_in_flight_calls_go_out_at_once(router: MakeRouter) -> None:
    r, shard = await router(max_in_flight=2, max_ops=2)
    futures = [r.call(0, op) for op in pings(6)]
    await settle()
    assert [len(b) for b in shard.batches] == [2, 2]  # the third batch waits
    shard.gates[1].set()
    await settle()
    assert [len(b) for b in shard.batches] == [2, 2, 2]
    for gate in shard.gates:
        gate.set()
    await asyncio.gather(*futures)


async def test_a_failed_call_frees_its_place(router: MakeRouter) -> None:
    r, shard = await router(max_in_flight=1)
    shard.broken = True
    failed = r.call(0, pings(1)[0])
    await settle()
    assert isinstance(failed.exception(), ConnectionError)
    assert r.lines.in_flight(0) == 0


def connects(n: int, first: int = 0) -> list[ops.Op]:
    return [ops.Connect(f"u{i}", f"s{i}") for i in range(first, first + n)]


async def test_connects_on_a_busy_line_wait_their_window_not_the_call_coming_back(router: MakeRouter) -> None:
    r, shard = await router(max_in_flight=1, connect_window_ms=60.0)
    first = [r.call(0, op) for op in pings(1)]
    await settle()
    waiting = [r.call(0, op) for op in connects(3)]
    shard.gates[0].set()
    await asyncio.gather(*first)
    await settle()  # the call came back, 25 ms passed: the connects still gather
    assert [len(b) for b in shard.batches] == [1]
    more = [r.call(0, op) for op in connects(2, first=3)]
    await asyncio.sleep(0.08)  # their window passed: one batch of all five
    assert [len(b) for b in shard.batches] == [1, 5]
    shard.gates[1].set()
    await asyncio.gather(*waiting, *more)


async def test_anything_else_joining_a_line_of_connects_sends_it_on_the_usual_rule(
    router: MakeRouter,
) -> None:
    r, shard = await router(max_in_flight=2, connect_window_ms=1_000.0)
    first = [r.call(0, op) for op in pings(1)]
    await settle()
    line = [r.call(0, op) for op in connects(3)]
    await settle()
    assert [len(b) for b in shard.batches] == [1]  # gathering for a second
    status = r.call(0, ops.SetStatus("u9", "s9", "dnd"))
    await settle()  # the usual window (1 ms): the status change takes the connects along, in order
    assert [len(b) for b in shard.batches] == [1, 4]
    assert isinstance(shard.batches[1][-1], ops.SetStatus)
    for gate in shard.gates:
        gate.set()
    await asyncio.gather(*first, *line, status)


async def test_connects_on_an_idle_line_leave_at_once(router: MakeRouter) -> None:
    r, shard = await router(max_in_flight=2, connect_window_ms=1_000.0)
    sent = [r.call(0, op) for op in connects(2)]
    await settle()
    assert [len(b) for b in shard.batches] == [2]  # Nagle's rule: nothing in flight, no wait
    shard.gates[0].set()
    await asyncio.gather(*sent)
