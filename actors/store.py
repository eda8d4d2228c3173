"""What a shard needs from its durable store, as an interface.

The shard shell (`actors.presence.PresenceShard`) is given a `ShardStore` the way it is given
`flush_write` and `clock`: `actors.pool` builds the PostgreSQL one (`actors.pgstore`), and the
unit tests a fake whose every load waits on a gate they open (`tests/unit/test_shard_shell.py`),
so the shell's ordering and failure rules are tested without PostgreSQL and without timing.

Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from actors.core.audience import Relations
from actors.core.contract import AccountRow


class Loads(Protocol):
    """The reads of one batch, together (on one connection of a PostgreSQL store)."""

    async def relations(self, user_ids: list[str]) -> dict[str, Relations]:
        """Friends, servers and visibility of each account; unknown ones get empty relations."""
        ...

    async def accounts(self, user_ids: list[str]) -> dict[str, AccountRow]:
        """The row of each account, creating the missing ones with the defaults."""
        ...

    async def channel_servers(self, channel_ids: list[str]) -> dict[str, str | None]:
        """The server of each channel; None for a channel the store does not know."""
        ...


@dataclass(frozen=True, slots=True)
class AudienceEvents:
    """What the store tells the shard about audience changes made by others (`presence load`):
    an account's relations or setting changed, a channel changed server, or changes may have been
    missed (a lost notification connection: forget every cached audience)."""

    on_user: Callable[[str], object]
    on_settings: Callable[[str], object]
    on_channel: Callable[[str], object]
    on_reset: Callable[[], object]


class ShardStore(Protocol):
    # The exceptions meaning "the store is away (for now)": the shell keeps working on what it
    # has in memory, answers UNAVAILABLE for what it could not load, and retries its writes.
    errors: tuple[type[BaseException], ...]

    async def start(self, events: AudienceEvents) -> None:
        """Connect, and start telling `events` about audience changes."""
        ...

    async def stop(self) -> None: ...

    def loading(self) -> AbstractAsyncContextManager[Loads]:
        """The reads of one batch; `async with store.loading() as loads: ...`."""
        ...

    async def read_accounts(self, user_ids: list[str]) -> dict[str, AccountRow]:
        """The rows of the accounts that exist; creates nothing (the operator's view)."""
        ...

    async def server_members(self, server_id: str) -> list[str]: ...

    def last_seen_since(self, since: float) -> AsyncIterator[list[tuple[str, float]]]:
        """Stored last-seen times at or after `since`, in chunks (refilling the active counts)."""
        ...

    async def persist(
        self, chosen: list[tuple[str, str, float]], visibility: list[tuple[str, str, float]]
    ) -> None:
        """Save chosen statuses and last-seen visibilities (account, value, when it was chosen),
        in one go; the store keeps the newest choice of each account."""
        ...

    async def healthy(self, timeout_s: float) -> bool:
        """Whether the store answers now (the operator page's health line)."""
        ...
