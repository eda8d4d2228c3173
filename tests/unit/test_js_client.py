"""The JavaScript client's own tests (clients/js/test/*.test.mjs: a scripted socket and a fake
clock; the reconnect policy against tests/unit/backoff_cases.json), run by node's test runner.

Skipped, with the reason, where node is not installed (CI installs Debian's nodejs).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JS = ROOT / "clients" / "js"


def node_or_skip() -> str:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (apt-get install nodejs): the JavaScript client is untested")
    return node


@pytest.mark.parametrize("name", ["client.test.mjs", "backoff.test.mjs"])
def test_js_client_unit(name: str) -> None:
    node = node_or_skip()
    result = subprocess.run(
        [node, "--test", str(JS / "test" / name)], cwd=JS, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
