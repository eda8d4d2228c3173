"""cluster/supervisor.py: the child's ending as the parent reports it, signals forwarded once,
a child that does not stop killed, and nothing of the child's process group left behind. Real
forks and signals; the children do nothing but wait and exit."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from cluster.supervisor import Ended, run_in_child
from tests.timing import wait_until


@pytest.fixture
def ready() -> Iterator[tuple[int, int]]:
    """A pipe the child writes a byte to once it is ready for the test's signal."""
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def signal_parent_when_ready(r: int, signo: int) -> None:
    """From a thread, as a supervisor would: once the child is ready, signal this (the parent)
    process; its handler (installed by run_in_child) runs in the main thread."""

    def go() -> None:
        os.read(r, 1)
        os.kill(os.getpid(), signo)

    threading.Thread(target=go, daemon=True).start()


def waits_for_a_signal(w: int, handled: int = 0) -> Callable[[], int]:
    def work() -> int:
        os.write(w, b"!")
        time.sleep(30)  # a KeyboardInterrupt (SIGINT, SIGTERM as the service installs it) ends this
        return handled

    return work


def test_the_childs_exit_code_passes_through() -> None:
    assert run_in_child(lambda: 3, poll_s=0.01) == Ended(3, None, False)
    assert run_in_child(lambda: 0, poll_s=0.01) == Ended(0, None, False)


def test_a_keyboard_interrupt_in_the_child_is_130() -> None:
    def interrupted() -> int:
        raise KeyboardInterrupt

    assert run_in_child(interrupted, poll_s=0.01) == Ended(130, None, False)


def test_an_exception_in_the_child_is_1() -> None:
    def broken() -> int:
        raise RuntimeError("boom")

    assert run_in_child(broken, poll_s=0.01).code == 1


def test_sigterm_to_the_parent_reaches_the_child_once(ready: tuple[int, int]) -> None:
    """The child stops like Ctrl-C on SIGTERM (what `presence up` installs); the parent keeps
    waiting, and says it was interrupted."""
    r, w = ready
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        signal_parent_when_ready(r, signal.SIGTERM)
        ended = run_in_child(waits_for_a_signal(w), poll_s=0.01)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert ended == Ended(130, None, True)


def test_a_child_killed_is_reported_as_such() -> None:
    def dies() -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    ended = run_in_child(dies, poll_s=0.01)
    assert ended == Ended(None, signal.SIGKILL, False)
    assert ended.describe() == "killed by SIGKILL"


def test_a_child_that_does_not_stop_is_killed_after_the_bound(ready: tuple[int, int]) -> None:
    r, w = ready

    def stuck() -> int:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a driver blocked in C, deaf to signals
        os.write(w, b"!")
        time.sleep(30)
        return 0

    signal_parent_when_ready(r, signal.SIGINT)
    started = time.monotonic()
    ended = run_in_child(stuck, stop_within_s=0.5, poll_s=0.01)
    assert ended == Ended(None, signal.SIGKILL, True)
    assert time.monotonic() - started < 10


def test_what_the_child_started_in_its_group_goes_with_it(ready: tuple[int, int]) -> None:
    """Ray's daemons of a child that died abruptly: still in the child's process group."""
    r, w = ready

    def leaves_a_process() -> int:
        left = subprocess.Popen(["sleep", "60"])
        os.write(w, str(left.pid).encode() + b"\n")
        return 0

    assert run_in_child(leaves_a_process, poll_s=0.01) == Ended(0, None, False)
    left_pid = int(os.read(r, 32).decode().strip())

    def gone() -> bool:
        try:
            return psutil.Process(left_pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    # SIGKILL was sent before run_in_child returned; its delivery is the kernel's, a moment later.
    wait_until(gone, 5, interval=0.01, what="the child's leftover process killed")


def test_presence_up_lets_the_service_drain_as_long_as_it_is_configured_to() -> None:
    """The bound after which `presence up` kills its Ray side covers the edge's drain, which
    operators size to their sockets (docs/operations.md: about sockets / 100 s), and the pool's."""
    from actors.pool import POOL_DRAIN_DEADLINE_S
    from cluster.config import Settings
    from cluster.up import stop_bound_s

    settings = Settings(drain_grace_s=4.0, drain_window_s=190.0)
    assert stop_bound_s(settings) >= 4.0 + 190.0 + POOL_DRAIN_DEADLINE_S + 30.0
