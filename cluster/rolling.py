"""Rolling restart of every edge of a cluster, one at a time, behind the load balancer.

    python -m cluster.rolling ray_cluster.yaml            # the nodes of a `ray up` cluster
    python -m cluster.rolling --edge http://10.0.0.11:8766 --edge http://10.0.0.12:8766

For each edge in turn (the worker nodes first, the head last): check that it is healthy, ask it
to drain (`presence drain`: /healthz 503 at once, so the balancer sends it nobody new; its sockets
closed with 1012 over the drain window, their clients back at once on the other edges, their
accounts resuming without a flicker), wait until it has stopped, then wait until its supervisor
(`ray_cluster.yaml`'s loop) has started it again and it answers /healthz 200 as a new process.
Only then the next one: at most one edge is ever out of the balancer. An edge that does not come
back in time stops the roll (exit 1) with the rest untouched.

The internal token comes from `PRESENCE_INTERNAL_TOKEN`, else from the `internal-token` of
`--data-dir` (what `presence up` generated), else from `presence.env` beside the cluster file (the
one `ray up` copies to every node). docs/operations.md, "Upgrading".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster.drain import DrainRefused, Health, health, request_drain
from cluster.runtime import INTERNAL_TOKEN_FILE

INTERNAL_PORT = 8766


@dataclass(frozen=True)
class Target:
    name: str
    url: str  # the edge's internal URL, http://HOST:PORT


def targets_of_cluster_file(path: Path, internal_port: int = INTERNAL_PORT) -> list[Target]:
    """The edges of a `ray_cluster.yaml` cluster: one per worker node, then the head's."""
    import yaml

    config = yaml.safe_load(path.read_text())
    provider = config.get("provider") or {}
    workers = [str(ip) for ip in provider.get("worker_ips") or []]
    head = provider.get("head_ip")
    nodes = [*(("worker", ip) for ip in workers), *((("head", str(head)),) if head else ())]
    return [Target(f"{role} {ip}", f"http://{ip}:{internal_port}") for role, ip in nodes]


def token_from_env_file(path: Path) -> str | None:
    """PRESENCE_INTERNAL_TOKEN from a `presence.env` (one VAR=value a line), if it sets it."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, sep, value = line.strip().partition("=")
        if sep and name.strip().removeprefix("export ").strip() == "PRESENCE_INTERNAL_TOKEN":
            return value.strip().strip("'\"") or None
    return None


@dataclass
class Roll:
    """One edge after another; the I/O is injected so that the order and the waits are tested
    without a cluster (tests/unit/test_rolling.py)."""

    token: str | None
    probe: Callable[[str], Health] = health
    drain: Callable[[str, str | None], dict[str, Any]] = request_drain
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    say: Callable[[str], None] = print
    stop_timeout_s: float = 120.0
    start_timeout_s: float = 180.0
    # How long an edge may take to answer /healthz 200 before its own restart: the one just
    # restarted sent it a share of its clients, and under load it can be too busy to answer the
    # 2 s probe for a while (bench rollout, 19,000 sockets: the second edge missed one probe
    # right after the first edge's clients came back, and the roll stopped there).
    ready_timeout_s: float = 60.0
    poll_s: float = 0.5

    def run(self, targets: list[Target]) -> int:
        started = self.clock()
        for i, target in enumerate(targets, 1):
            if not self.one(target, f"[{i}/{len(targets)}]"):
                self.say(f"rolling restart stopped at {target.name}; the edges after it were not touched")
                return 1
        self.say(f"rolling restart done: {len(targets)} edges in {self.clock() - started:.1f} s")
        return 0

    def one(self, target: Target, step: str) -> bool:
        before = self._until(lambda h: h.status == 200, target.url, self.ready_timeout_s)
        if before is None:
            self.say(
                f"{step} {target.name}: not healthy within {self.ready_timeout_s:.0f} s before its "
                f"restart ({self.probe(target.url).status}); left alone"
            )
            return False
        began = self.clock()
        try:
            answer = self.drain(target.url, self.token)
        except DrainRefused as e:
            self.say(f"{step} {target.name}: {e}")
            return False
        old = str(answer.get("edge") or before.edge)
        self.say(
            f"{step} {target.name}: edge {old} draining ({answer.get('sockets')} sockets over "
            f"{answer.get('windowS')} s after {answer.get('graceS')} s)"
        )
        if not self._until(lambda h: h.gone(old), target.url, self.stop_timeout_s):
            self.say(f"{step} {target.name}: edge {old} still answers after {self.stop_timeout_s:.0f} s")
            return False
        stopped = self.clock()
        self.say(f"{step} {target.name}: edge {old} stopped after {stopped - began:.1f} s; awaiting restart")
        fresh = self._until(lambda h: h.status == 200 and h.edge != old, target.url, self.start_timeout_s)
        if fresh is None:
            self.say(f"{step} {target.name}: no healthy edge after {self.start_timeout_s:.0f} s")
            return False
        self.say(f"{step} {target.name}: edge {fresh.edge} healthy after {self.clock() - stopped:.1f} s")
        return True

    def _until(self, ok: Callable[[Health], bool], url: str, timeout_s: float) -> Health | None:
        end = self.clock() + timeout_s
        while True:
            h = self.probe(url)
            if ok(h):
                return h
            if self.clock() >= end:
                return None
            self.sleep(self.poll_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cluster.rolling",
        description="Restart every edge of a cluster one at a time behind the balancer: drain, "
        "wait for its supervisor to start it again, wait for /healthz 200, next.",
    )
    parser.add_argument("cluster_file", nargs="?", help="ray_cluster.yaml: its head and worker nodes' edges")
    parser.add_argument(
        "--edge", action="append", default=[], metavar="URL", help="an edge's internal URL (repeatable)"
    )
    parser.add_argument("--internal-port", type=int, default=INTERNAL_PORT, help="with a cluster file")
    parser.add_argument("--skip-head", action="store_true", help="leave the head node's edge alone")
    parser.add_argument("--stop-timeout", type=float, default=120.0, help="seconds for an edge to stop")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="seconds for it to be back")
    parser.add_argument(
        "--ready-timeout", type=float, default=60.0, help="seconds for an edge to be healthy before its turn"
    )
    parser.add_argument(
        "--data-dir", default=None, help="use the internal-token presence up wrote in this data directory"
    )
    args = parser.parse_args(argv)
    targets = [Target(url, url.rstrip("/")) for url in args.edge]
    token = os.environ.get("PRESENCE_INTERNAL_TOKEN") or None
    if args.data_dir and not token:
        try:
            token = (Path(args.data_dir) / INTERNAL_TOKEN_FILE).read_text().strip() or None
        except OSError as e:
            parser.error(
                f"--data-dir: cannot read its {INTERNAL_TOKEN_FILE} ({e.strerror}): "
                "is a presence up running there?"
            )
    if args.cluster_file:
        path = Path(args.cluster_file)
        found = targets_of_cluster_file(path, args.internal_port)
        targets += [t for t in found if not (args.skip_head and t.name.startswith("head"))]
        token = token or token_from_env_file(path.parent / "presence.env")
    if not targets:
        parser.error("name a cluster file or at least one --edge")
    roll = Roll(
        token,
        stop_timeout_s=args.stop_timeout,
        start_timeout_s=args.start_timeout,
        ready_timeout_s=args.ready_timeout,
    )
    return roll.run(targets)


if __name__ == "__main__":
    sys.exit(main())
