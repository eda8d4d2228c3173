"""actors/lazy_start.py: a host's start runs once, and a failed or abandoned one is tried again."""

from __future__ import annotations

import asyncio

import pytest

from actors.lazy_start import LazyStart


class Starter:
    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self) -> None:
        self.calls += 1
        await self.gate.wait()
        if self.calls <= self.failures:
            raise ConnectionRefusedError("PostgreSQL is away")


async def test_a_successful_start_runs_once_for_every_caller() -> None:
    starter = Starter()
    lazy = LazyStart(starter)
    await asyncio.gather(*(lazy.wait() for _ in range(5)))
    await lazy.wait()
    assert starter.calls == 1


async def test_a_failed_start_is_tried_again_by_the_next_call() -> None:
    # A shard restarted while PostgreSQL was away serves once it is back.
    starter = Starter(failures=2)
    lazy = LazyStart(starter)
    for _ in range(2):
        with pytest.raises(ConnectionRefusedError):
            await lazy.wait()
    await lazy.wait()
    await lazy.wait()
    assert starter.calls == 3


async def test_a_cancelled_caller_does_not_cancel_the_start_others_wait_on() -> None:
    starter = Starter()
    starter.gate.clear()
    lazy = LazyStart(starter)
    first = asyncio.ensure_future(lazy.wait())
    second = asyncio.ensure_future(lazy.wait())
    await asyncio.sleep(0)  # both callers are waiting on the start
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    starter.gate.set()
    await asyncio.wait_for(second, 5)
    assert starter.calls == 1
