"""One factor for every wait of the tests (issue 27).

A test waits for something to happen (a frame, a row, a process gone) with a timeout, never for
a fixed time hoping it has happened. Such a timeout only says when to give up and call it a
failure: it costs nothing while the test passes, so it is generous, and it is stretched by one
factor, `PRESENCE_TEST_PATIENCE` (default 3), on every wait of the suite: `patience(seconds)`.
Two cores shared by parallel workers, or a machine shared with other work, stretch every step
(a Ray actor's restart, `initdb`, a subprocess importing Ray) several times over.

What is *not* scaled: a bound that is the scenario itself (an account offline no sooner than its
socket timeout, a client giving up within its own two seconds, a departure stored within a second
of the moment it happened). Those are asserted on measured times, and a test states them as such.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

PATIENCE = float(os.environ.get("PRESENCE_TEST_PATIENCE", "3"))


def patience(seconds: float) -> float:
    """How long to wait for something the test expects within about `seconds` on a quiet machine."""
    return seconds * PATIENCE


def wait_until(
    check: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    what: str = "",
    explain: Callable[[], str] | None = None,
) -> T:
    """Block until `check()` returns something truthy (returned), for at most `patience(timeout)`;
    fail with its last value and `explain()` (a log, say). `check` may raise to fail at once (the
    process it waits on died). For synchronous tests (subprocesses, files, processes); an async
    test uses tests.integration.wsclient.eventually."""
    limit = patience(timeout)
    deadline = time.monotonic() + limit
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(
                f"{what or 'condition'} not met within {limit:.0f} s (last value {value!r}){detail}"
            )
        time.sleep(interval)  # the interval of a polling loop
