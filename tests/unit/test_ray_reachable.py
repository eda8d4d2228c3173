"""`presence status` and `presence scale` fail in seconds, with one line, while Ray is away
(issue 25: `presence status` hung 95 s while the head was down)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from cluster.config import Settings
from cluster.report import report
from cluster.rollout import cmd_rollout
from cluster.runtime import ClusterInfo, ray_reachable_or_exit, write_info


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


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stale_data_dir(tmp_path: Path) -> Path:
    """What `kill -9` of `presence up` leaves: a cluster.json naming a Ray and stores now gone."""
    port = _closed_port()
    write_info(
        tmp_path,
        ClusterInfo(
            f"postgresql://u:p@127.0.0.1:{port}/db", None, f"127.0.0.1:{port}", "ns", "ws://x", "http://x", 1
        ),
    )
    return tmp_path


def test_report_with_ray_away_reports_the_rest_in_seconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`presence report` joined the Ray that was away and retried for minutes (an operator's
    pass: 5.5 min with no report); now it says so and reports what the stores hold."""
    started = time.monotonic()
    assert report(Settings(data_dir=_stale_data_dir(tmp_path))) == 0
    assert time.monotonic() - started < 20
    out, err = capsys.readouterr()
    assert "presence report: Ray is not reachable" in err
    assert "pending last-seen writes: shards unavailable, flusher unavailable" in out


def test_rollout_with_ray_away_is_one_line_in_seconds(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(SystemExit) as e:
        cmd_rollout(Settings(data_dir=_stale_data_dir(tmp_path)))
    assert time.monotonic() - started < 5
    assert str(e.value).startswith("presence rollout: Ray is not reachable")
