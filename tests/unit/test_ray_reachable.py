"""`presence status` and `presence scale` fail in seconds, with one line, while Ray is away
(issue 25: `presence status` hung 95 s while the head was down)."""

from __future__ import annotations

import socket
import time

import pytest

from cluster.runtime import ray_reachable_or_exit


def test_a_gcs_that_does_not_answer_is_one_line_within_seconds() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(SystemExit) as e:
        ray_reachable_or_exit(f"127.0.0.1:{port}", "status")
    assert time.monotonic() - started < 5
    line = str(e.value)
    assert "\n" not in line and line.startswith("presence status: Ray is not reachable at 127.0.0.1:")


def test_a_listening_gcs_and_auto_pass() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        ray_reachable_or_exit(f"127.0.0.1:{s.getsockname()[1]}", "status")
    ray_reachable_or_exit("auto", "status")
