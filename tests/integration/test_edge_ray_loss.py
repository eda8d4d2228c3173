"""`presence edge` when Ray is not there for it (issue 25): after a head restart the head's GCS
answers again but this node's own Ray has gone (it exits a minute after losing the GCS), and
`ray.init` waits for a raylet that never comes; the edge hung there, so its supervisor never
tried again. Now it gives up at PRESENCE_RAY_JOIN_TIMEOUT_S with one line and exit code 3,
saying where it is meanwhile. The edge leaving when its raylet goes is tests/unit/test_liveness.py
(the watch) and the testbed's head restart (the real thing)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def ray_head(tmp: Path, port: int, env: dict[str, str]) -> Iterator[None]:
    """A Ray head of this test's own (its own temp dir and port), stopped by its PIDs."""
    proc = subprocess.Popen(
        ["ray", "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
         "--num-cpus=0", "--include-dashboard=false", f"--temp-dir={tmp}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            time.sleep(0.5)
        time.sleep(3)  # its raylet registers
        yield
    finally:
        family = [proc, *psutil.Process(proc.pid).children(recursive=True)] if proc.poll() is None else [proc]
        for p in family:
            with contextlib.suppress(ProcessLookupError, psutil.Error):
                p.send_signal(signal.SIGKILL)
        proc.wait(30)


@pytest.mark.skipif(
    shutil.which("presence") is None or shutil.which("ray") is None, reason="needs presence, ray"
)
def test_presence_edge_gives_up_joining_when_this_node_has_no_ray_in_bounded_time(tmp_path: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESENCE_", "RAY_"))}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    ray_tmp = Path("/tmp") / f"edge-ray-loss-{port}"  # short: Ray's socket paths have a length limit
    with ray_head(ray_tmp, port, env):
        edge_env = {
            **env,
            "RAY_ADDRESS": f"127.0.0.1:{port}",
            # A node whose Ray is gone: no raylet has this address.
            "PRESENCE_RAY_NODE_IP": "127.0.0.2",
            "PRESENCE_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none",
            "PRESENCE_TOKEN_SECRET": "s" * 40,
            "PRESENCE_INTERNAL_TOKEN": "t" * 40,
            "PRESENCE_RAY_JOIN_TIMEOUT_S": "25",
        }
        started = time.monotonic()
        out = subprocess.run(
            ["presence", "edge", "--data-dir", str(tmp_path)],
            env=edge_env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        took = time.monotonic() - started
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert out.returncode == 3, out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("presence:")]
    assert len(lines) == 1 and "could not join Ray" in lines[0] and "within 25 s" in lines[0], out.stderr
    assert "still joining Ray" in out.stdout, out.stdout
    assert took < 60, took
