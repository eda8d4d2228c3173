"""The command line as a user runs it: `presence up` in one terminal, `token`, `load`, `status` and
`edge` in another, Ctrl-C leaving no process behind. (The shared conformance suite, which runs the
command line too, is test_conformance.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import jsonschema
import psutil
import pytest

from tests.timing import patience, wait_until

pytestmark = pytest.mark.integration

STATUS_SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "status.schema.json"


def presence() -> list[str]:
    exe = shutil.which("presence")
    return [exe] if exe else [sys.executable, "-m", "cluster.cli"]


def children_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def processes_using(data_dir: Path) -> list[psutil.Process]:
    """Live processes whose command line names `data_dir` (the embedded servers are started in
    sessions of their own and are reparented once their starter goes: not children any more)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and str(data_dir) in " ".join(
                proc.info["cmdline"] or ()
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _is_alive(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def data_dir() -> Iterator[Path]:
    """`presence up`'s data directory, in a `mkdtemp` directory of its own under /tmp rather than
    under pytest's tmp_path: the embedded PostgreSQL runs as another system user that must
    traverse the path, and any pytest session starting on the machine resets pytest's base
    directory to 0700 (see tests/conftest.py)."""
    root = Path(tempfile.mkdtemp(prefix="presence-cli-"))
    yield root / "data"
    shutil.rmtree(root, ignore_errors=True)


def signal_up_when(
    tmp_path: Path,
    data_dir: Path,
    ready: Callable[[Path, str], bool],
    send: Callable[[subprocess.Popen[bytes]], None],
    sigint_ignored: bool = False,
) -> None:
    """Start `presence up` (a process group of its own), `send` it a signal once `ready(data
    directory, its output so far)`, and check that it stopped everything it had started."""
    env = {k: v for k, v in os.environ.items() if k not in ("PRESENCE_DATABASE_URL", "PRESENCE_REDIS_URL")}
    log_path = tmp_path / "up.log"
    up = subprocess.Popen(
        [*presence(), "up", "--ws-port", "0", "--internal-port", "0", "--data-dir", str(data_dir)],
        stdout=log_path.open("w+"),
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
        # As a shell without job control starts `presence up &`: SIGINT ignored.
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None,
    )

    def up_ready() -> bool:
        assert up.poll() is None, log_path.read_text()
        return ready(data_dir, log_path.read_text())

    try:
        wait_until(up_ready, 90, interval=0.02, what="presence up to get there", explain=log_path.read_text)
        send(up)
        code = up.wait(patience(60))
    finally:
        if up.poll() is None:
            up.kill()
    output = log_path.read_text()
    assert code in (0, 130), output  # 0 only if it got all the way up before the signal landed
    assert "stopping PostgreSQL" in output, output
    assert "did not stop within" not in output, output  # stopped by the signal, not killed after
    wait_until(
        lambda: not processes_using(data_dir),
        15,
        interval=0.2,
        what="every process of presence up gone",
        explain=lambda: f"left behind: {[p.info['cmdline'] for p in processes_using(data_dir)]}",
    )


def test_sigterm_during_start_up_stops_what_was_started(tmp_path: Path, data_dir: Path) -> None:
    """A supervisor's (or `timeout`'s) SIGTERM while `presence up` is still starting: the
    servers started so far are stopped, like Ctrl-C. Before, the process died on the spot and
    left the embedded PostgreSQL running."""
    # PostgreSQL is the first server it starts: signal as soon as it exists.
    signal_up_when(
        tmp_path,
        data_dir,
        lambda data_dir, _: (data_dir / "pg" / "postmaster.pid").exists(),
        lambda up: up.send_signal(signal.SIGTERM),
    )


def test_sigint_during_start_up_stops_it_even_when_inherited_ignored(tmp_path: Path, data_dir: Path) -> None:
    """`presence up &` from a script inherits SIGINT ignored; `kill -INT` during its start-up was
    lost in the process doing the starting, the service came up anyway, and the supervisor killed
    it 150 s later (an operator's pass). SIGINT is ours: it stops `presence up` like Ctrl-C."""
    signal_up_when(
        tmp_path,
        data_dir,
        lambda _, output: "starting Ray" in output,
        lambda up: up.send_signal(signal.SIGINT),
        sigint_ignored=True,
    )


def test_sigterm_to_the_whole_process_group_stops_everything(tmp_path: Path, data_dir: Path) -> None:
    """`timeout` and `kill -- -PID` signal the whole group. `presence up` used to wait for ever
    for a GCS that had gone (draining the pool); Ray's daemons now run in the group of its second
    process (cluster/supervisor.py), which drains.

    Signalled as soon as the pool is up, before the serving loop takes SIGTERM over. There, Ray's
    handlers had replaced ours (actors/clients.py `sigterm_kept`): the process exited 15, or 3 s
    into its clean-up died of SIGABRT, PostgreSQL left running (CI at 792a3cc). With the handlers
    restored, a driver blocked in a call to the gone GCS heard nothing for 60 s and Ray then ended
    it (exit 1), PostgreSQL again left running: the reason for the second process."""
    signal_up_when(
        tmp_path,
        data_dir,
        lambda _, output: "the FlushActor … ok" in output,
        lambda up: os.killpg(up.pid, signal.SIGTERM),
    )


def test_up_token_load_status_and_clean_interrupt(tmp_path: Path, data_dir: Path) -> None:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PRESENCE_DATABASE_URL", "PRESENCE_REDIS_URL", "RAY_ADDRESS", "PRESENCE_INTERNAL_TOKEN")
    }
    env |= {"PRESENCE_DRAIN_GRACE_S": "0.2", "PRESENCE_DRAIN_WINDOW_S": "0.2"}  # `presence drain` below
    log = (tmp_path / "up.log").open("w+")
    started = time.monotonic()
    up = subprocess.Popen(
        [
            *presence(),
            "up",
            "--shards",
            "2",
            # Ports of its own choosing (printed): a port picked free here may be taken by a
            # parallel worker's Ray or PostgreSQL before presence up binds it.
            "--ws-port",
            "0",
            "--internal-port",
            "0",
            "--data-dir",
            str(data_dir),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    up_log = (tmp_path / "up.log").read_text

    def up_ready() -> bool:
        assert up.poll() is None, up_log()
        return "presence is up" in up_log() and "  operator " in up_log()

    try:
        wait_until(up_ready, 90, interval=0.2, what="presence is up", explain=up_log)
        ready_s = time.monotonic() - started
        print(f"presence up ready in {ready_s:.1f} s")
        internal_port = int(re.search(r"internal\s+http://127\.0\.0\.1:(\d+)", up_log()).group(1))  # type: ignore[union-attr]
        with urllib.request.urlopen(f"http://127.0.0.1:{internal_port}/healthz", timeout=5) as r:
            assert json.loads(r.read())["ok"] is True
        # The internal token presence up generated (none was configured): the owner's only.
        token_file = data_dir / "internal-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        internal_token = token_file.read_text().strip()
        assert len(internal_token) >= 32
        assert f"{internal_port}/admin" in (tmp_path / "up.log").read_text()  # the banner names it
        metrics = urllib.request.Request(
            f"http://127.0.0.1:{internal_port}/metrics", headers={"Authorization": f"Bearer {internal_token}"}
        )
        # The cycle-collector policy runs in the edge and in every shard (they report its pauses).
        with urllib.request.urlopen(metrics, timeout=5) as r:
            gc_series = [
                ln
                for ln in r.read().decode().splitlines()
                if ln.startswith("presence_gc_pause_seconds_count")
            ]
        assert any("shard=" not in ln for ln in gc_series), gc_series
        assert {ln.split('shard="')[1].split('"')[0] for ln in gc_series if 'shard="' in ln} == {"0", "1"}, (
            gc_series
        )
        descendants = children_of(up.pid)
        assert descendants, "Ray, PostgreSQL and Redis run as children of presence up"

        def cli(*args: str) -> str:
            out = subprocess.run(
                [*presence(), *args, "--data-dir", str(data_dir)],
                capture_output=True,
                text=True,
                timeout=patience(60),
                env=env,
            )
            assert out.returncode == 0, out.stderr
            return out.stdout

        token = cli("token", "alice").strip().splitlines()[-1]
        assert token.count(".") == 2
        graph = tmp_path / "graph.json"
        graph.write_text(
            json.dumps({"users": [{"id": "alice"}], "servers": [{"id": "g1", "members": ["alice"]}]})
        )
        assert "loaded" in cli("load", str(graph))
        status = cli("status")
        assert "shard" in status and "postgres: ok" in status and "redis: ok" in status
        assert "in memory: accounts a shard holds" in status  # what the column counts (issue 29)
        # What the running service uses, redacted, not the environment's nulls (issue 29).
        used = json.loads(cli("config", "--json"))
        assert used["database_url"].startswith("postgresql://postgres:<redacted>@127.0.0.1:"), used
        assert used["token_secret"] == "<redacted>" and used["internal_token"] == "<redacted>"
        # Every file holding a secret or a URL with a password is the owner's only.
        for name in (
            "cluster.json",
            "secret",
            "postgres.password",
            "redis.password",
            "postgres.log",
            "redis/redis.log",
        ):
            assert stat.S_IMODE((data_dir / name).stat().st_mode) == 0o600, name
        passwords = [(data_dir / n).read_text().strip() for n in ("postgres.password", "redis.password")]
        assert all(passwords)
        status_json = cli("status", "--json")
        assert not any(p in status + status_json for p in passwords)
        report = json.loads(status_json)
        jsonschema.validate(report, json.loads(STATUS_SCHEMA.read_text()))
        assert report["postgres"] is True and len(report["shards"]) == 2
        # The seed's sanity check: everything reachable, so nothing is null.
        sanity = json.loads(cli("report", "--json"))
        assert sanity["stored"]["flushed_last_day"] >= 0 and sanity["pending_writes"]["flusher"] == 0
        assert all(isinstance(n, int) for n in sanity["active"].values()), sanity
        assert "flushed in the last hour:" in cli("report")

        resized = cli("scale", "3")
        assert "resized from 2 to 3 shards" in resized, resized
        rows = [line for line in cli("status").splitlines() if line.strip()[:1].isdigit()]
        assert [r.split()[0] for r in rows] == ["0", "1", "2"], rows
        assert sum(int(r.split()[2]) for r in rows) == 4096, rows  # shard, node, slots, ...

        # `presence drain` drains the edge, not the service: a new edge takes its place in the
        # same `presence up` (before, the end of the drain stopped the pool, the stores and Ray,
        # and another edge's clients with them).
        assert "draining" in cli("drain")
        # Each line of the edge's log once: ray.init's logging_config added a handler of Ray's
        # own to this process's root logger, and every line came twice.
        wait_until(
            lambda: "draining: /healthz answers 503" in up_log(), 30, interval=0.2, what="the drain's line"
        )
        assert up_log().count("draining: /healthz answers 503") == 1, up_log()
        # The new edge's line, after the drain's (which ends with a parenthesis of its own: waiting
        # for the log to end with one raced the new edge's start, once in a full suite).
        new_edge = re.compile(
            r"starting a new edge.*?is up: \S+ \(internal (http://127\.0\.0\.1:\d+)\)", re.S
        )
        wait_until(
            lambda: new_edge.search(up_log()) is not None,
            60,
            interval=0.2,
            what="a new edge after the drain",
            explain=up_log,
        )
        assert up.poll() is None, up_log()
        found = new_edge.search(up_log())
        assert found is not None
        new_internal = found.group(1)
        with urllib.request.urlopen(f"{new_internal}/healthz", timeout=5) as r:
            assert json.loads(r.read())["ok"] is True
        assert "postgres: ok" in cli("status") and cli("token", "alice").strip()
        # A second `presence up` on the same data directory is refused at once, and the first
        # one is left as it was (the second used to take over its PostgreSQL, kill its Redis
        # and replace its token).
        second = subprocess.run(
            [*presence(), "up", "--ws-port", "0", "--internal-port", "0", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=patience(30),
            env=env,
        )
        assert second.returncode == 2 and f"already running from {data_dir} (pid {up.pid})" in second.stderr
        assert "Traceback" not in second.stderr + second.stdout
        assert "postgres: ok" in cli("status") and "redis: ok" in cli("status")
        assert stat.S_IMODE((data_dir / "presence-up.lock").stat().st_mode) == 0o600
        # One more edge on a port that is taken (the running edge's): one line, exit 2 (it was
        # a traceback once everything had started).
        taken = re.findall(r"ws://127\.0\.0\.1:(\d+)/ws/presence", up_log())[-1]
        clash = subprocess.run(
            [*presence(), "edge", "--ws-port", taken, "--internal-port", "0", "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=patience(90),
            env=env,
        )
        assert clash.returncode == 2 and "cannot listen on the websocket port" in clash.stderr, clash.stderr
        assert "Traceback" not in clash.stderr + clash.stdout

        bad = subprocess.run(
            [*presence(), "load", str(tmp_path / "missing.json"), "--data-dir", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=patience(60),
            env=env,
        )
        assert bad.returncode == 2 and "cannot read" in bad.stderr
    finally:
        up.send_signal(signal.SIGINT)
        code = up.wait(patience(90))
    log.close()
    output = (tmp_path / "up.log").read_text()
    assert code == 0, output
    assert "last-seen drained" in output
    assert not (data_dir / "internal-token").exists()  # a stopped service's token is gone
    # presence up never prints a password: the URLs it shows are redacted.
    assert not any(p in output for p in passwords), output
    assert "database    postgresql://postgres:<redacted>@127.0.0.1:" in output
    wait_until(
        lambda: not [p for p in descendants if _is_alive(p)],
        15,
        interval=0.1,
        what="every child of presence up gone",
        explain=lambda: f"left behind: {[(p.pid, p.name()) for p in descendants if _is_alive(p)]}",
    )
    assert not processes_using(data_dir), "an embedded server outlived presence up"
