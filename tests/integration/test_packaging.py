"""A wheel carries everything the code reads (issue 15): `pip install .` into a fresh virtual
environment, then, from another folder, the demo page and the JavaScript client it imports are
served, the schema is read, `presence --version` answers, and benchmark results would go under the
current folder, never into the installed package.

The environment sees this interpreter's packages (`--system-site-packages`: Ray is not installed
again) and the wheel is built without build isolation (setuptools and wheel from the test extra),
so no download is needed and the test takes a few seconds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

CHECK = r"""
import sys
from pathlib import Path
from websockets.http11 import Request
from websockets.datastructures import Headers

import bench.results, cluster.db, edge, edge.demo, presence_client

venv = Path(sys.argv[1]).resolve()
here = Path.cwd().resolve()
assert Path(edge.__file__).resolve().is_relative_to(venv), edge.__file__
assert Path(presence_client.__file__).resolve().is_relative_to(venv), presence_client.__file__
site = edge.demo.DemoSite("s" * 32)
PAGES = [("/", b"<html"), ("/demo.js", b""), ("/demo.css", b""), ("/client/client.js", b"export")]
for path, needle in PAGES:
    response = site.handle(Request(path, Headers()))
    assert response is not None and response.status_code == 200, path
    assert needle in response.body, path
assert "CREATE TABLE" in cluster.db.SCHEMA_PATH.read_text().upper()
assert Path(cluster.db.SCHEMA_PATH).resolve().is_relative_to(venv)
for package in ("actors", "cluster", "edge", "presence_client"):
    assert (Path(__import__(package).__file__).parent / "py.typed").is_file(), package
assert bench.results.RESULTS_DIR.resolve().is_relative_to(here), bench.results.RESULTS_DIR
assert bench.results.RESULTS_MD.resolve().is_relative_to(here), bench.results.RESULTS_MD
print("CHECKED")
"""


def copy_source(dest: Path) -> Path:
    ignore = shutil.ignore_patterns(
        ".git", "build", "*.egg-info", "__pycache__", ".presence", "node_modules", ".pytest_cache"
    )
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


def test_a_wheel_installed_elsewhere_serves_everything(tmp_path: Path) -> None:
    # Only the virtual environment decides what is imported (a PYTHONPATH would bring a checkout).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    source = copy_source(tmp_path / "src")
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
        timeout=60,
    )
    python = venv / "bin" / "python"
    out = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--ignore-installed",
            ".",
        ],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    checked = subprocess.run(
        [str(python), "-c", CHECK, str(venv)],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert "CHECKED" in checked.stdout, checked.stdout + checked.stderr
    shown = subprocess.run(
        [str(venv / "bin" / "presence"), "--version"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert shown.stdout.strip() == f"presence {version('presence-cluster')}", shown.stdout + shown.stderr
    assert not any(elsewhere.iterdir()), "running the installed code wrote into the current folder"
