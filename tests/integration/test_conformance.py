"""The shared conformance suite (shared/conformance, beside the repository) against `presence`:
it starts the service from the command line in a scratch directory on free ports and checks the
wire contract end to end."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

CONFORMANCE = Path(__file__).resolve().parents[2].parent / "shared" / "conformance" / "conformance.py"


@pytest.mark.skipif(not CONFORMANCE.exists(), reason=f"the shared conformance suite is not at {CONFORMANCE}")
def test_shared_conformance_suite_passes() -> None:
    exe = shutil.which("presence")
    if exe is None:
        pytest.skip("the presence command is not installed (pip install -e .)")
    out = subprocess.run(
        [sys.executable, str(CONFORMANCE), "--presence", exe],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=CONFORMANCE.parent,
    )
    print(out.stdout[-3000:])
    last = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 0 and last.endswith("0 failed"), out.stdout[-3000:] + out.stderr[-2000:]
