"""The shard's CPU per status change through its shell, without Ray: a micro-benchmark of what
`presence bench fanout` pays in a shard beside the pure state (bench/profiles/fanout_core.py).

    python bench/profiles/shard_shell.py [--accounts 2000] [--watchers 50] [--rate 400]
                                         [--seconds 10] [--idle-s 10] [--batch 1] [--profile FILE]

A child process runs a `PresenceShard` (an in-memory store, no PostgreSQL, no Redis) behind its
direct lane (`actors.lane.LaneServer`) on uvloop, as a shard does inside its Ray worker. This
process plays one edge: it connects `--accounts` sockets, each watching the next `--watchers`
accounts (a shared server: everybody's audience), keeps a long-poll `pull` open as the router
does, then sends status changes (each account alternating idle/online) at `--rate` per second,
one operation per `apply_and_collect` (`--batch`: that many), as the edge's batches leave at that
rate. Printed: the
child's CPU (and per thread) at rest and during the changes, per change and per delivery (a
delivery: one watcher socket told). The child's Ray-free CPU is the floor of a shard's: the Ray
worker adds its own threads (bench/profiles/README.md).

`PYTHONPATH=<checkout>` runs it against any commit, so before/after are the same script.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, tuple[str, float, int]]:
    """tid → (name, CPU seconds, voluntary context switches)."""
    out: dict[str, tuple[str, float, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        switches = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("voluntary"))
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / TICK, switches)
    return out


def report(what: str, before: dict[str, tuple[str, float, int]], after: dict[str, tuple[str, float, int]],
           seconds: float) -> float:  # fmt: skip
    total = 0.0
    rows = []
    for tid, (name, cpu, switches) in after.items():
        _, cpu0, sw0 = before.get(tid, (name, 0.0, 0))
        total += cpu - cpu0
        rows.append((cpu - cpu0, (switches - sw0) / seconds, name, tid))
    print(f"{what}: {total / seconds:.4f} cores")
    for cpu, wakes, name, tid in sorted(rows, reverse=True):
        if cpu > 0 or wakes >= 1:
            print(f"    {cpu / seconds:.4f} cores  {wakes:7.1f} wakes/s  {name} ({tid})")
    return total


# ---------------------------------------------------------------------------- the shard (child)


async def serve(accounts: int, noop: bool) -> None:
    from actors.core.audience import Relations
    from actors.core.contract import AccountRow
    from actors.lane import LaneServer
    from actors.presence import PresenceShard, ShardConfig
    from cluster.config import Settings

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.unit.fake_store import FakeStore

    rel = Relations(frozenset(), frozenset({"g"}), "everyone")
    users = [f"u{i}" for i in range(accounts)]
    store = FakeStore({u: AccountRow() for u in users}, {u: rel for u in users})

    async def flush_write(entries: list[tuple[str, float]]) -> None:
        return None

    settings = Settings()
    config = ShardConfig(shard_index=0, database_url="", redis_url=None, gc_thresholds=settings.gc_thresholds)
    shard = PresenceShard(config, flush_write=flush_write, store=store)  # type: ignore[arg-type]
    await shard.start()
    handlers: dict[str, Any] = {"apply_and_collect": shard.apply_and_collect, "pull": shard.pull}
    immediate: dict[str, Any] = {}
    if hasattr(shard, "apply_and_collect_now"):  # an older checkout's lane has no immediate road
        immediate = {"apply_and_collect": shard.apply_and_collect_now}
    if noop:  # the lane alone: a reply of the same shape, nothing applied
        pulls: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def nothing(*args: object) -> object:
            return "x", [None], (0, 0, [])

        async def never(*args: object) -> object:
            await pulls
            return None

        handlers = {"apply_and_collect": nothing, "pull": never}
        if immediate:
            immediate = {"apply_and_collect": lambda *args: ("x", [None], (0, 0, []))}
    lane = LaneServer(handlers, immediate=immediate) if immediate else LaneServer(handlers)
    _, port = await lane.start("127.0.0.1")
    print(port, lane.secret.hex(), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent goes


# ---------------------------------------------------------------------------- the edge (parent)


class Edge:
    """This process as one edge on the shard's lane: its batches, its long-poll, the mail counted."""

    def __init__(self, lane: Any) -> None:
        self.lane = lane
        self.incarnation: str | None = None
        self.acked = 0
        self.items = 0

    async def apply(self, batch: list[Any]) -> None:
        from actors.core import ops

        # In the form the checkout's edge sends (plain tuples from wire version 3 on).
        wire = getattr(ops, "to_wire", lambda typed: typed)
        incarnation, _, (_, last, items) = await self.lane.call(
            "apply_and_collect", "e0", wire(batch), self.incarnation, self.acked
        )
        self.incarnation = incarnation
        self.acked = max(self.acked, last)
        self.items += len(items)

    async def pull_loop(self) -> None:
        while True:
            _, (_, last, items) = await self.lane.call("pull", "e0", self.incarnation, self.acked, 5.0, False)
            self.acked = max(self.acked, last)
            self.items += len(items)

    async def set_up(self, users: list[str], watchers: int) -> None:
        """Every account connected once, its socket watching the next `watchers` accounts."""
        from actors.core import ops

        n = len(users)
        for start in range(0, n, 500):
            await self.apply(
                [ops.Connect(u, f"s{i}") for i, u in enumerate(users[start : start + 500], start)]
            )
        for start in range(0, n, 100):
            await self.apply([
                ops.Watch(users[i], f"s{i}", tuple(users[(i + k) % n] for k in range(1, watchers + 1)))
                for i in range(start, min(n, start + 100))
            ])  # fmt: skip

    async def changes(self, users: list[str], rate: float, seconds: float, batch: int = 1) -> int:
        """Status changes at `rate`, `batch` per call, for `seconds`; how many were made."""
        from actors.core import ops

        n = len(users)
        changes = 0
        started = time.monotonic()
        in_flight: set[asyncio.Task[None]] = set()
        while time.monotonic() < started + seconds:
            batch_ops = []
            for _ in range(batch):
                i = changes % n
                status = "idle" if (changes // n) % 2 == 0 else "online"
                batch_ops.append(ops.SetStatus(users[i], f"s{i}", status))
                changes += 1
            task = asyncio.get_running_loop().create_task(self.apply(batch_ops))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            await asyncio.sleep(max(0.0, started + changes / rate - time.monotonic()))
        if in_flight:
            await asyncio.wait(in_flight)
        return changes


def _spy(args: argparse.Namespace, pid: int) -> subprocess.Popen[bytes] | None:
    if not args.profile:
        return None
    return subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--duration", str(round(args.seconds)), "--rate", "200",
         "--format", "raw", "--output", args.profile, "--nonblocking"]
        + (["--native"] if args.native else []),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def drive(args: argparse.Namespace, child: subprocess.Popen[str], port: int, secret: bytes) -> None:
    from actors.lane import LaneClient

    edge = Edge(await LaneClient.open("127.0.0.1", port, secret))
    users = [f"u{i}" for i in range(args.accounts)]
    await edge.set_up(users, args.watchers)
    puller = asyncio.get_running_loop().create_task(edge.pull_loop())
    await asyncio.sleep(2.0)  # settle: the set-up's mail handed out, the collector's first rounds

    before = thread_cpu(child.pid)
    await asyncio.sleep(args.idle_s)
    report(f"at rest, {args.idle_s:g} s", before, thread_cpu(child.pid), args.idle_s)

    spy = _spy(args, child.pid)
    items_before = edge.items
    before = thread_cpu(child.pid)
    started, edge_cpu = time.monotonic(), time.process_time()
    changes = await edge.changes(users, args.rate, args.seconds, args.batch)
    await asyncio.sleep(0.2)
    seconds, edge_cpu = time.monotonic() - started, time.process_time() - edge_cpu
    cpu = report(f"{args.rate:g} changes/s, {seconds:.1f} s", before, thread_cpu(child.pid), seconds)
    deliveries = changes * args.watchers
    print(
        f"{changes} changes ({changes / seconds:.0f}/s), {edge.items - items_before} mail items: "
        f"{cpu / changes * 1e6:.1f} µs of shard CPU per change, {cpu / deliveries * 1e6:.3f} µs per "
        f"delivery ({args.watchers} watchers each); this edge (lane client and driver) "
        f"{edge_cpu / changes * 1e6:.1f} µs per change"
    )
    if spy is not None:
        spy.wait(60)
    puller.cancel()
    edge.lane.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--accounts", type=int, default=2_000)
    p.add_argument("--watchers", type=int, default=50)
    p.add_argument("--rate", type=float, default=400.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument(
        "--batch", type=int, default=1, help="changes per call (an edge that waits to gather them; default 1)"
    )
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--profile", default=None, help="py-spy raw stacks of the shard into FILE")
    p.add_argument("--native", action="store_true")
    p.add_argument("--noop", action="store_true", help="the lane alone: the shard answers without applying")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    import uvloop

    if args.serve:
        uvloop.run(serve(args.accounts, args.noop))
        return
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--accounts", str(args.accounts)]
        + (["--noop"] if args.noop else []),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        port, secret = child.stdout.readline().split()
        uvloop.run(drive(args, child, int(port), bytes.fromhex(secret)))
    finally:
        child.kill()
        child.wait()


if __name__ == "__main__":
    main()
