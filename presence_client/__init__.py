"""presence-cluster's asyncio client for back-end services and bots (docs/clients.md).

    from presence_client import PresenceClient

    async with PresenceClient("ws://127.0.0.1:8765/ws/presence", token=token) as client:
        await client.subscribe(["bob"])
        print(client.get("bob"))

It needs only `websockets` (and the display helper `describe_last_seen`, the one the service's
own code and tests use). The reconnect policy is a pure function, `reconnect_delay`, for anything
that must reconnect the way real clients do (benchmarks included).
"""

from actors.core.lastseen_display import describe_last_seen
from presence_client.backoff import (
    DEFAULT_BACKOFF,
    RESTART_CLOSE_CODES,
    THROTTLING_CLOSE_CODES,
    BackoffPolicy,
    reconnect_delay,
    restart_delay,
)
from presence_client.client import MAX_QUEUED_FRAMES, ConnectionState, PresenceClient, TokenContext
from presence_client.picture import (
    MAX_QUERY_IDS,
    PRESENT,
    TYPING_LAPSE_S,
    Change,
    Entry,
    PresenceError,
    QueryAnswer,
    chunk_ids,
)

__all__ = [
    "DEFAULT_BACKOFF",
    "MAX_QUERY_IDS",
    "MAX_QUEUED_FRAMES",
    "PRESENT",
    "RESTART_CLOSE_CODES",
    "THROTTLING_CLOSE_CODES",
    "TYPING_LAPSE_S",
    "BackoffPolicy",
    "Change",
    "ConnectionState",
    "Entry",
    "PresenceClient",
    "PresenceError",
    "QueryAnswer",
    "TokenContext",
    "chunk_ids",
    "describe_last_seen",
    "reconnect_delay",
    "restart_delay",
]
