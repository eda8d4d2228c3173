"""The deployment rehearsal (issue 15): ray_cluster.yaml's own head and worker start commands as a
three-node Ray cluster on 127.0.0.1-3, an edge per node, clients through every edge. See
rehearsal.py for what it does; docs/operations.md ("Rehearsal") for how to run it. Slow (about
two minutes on two cores) and needs root for its namespaces."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0, reason="the rehearsal makes namespaces: run as root")
@pytest.mark.skipif(
    not all(shutil.which(t) for t in ("unshare", "flock", "ip")), reason="needs unshare, flock, ip"
)
@pytest.mark.skipif(shutil.which("presence") is None, reason="the presence command is not installed")
def test_rehearsal_of_the_cluster_launcher_commands() -> None:
    work = Path(tempfile.mkdtemp(prefix="presence-rehearsal-", dir="/var/tmp"))
    work.chmod(0o755)  # the embedded PostgreSQL runs as its own user
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    try:
        out = subprocess.run(
            ["unshare", "--net", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child",
             sys.executable, "-m", "tests.integration.rehearsal", str(work)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    if '"ok": true' in out.stdout:
        shutil.rmtree(work, ignore_errors=True)  # kept for a look when the rehearsal failed
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    assert lines, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(lines[-1])
    print(json.dumps(result, indent=2))
    assert result["ok"], json.dumps(result, indent=2)
