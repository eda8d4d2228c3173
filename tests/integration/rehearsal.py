"""A rehearsal of `ray up ray_cluster.yaml` on this machine: three nodes, the file's own commands.

Run by test_rehearsal.py as PID 1 of its own PID, mount and network namespace (`unshare`), so
nothing it starts is visible to, or can collide with, the rest of the machine. Inside:

- the loopback interface is brought up; 127.0.0.1, 127.0.0.2 and 127.0.0.3 are the node addresses;
- PostgreSQL and Redis (the embedded ones) stand for the operator's own;
- what `ray up` copies with `file_mounts` is copied into each node's home (the Ray token and
  `presence.env`); `setup_commands` run except the pip install (the nodes use this machine's
  installed package);
- each node is a PID and mount namespace of its own with a private /tmp, so its `ray stop` stops
  only its own Ray, and runs the file's `head_start_ray_commands` or `worker_start_ray_commands`
  exactly as written (with `RAY_HEAD_IP` exported as Ray's updater does);
- clients connect through every node's edge and must see each other's presence; the head's start
  command is run a second time and must not start a second `presence up`.

Prints one JSON line with what it saw (`"ok": true` when everything held).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parents[2]
NODES = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
USERS = ("rehearsal-1", "rehearsal-2", "rehearsal-3")
SERVER = "rehearsal-g"


def node_script(commands: list[str], done: Path, hosts: Path) -> str:
    # A machine of its own: a private /tmp (Ray's session files), and a hosts file naming this
    # host 127.0.0.1 (Ray replaces a GCS address of 127.0.0.1 by the host name's address, which
    # outside this network namespace is the machine's real one).
    lines = ["set -u", "mount -t tmpfs tmpfs /tmp", f"mount --bind {hosts} /etc/hosts", "cd ~"]
    for i, cmd in enumerate(commands):
        lines.append(f'bash -c {shlex_quote(cmd)} > ~/start-{i}.log 2>&1 || echo "command {i} failed: $?"')
    lines += [f"touch {done}", "exec sleep infinity"]
    return "\n".join(lines)


def shlex_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


def start_node(
    index: int, ip: str, config: dict[str, Any], work: Path, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    home = work / f"node{index + 1}"
    key = "head_start_ray_commands" if index == 0 else "worker_start_ray_commands"
    commands = list(config[key])
    if index > 0:  # Ray's updater exports the head's address to worker commands
        commands = [f"export RAY_HEAD_IP={NODES[0]}; {c}" for c in commands]
    setup = [c for c in config["setup_commands"] if "pip install" not in c]
    done = home / "started"
    node_env = {**env, "HOME": str(home), "NODE_IP": ip}
    return subprocess.Popen(
        ["unshare", "--pid", "--mount", "--fork", "--mount-proc", "--kill-child", "bash", "-c",
         node_script(setup + commands, done, work / "hosts")],
        env=node_env,
        stdout=(home / "node.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def wait(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception:
            value = None
        if value:
            return value
        # The polling interval of the wait.
        time.sleep(0.5)
    raise TimeoutError(what)


def healthy(ip: str) -> bool:
    with urllib.request.urlopen(f"http://{ip}:8766/healthz", timeout=3) as r:
        return json.loads(r.read()).get("ok") is True


def processes(needle: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if needle in cmd and "bash -c" not in cmd and "flock" not in cmd:
            found.append(p)
    return found


async def drive(secret: str, internal_token: str) -> dict[str, Any]:
    from edge.tokens import mint_token
    from tests.integration.wsclient import Client, changed, of_type

    seen: dict[str, Any] = {}
    clients = [
        await Client.connect(f"ws://{ip}:8765/ws/presence", mint_token(user, secret))
        for ip, user in zip(NODES, USERS, strict=True)
    ]
    # Everybody online, seen by everybody else through their own edge (each on another node).
    for c, user in zip(clients, USERS, strict=True):
        others = [u for u in USERS if u != user]
        sync = await c.request({"type": "presence.subscribe", "userIds": others}, of_type("presence.sync"))
        statuses = {u["userId"]: u["status"] for u in sync["users"]}
        assert statuses == dict.fromkeys(others, "online"), (user, statuses)
    seen["online_seen_across_edges"] = True
    await clients[2].send({"type": "presence.update", "status": "dnd"})
    for c in clients[:2]:
        await c.expect(changed(USERS[2], "dnd"), timeout=20)
    seen["status_change_seen_across_edges"] = True
    await clients[0].close()
    for c in clients[1:]:
        await c.expect(changed(USERS[0], "offline"), timeout=30)
    seen["departure_seen_across_edges"] = True
    counts = []
    for ip in NODES:
        request = urllib.request.Request(
            f"http://{ip}:8766/api/v1/internal/presence/online?serverId={SERVER}",
            headers={"Authorization": f"Bearer {internal_token}"},
        )
        counts.append(json.loads(urllib.request.urlopen(request, timeout=5).read()))
    seen["online_counts_per_edge"] = counts
    for c in clients[1:]:
        await c.close()
    return seen


def main(work: Path) -> int:
    from cluster import db
    from cluster.embedded import EmbeddedPostgres, EmbeddedRedis

    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    result: dict[str, Any] = {"ok": False}
    config = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESENCE_", "RAY_"))}
    import socket

    (work / "hosts").write_text(f"127.0.0.1 localhost {socket.gethostname()}\n")
    pg, rd = EmbeddedPostgres(), EmbeddedRedis()
    nodes: list[subprocess.Popen[bytes]] = []
    started = time.monotonic()
    try:
        database_url = pg.start(work / "stores")
        redis_url = rd.start(work / "stores")
        asyncio.run(db.migrate(database_url))
        asyncio.run(load_graph(database_url))
        secret, internal_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        token = secrets.token_hex(32)
        for i, _ in enumerate(NODES):  # what file_mounts copies
            home = work / f"node{i + 1}"
            (home / ".ray").mkdir(parents=True)
            (home / ".ray" / "auth_token").write_text(token)
            (home / ".presence.env").write_text(
                f"PRESENCE_DATABASE_URL={database_url}\nPRESENCE_REDIS_URL={redis_url}\n"
                f"PRESENCE_TOKEN_SECRET={secret}\nPRESENCE_INTERNAL_TOKEN={internal_token}\n"
            )
        # The head's autoscaler reads this file (`ray up` writes it); no workers for it to launch
        # over SSH: the rehearsal starts them itself.
        bootstrap = {**config, "provider": {**config["provider"], "head_ip": NODES[0], "worker_ips": []}}
        bootstrap["max_workers"] = 0
        # `ray up` points the head's file_mounts at the copies it made there.
        bootstrap["file_mounts"] = {remote: remote for remote in config["file_mounts"]}
        (work / "node1" / "presence-dist").mkdir()
        (work / "node1" / "ray_bootstrap_config.yaml").write_text(yaml.safe_dump(bootstrap))
        nodes.append(start_node(0, NODES[0], config, work, env))
        wait(lambda: (work / "node1" / "started").exists(), 120, "head start commands")
        wait(lambda: healthy(NODES[0]), 180, f"head edge healthy ({(work / 'node1' / 'presence.log')})")
        result["head_up_s"] = round(time.monotonic() - started, 1)
        for i, ip in enumerate(NODES[1:], start=1):
            nodes.append(start_node(i, ip, config, work, env))
        for i, ip in enumerate(NODES[1:], start=1):
            wait(
                lambda i=i: (work / f"node{i + 1}" / "started").exists(), 120, f"node {i + 1} start commands"
            )
            wait(lambda ip=ip: healthy(ip), 180, f"edge on {ip} healthy")
        result["cluster_up_s"] = round(time.monotonic() - started, 1)
        result["token_file_modes"] = [
            oct((work / f"node{i + 1}" / ".ray" / "auth_token").stat().st_mode & 0o777) for i in range(3)
        ]
        logs = [(work / f"node{i + 1}" / "presence.log").read_text() for i in range(3)]
        result["open_files_lines"] = [
            next((ln for ln in log.splitlines() if "open files limit" in ln), None) for log in logs
        ]
        result.update(asyncio.run(drive(secret, internal_token)))
        # A second `ray up` runs the head's start commands again: no second presence up.
        before = len(processes("presence up"))
        again = config["head_start_ray_commands"][-1]
        subprocess.run(["bash", "-c", again], env={**env, "HOME": str(work / "node1"), "NODE_IP": NODES[0]})
        # A window for a second presence up that must not start: its absence has no event.
        time.sleep(3)
        result["presence_up_processes_before_after_second_start"] = [before, len(processes("presence up"))]
        result["presence_edge_processes"] = len(processes("presence edge"))
        result["ok"] = (
            result["presence_up_processes_before_after_second_start"] == [1, 1]
            and result["presence_edge_processes"] == 2
            and result["token_file_modes"] == ["0o600"] * 3
            and all(result["open_files_lines"])
            and all(c.get("online") is not None for c in result["online_counts_per_edge"])
        )
    except Exception as e:
        result["error"] = f"{type(e).__name__}: {e}"
        for i in range(3):
            for log in sorted((work / f"node{i + 1}").glob("*.log")):
                result[f"node{i + 1}_{log.name}"] = log.read_text()[-1200:]
    finally:
        result["total_s"] = round(time.monotonic() - started, 1)
        for proc in nodes:
            with_kill(proc)
        rd.stop()
        pg.stop()
    print(json.dumps(result))
    return 0 if result["ok"] else 1


def with_kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # PID 1 of the node's namespace: the node goes with it
    proc.wait(30)


async def load_graph(database_url: str) -> None:
    import asyncpg

    from cluster import db

    conn = await asyncpg.connect(database_url)
    try:
        await db.load_fixture(
            conn, {"users": [{"id": u} for u in USERS], "servers": [{"id": SERVER, "members": list(USERS)}]}
        )
    finally:
        await conn.close()


if __name__ == "__main__":
    work_dir = Path(sys.argv[1])
    work_dir.mkdir(parents=True, exist_ok=True)
    try:
        sys.exit(main(work_dir))
    finally:
        shutil.rmtree(work_dir / "stores", ignore_errors=True)
