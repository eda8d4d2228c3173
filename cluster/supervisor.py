"""Run the Ray side of `presence up` in a child process, so that its own stop never depends on Ray.

A driver's calls into a Ray whose daemons have gone (a SIGTERM to the whole process group reaches
a local cluster's GCS and raylet too) block in C, where no Python signal handler runs, and Ray then
ends the process after a minute (exit 1), or its abseil handler aborts it 3 s after a SIGTERM. A
process in that state cannot be trusted to stop the embedded PostgreSQL and Redis on its way out.
So `presence up` starts those, forks, and waits: the child joins Ray, starts the pool and serves
the edge; the parent, which never calls into Ray, stops the servers once the child has gone,
however it went.

The child is a process group of its own. A signal meant for the service (Ctrl-C in a terminal,
SIGTERM to the process or its group) reaches it exactly once, forwarded by the parent, and Ray's
daemons, which it starts in its group, are left running long enough to drain the pool. If the
parent dies (SIGKILL), the kernel sends the child SIGTERM (Linux).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

# Signals forwarded to the child.
FORWARDED = (signal.SIGINT, signal.SIGTERM)
# Linux prctl(2) option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Ended:
    """How the child ended: its exit code, or the signal that killed it; and whether the parent
    was asked to stop meanwhile (then the service was interrupted, whatever the child returned)."""

    code: int | None
    killed_by: int | None
    interrupted: bool

    def describe(self) -> str:
        if self.killed_by is not None:
            return f"killed by {signal.Signals(self.killed_by).name}"
        return f"exit code {self.code}"


def run_in_child(work: Callable[[], int], stop_within_s: float = 120.0, poll_s: float = 0.1) -> Ended:
    """Fork; the child runs `work` (its return value is the exit code; KeyboardInterrupt is 130)
    and the parent waits for it, forwarding SIGINT and SIGTERM. `stop_within_s` after the first
    forwarded signal a child still running is killed with its whole process group (SIGKILL), and
    whatever is left in that group once the child has gone is killed too: Ray's daemons of a
    child that died abruptly. No thread may be running at the fork."""
    sys.stdout.flush()
    sys.stderr.flush()
    parent = os.getpid()
    signalled: list[int] = []
    child: list[int] = []

    def forward(signo: int, _frame: FrameType | None) -> None:
        signalled.append(signo)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child[0], signo)

    # Held back over the fork, so that none lands between it and the handlers each side needs.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child leaves through os._exit; its effects are tested
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os._exit(_child(work, parent))
    child.append(pid)
    previous = {signo: signal.signal(signo, forward) for signo in FORWARDED}
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    try:
        status = _wait(pid, signalled, stop_within_s, poll_s)
    finally:
        for signo, handler in previous.items():
            signal.signal(signo, handler)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    if os.WIFSIGNALED(status):
        return Ended(None, os.WTERMSIG(status), bool(signalled))
    return Ended(os.WEXITSTATUS(status), None, bool(signalled))


def _wait(pid: int, signalled: list[int], stop_within_s: float, poll_s: float) -> int:
    deadline: float | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if signalled and deadline is None:
            deadline = time.monotonic() + stop_within_s
        if deadline is not None and time.monotonic() > deadline:
            print(
                f"presence: the service did not stop within {stop_within_s:.0f} s; killing it",
                file=sys.stderr,
                flush=True,
            )
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]
        time.sleep(poll_s)  # signal handlers run here


def _child(work: Callable[[], int], parent: int) -> int:  # pragma: no cover - the forked child
    code = 1
    try:
        os.setpgid(0, 0)
        _die_with(parent)
        code = work()
    except KeyboardInterrupt:
        code = 130
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _die_with(parent: int) -> None:  # pragma: no cover - runs in the forked child
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)
