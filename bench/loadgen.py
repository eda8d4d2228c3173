"""Shared machinery of the websocket benchmarks (`edge`, `connections`, `fanout`, `query`).

- `WsConn`: a lean RFC 6455 client on a bare asyncio protocol. Real TCP, a real upgrade
  handshake (checked `Sec-WebSocket-Accept`), masked client frames, the server's frames parsed;
  no compression, no keepalive pings (the edge sends none). A load generator written with the
  `websockets` client would spend most of these two cores on its own frame machinery; this one
  spends little, so the servers get the CPU and the measurement is theirs. The same client drives
  our edge and the bare server.
- Generator processes (`Workers` on the benchmark's side, `Generator` inside each process):
  spawned processes that hold the client sockets (each < 19,000: the open-file limit is per
  process) and run phases on command, reporting progress and results through pipes. Each
  reports the CPU it used, so benchmarks can say what the generator cost.
- `BenchEnv`: PostgreSQL, Redis (embedded in a temp dir unless URLs are given), a local Ray
  instance with the actor pool, and a data directory with `cluster.json` and the token secret,
  so that `presence edge` processes can join it exactly as an operator's would.
- `EdgeProcess` / `EchoProcess`: our edge (`presence edge`) and the bare server
  (`bench.echo_server`) as their own OS processes, with their RSS and CPU readable from /proc.

Clients connect from many loopback source addresses (127.1.x.y, at most `PER_ADDRESS` sockets
each), as many clients would: the edge's per-address socket limit (1,000) then applies unchanged,
and every address has its own range of ephemeral ports.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import importlib
import math
import multiprocessing as mp
import os
import random
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from array import array
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    import argparse

    from actors.core.contract import ShardStats
    from cluster.config import Settings

PER_ADDRESS = 900
WS_PATH = "/ws/presence"
HEARTBEAT = b'{"type":"heartbeat"}'
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
ROOT = Path(__file__).resolve().parents[1]


def source_address(connection_index: int) -> str:
    """The loopback address a client connection binds to: a new one every PER_ADDRESS sockets."""
    n = connection_index // PER_ADDRESS
    return f"127.{1 + n // 62_500}.{(n // 250) % 250}.{n % 250 + 1}"


def raise_nofile(at_least: int = 0) -> int:
    """Raise this process's soft open-file limit to its hard limit, and the hard limit itself to
    `at_least` where the process may (root; the processes it starts inherit both); returns the
    soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < at_least:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (at_least, at_least))
            return at_least
        except (ValueError, OSError):
            pass  # not allowed: the hard limit stays, and the caller says what is missing
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def install_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


# ------------------------------------------------------------------------------- the client


