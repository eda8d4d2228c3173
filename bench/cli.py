"""`presence bench NAME [options]`: dispatch to one benchmark.

Each benchmark is a module with `main(argv, settings) -> int` (argv without the name). Adding one
is one entry in `BENCHMARKS`; modules are imported only when chosen, so a benchmark's heavy
imports never slow down another.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cluster.config import Settings

# name -> (module, one-line description)
BENCHMARKS: dict[str, tuple[str, str]] = {
    "scale": (
        "bench.scale",
        "frames/s absorbed by the pool at 1, 2, 4, 8 shards, with live resizes under load",
    ),
    "lastseen": (
        "bench.lastseen",
        "last-seen write load on real PostgreSQL: ours vs write-through vs coarse + Redis + batched",
    ),
    "edge": ("bench.edge", "heartbeats/s one edge absorbs, beside a bare websockets echo server"),
    "connections": ("bench.connections", "idle sockets per edge, memory per socket, beside the bare server"),
    "fanout": ("bench.fanout", "status change → subscriber latency at 10,000 accounts x 50 subscriptions"),
    "query": (
        "bench.query",
        "presence.query latency for 100 ids under load, beside a bare websockets + Redis EXISTS server",
    ),
    "reconnect": (
        "bench.reconnect",
        "reconnect storm: an edge killed under its sockets, all back on another, beside the bare server",
    ),
    "rollout": (
        "bench.rollout",
        "a deploy under load: edges restarted the old way, then rolled (drain, resume), then a pool rollout",
    ),
    "bigserver": (
        "bench.bigserver",
        "a server of 1,000,000 members: its load, lookups, typing, counts, reloads beside a 1,000-member one",
    ),
    "rtt": ("bench.rtt", "round trip of one Ray call to an idle shard: the floor under every hop"),
    "all": ("bench.all", "every benchmark, one after another, and a summary of every target"),
}


def usage() -> str:
    lines = [
        "usage: presence bench NAME [options]   (presence bench NAME --help for its options)",
        "",
        "benchmarks:",
    ]
    width = max(len(n) for n in BENCHMARKS)
    lines += [f"  {name:<{width}}  {desc}" for name, (_, desc) in BENCHMARKS.items()]
    return "\n".join(lines)


def run_bench(argv: list[str], settings: Settings) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    entry = BENCHMARKS.get(name)
    if entry is None:
        print(
            f"presence bench: unknown benchmark {name!r}; available: {', '.join(BENCHMARKS)}", file=sys.stderr
        )
        print(usage(), file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    return int(module.main(rest, settings))
