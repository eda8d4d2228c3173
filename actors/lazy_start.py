"""A host's start, run by its first call and tried again after a failure.

Ray re-runs an actor's `__init__` after a crash but never an async start, so the hosts in
actors/pool.py start on their first call. A start that failed (a shard restarted while
PostgreSQL was away: its pool cannot connect) must not be kept: the next call tries again, so
the shard serves as soon as PostgreSQL is back. A caller that is cancelled (its edge gave up)
does not cancel the start the other callers wait on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class LazyStart:
    def __init__(self, start: Callable[[], Awaitable[None]]) -> None:
        self._start = start
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        await self._start()

    @property
    def started(self) -> bool:
        """The start has succeeded (`wait` would return at once)."""
        task = self._task
        return task is not None and task.done() and not task.cancelled() and task.exception() is None

    async def wait(self) -> None:
        """Returns once the start has succeeded; raises its error, and forgets it, if it failed."""
        task = self._task
        if task is None:
            task = self._task = asyncio.get_running_loop().create_task(self._run())
        try:
            await asyncio.shield(task)
        except BaseException:
            if task.done() and (task.cancelled() or task.exception() is not None) and self._task is task:
                self._task = None
            raise
