"""Retrying a call with the one backoff (the loop around `actors.core.backoff.Backoff`), and
keeping a background duty running (`supervise`).

The policy is pure and lives in the core; waiting is I/O on a clock, so the loop lives here, in
the shells' layer (tests/unit/test_layers.py keeps asyncio and clocks out of the core). Its
clock, sleep and random source are parameters, so its tests (tests/unit/test_retry.py) run in
microseconds.
"""

from __future__ import annotations

import asyncio
import random as _random
import time
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

from actors.core.backoff import Backoff, Random

__all__ = ["retry", "supervise"]

T = TypeVar("T")


async def retry(
    call: Callable[[], Awaitable[T]],
    policy: Backoff,
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    when: Callable[[BaseException], bool] | None = None,
    deadline: float | None = None,
    on_retry: Callable[[BaseException, float], None] | None = None,
    random: Random = _random.random,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> T:
    """Await `call()` until it returns, waiting `policy.delay(attempt)` after each failure.

    Only exceptions of the `retry_on` types that `when` (if given) accepts are retried; any other
    propagates at once (cancellation always does). With a `deadline` (on `clock`), a failure
    whose next wait would end past it is raised instead; without one the call is retried forever.
    `on_retry(error, wait)` is told of each failure before its wait (metrics, logs)."""
    attempt = 0
    while True:
        try:
            return await call()
        except asyncio.CancelledError:
            raise
        except retry_on as e:
            if when is not None and not when(e):
                raise
            wait = policy.delay(attempt, random)
            if deadline is not None and clock() + wait > deadline:
                raise
            if on_retry is not None:
                on_retry(e, wait)
            await sleep(wait)
            attempt += 1


async def supervise(
    duty: Callable[[], Awaitable[None]],
    *,
    restart_after_s: float,
    on_failure: Callable[[Exception], None],
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> NoReturn:
    """Keep a background duty running until cancelled: run `duty` again whenever it returns, and,
    when it raises, tell `on_failure` (called inside the handler, so a logger sees the traceback)
    and start it again after `restart_after_s`. A duty that fails is restarted, never silently
    gone: every caller waiting on it (a writer waiting for its batch) would hang."""
    while True:
        try:
            await duty()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            on_failure(e)
            await sleep(restart_after_s)
