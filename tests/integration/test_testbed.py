"""The multi-host testbed (issue 25): `python -m tests.testbed run` as a test. Three network
namespaces as hosts, `ray up ray_cluster.yaml` over SSH, HAProxy in front of the edges, watchers
through it, a worker cut off for 30 s, a worker node killed whole, the head restarted; the table
of what it measured is printed. Slow (about ten minutes on two cores) and needs root;
docs/testing.md ("Multi-host testbed")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0, reason="the testbed makes network namespaces: run as root")
@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("ip", "unshare", "ssh-keygen", "ssh")), reason="needs ip, unshare, ssh"
)
@pytest.mark.skipif(shutil.which("ray") is None, reason="Ray's launcher (`ray`) is not on PATH")
def test_the_testbed_runs_every_scenario_and_every_expectation_holds() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESENCE_", "RAY_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-m", "tests.testbed", "run"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500,
    )  # fmt: skip
    print(out.stdout[-6000:])
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-3000:]