def client_frame(payload: bytes, opcode: int = 1) -> bytes:
    """One masked client frame (FIN set)."""
    n = len(payload)
    if n < 126:
        header = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65_536:
        header = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        header = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    mask = os.urandom(4)
    if n:
        key = int.from_bytes((mask * (n // 4 + 1))[:n], "big")
        payload = (int.from_bytes(payload, "big") ^ key).to_bytes(n, "big")
    return header + mask + payload


class HandshakeError(ConnectionError):
    pass


class WsConn(asyncio.Protocol):
    """One client websocket. Text frames go to `waiter` (a future of the next frame) when one is
    set, else to `on_text(conn, payload)`, else nowhere. In pipeline mode (`pipe` set) frames are
    only counted and each answer sends the next request, keeping `pipe.in_flight` requests out.
    """

    def __init__(self, host: str, port: int, path: str) -> None:
        self.transport: asyncio.Transport | None = None
        self._key = base64.b64encode(secrets.token_bytes(16))
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {self._key.decode()}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n"
        ).encode()
        self._hs: bytes | None = b""
        self._buf = b""
        loop = asyncio.get_running_loop()
        self.opened: asyncio.Future[None] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self.waiter: asyncio.Future[bytes] | None = None
        self.on_text: Callable[[WsConn, bytes], None] | None = None
        self.pipe: Pipeline | None = None
        self.close_code: int | None = None
        self.user: str = ""
        self.index = -1  # `connect`'s connection index (the source address's, a storm's seed)
        self.state: Any = None  # whatever a role keeps per connection

    # -- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment] # uvloop's is no asyncio.Transport subclass
        self.transport.write(self._request)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.opened.done():
            self.opened.set_exception(exc or HandshakeError("closed during the handshake"))
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError(f"closed ({self.close_code})"))
        if not self.lost.done():
            self.lost.set_result(None)

    def _handshake(self, data: bytes) -> bytes | None:
        """Take the upgrade response from `data`: the bytes after it (frames already), or None
        while it is incomplete or when it failed."""
        assert self._hs is not None
        self._hs += data
        end = self._hs.find(b"\r\n\r\n")
        if end < 0:
            if len(self._hs) > 16_384:
                self._fail("oversized handshake response")
            return None
        head, rest = self._hs[:end], self._hs[end + 4 :]
        self._hs = None
        if not head.startswith(b"HTTP/1.1 101"):
            self._fail(head.split(b"\r\n", 1)[0].decode(errors="replace"))
            return None
        accept = base64.b64encode(hashlib.sha1(self._key + _GUID).digest())
        if b"sec-websocket-accept: " + accept.lower() not in head.lower():
            self._fail("bad Sec-WebSocket-Accept")
            return None
        if self.opened.done():  # the opener gave up (timed out) and is aborting us
            return None
        self.opened.set_result(None)
        return rest

    def data_received(self, data: bytes) -> None:
        if self._hs is not None:
            rest = self._handshake(data)
            if not rest:
                return
            data = rest
        buf = self._buf + data if self._buf else data
        pos, size = 0, len(buf)
        texts = 0
        while size - pos >= 2:
            b1 = buf[pos + 1]
            n = b1 & 0x7F
            start = pos + 2
            if n == 126:
                if size - pos < 4:
                    break
                n = int.from_bytes(buf[pos + 2 : pos + 4], "big")
                start = pos + 4
            elif n == 127:
                if size - pos < 10:
                    break
                n = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                start = pos + 10
            end = start + n
            if end > size:
                break
            opcode = buf[pos] & 0x0F
            pos = end
            if opcode == 1 or opcode == 2 or opcode == 0:
                if self.pipe is not None:
                    texts += 1
                    continue
                self._text(buf[start:end])
            elif opcode == 8:
                self._closing(buf[start:end], n)
                return
            elif opcode == 9 and self.transport is not None:
                self.transport.write(client_frame(buf[start:end], 10))
        self._buf = buf[pos:]
        if texts:
            assert self.pipe is not None
            self.pipe.answered(self, texts)

    def _text(self, payload: bytes) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            self.waiter = None
            waiter.set_result(payload)
        elif self.on_text is not None:
            self.on_text(self, payload)

    def _closing(self, payload: bytes, n: int) -> None:
        """The server's close frame: note its code, answer it, close."""
        self.close_code = int.from_bytes(payload[:2], "big") if n >= 2 else 1005
        if self.transport is not None:
            self.transport.write(client_frame(payload[:2], 8))
            self.transport.close()

    def _fail(self, why: str) -> None:
        if not self.opened.done():
            self.opened.set_exception(HandshakeError(why))
        if self.transport is not None:
            self.transport.abort()

    # -- use

    @property
    def open(self) -> bool:
        return self.transport is not None and self.opened.done() and self.close_code is None

    def send(self, payload: bytes) -> None:
        if self.transport is not None:
            self.transport.write(client_frame(payload))

    def send_raw(self, frames: bytes) -> None:
        if self.transport is not None:
            self.transport.write(frames)

    def next_text(self) -> asyncio.Future[bytes]:
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        if self.transport is None:
            fut.set_exception(ConnectionError(f"closed ({self.close_code})"))
        else:
            self.waiter = fut
        return fut

    async def expect(self, kind: bytes, timeout: float) -> dict[str, Any]:
        """The next frame whose type is `kind` (others are skipped); ConnectionError if the
        socket closes first, TimeoutError after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            raw = await asyncio.wait_for(self.next_text(), max(0.0, deadline - time.monotonic()))
            frame = orjson.loads(raw)
            if frame.get("type") == kind.decode():
                return frame  # type: ignore[no-any-return]
            if frame.get("type") == "error" and kind != b"error":
                raise ConnectionError(f"error frame: {frame}")

    def close(self) -> None:
        if self.transport is not None and self.close_code is None:
            self.close_code = 1000
            self.transport.write(client_frame((1000).to_bytes(2, "big"), 8))


async def open_ws(
    host: str, port: int, path: str = WS_PATH, local_ip: str | None = None, timeout: float = 30.0
) -> WsConn:
    loop = asyncio.get_running_loop()
    _, conn = await asyncio.wait_for(
        loop.create_connection(
            lambda: WsConn(host, port, path), host, port, local_addr=(local_ip, 0) if local_ip else None
        ),
        timeout,
    )
    try:
        await asyncio.wait_for(conn.opened, timeout)
    except BaseException:  # timed out or cancelled: no half-open socket left behind
        if conn.transport is not None:
            conn.transport.abort()
        raise
    return conn


@dataclass
class Pipeline:
    """Keeps `in_flight` heartbeats outstanding on every connection of a group."""

    frame: bytes
    in_flight: int
    running: bool = True
    done: int = 0
    counting: bool = False
    counted: int = 0
    outstanding: int = 0

    def answered(self, conn: WsConn, n: int) -> None:
        self.done += n
        if self.counting:
            self.counted += n
        if self.running and conn.transport is not None:
            conn.transport.write(self.frame * n)
        else:
            self.outstanding -= n


# ------------------------------------------------------------------------------- statistics


def percentile(sorted_values: list[float] | array[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (NaN when empty)."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def summary_ms(values_s: list[float] | array[float]) -> dict[str, float | int]:
    """p50 / p90 / p99 / p99.9 / max / mean in milliseconds of latencies given in seconds."""
    v = sorted(values_s)
    if not v:
        return {"n": 0, "p50": math.nan, "p90": math.nan, "p99": math.nan, "p999": math.nan,
                "max": math.nan, "mean": math.nan}  # fmt: skip
    return {
        "n": len(v),
        "p50": percentile(v, 50) * 1000,
        "p90": percentile(v, 90) * 1000,
        "p99": percentile(v, 99) * 1000,
        "p999": percentile(v, 99.9) * 1000,
        "max": v[-1] * 1000,
        "mean": sum(v) / len(v) * 1000,
    }


def rss_kib(pid: int) -> int:
    """VmRSS of a process, KiB, from /proc/PID/status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def machine_cpu_seconds() -> float:
    """CPU seconds every core of the machine has been busy (not idle, not waiting on I/O) so far."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def fmt_ms(x: float) -> str:
    return "-" if math.isnan(x) else (f"{x:.1f}" if x < 100 else f"{x:,.0f}")


# ------------------------------------------------------------------------------- processes


class ServerProcess:
    """A server subprocess whose output goes to a log file; `ready` parses its port from it."""

    def __init__(self, label: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.label = label
        self.log = log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(
            argv, stdout=self._log_file, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )
        self.port = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_for(self, pattern: str, timeout: float = 90.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            text = self.log.read_text(errors="replace")
            m = regex.search(text)
            if m:
                return m
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.label} exited ({self.proc.returncode}):\n{text[-3000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"{self.label} did not start within {timeout} s:\n{self.log.read_text()[-3000:]}")

    def rss_kib(self) -> int:
        return rss_kib(self.pid)

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def stop(self, timeout: float = 60.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log_file.close()


class EchoProcess(ServerProcess):
    """`python -m bench.echo_server` on a free port."""

    def __init__(self, log: Path) -> None:
        super().__init__(
            "echo server",
            [sys.executable, "-m", "bench.echo_server", "--host", "127.0.0.1", "--port", "0"],
            {**os.environ, "PYTHONUNBUFFERED": "1"},
            log,
        )
        self.port = int(self.wait_for(r"listening on (\d+)").group(1))


# A benchmark's edge stops without the deploy drain (docs/operations.md, "Upgrading"): no balancer
# watches its /healthz, and the drain's grace and window (4 s + 10 s by default) were paid at every
# stop, a fifth of a `bench all --quick` run alone. bench rollout, which measures the drain, sets its own.
NO_DRAIN = {"PRESENCE_DRAIN_GRACE_S": "0", "PRESENCE_DRAIN_WINDOW_S": "0"}


def edge_process_env(env: dict[str, str] | None) -> dict[str, str]:
    """A benchmark's edge's environment: this one's, loopback, `NO_DRAIN`, then `env`."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PRESENCE_WS_HOST": "127.0.0.1", **NO_DRAIN, **(env or {})}


class EdgeProcess(ServerProcess):
    """`presence edge --data-dir D` joined to the benchmark's pool; `env` overrides settings
    (e.g. PRESENCE_SOCKET_RATE_PER_S), `NO_DRAIN` among them."""

    def __init__(
        self,
        data_dir: Path,
        log: Path,
        env: dict[str, str] | None = None,
        ports: tuple[int, int] = (0, 0),
    ) -> None:
        """`ports`: (websocket, internal), 0 for free ones; fixed, a restarted edge comes back
        where its clients and its balancer knew it (bench rollout)."""
        from cluster.runtime import INTERNAL_TOKEN_FILE

        # The internal port answers nothing but /healthz without the token `bench_env` wrote.
        self.internal_token = (data_dir / INTERNAL_TOKEN_FILE).read_text().strip()
        super().__init__(
            "presence edge",
            [
                sys.executable,
                "-m",
                "cluster.cli",
                "edge",
                "--data-dir",
                str(data_dir),
                "--ws-port",
                str(ports[0]),
                "--internal-port",
                str(ports[1]),
            ],
            edge_process_env(env),
            log,
        )
        self.port = int(self.wait_for(r"websocket\s+ws://127\.0\.0\.1:(\d+)/ws/presence").group(1))
        self.edge_id = self.wait_for(r"edge (\S+) is up").group(1)
        self.internal_port = int(self.wait_for(r"internal\s+http://[^:\s]+:(\d+)").group(1))

    def metrics_text(self, timeout: float = 10.0) -> str:
        """The edge's /metrics (its own registry and every shard's), Prometheus text."""
        import urllib.request

        request = urllib.request.Request(
            f"http://127.0.0.1:{self.internal_port}/metrics",
            headers={"Authorization": f"Bearer {self.internal_token}"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return str(r.read().decode())


@dataclass
class BenchEnv:
    """Everything a websocket benchmark runs against; see `bench_env`."""

    name: str
    tmp: Path
    data_dir: Path
    database_url: str
    redis_url: str
    secret: str
    namespace: str
    shards: int
    servers: list[ServerProcess] = field(default_factory=list)
    _logs: int = 0

    def _log(self, label: str) -> Path:
        self._logs += 1
        return self.tmp / f"{self._logs:02d}-{label}.log"

    def start_edge(self, env: dict[str, str] | None = None, ports: tuple[int, int] = (0, 0)) -> EdgeProcess:
        edge = EdgeProcess(self.data_dir, self._log("edge"), env, ports)
        self.servers.append(edge)
        return edge

    def start_echo(self) -> EchoProcess:
        echo = EchoProcess(self._log("echo"))
        self.servers.append(echo)
        return echo

    def start_server(self, label: str, argv: list[str]) -> ServerProcess:
        """`python ARGV…`, a server that prints `listening on PORT` once it accepts (e.g.
        bench.query_server); stopped with the environment if not before."""
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        server = ServerProcess(label, [sys.executable, *argv], env, self._log(label.replace(" ", "-")))
        self.servers.append(server)
        server.port = int(server.wait_for(r"listening on (\d+)").group(1))
        return server

    def stop(self, server: ServerProcess) -> None:
        server.stop()
        if server in self.servers:
            self.servers.remove(server)

    @contextlib.contextmanager
    def serving(self, *servers: ServerProcess) -> Iterator[tuple[ServerProcess, ...]]:
        """Servers just started, stopped when the block ends (one side of a pair measured after
        the other: each has the machine to itself)."""
        try:
            yield servers
        finally:
            for server in servers:
                self.stop(server)

    def shard_stats(self) -> list[ShardStats]:
        from actors import clients

        async def all_stats() -> list[ShardStats]:
            return list(await asyncio.gather(*(clients.ShardClient(i).stats(30) for i in range(self.shards))))

        return asyncio.run(all_stats())

    def sockets_in_pool(self, settle_s: float = 0.0) -> int:
        """Sockets registered in the shards; with `settle_s`, once the count has stopped moving for
        that long (departures of an edge just stopped are still arriving), at most 30 s."""
        count = sum(s.sockets for s in self.shard_stats())
        deadline = time.monotonic() + 30
        while settle_s > 0 and time.monotonic() < deadline:
            time.sleep(settle_s)
            again = sum(s.sockets for s in self.shard_stats())
            if again == count:
                break
            count = again
        return count


# ------------------------------------------------------------------------------- a server pair

# What a client of the bare server sends first (and waits to see echoed): an identify frame the
# size of ours, so that both servers read the same bytes before a socket counts as open.
BARE_HELLO = b'{"type":"identify","token":"-"}'


@dataclass(frozen=True)
class Side:
    """One server of a pair, as its clients see it: ours (presence sockets on the edge's path,
    each identified as the account `users + index`) or the bare baseline beside it (`users` None:
    a hello on `/`, echoed back). Every websocket benchmark measures such a pair with the same
    clients (`connect_side`), in turns or one after the other."""

    name: str
    users: str | None = None
    hello: bytes = BARE_HELLO  # what a bare client sends first

    @property
    def ours(self) -> bool:
        return self.users is not None

    def connect_kwargs(self, first_account: int, count: int) -> dict[str, Any]:
        """`Generator.connect`'s arguments for `count` connections, accounts from `first_account` on."""
        if self.users is None:
            return {"path": "/", "hello": self.hello, "users": None}
        return {"path": WS_PATH, "users": [f"{self.users}{first_account + k}" for k in range(count)]}


def split(n: int, parts: int) -> list[int]:
    """`n` as `parts` shares differing by at most one, the larger first."""
    return [n // parts + (1 if i < n % parts else 0) for i in range(parts)]


def alternating(rounds: int, first: str = "bare", second: str = "ours") -> list[str]:
    """The order of a pair's windows: first, second, second, first, ... so that a drift of the
    machine's speed during the run hits both alike."""
    order: list[str] = []
    for r in range(rounds):
        order += [first, second] if r % 2 == 0 else [second, first]
    return order


def connect_side(
    workers: Workers,
    stage: Stage,
    side: Side,
    targets: list[tuple[str, int]],
    shares: list[int],
    *,
    group: str | None = None,
    first_index: int = 0,
    label: str | None = None,
    **connect: Any,
) -> dict[str, Any]:
    """Open shares[i] connections of `side` from generator i (to `targets` in turn; the group is
    the side's name unless given): accounts `side.users` + 0, 1, ..., from the source addresses
    of connection indexes `first_index` on. Returns totals, the connect rate and the errors."""
    firsts = [sum(shares[:i]) for i in range(len(shares))]
    group = group or side.name
    label = label or f"connect {side.name}"
    res = workers.call(
        "connect",
        [
            {"group": group, "targets": targets, "count": shares[i], "first_index": first_index + firsts[i]}
            | side.connect_kwargs(firsts[i], shares[i])
            | connect
            for i in range(len(shares))
        ],
        on_progress=stage.progress(label, sum(shares)),
    )
    # From the first generator's start to the last one's end, each after minting its tokens.
    seconds = max(r["ended"] for r in res) - min(r["started"] for r in res)
    connected = sum(r["connected"] for r in res)
    errors: dict[str, int] = {}
    for r in res:
        for k, v in r["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "connected": connected,
        "failed": sum(shares) - connected,
        "seconds": seconds,
        "per_s": connected / seconds if seconds else 0.0,
        "errors": errors,
    }


def _write_data_dir(data_dir: Path, database_url: str, redis_url: str, namespace: str) -> str:
    """What `presence up` writes for the edges that join it (docs/security.md): the token secret
    (returned), the internal token and `cluster.json`."""
    from actors import clients
    from cluster.runtime import (
        CLUSTER_FILE,
        INTERNAL_TOKEN_FILE,
        SECRET_FILE,
        ClusterInfo,
        write_info,
        write_private,
    )

    data_dir.mkdir()
    secret = secrets.token_urlsafe(32)
    (data_dir / SECRET_FILE).write_text(secret)
    write_private(data_dir / INTERNAL_TOKEN_FILE, secrets.token_urlsafe(32) + "\n")
    info = ClusterInfo(
        database_url, redis_url, clients.gcs_address(), namespace, "", "", os.getpid(), clients.auth_mode()
    )
    write_info(data_dir, info)
    assert (data_dir / CLUSTER_FILE).exists()
    return secret


@contextlib.contextmanager
def _stores(
    tmp: Path, database_url: str | None, redis_url: str | None, log: Callable[[str], None]
) -> Iterator[tuple[str, str]]:
    """The PostgreSQL and Redis to use (embedded in `tmp` for those not given, stopped at the
    end), PostgreSQL migrated."""
    from cluster import db
    from cluster.embedded import EmbeddedPostgres, EmbeddedRedis

    started: list[Any] = []
    try:
        if database_url is None:
            log("starting PostgreSQL (embedded)")
            pg = EmbeddedPostgres()
            database_url = pg.start(tmp)
            started.append(pg)
        if redis_url is None:
            log("starting Redis (embedded)")
            rd = EmbeddedRedis()
            redis_url = rd.start(tmp)
            started.append(rd)
        asyncio.run(db.migrate(database_url))
        yield database_url, redis_url
    finally:
        for server in reversed(started):
            with contextlib.suppress(Exception):
                server.stop()


@contextlib.contextmanager
def bench_env(
    name: str,
    settings: Settings,
    database_url: str | None = None,
    redis_url: str | None = None,
    shards: int | None = None,
    log: Callable[[str], None] = lambda _line: None,
) -> Iterator[BenchEnv]:
    """PostgreSQL, Redis, Ray and the actor pool (`shards`, default the settings'), plus a data
    directory `presence edge` can join. Everything it started is stopped on the way out."""
    from actors import clients
    from actors.pool import start_pool, stop_pool
    from cluster.up import shard_config

    raise_nofile()
    tmp = Path(tempfile.mkdtemp(prefix=f"presence-bench-{name}-"))
    shards = shards or default_shards(settings)
    namespace = f"presence-bench-{name}-{secrets.token_hex(3)}"
    env: BenchEnv | None = None
    try:
        with _stores(
            tmp, database_url or settings.database_url, redis_url or settings.redis_url, log
        ) as urls:
            log(f"starting Ray and {shards} shards")
            clients.connect(None, namespace)
            try:
                config = shard_config(settings, *urls)
                start_pool(shards, config, settings.flush_interval_s, settings.flush_max_rows)
                secret = _write_data_dir(tmp / "data", *urls, namespace)
                env = BenchEnv(name, tmp, tmp / "data", *urls, secret, namespace, shards)
                yield env
            finally:
                if env is not None:
                    for server in reversed(env.servers):
                        with contextlib.suppress(Exception):
                            server.stop()
                with contextlib.suppress(Exception):
                    stop_pool(drain_timeout_s=10)
                clients.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------------------------- generator processes


class WorkerError(RuntimeError):
    pass


class Workers:
    """Generator processes, each running a `Generator`; `call` runs one method on all of them."""

    def __init__(self, count: int, spec: dict[str, Any]) -> None:
        ctx = mp.get_context("spawn")
        self.procs: list[Any] = []
        self._cmd: list[Connection] = []
        self._out: list[Connection] = []
        for i in range(count):
            cmd_r, cmd_w = ctx.Pipe(duplex=False)
            out_r, out_w = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=worker_main, args=(i, count, spec, cmd_r, out_w), daemon=True)
            proc.start()
            cmd_r.close()
            out_w.close()
            self.procs.append(proc)
            self._cmd.append(cmd_w)
            self._out.append(out_r)

    def __len__(self) -> int:
        return len(self.procs)

    @property
    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.procs]

    def cpu_seconds(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def call(
        self,
        method: str,
        kwargs: dict[str, Any] | list[dict[str, Any]] | None = None,
        timeout: float = 600.0,
        on_progress: Callable[[list[dict[str, Any]]], None] | None = None,
        tick: Callable[[], None] | None = None,
    ) -> list[Any]:
        """Run `method(**kwargs)` in every generator (kwargs per generator when a list); returns
        their results in order. `on_progress` gets the latest progress report of each; `tick` is
        called at least once a second while they run."""
        per = kwargs if isinstance(kwargs, list) else [kwargs or {}] * len(self.procs)
        for conn, kw in zip(self._cmd, per, strict=True):
            conn.send((method, kw))
        results: list[Any] = [None] * len(self.procs)
        done = [False] * len(self.procs)
        latest: list[dict[str, Any]] = [{} for _ in self.procs]
        deadline = time.monotonic() + timeout
        while not all(done):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"generators did not finish {method} within {timeout} s")
            if tick is not None:
                tick()
            for r in wait([o for o, d in zip(self._out, done, strict=True) if not d], min(left, 1.0)):
                assert isinstance(r, Connection)
                i = self._out.index(r)
                try:
                    kind, value = r.recv()
                except EOFError:
                    raise WorkerError(f"generator {i} died during {method}") from None
                if kind == "progress":
                    latest[i] = value
                    if on_progress is not None:
                        on_progress(latest)
                elif kind == "error":
                    raise WorkerError(f"generator {i} failed in {method}:\n{value}")
                else:
                    results[i] = value
                    done[i] = True
        return results

    def close(self, timeout: float = 60.0) -> None:
        for conn in self._cmd:
            with contextlib.suppress(OSError):
                conn.send(("exit", {}))
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            proc.join(max(0.1, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(5)

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def worker_main(index: int, count: int, spec: dict[str, Any], cmd: Connection, out: Connection) -> None:
    """Entry point of a generator process."""
    raise_nofile()
    install_uvloop()
    asyncio.run(_worker(index, count, spec, cmd, out))


async def _worker(index: int, count: int, spec: dict[str, Any], cmd: Connection, out: Connection) -> None:
    gen = Generator(index, count, spec, lambda value: out.send(("progress", value)))
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                method, kwargs = await loop.run_in_executor(None, cmd.recv)
            except EOFError:
                return
            if method == "exit":
                return
            try:
                result = await getattr(gen, method)(**kwargs)
            except Exception:
                out.send(("error", traceback.format_exc()))
            else:
                out.send(("result", result))
    finally:
        await gen.close_all()


# ------------------------------------------------------------------------------- inside a generator


# The longest a window waits for late deliveries: a server that still delivers after this is
# too far behind for its window to say anything, and its delivered fraction says so.
DRAIN_CAP_S = 30.0


async def until_quiet(
    received: Callable[[], int],
    quiet_s: float,
    cap_s: float,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> int:
    """Wait until `received()` stays the same for `quiet_s` (late deliveries have stopped
    coming), at most about `cap_s`; the periods waited. A loaded machine's tail (receipts still
    arriving a second after the window, the bare server's included) is counted instead of cut."""
    periods = 0
    while True:
        before = received()
        await sleep(quiet_s)
        periods += 1
        if received() == before or periods * quiet_s >= cap_s:
            return periods


def fanout_targets(i: int, accounts: int, subscriptions: int) -> list[int]:
    """Whom account i subscribes to: the next `subscriptions` accounts on a ring. Every account
    is then watched by exactly as many as it watches."""
    return [(i + k) % accounts for k in range(1, subscriptions + 1)]


def query_targets(j: int, accounts: int, ids: int) -> list[int]:
    """The ids querier j asks about (its friends among the fanout accounts)."""
    return [(j * 97 + k) % accounts for k in range(ids)]


class Generator:
    """The client side of every benchmark, inside one generator process. Methods are phases the
    benchmark runs on all generators at once (`Workers.call`)."""

    def __init__(
        self, index: int, count: int, spec: dict[str, Any], progress: Callable[[dict[str, Any]], None]
    ) -> None:
        self.index = index
        self.count = count
        self.secret: str = spec.get("secret", "")
        self.groups: dict[str, list[WsConn]] = {}
        self.progress = progress
        self._tasks: list[asyncio.Task[Any]] = []
        self.receipts_user = array("i")
        self.receipts_status = bytearray()
        self.receipts_t = array("d")
        self.recording = False
        self.prefix = ""
        self.query_prefix = ""
        self.changes: dict[str, dict[str, int]] = {}  # group → account → status changes sent

    async def close_all(self) -> None:
        for t in self._tasks:
            t.cancel()
        for group in list(self.groups):
            await self.close(group, timeout=5.0)

    # -- connecting

    async def connect(
        self,
        group: str,
        targets: list[tuple[str, int]],
        count: int,
        first_index: int,
        users: list[str] | None = None,
        path: str = WS_PATH,
        concurrency: int = 100,
        hello: bytes | None = None,
        timeout: float = 60.0,
        retries: int = 0,
    ) -> dict[str, Any]:
        """Open `count` connections; connection k goes to `targets[k % len(targets)]` from
        `source_address(first_index + k)`. With `users`, connection k identifies as users[k]
        and waits for `ready`; else, with `hello`, it sends that and waits for the echo. A
        connection reset or closed during its handshake is tried again up to `retries` times
        (a set-up that must be complete)."""
        opening = _Opening(self, self.groups.setdefault(group, []), count, path, users, hello, timeout)
        opening.mint_tokens()  # before the clock: a real client has its token already
        started = time.monotonic()
        next_k = 0

        async def runner() -> None:
            nonlocal next_k
            while next_k < count:
                k = next_k
                next_k += 1
                await opening.open_with_retries(k, targets[k % len(targets)], first_index + k, retries)

        await asyncio.gather(*(runner() for _ in range(min(concurrency, max(count, 1)))))
        ok = [c for c in opening.conns if c is not None]
        self.progress({"done": count, "ok": len(ok), "of": count})
        ended = time.monotonic()
        return {
            "connected": len(ok),
            "failed": count - len(ok),
            "seconds": ended - started,
            # CLOCK_MONOTONIC is one clock for every process of the machine: `connect_side` times
            # the generators together from these.
            "started": started,
            "ended": ended,
            "errors": opening.errors,
        }

    async def phase(self, target: str, kwargs: dict[str, Any]) -> Any:
        """Run `await module.function(self, **kwargs)` (`target` "module:function"): a phase that
        lives with the one benchmark using it (bench.reconnect's storm) rather than here."""
        module, _, function = target.partition(":")
        return await getattr(importlib.import_module(module), function)(self, **kwargs)

    async def open_count(self, group: str) -> int:
        return sum(1 for c in self.groups.get(group, []) if c.open)

    async def heartbeats(self, group: str, interval_s: float) -> None:
        """Every connection of the group sends a heartbeat every `interval_s`, spread evenly (what
        an idle client does; the edge closes sockets silent for 90 s)."""

        async def loop() -> None:
            tick = 0.1
            i = 0
            carry = 0.0
            while True:
                await asyncio.sleep(tick)
                conns = self.groups.get(group, [])
                if not conns:
                    continue
                carry += len(conns) * tick / interval_s
                n, carry = int(carry), carry - int(carry)
                for _ in range(n):
                    conns[i % len(conns)].send(HEARTBEAT)
                    i += 1

        self._tasks.append(asyncio.create_task(loop()))

    async def close(self, group: str, timeout: float = 30.0) -> dict[str, Any]:
        conns = self.groups.pop(group, [])
        for c in conns:
            c.close()
        pending = [c.lost for c in conns if not c.lost.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        left = 0
        for c in conns:
            if c.transport is not None:
                left += 1
                c.transport.abort()
        return {"closed": len(conns), "aborted": left}

    # -- pipelined heartbeats (bench edge)

    async def pipeline(self, group: str, seconds: float, warmup_s: float, in_flight: int) -> dict[str, Any]:
        """Keep `in_flight` heartbeats outstanding on every connection; count the answers that
        arrive during `seconds` after `warmup_s`."""
        conns = [c for c in self.groups.get(group, []) if c.open]
        pipe = Pipeline(client_frame(HEARTBEAT), in_flight)
        for c in conns:
            c.pipe = pipe
            pipe.outstanding += in_flight
            c.send_raw(pipe.frame * in_flight)
        await asyncio.sleep(warmup_s)
        cpu0, t0 = time.process_time(), time.monotonic()
        pipe.counting = True
        await asyncio.sleep(seconds)
        pipe.counting = False
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        pipe.running = False
        deadline = time.monotonic() + 10
        while pipe.outstanding > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for c in conns:
            c.pipe = None
        return {"count": pipe.counted, "wall_s": wall, "cpu_s": cpu, "connections": len(conns),
                "unanswered": pipe.outstanding}  # fmt: skip

    # -- fanout and query (bench fanout, bench query)

    def _on_frame(self, conn: WsConn, payload: bytes) -> None:
        if not self.recording or not payload.startswith(b'{"type":"presence.changed"'):
            return
        t = time.monotonic()
        frame = orjson.loads(payload)
        user = frame["userId"]
        if not user.startswith(self.prefix):
            return
        self.receipts_t.append(t)
        self.receipts_user.append(int(user[len(self.prefix) :]))
        self.receipts_status.append(1 if frame["status"] == "idle" else 0)

    async def fanout_setup(
        self,
        targets: list[tuple[str, int]],
        prefix: str,
        accounts: int,
        subscriptions: int,
        concurrency: int,
        queriers: int = 0,
        query_prefix: str = "",
        timeout: float = 120.0,
        bare_query_target: tuple[str, int] | None = None,
        account_share: tuple[int, int] | None = None,
        my_queriers: list[int] | None = None,
    ) -> dict[str, Any]:
        """Connect this generator's share of the accounts and of the queriers, then subscribe every
        account to its `subscriptions` targets. The share: accounts i ≡ k mod n for
        `account_share` (k, n) (none when n is 0; default: this generator's index and count), the
        queriers `my_queriers` (default: j ≡ index mod count). With `bare_query_target`, each
        querier also gets a socket to that server (bench.query_server), group "queriers_bare",
        asking the same ids."""
        self.prefix = prefix
        self.query_prefix = query_prefix
        # Idle clients heartbeat (every 30 s, the contract's interval): a long set-up must not let
        # the edge close the first sockets as silent.
        await self.heartbeats("fanout", 30.0)
        await self.heartbeats("queriers", 30.0)
        # Account i goes to edge i % edges, so its watchers sit on every edge.
        per_edge: dict[int, list[int]] = {}
        for i in self._my_accounts(accounts, account_share):
            per_edge.setdefault(i % len(targets), []).append(i)
        result: dict[str, Any] = {"connect_s": 0.0, "connected": 0, "failed": 0, "errors": {}}
        base = self.index * 100_000
        for e, ids in per_edge.items():
            r = await self.connect(
                "fanout", [targets[e]], len(ids), base + e * 20_000, [f"{prefix}{i}" for i in ids],
                concurrency=concurrency, timeout=timeout,
            )  # fmt: skip
            result["connect_s"] += r["seconds"]
            result["connected"] += r["connected"]
            result["failed"] += r["failed"]
            for k, v in r["errors"].items():
                result["errors"][k] = result["errors"].get(k, 0) + v
        mine_q = list(range(self.index, queriers, self.count)) if my_queriers is None else my_queriers
        if mine_q:
            result |= await self._connect_queriers(targets, mine_q, bare_query_target, concurrency, timeout)
        r = await self._subscribe_all("fanout", prefix, accounts, subscriptions, concurrency, timeout)
        result["subscribe_s"], result["subscribed"], result["subscribe_errors"] = r
        return result

    async def _connect_queriers(
        self,
        targets: list[tuple[str, int]],
        mine: list[int],
        bare_target: tuple[str, int] | None,
        concurrency: int,
        timeout: float,
    ) -> dict[str, int]:
        """The queriers `mine` on the edges and, with `bare_target`, each beside it on that server."""
        base = self.index * 100_000
        r = await self.connect(
            "queriers", [targets[j % len(targets)] for j in range(len(targets))], len(mine),
            base + 90_000, [f"{self.query_prefix}{j}" for j in mine], concurrency=concurrency,
            timeout=timeout,
        )  # fmt: skip
        out = {"queriers": r["connected"]}
        if bare_target is not None:
            first = base + 95_000
            r = await self.connect(
                "queriers_bare", [bare_target], len(mine), first, path="/",
                concurrency=concurrency, timeout=timeout,
            )  # fmt: skip
            for c in self.groups.get("queriers_bare", []):
                c.user = f"{self.query_prefix}{mine[c.index - first]}"  # the querier it stands beside
            out["queriers_bare"] = r["connected"]
        return out

    def _my_accounts(self, accounts: int, share: tuple[int, int] | None) -> list[int]:
        """Accounts i ≡ k mod n of `share` (k, n), none when n is 0 (a generator of queriers
        only); by default this generator's index and count."""
        k, n = share if share is not None else (self.index, self.count)
        return list(range(k, accounts, n)) if n else []

    async def _subscribe_all(
        self,
        group: str,
        prefix: str,
        accounts: int,
        subscriptions: int,
        concurrency: int,
        timeout: float,
        targets_of: Callable[[int], list[int]] | None = None,
    ) -> tuple[float, int, dict[str, int]]:
        """Subscribe every account of `group` to its `subscriptions` targets (`targets_of(i)`, by
        default the next ones on the ring: `fanout_targets`), each waiting for its
        `presence.sync`; (seconds taken, subscribed, errors)."""
        conns = self.groups.get(group, [])
        for c in conns:
            c.on_text = self._on_frame
        started = time.monotonic()
        sem = asyncio.Semaphore(concurrency)
        synced = 0
        sub_errors: dict[str, int] = {}

        async def subscribe(c: WsConn) -> None:
            nonlocal synced
            async with sem:
                i = int(c.user[len(prefix) :])
                targets = targets_of(i) if targets_of else fanout_targets(i, accounts, subscriptions)
                ids = [f"{prefix}{t}" for t in targets]
                try:
                    fut_sync = c.expect(b"presence.sync", timeout)
                    c.send(orjson.dumps({"type": "presence.subscribe", "userIds": ids}))
                    await fut_sync
                    synced += 1
                except Exception as e:
                    key = f"{type(e).__name__}: {e}"[:120]
                    sub_errors[key] = sub_errors.get(key, 0) + 1
                finally:
                    c.on_text = self._on_frame
                if synced % 500 == 0:
                    self.progress({"done": synced, "ok": synced, "of": len(conns), "phase": "subscribe"})

        # `expect` takes frames through the waiter; everything else goes to _on_frame (ignored
        # until recording starts).
        await asyncio.gather(*(subscribe(c) for c in conns))
        return time.monotonic() - started, synced, sub_errors

    async def fanout_bare_setup(
        self,
        target: tuple[str, int],
        prefix: str,
        accounts: int,
        subscriptions: int,
        concurrency: int,
        timeout: float = 120.0,
        account_share: tuple[int, int] | None = None,
    ) -> dict[str, Any]:
        """The same accounts as `fanout_setup` (the same `account_share`), each with a second
        socket, to the bare server (bench.fanout_server), group "fanout_bare", subscribed to the
        same targets: the same fan-out graph on the same clients."""
        mine = self._my_accounts(accounts, account_share)
        r = await self.connect(
            "fanout_bare", [target], len(mine), self.index * 100_000 + 60_000,
            [f"{prefix}{i}" for i in mine], path="/", concurrency=concurrency, timeout=timeout,
        )  # fmt: skip
        seconds, synced, errors = await self._subscribe_all(
            "fanout_bare", prefix, accounts, subscriptions, concurrency, timeout
        )
        return {**r, "subscribe_s": seconds, "subscribed": synced, "subscribe_errors": errors}

    async def fanout_run(
        self,
        start_at: float,
        seconds: float,
        rate: float,
        drain_s: float,
        query_rate: float = 0.0,
        query_ids: int = 0,
        accounts: int = 0,
        query_timeout_s: float = 5.0,
        group: str = "fanout",
    ) -> dict[str, Any]:
        """From `start_at` (monotonic, shared by every generator) for `seconds`: change the status
        of this generator's accounts (their sockets of `group`: "fanout_bare" drives the bare
        server) at `rate` per second, round robin, alternating idle and online per account, and
        record every `presence.changed` received; with `query_rate`, send `presence.query` for
        `query_ids` ids from the queriers, one at a time per querier. Then wait for late
        deliveries until none came for `drain_s` (`until_quiet`). Each run records its own
        receipts (windows one after another)."""
        window = _FanoutWindow(self, group, rate, _Queries(query_rate, query_ids, accounts, query_timeout_s))
        self.receipts_user, self.receipts_status, self.receipts_t = array("i"), bytearray(), array("d")
        # Recording from before `start_at`, not from this generator's own wake-up: the loop runs
        # a turn's socket reads before the task its timer woke, so a generator that woke a moment
        # late missed the deliveries of the other generators' first changes that came in that turn
        # (one change's watchers here, 25 of 1,200,000, or one or two: the losses of some windows,
        # the bare server's too). Anything received before the first change matches no change
        # and is counted unmatched, not delivered.
        self.recording = True
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        cpu0 = time.process_time()
        await window.run(seconds)
        cpu_load, wall = time.process_time() - cpu0, time.monotonic() - window.t0
        await until_quiet(lambda: len(self.receipts_t), drain_s, cap_s=DRAIN_CAP_S)
        self.recording = False
        return {
            "cpu_s": cpu_load,
            "wall_s": wall,
            **window.sends(),
            "receipts": (
                self.receipts_user.tobytes(),
                bytes(self.receipts_status),
                self.receipts_t.tobytes(),
            ),
            **window.queried(),
            "open": len(window.conns),
        }


async def _both(first: Any, second: Any) -> None:
    await asyncio.gather(first, second)


class _Opening:
    """The connections one `Generator.connect` opens: each identified (`users`) or greeted
    (`hello`), joining its group as soon as it is open; errors counted by kind."""

    def __init__(
        self,
        gen: Generator,
        group_list: list[WsConn],
        count: int,
        path: str,
        users: list[str] | None,
        hello: bytes | None,
        timeout: float,
    ) -> None:
        self.gen, self.group_list, self.count = gen, group_list, count
        self.path, self.users, self.hello, self.timeout = path, users, hello, timeout
        self.conns: list[WsConn | None] = [None] * count
        self.tokens: list[str] = []
        self.errors: dict[str, int] = {}
        self.done = 0
        self.last_report = 0.0

    def mint_tokens(self) -> None:
        """The signed tokens of `users`, made before the connections are timed (minting one costs
        the generator as much CPU as a server spends on a handshake)."""
        from edge.tokens import mint_token

        if self.users is not None:
            self.tokens = [mint_token(user, self.gen.secret, 7200) for user in self.users]

    async def open(self, k: int, target: tuple[str, int], index: int) -> None:
        host, port = target
        conn = await open_ws(host, port, self.path, source_address(index), self.timeout)
        conn.index = index
        try:
            if self.users is not None:
                conn.user = self.users[k]
                conn.send(orjson.dumps({"type": "identify", "token": self.tokens[k]}))
                await conn.expect(b"ready", self.timeout)
            elif self.hello is not None:
                fut = conn.next_text()
                conn.send(self.hello)
                await asyncio.wait_for(fut, self.timeout)
        except BaseException:
            if conn.transport is not None:
                conn.transport.abort()
            raise
        self.conns[k] = conn
        self.group_list.append(conn)  # heartbeats (if running for the group) start at once

    async def open_with_retries(self, k: int, target: tuple[str, int], index: int, retries: int) -> None:
        for attempt in range(retries + 1):
            try:
                await self.open(k, target, index)
            except Exception as e:
                if isinstance(e, ConnectionError | HandshakeError) and attempt < retries:
                    await asyncio.sleep(0.1 * (attempt + 1))
                    continue
                key = f"{type(e).__name__}: {e}"[:120]
                self.errors[key] = self.errors.get(key, 0) + 1
            break
        self.done += 1
        now = time.monotonic()
        if now - self.last_report > 0.5:
            self.last_report = now
            ok = self.done - sum(self.errors.values())
            self.gen.progress({"done": self.done, "ok": ok, "of": self.count})


@dataclass(frozen=True)
class _Queries:
    """The queries of a fanout window (bench query): how many per second, of how many ids, among
    how many accounts, each given up after `timeout_s`."""

    rate: float
    ids: int
    accounts: int
    timeout_s: float


@dataclass
class _Asked:
    """One server's answers to the queries: latencies (seconds) and failures by kind."""

    latencies: list[float] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=dict)

    def failed(self, key: str) -> None:
        self.failures[key] = self.failures.get(key, 0) + 1


_STATUS_FRAMES = {
    0: client_frame(b'{"type":"presence.update","status":"online"}'),
    1: client_frame(b'{"type":"presence.update","status":"idle"}'),
}


def query_moments(t0: float, rate: float, seed: int) -> Iterator[float]:
    """When `bench query`'s queries leave: the k-th at a random moment of its own interval,
    `t0 + (k + u) / rate`, u uniform in [0, 1) from a generator seeded with `seed`. The rate
    holds, and no query is in step with anything else on a grid from `t0`."""
    phase = random.Random(seed)
    k = 0
    while True:
        yield t0 + (k + phase.random()) / rate
        k += 1


class _FanoutWindow:
    """One `Generator.fanout_run` window: the changes it sends (who, which status, when) and the
    queries it asks, to our edge and, beside each querier, to the bare server (bench query)."""

    def __init__(self, gen: Generator, group: str, rate: float, queries: _Queries) -> None:
        self.gen, self.rate, self.queries = gen, rate, queries
        self.conns = [c for c in gen.groups.get(group, []) if c.open]
        self.queriers = [c for c in gen.groups.get("queriers", []) if c.open]
        # Beside each querier, its socket to the bare server (bench query), asking the same ids.
        self.bare_of = {c.user: c for c in gen.groups.get("queriers_bare", []) if c.open}
        # Changes made so far per account, over every window of the run: a window alternates each
        # account's status from where the previous one left it (else its first change would be a
        # repeat, which changes nothing and is delivered to nobody).
        self.changes = gen.changes.setdefault(group, {})
        self.sends_user, self.sends_status, self.sends_t = array("i"), bytearray(), array("d")
        self.ours, self.bare = _Asked(), _Asked()
        self.skipped = 0
        self.t0 = self.end = 0.0

    async def run(self, seconds: float) -> None:
        self.t0 = time.monotonic()
        self.end = self.t0 + seconds
        jobs = [self._changer()] if self.rate > 0 else []  # a generator of queriers only changes nothing
        if self.queries.rate > 0 and self.queriers:
            jobs.append(self._querier())
        await asyncio.gather(*jobs)

    async def _changer(self) -> None:
        conns, prefix, rate, k = self.conns, self.gen.prefix, self.rate, 0
        while True:
            now = time.monotonic()
            if now >= self.end:
                return
            due = int((now - self.t0) * rate) + 1
            while k < due and conns:
                c = conns[k % len(conns)]
                n = self.changes[c.user] = self.changes.get(c.user, 0) + 1
                status = n % 2  # first change: idle (1), then online (0), ...
                self.sends_t.append(time.monotonic())
                c.send_raw(_STATUS_FRAMES[status])
                self.sends_user.append(int(c.user[len(prefix) :]))
                self.sends_status.append(status)
                k += 1
            await asyncio.sleep(max(0.0, min(self.end, self.t0 + k / rate) - time.monotonic()))

    async def _one_query(self, c: WsConn, asked: _Asked) -> None:
        q, prefix = self.queries, self.gen.prefix
        j = int(c.user[len(self.gen.query_prefix) :])
        ids = [f"{prefix}{t}" for t in query_targets(j, q.accounts, q.ids)]
        got = 0
        t_send = time.monotonic()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_text(_c: WsConn, payload: bytes) -> None:
            nonlocal got
            if payload.startswith(b'{"type":"presence.changed"'):
                got += 1
                if got == q.ids and not done.done():
                    done.set_result(None)
            elif payload.startswith(b'{"type":"error"') and not done.done():
                done.set_exception(RuntimeError(orjson.loads(payload).get("code", "error")))

        c.on_text = on_text
        c.send(orjson.dumps({"type": "presence.query", "userIds": ids}))
        try:
            await asyncio.wait_for(done, q.timeout_s)
            asked.latencies.append(time.monotonic() - t_send)
        except Exception as e:
            asked.failed("timeout" if isinstance(e, TimeoutError) else str(e))
        finally:
            c.on_text = None

    def _ask(self, idx: int, k: int) -> asyncio.Task[None]:
        """Querier idx asks our edge, and the bare server beside it the same ids (in turn first)."""
        ours = self._one_query(self.queriers[idx], self.ours)
        bare = self.bare_of.get(self.queriers[idx].user)
        if bare is None:
            return asyncio.create_task(ours)
        pair = (ours, self._one_query(bare, self.bare))
        return asyncio.create_task(_both(*(pair if k % 2 else pair[::-1])))

    async def _querier(self) -> None:
        """Query k leaves at a moment drawn at random within its interval, `t0 + (k + u) / rate`
        (u uniform, seeded): on the grid `t0 + k / rate` every query left in the same turn as a
        status change (both grids start at `t0`, and the change rate is a multiple of the query
        rate), so each found its shard's line busy with that change's call and waited out the
        busy line's batching window, a phase lock no real client has (bench/profiles/README.md,
        "Query: where the milliseconds go")."""
        k = 0
        busy: set[int] = set()
        running: set[asyncio.Task[None]] = set()
        for at in query_moments(self.t0, self.queries.rate, seed=self.gen.index):
            await asyncio.sleep(max(0.0, min(at, self.end) - time.monotonic()))
            if time.monotonic() >= self.end:
                break
            idx = k % len(self.queriers)
            k += 1
            if idx in busy:
                self.skipped += 1
                continue
            busy.add(idx)
            task = self._ask(idx, k)
            running.add(task)
            task.add_done_callback(lambda t, i=idx: (busy.discard(i), running.discard(t)))
        if running:
            await asyncio.wait(list(running), timeout=self.queries.timeout_s + 1)

    def sends(self) -> dict[str, Any]:
        return {"sends": (self.sends_user.tobytes(), bytes(self.sends_status), self.sends_t.tobytes())}

    def queried(self) -> dict[str, Any]:
        return {
            "query_latencies": self.ours.latencies,
            "query_failures": self.ours.failures,
            "bare_query_latencies": self.bare.latencies,
            "bare_query_failures": self.bare.failures,
            "query_skipped": self.skipped,
        }


Run = Callable[[Any, BenchEnv, "Stage"], dict[str, Any]]
Report = Callable[[Any, dict[str, Any], float, str], int]


def main_in_env(name: str, args: Any, settings: Settings, run: Run, report: Report) -> int:
    """Every websocket benchmark's `main`: measure with `run` inside a fresh `bench_env`, then
    `report(args, measured, runtime_s, started_at)` once the environment is gone (`bench all`
    calls the same `run` and `report` inside its shared environment)."""
    from bench.results import utc_now

    stage = Stage(name)
    started_at = utc_now()
    t0 = time.monotonic()
    with bench_env(name, settings, args.database_url, args.redis_url, args.shards, stage.log) as env:
        measured = run(args, env, stage)
    return report(args, measured, time.monotonic() - t0, started_at.isoformat(timespec="seconds"))


# ------------------------------------------------------------------------------- command line and results


def default_shards(settings: Settings) -> int:
    """PRESENCE_SHARDS when set, else one shard per core: on a small machine, shards beyond the
    cores only add Ray calls and context switches (2 cores, fanout: 4 shards and 2 edges p50
    141 ms, 2 shards and 1 edge 38 ms, same run set-up)."""
    if "shards" in settings.model_fields_set:
        return settings.shards
    return os.cpu_count() or 1


def add_common_args(p: Any) -> None:
    """Options every websocket benchmark takes."""
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke test (well under a minute)")
    p.add_argument("--no-record", action="store_true", help="do not append a row to bench/RESULTS.md")
    p.add_argument("--output", type=Path, default=None, help="JSON results file (default bench/results/…)")
    p.add_argument("--database-url", default=None, help="PostgreSQL to use (default: embedded, temp dir)")
    p.add_argument("--redis-url", default=None, help="Redis to use (default: embedded, temp dir)")
    p.add_argument(
        "--shards",
        type=int,
        default=None,
        help="shards (default PRESENCE_SHARDS, else one per core)",
    )


class Stage:
    """Progress of one benchmark on stderr: a stage label plus a live line (bench.results.Progress)."""

    def __init__(self, bench: str) -> None:
        self.bench = bench
        self.started = time.monotonic()

    def log(self, text: str) -> None:
        sys.stderr.write(f"[{self.bench} {time.monotonic() - self.started:6.1f}s] {text}\n")
        sys.stderr.flush()

    def progress(self, label: str, total: int) -> Callable[[list[dict[str, Any]]], None]:
        from bench.results import Progress

        bar = Progress(f"{self.bench}: {label}", total)

        def update(latest: list[dict[str, Any]]) -> None:
            done = sum(int(x.get("done", 0)) for x in latest)
            ok = sum(int(x.get("ok", 0)) for x in latest)
            bar.update(done, f"{ok:,}/{total:,} ({time.monotonic() - self.started:.0f} s)", time.monotonic())

        return update


# ------------------------------------------------------------------------------- profiles


def require_profiler(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`--profile` needs py-spy on the PATH (the `dev` extra): say so before any set-up."""
    if getattr(args, "profile", None) is not None and shutil.which("py-spy") is None:
        p.error("--profile needs py-spy, which is not installed: pip install py-spy (in the dev extra)")


def start_profile(path: Path, pid: int, seconds: float, rate: int = 200) -> subprocess.Popen[bytes]:
    """`py-spy record` of one process for `seconds`, as collapsed stacks (text) at `path` (its
    errors at `path`.err); `finish_profile` waits for it. Raises if py-spy is not installed."""
    if shutil.which("py-spy") is None:
        raise RuntimeError("--profile needs py-spy, which is not installed: pip install py-spy")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_suffix(".err").open("wb") as err:
        return subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(max(1, round(seconds))),
                "--rate",
                str(rate),
                "--format",
                "raw",
                "--output",
                str(path),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def finish_profile(spy: subprocess.Popen[bytes], path: Path, timeout: float = 60.0) -> Path:
    """Wait for a `start_profile` recording and write its summary; raises (with py-spy's own
    words) when it recorded nothing, rather than leaving the profile silently missing."""
    try:
        spy.wait(timeout)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait(10)
    summary = summarize_profile(path)
    err = path.with_suffix(".err")
    said = err.read_text(errors="replace").strip() if err.exists() else ""
    if summary is None:
        raise RuntimeError(f"py-spy recorded nothing at {path} (exit {spy.returncode}): {said[-2000:]}")
    if not said:
        err.unlink(missing_ok=True)
    return summary


def summarize_profile(raw: Path, top: int = 30) -> Path | None:
    """A text report next to a collapsed-stack profile: the share of samples by function (own =
    leaf frame, then inclusive), then the hottest lines. `Runner.run` as a leaf is the event loop
    itself (uvloop's C code, mostly waiting in epoll)."""
    if not raw.exists():
        return None
    line_own: dict[str, int] = {}
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f for f in stack.split(";") if f] or ["(native)"]
        line_own[frames[-1]] = line_own.get(frames[-1], 0) + n
        funcs = [re.sub(r":\d+\)$", ")", f) for f in frames]
        own[funcs[-1]] = own.get(funcs[-1], 0) + n
        for f in set(funcs):
            incl[f] = incl.get(f, 0) + n
    if not total:
        return None

    def block(title: str, counts: dict[str, int], k: int) -> list[str]:
        rows = sorted(counts.items(), key=lambda kv: -kv[1])[:k]
        return ["", title, *(f"{100 * c / total:6.1f}%  {f}" for f, c in rows)]

    lines = [f"{raw.name}: {total} samples (py-spy record --format raw)"]
    lines += block("own samples, by function:", own, top)
    lines += block("inclusive, by function:", incl, top)
    lines += block("own samples, by line:", line_own, 20)
    out = raw.with_name(raw.stem + "-summary.txt")
    out.write_text("\n".join(lines) + "\n")
    return out
