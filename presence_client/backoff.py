"""The reconnect policy: capped exponential backoff with full jitter. Pure: the random source is a
parameter, so a benchmark (or a test) can replay a storm exactly.

The draw is the service's own (`actors.core.backoff`, also behind the edges' and shards'
retries): full jitter, or equal jitter when throttled. The same numbers as the JavaScript
client's `clients/js/src/backoff.js` (in milliseconds there); `tests/unit/backoff_cases.json`
holds both to them.

Why full jitter: when an edge dies, every socket it held notices within a second or two. Clients
that all wait "1 s, 2 s, 4 s" come back in synchronised waves, each one a connection storm on the
surviving edges. Drawing the wait uniformly from ``[0, min(cap, base * 2**attempt))`` spreads each
wave over its whole window. A server that says "too many" (4029) or "flooding" (1008) is obeyed
harder: a longer base, and never less than half the window. A server that closes with 1012 (its
edge drains) or 1011 (a shard out of reach) asks for the opposite: come back at once, to any edge,
within a small jittered window (`restart_delay`), and the account keeps its presence meanwhile
(protocol.md "Drain and resume").
"""

from __future__ import annotations

import random as _random
from collections.abc import Callable
from dataclasses import dataclass

from actors.core.backoff import Backoff

__all__ = [
    "DEFAULT_BACKOFF",
    "RESTART_CLOSE_CODES",
    "THROTTLING_CLOSE_CODES",
    "BackoffPolicy",
    "reconnect_delay",
    "restart_delay",
]

# Close codes after which a client backs off harder: too many sockets (4029), a flood (1008).
THROTTLING_CLOSE_CODES = frozenset({4029, 1008})
# Close codes after which a client comes back at once: the edge drains (1012), a shard was out of
# reach (1011). The server closed it for its own reasons and holds the account's place.
RESTART_CLOSE_CODES = frozenset({1011, 1012})


@dataclass(frozen=True)
class BackoffPolicy:
    """Windows in seconds."""

    base_s: float = 1.0  # window of the first retry
    cap_s: float = 30.0  # the window never grows past this
    throttled_base_s: float = 10.0  # after 4029 / 1008
    throttled_cap_s: float = 120.0
    # After 1012 / 1011: uniform over this window, then the usual backoff from its first window.
    # Small next to the resume window (15 s), and the drain already spreads its closes over 10 s.
    restart_window_s: float = 1.0


DEFAULT_BACKOFF = BackoffPolicy()


def reconnect_delay(
    attempt: int,
    throttled: bool = False,
    policy: BackoffPolicy = DEFAULT_BACKOFF,
    random: Callable[[], float] = _random.random,
) -> float:
    """Seconds to wait before reconnect attempt `attempt` (0 for the first retry after a lost
    connection); `throttled` after a 4029 or 1008 close; `random` returns a float in [0, 1)."""
    if throttled:
        return Backoff(policy.throttled_base_s, policy.throttled_cap_s, floor=0.5).delay(attempt, random)
    return Backoff(policy.base_s, policy.cap_s).delay(attempt, random)


def restart_delay(
    policy: BackoffPolicy = DEFAULT_BACKOFF, random: Callable[[], float] = _random.random
) -> float:
    """Seconds to wait before reconnecting after a 1012 or 1011 close: at once, jittered over
    `restart_window_s` so that the clients of one drained edge do not arrive in one instant."""
    return Backoff(policy.restart_window_s, policy.restart_window_s).delay(0, random)
