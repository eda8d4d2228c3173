"""The testbed's machines: network namespaces on a private bridge, each an SSH host with a home of
its own, brought up as a Ray cluster by `ray up ray_cluster.yaml` and put behind HAProxy.

Layout (all names carry PREFIX, so `down` finds only what a testbed made):

- a Linux bridge `prtb-br` in the root namespace with 10.225.25.1/24, the only place that subnet
  exists: no route, NAT or firewall rule anywhere else, so nothing sent to it can leave the machine;
- node i (1..N) is the network namespace `prtb-n<i>` at 10.225.25.1<i>, joined to the bridge by a
  veth pair, with only `lo` and that link (no default route). In it, a PID and mount namespace of
  its own (`unshare`) runs an sshd (Debian's openssh-server, key-only, root, a host key and a
  client key made for this testbed) on 10.225.25.1<i>:22. That mount namespace has a private /tmp
  (Ray's session files; `ray stop` inside sees only the node's processes, its PID namespace) and a
  /etc/passwd whose root home is the node's own directory, so `~` over SSH is the node's home;
- every node's home has a venv (`--system-site-packages`, so Ray and every dependency come from
  this machine's interpreter and `pip install` of the wheel needs no network: PIP_NO_INDEX is set)
  and `ray` in it runs that venv's python, so Ray's workers import the wheel installed there;
- PostgreSQL and Redis (the embedded ones) stand for the operator's; they listen on 127.0.0.1 and
  HAProxy forwards 10.225.25.1:15432/16379 to them for the nodes;
- HAProxy listens on 127.0.0.1 for the clients and balances over the edges' 8765, health-checking
  `GET /healthz` on their internal 8766, and closes a server's sessions when it marks it down.

`ray up` runs in a mount namespace with a private /tmp (its cluster state file) and HOME the
launcher's directory, with ray_cluster.yaml as it is but for the addresses and the SSH user and key.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "prtb"
BRIDGE = f"{PREFIX}-br"
SUBNET = "10.225.25"
GATEWAY = f"{SUBNET}.1"
PG_PORT, REDIS_PORT, RAY_GCS_REDIS_PORT = 15432, 16379, 16380
WORK_ROOT = Path("/var/lib/presence-testbed")
STATE = WORK_ROOT / "state.json"  # what `down` cleans after a run that could not
DEBIAN_PACKAGES = {"sshd": "openssh-server", "haproxy": "haproxy", "rsync": "rsync"}
T = TypeVar("T")


def log(line: str) -> None:
    print(f"[testbed {time.strftime('%H:%M:%S')}] {line}", flush=True)


def run(*cmd: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def wait_for(check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5) -> T:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except Exception as e:
            value, last = None, e
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what} (after {timeout:.0f} s; last error: {last})")


def ensure_packages() -> None:
    """Debian's openssh-server, haproxy and rsync (which `ray up` copies file_mounts with)."""
    missing = [pkg for tool, pkg in DEBIAN_PACKAGES.items() if not _tool(tool)]
    if not missing:
        return
    log(f"installing Debian packages the testbed needs: {' '.join(missing)} (apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True, env=env)


def _tool(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


@dataclass
class Node:
    index: int  # 1-based; node 1 is the head
    work: Path

    @property
    def name(self) -> str:
        return f"{PREFIX}-n{self.index}"

    @property
    def ip(self) -> str:
        return f"{SUBNET}.{10 + self.index}"

    @property
    def veth(self) -> str:
        return f"{PREFIX}-v{self.index}"

    @property
    def home(self) -> Path:
        return self.work / f"node{self.index}"

    @property
    def edge(self) -> str:
        return f"http://{self.ip}:8766"


@dataclass
class Testbed:
    work: Path
    size: int = 3
    # Ray's GCS fault tolerance: the head's `ray start` with RAY_REDIS_ADDRESS (a Redis of Ray's
    # own, not the service's), as the yaml's comment says to turn it on.
    gcs_ft: bool = False
    nodes: list[Node] = field(default_factory=list)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    lb_port: int = 0
    secret: str = ""
    internal_token: str = ""
    database_url: str = ""  # as seen from this machine (127.0.0.1)
    ray_redis_url: str = ""
    redis_url: str = ""
    ray_redis_password: str = ""
    timings: dict[str, float] = field(default_factory=dict)
    _stores: list[Any] = field(default_factory=list)

    # ------------------------------------------------------------------ up

    def up(self) -> None:
        started = time.monotonic()
        if os.geteuid() != 0:
            raise SystemExit("the testbed makes network namespaces and a bridge: run it as root")
        ensure_packages()
        self.nodes = [Node(i, self.work) for i in range(1, self.size + 1)]
        self._save_state()
        self._keys()
        self._network()
        self._stores_up()
        self._haproxy()
        for node in self.nodes:
            self._node_up(node)
        for node in self.nodes:
            wait_for(lambda node=node: _port_open(node.ip, 22), 30, f"sshd on {node.ip}")
        self.timings["hosts_s"] = time.monotonic() - started
        self._launcher()
        t = time.monotonic()
        self._ray_up()
        self.timings["ray_up_s"] = time.monotonic() - t
        for node in self.nodes:
            wait_for(
                lambda node=node: healthy(node.edge),
                300,
                f"the edge on {node.ip} healthy ({node.home}/presence.log)",
            )
        # The balancer marks an edge UP only after two passed checks a second apart: until then
        # it answers 503 to every client (the partition's watchers, connected right after this,
        # were refused so at set-up in two of the runs of 2026-12-04).
        wait_for(lambda: set(self.haproxy_states().values()) == {"UP"}, 60, "every edge UP in HAProxy")
        self.timings["cluster_up_s"] = time.monotonic() - started
        log(f"up: {self.size} nodes, edges healthy, balancer ws://127.0.0.1:{self.lb_port}/ws/presence")

    def _save_state(self) -> None:
        STATE.write_text(
            json.dumps(
                {
                    "work": str(self.work),
                    "namespaces": [n.name for n in self.nodes],
                    "links": [BRIDGE, *(n.veth for n in self.nodes)],
                    "pids": {k: p.pid for k, p in self.procs.items()},
                    "stores": [s.pid for s in self._stores if s.pid],
                }
            )
        )

    def _keys(self) -> None:
        keys = self.work / "keys"
        keys.mkdir(mode=0o700)
        for name in ("id_ed25519", "host_ed25519"):
            run(
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"presence-testbed {name}",
                "-f",
                str(keys / name),
            )
        shutil.copy(keys / "id_ed25519.pub", keys / "authorized_keys")
        (keys / "authorized_keys").chmod(0o600)

    def _network(self) -> None:
        taken = run("ip", "-o", "addr", "show").stdout
        if f" {SUBNET}." in taken and BRIDGE not in taken:
            raise SystemExit(f"{SUBNET}.0/24 is in use on this machine: the testbed will not share it")
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")
        for node in self.nodes:
            run("ip", "netns", "add", node.name)
            run("ip", "link", "add", node.veth, "type", "veth", "peer", "name", "eth0", "netns", node.name)
            run("ip", "link", "set", node.veth, "master", BRIDGE)
            run("ip", "link", "set", node.veth, "up")
            ns = ("ip", "netns", "exec", node.name)
            run(*ns, "ip", "link", "set", "lo", "up")
            run(*ns, "ip", "addr", "add", f"{node.ip}/24", "dev", "eth0")
            run(*ns, "ip", "link", "set", "eth0", "up")

    def _stores_up(self) -> None:
        from cluster import db
        from cluster.embedded import EmbeddedPostgres, EmbeddedRedis

        stores = self.work / "stores"
        stores.mkdir()
        pg, rd = EmbeddedPostgres(), EmbeddedRedis()
        self._stores = [pg, rd]
        self.database_url = pg.start(stores)
        self.redis_url = rd.start(stores)
        if self.gcs_ft:  # Ray's own Redis: a separate server, outside every node (it outlives the head)
            ray_redis = EmbeddedRedis()
            self._stores.append(ray_redis)
            self.ray_redis_url = ray_redis.start(stores / "ray-gcs")
            self.ray_redis_password = self.ray_redis_url.split("://:", 1)[1].split("@", 1)[0]
        self._save_state()
        import asyncio

        asyncio.run(db.migrate(self.database_url))
        self.secret, self.internal_token = secrets.token_urlsafe(32), secrets.token_urlsafe(32)

    def node_urls(self) -> tuple[str, str]:
        """The stores' URLs as the nodes see them: through HAProxy on the bridge."""
        from urllib.parse import urlsplit, urlunsplit

        def through(url: str, port: int) -> str:
            parts = urlsplit(url)
            netloc = parts.netloc.rsplit("@", 1)
            host = f"{GATEWAY}:{port}"
            return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))

        return through(self.database_url, PG_PORT), through(self.redis_url, REDIS_PORT)

    def _haproxy(self) -> None:
        from cluster.embedded import free_port

        self.lb_port = free_port()
        pg_port = int(self.database_url.rsplit(":", 1)[1].split("/")[0])
        redis_port = int(self.redis_url.rsplit(":", 1)[1].split("/")[0])
        ray_redis = ""
        if self.gcs_ft:
            ray_redis_port = int(self.ray_redis_url.rsplit(":", 1)[1].split("/")[0])
            ray_redis = (
                f"listen raygcs\n  mode tcp\n  bind {GATEWAY}:{RAY_GCS_REDIS_PORT}\n"
                f"  server raygcs 127.0.0.1:{ray_redis_port}\n"
            )
        servers = "\n".join(
            f"  server {n.name} {n.ip}:8765 check port 8766"
            for n in (Node(i, self.work) for i in range(1, self.size + 1))
        )
        cfg = self.work / "haproxy.cfg"
        cfg.write_text(
            f"""global
  maxconn 4000
  stats socket {self.work}/haproxy.sock mode 600 level admin
defaults
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  timeout tunnel 1h
  timeout check 2s
frontend clients
  mode http
  bind 127.0.0.1:{self.lb_port}
  default_backend edges
backend edges
  mode http
  balance roundrobin
  option httpchk GET /healthz
  http-check expect status 200
  http-response set-header X-Presence-Edge %s
  default-server inter 1s fall 2 rise 2 on-marked-down shutdown-sessions
{servers}
listen postgres
  mode tcp
  bind {GATEWAY}:{PG_PORT}
  server pg 127.0.0.1:{pg_port}
listen redis
  mode tcp
  bind {GATEWAY}:{REDIS_PORT}
  server redis 127.0.0.1:{redis_port}
{ray_redis}"""
        )
        haproxy = _tool("haproxy")
        assert haproxy
        run(haproxy, "-c", "-q", "-f", str(cfg))
        self.procs["haproxy"] = subprocess.Popen(
            [haproxy, "-db", "-f", str(cfg)],
            stdout=(self.work / "haproxy.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._save_state()
        wait_for(lambda: _port_open("127.0.0.1", self.lb_port), 10, "HAProxy listening")

    def _node_up(self, node: Node) -> None:
        home = node.home
        home.mkdir(mode=0o700)
        keys = self.work / "keys"
        passwd = "".join(
            (f"root:x:0:0:root:{home}:/bin/bash\n" if line.startswith("root:") else line + "\n")
            for line in Path("/etc/passwd").read_text().splitlines()
        )
        (home / "passwd").write_text(passwd)
        (home / "passwd").chmod(0o644)
        (home / "hosts").write_text(f"127.0.0.1 localhost\n{node.ip} {socket.gethostname()}\n")
        (home / "hosts").chmod(0o644)
        sftp = next((p for p in ("/usr/lib/openssh/sftp-server",) if Path(p).exists()), "internal-sftp")
        (home / "sshd_config").write_text(
            f"""ListenAddress {node.ip}:22
HostKey {keys}/host_ed25519
AuthorizedKeysFile {keys}/authorized_keys
PidFile {home}/sshd.pid
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
X11Forwarding no
AllowTcpForwarding no
MaxStartups 200
MaxSessions 100
Subsystem sftp {sftp}
"""
        )
        venv = home / "venv"
        base = Path(sys.base_prefix) / "bin" / "python3"
        run(str(base), "-m", "venv", "--system-site-packages", "--without-pip", str(venv))
        # Ray from this machine's interpreter, run by the venv's python (its workers then import
        # what `pip install` put in the venv).
        ray = venv / "bin" / "ray"
        ray.write_text(
            f"#!{venv}/bin/python3\nimport sys\nfrom ray.scripts.scripts import main\nsys.exit(main())\n"
        )
        ray.chmod(0o755)
        profile = (
            f"export PATH={venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
            "export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 RAY_USAGE_STATS_ENABLED=0\n"
        )
        (home / ".bashrc").write_text(profile)
        (home / ".profile").write_text(". ~/.bashrc\n")
        self._boot(node)

    def _boot(self, node: Node) -> None:
        """Power the node on: its PID and mount namespaces, its sshd."""
        home = node.home
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        script = "\n".join(
            [
                "set -e",
                "mount -t tmpfs tmpfs /tmp",
                f"mount --bind {home}/passwd /etc/passwd",
                f"mount --bind {home}/hosts /etc/hosts",
                f"/usr/sbin/sshd -D -e -f {home}/sshd_config &",
                "while :; do wait || true; sleep 1; done",  # PID 1 of the node: reaps orphans
            ]
        )
        self.procs[node.name] = subprocess.Popen(
            ["ip", "netns", "exec", node.name, "unshare", "--pid", "--mount", "--fork", "--mount-proc",
             "--kill-child", "--propagation", "private", "bash", "-c", script],
            stdout=(self.work / f"{node.name}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home)},
        )  # fmt: skip
        self._save_state()

    def _launcher(self) -> None:
        """The machine `ray up` runs from: the wheel, presence.env, Ray's token, the filled yaml."""
        launcher = self.work / "launcher"
        (launcher / "dist").mkdir(parents=True)
        (launcher / ".ray").mkdir()
        log("building the wheel (pip wheel --no-deps)")
        build = self.work / "build"
        shutil.copytree(
            ROOT, build, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "dist")
        )
        run(
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(launcher / "dist"),
            str(build),
        )
        token = launcher / ".ray" / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        pg, rd = self.node_urls()
        env = launcher / "presence.env"
        env.write_text(
            f"PRESENCE_DATABASE_URL={pg}\nPRESENCE_REDIS_URL={rd}\n"
            f"PRESENCE_TOKEN_SECRET={self.secret}\nPRESENCE_INTERNAL_TOKEN={self.internal_token}\n"
        )
        env.chmod(0o600)
        (launcher / "cluster.yaml").write_text(yaml.safe_dump(self.filled_yaml(), sort_keys=False))

    def filled_yaml(self) -> dict[str, Any]:
        """ray_cluster.yaml with only the addresses and the SSH user and key filled in."""
        config = yaml.safe_load((ROOT / "ray_cluster.yaml").read_text())
        config["provider"]["head_ip"] = self.nodes[0].ip
        config["provider"]["worker_ips"] = [n.ip for n in self.nodes[1:]]
        config["auth"] = {"ssh_user": "root", "ssh_private_key": str(self.work / "keys" / "id_ed25519")}
        config["max_workers"] = len(self.nodes) - 1
        if self.gcs_ft:
            with_gcs_fault_tolerance(config, f"{GATEWAY}:{RAY_GCS_REDIS_PORT}", self.ray_redis_password)
        return config

    def _ray_up(self) -> None:
        launcher = self.work / "launcher"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PRESENCE_", "RAY_"))}
        env.update(HOME=str(launcher), RAY_USAGE_STATS_ENABLED="0")
        ray = shlex.quote(shutil.which("ray") or "ray")
        log("ray up ray_cluster.yaml (the head; its autoscaler then starts the workers over SSH)")
        with (self.work / "ray-up.log").open("wb") as out:
            done = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "bash", "-c",
                 f"mount -t tmpfs tmpfs /tmp && exec {ray} up -y --no-config-cache cluster.yaml"],
                cwd=launcher, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=600,
            )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(
                f"ray up failed ({done.returncode}): {(self.work / 'ray-up.log').read_text()[-3000:]}"
            )

    # ------------------------------------------------------------------ acting on nodes

    def ssh(self, node: Node, command: str, timeout: float = 120, check: bool = True) -> str:
        """Run a command on a node as `ray up` does (a login shell of root in the node's home)."""
        key = self.work / "keys" / "id_ed25519"
        done = subprocess.run(
            ["ssh", "-i", str(key), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", f"root@{node.ip}",
             f"bash --login -c {shlex.quote(command)}"],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"on {node.ip}: {command!r} failed ({done.returncode}): {done.stderr[-2000:]}")
        return done.stdout

    def cut(self, node: Node) -> None:
        """The node's link goes silent both ways (packets dropped, nothing refused)."""
        run("ip", "link", "set", node.veth, "down")

    def heal(self, node: Node) -> None:
        run("ip", "link", "set", node.veth, "up")

    def kill(self, node: Node) -> None:
        """The machine dies: its link goes silent, then every process in its namespace is killed."""
        self.cut(node)
        proc = self.procs.pop(node.name, None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        _kill_netns_pids(node.name)
        if proc is not None:
            proc.wait(30)

    def revive(self, node: Node) -> None:
        """The machine comes back after `kill`: empty /tmp (no Ray), its link up, sshd."""
        self.heal(node)
        self._boot(node)
        wait_for(lambda: _port_open(node.ip, 22), 30, f"sshd on {node.ip}")

    def keep_head_disk(self) -> str:
        """The head's copy of the local provider's cluster state (which workers it launched), read
        before the head dies: the testbed's /tmp is a tmpfs, lost with the node, and without it
        the restarted head's autoscaler would launch every worker again (`ray stop` there)."""
        return self.ssh(self.nodes[0], "cat /tmp/cluster-presence.state 2>/dev/null || true")

    def restore_head_disk(self, state: str) -> None:
        if state.strip():
            self.ssh(self.nodes[0], f"cat > /tmp/cluster-presence.state <<'EOF'\n{state}\nEOF")

    def ray_up_again(self) -> float:
        """The operator's one step after a head restart: `ray up ray_cluster.yaml` again."""
        t = time.monotonic()
        self._ray_up()
        return time.monotonic() - t

    def haproxy_states(self) -> dict[str, str]:
        """server name -> UP/DOWN/... as HAProxy sees the edges."""
        sock = socket.socket(socket.AF_UNIX)
        sock.settimeout(2)
        sock.connect(str(self.work / "haproxy.sock"))
        sock.sendall(b"show stat\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        sock.close()
        states = {}
        for line in data.decode().splitlines():
            cols = line.split(",")
            if len(cols) > 17 and cols[0] == "edges" and cols[1] not in ("BACKEND", "FRONTEND"):
                states[cols[1]] = cols[17]
        return states

    # ------------------------------------------------------------------ down

    def down(self) -> None:
        for node in self.nodes:
            proc = self.procs.pop(node.name, None)
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(30)
        haproxy = self.procs.pop("haproxy", None)
        if haproxy is not None:
            haproxy.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                haproxy.wait(10)
        for store in reversed(self._stores):
            with contextlib.suppress(Exception):
                store.stop()
        clean_network([n.name for n in self.nodes], [BRIDGE, *(n.veth for n in self.nodes)])
        STATE.unlink(missing_ok=True)


def with_gcs_fault_tolerance(config: dict[str, Any], redis_address: str, password: str) -> None:
    """Turn on GCS fault tolerance in the yaml's start commands, exactly as its comment says."""
    wait = "RAY_gcs_rpc_server_reconnect_timeout_s=600"
    mode = "export RAY_AUTH_MODE=token"
    head = config["head_start_ray_commands"]
    head[1] = head[1].replace(mode, f"export RAY_REDIS_ADDRESS={redis_address} {wait} RAY_AUTH_MODE=token", 1)
    head[1] = head[1].replace("ray start --head", f"ray start --head --redis-password={password}", 1)
    worker = config["worker_start_ray_commands"]
    worker[1] = worker[1].replace(mode, f"export {wait} RAY_AUTH_MODE=token", 1)
    for commands in (head, worker):  # the edges' own Ray clients wait as long
        commands[2] = commands[2].replace(mode, f"export {wait} RAY_AUTH_MODE=token", 1)
    assert all(redis_address in c or wait in c for c in (head[1], head[2], worker[1], worker[2]))


def _kill_netns_pids(name: str) -> None:
    pids = run("ip", "netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def clean_network(namespaces: list[str], links: list[str]) -> None:
    """Kill what runs in the testbed's namespaces (by their PIDs), then delete them and its links."""
    for ns in namespaces:
        if ns.startswith(PREFIX + "-"):
            _kill_netns_pids(ns)
    time.sleep(0.5)
    for ns in namespaces:
        if ns.startswith(PREFIX + "-"):
            run("ip", "netns", "del", ns, check=False)
    for link in links:
        if link.startswith(PREFIX + "-"):
            run("ip", "link", "del", link, check=False)


def down_from_state() -> None:
    """`python -m tests.testbed down`: clean what a run that could not clean after itself left."""
    if not STATE.exists():
        log("nothing to clean (no state file)")
        return
    state = json.loads(STATE.read_text())
    for pid in [*state.get("pids", {}).values(), *state.get("stores", [])]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    clean_network(state.get("namespaces", []), state.get("links", []))
    STATE.unlink()
    log(f"cleaned; the work directory {state.get('work')} is kept for a look")


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1):
            return True
    except OSError:
        return False


def healthy(internal: str) -> bool:
    with urllib.request.urlopen(f"{internal}/healthz", timeout=3) as r:
        return json.loads(r.read()).get("ok") is True
