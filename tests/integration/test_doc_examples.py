"""Every fenced example in README.md and docs/*.md runs as written (issue 29, item 7).

A newcomer follows the README from a fresh clone: `presence up` in one terminal, the commands in
another, in the project folder (so `./.presence` is found). Here `presence up` runs in a scratch
folder on free ports, and the examples run there as they are written but for their port numbers
(8765, 8766 and the second edge's 9765, 9766 are replaced by free ones). Python examples run with
this interpreter, JavaScript ones under node (Node 20 with the `ws` package, or Node 22), each as
its own process. A block this file does not know how to run fails `test_every_example_is_run`.

Before the issue: docs/clients.md's JavaScript example needed `--experimental-websocket` on
Node 20 and fetched a `/token` endpoint that does not exist; its Python example subscribed to a
channel the README's graph does not have and never listened to errors; the README's resize
example used an undefined `address` and a top-level `await`.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster.embedded import free_port
from tests.timing import patience, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
# Blocks that install things (the package, the JavaScript client's tarball) or run the whole
# suite: not run here, they are what set up the machine this test runs on.
INSTALLS = ("pip install", "cd clients/js && npm pack")


@dataclass(frozen=True)
class Example:
    document: str
    line: int
    lang: str
    code: str

    @property
    def installs(self) -> bool:
        return self.code.lstrip().startswith(INSTALLS)


def examples() -> list[Example]:
    found = []
    for path in DOCUMENTS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(Example(path.relative_to(ROOT).as_posix(), line, m.group(1), m.group(2)))
    return found


def one(document: str, lang: str, contains: str) -> Example:
    (found,) = [e for e in examples() if e.document == document and e.lang == lang and contains in e.code]
    return found


README_COMMANDS = ("README.md", "sh", "presence token alice")
README_GRAPH = ("README.md", "json", '"users"')
README_RESIZE = ("README.md", "python", "resize(")
CLIENTS_JS = ("docs/clients.md", "js", "PresenceClient")
CLIENTS_PYTHON = ("docs/clients.md", "python", "PresenceClient")
RUN_HERE = (README_COMMANDS, README_GRAPH, README_RESIZE, CLIENTS_JS, CLIENTS_PYTHON)


def test_every_example_is_run() -> None:
    """Each fenced block is either run by a test below or installs something (named above)."""
    run = {one(*key) for key in RUN_HERE}
    for e in examples():
        assert e in run or e.installs, f"{e.document}:{e.line}: a ```{e.lang} example no test runs"


def test_the_readme_quotes_no_benchmark_figures_but_links_them() -> None:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Benchmarks") : text.index("## Layout")]
    assert "bench/RESULTS.md" in section
    figures = re.findall(r"\d[\d.,]*\s*(?:ms|%|x\b|statements/s|KiB)", section)
    assert figures == [], f"figures that go stale when the next run lands: {figures}"


@dataclass
class Live:
    folder: Path
    env: dict[str, str]
    ports: dict[str, str]

    def localise(self, code: str) -> str:
        for written, port in self.ports.items():
            code = code.replace(written, port)
        return code

    def run(self, args: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            args, cwd=self.folder, env={**self.env, **env}, capture_output=True, text=True, timeout=timeout
        )


@pytest.fixture(scope="module")
def live() -> Iterator[Live]:
    exe = shutil.which("presence")
    if exe is None:
        pytest.skip("the presence command is not installed (pip install -e .)")
    # Under /tmp itself: the embedded PostgreSQL's system user must traverse the path (pytest's
    # own temporary folders are its owner's only).
    folder = Path(tempfile.mkdtemp(prefix="presence-newcomer-"))
    drop = ("PRESENCE_DATABASE_URL", "PRESENCE_REDIS_URL", "RAY_ADDRESS", "PRESENCE_INTERNAL_TOKEN")
    env = {k: v for k, v in os.environ.items() if k not in drop and k != "PRESENCE_TOKEN_SECRET"}
    env["PATH"] = f"{Path(exe).parent}{os.pathsep}{env.get('PATH', '')}"
    ports = {
        "8765": str(free_port()),
        "8766": str(free_port()),
        "9765": str(free_port()),
        "9766": str(free_port()),
    }
    log = (folder / "up.log").open("w+")
    up = subprocess.Popen(
        [exe, "up", "--ws-port", ports["8765"], "--internal-port", ports["8766"]],
        cwd=folder,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def up_log() -> str:
        return (folder / "up.log").read_text()[-3000:]

    def up_ready() -> bool:
        assert up.poll() is None, up_log()
        return "presence is up" in (folder / "up.log").read_text()

    try:
        wait_until(up_ready, 60, interval=0.2, what="presence is up", explain=up_log)
        yield Live(folder, env, ports)
    finally:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(patience(90))
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def test_readme_commands_run_as_written(live: Live) -> None:
    """The README's second terminal: token, load graph.json (the README's own), status, report,
    and one more edge."""
    (live.folder / "graph.json").write_text(one(*README_GRAPH).code)
    for line in one(*README_COMMANDS).code.splitlines():
        command = live.localise(line.split("#", 1)[0].strip())
        if not command:
            continue
        if command.startswith("presence edge"):
            edge = subprocess.Popen(
                ["bash", "-c", f"exec {command}"],
                cwd=live.folder,
                env=live.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert edge.stdout is not None
            seen = []
            while True:  # until its banner's last line, or its end (readline blocks meanwhile)
                text = edge.stdout.readline()
                seen.append(text)
                if text.strip().startswith("internal") or not text:
                    break
            # Serving (its Ctrl-C handler is in place once it answers), then Ctrl-C.
            healthz = f"http://127.0.0.1:{live.ports['9766']}/healthz"
            wait_until(lambda h=healthz: _answers(h), 30, 0.2, healthz, explain=lambda s=seen: "".join(s))
            edge.send_signal(signal.SIGINT)
            try:
                rest, _ = edge.communicate(timeout=patience(90))
            except subprocess.TimeoutExpired:
                edge.kill()
                rest, _ = edge.communicate()
                raise AssertionError(
                    "presence edge did not stop on Ctrl-C:\n" + "".join(seen) + rest
                ) from None
            assert any(" is up" in s for s in seen), "".join(seen) + rest
            continue
        done = live.run(["bash", "-c", command])
        assert done.returncode == 0, (command, done.stdout, done.stderr)
        if command.startswith("presence token"):
            assert done.stdout.strip().count(".") == 2
        if command.startswith("presence load"):
            assert "loaded" in done.stdout


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def test_readme_resize_runs_as_written(live: Live) -> None:
    script = live.folder / "resize.py"
    script.write_text(live.localise(one(*README_RESIZE).code))
    done = live.run([sys.executable, str(script)], timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'from': 4, 'to': 5" in done.stdout, done.stdout


def token(live: Live, user: str) -> str:
    done = live.run(["presence", "token", user])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_clients_python_example_runs_as_written(live: Live) -> None:
    (live.folder / "graph.json").write_text(one(*README_GRAPH).code)
    assert live.run(["presence", "load", "graph.json"]).returncode == 0
    script = live.folder / "bot.py"
    script.write_text(live.localise(one(*CLIENTS_PYTHON).code))
    done = live.run([sys.executable, str(script)], TOKEN=token(live, "alice"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused" not in done.stdout, done.stdout  # no error frame: c1 is alice's channel
    assert re.search(r"^bob ", done.stdout, re.M), done.stdout  # bob's last-seen label


def _node_with_a_websocket(node: str, folder: Path) -> str | None:
    """Why the JavaScript example cannot run here, or None (node_modules prepared in `folder`)."""
    modules = folder / "node_modules"
    client = modules / "@presence-cluster" / "client"
    client.parent.mkdir(parents=True, exist_ok=True)
    if not client.exists():
        client.symlink_to(ROOT / "clients" / "js")  # what `npm install /path/to/clients/js` makes
    has_global = subprocess.run(
        [node, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)"], capture_output=True
    )
    if has_global.returncode == 0:
        return None
    npm_root = (
        subprocess.run(["npm", "root", "-g"], capture_output=True, text=True) if shutil.which("npm") else None
    )
    candidates = [Path("/usr/share/nodejs/ws")]  # Debian's node-ws
    if npm_root is not None and npm_root.returncode == 0:
        candidates.append(Path(npm_root.stdout.strip()) / "ws")
    for ws in candidates:
        if (ws / "package.json").exists():
            if not (modules / "ws").exists():
                (modules / "ws").symlink_to(ws)  # what `npm install ws` would make
            return None
    return "Node 20 needs the ws package for the example (apt-get install node-ws, or npm install ws)"


def test_clients_js_example_runs_as_written(live: Live) -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed (apt-get install nodejs): the JavaScript example is not run")
    why = _node_with_a_websocket(node, live.folder)
    if why is not None:
        pytest.skip(why)
    (live.folder / "graph.json").write_text(one(*README_GRAPH).code)
    assert live.run(["presence", "load", "graph.json"]).returncode == 0
    script = live.folder / "watch.mjs"
    script.write_text(live.localise(one(*CLIENTS_JS).code))
    done = live.run([node, str(script)], timeout=60, TOKEN=token(live, "alice"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "refused" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert "connection: open" in done.stdout and "bob " in done.stdout, done.stdout
