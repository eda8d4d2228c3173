"""`python -m bench.capacity`: a capacity model fitted to the figures measured here, predicting
accounts and status changes per node for 1 to 64 nodes, and which resource runs out first.

Every cost below is a measured figure from bench/RESULTS.md (2-core machine, the commit and row
named beside it); the workload is the seed's, with the parameters a user would change on the
command line. The model is arithmetic, not a simulation: it says where the time goes so that a
scaling experiment can be planned, and it is checked against the one size measured for real
(`--check`: one node at the fanout benchmark's load).

A node is a 2-core machine running one edge and two shards (the bench defaults: one process per
core). An account has one socket, heartbeats every `heartbeat_s`, changes status `changes_per_h`
times an hour, is watched by `watchers` sockets spread over the edges at random, and 1 % of the
accounts leave and 1 % arrive each minute (each arrival identifies and subscribes to `watchers`
ids). Per node, CPU is spent on:

- heartbeats, at the edge (never sent upstream);
- each status change, routed by the edge and applied by its shard;
- each change's fan-out in its shard: a part per change, and a part per edge that holds one of
  its watchers (fan-out per edge, issue 28: the shard no longer walks the watchers, it sends one
  publication to each edge that watches the account; the audience was decided at the watch);
- each delivery, at the edge (its index of its own sockets watching the account expands the
  publication, checks each socket's view and writes it);
- connects (identify + subscribe);
- calls between edges and shards: a call costs `call_us` of CPU over both ends, whatever it
  carries (`--road direct`, the default: the shards' direct lanes, actors/lane.py; `--road ray`:
  a Ray actor call each, the road before c3413d8). An edge's line to
  a shard sends a call per operation while the line is quiet and batches once operations arrive
  faster than a round trip (`rtt_ms`); the same for a shard's mail to an edge. With N nodes there
  are 2N shards per edge and 2N x N lines in the mesh, so the calls per change grow with N until
  every change's mail to every edge holding one of its watchers is a call of its own.

The node is full when it uses `usable_cores` (headroom for bursts and the OS), or when its memory
is (RSS per socket at the edge plus the account's state in its shard).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

# Measured costs, µs of CPU. A Ray call costs CALL_US over both ends whatever it carries (~1.5 ms
# here, bench/profiles/README.md; bench scale's 1 → 8 shards difference would make it up to
# 3.8 ms, so the figures below are the optimistic end); the per-operation costs are the measured
# ones less their share of the calls that carried them.
CALL_US = 1_500.0
# A call on a shard's direct lane: bench rtt b5130a4 measured both roads side by side (whole
# machine, back to back): 227 µs against 2,433 µs for a Ray call on that (slow) hour, 0.093x;
# scaled to the Ray call's 1.5 ms above.
LANE_CALL_US = CALL_US * 227 / 2_433
# bench edge 2443416 (the sans-I/O edge, quiet machine): 34,452 heartbeats per CPU-second, ours
# 1.47x the bare server on that (slow) hour; 24 µs at 1d16161 on a faster one.
HEARTBEAT_US = 1e6 / 34_452
# bench scale b81985d, 1 shard: router 12.4 µs/frame, shard (2 - 0.98 cores) / 74,798 frames/s =
# 13.6, with 2.1 calls per 1,000 frames.
ROUTE_US, SHARD_APPLY_US = 12.4, 13.6
APPLY_US = ROUTE_US + SHARD_APPLY_US - 2.1 * CALL_US / 1000
# Fan-out per edge (issue 28 item 1), bench fanout 267bdf7 on the quiet machine, 800 changes/s of
# 10,000 accounts x 50 watchers on one edge: 14.8 µs (edge) + 6.8 µs (shards) per delivery, with
# 19.5 shard calls per 1,000 deliveries (about one call per change); a call's CPU is taken out,
# half from each end.
FANOUT_CALLS_PER_DELIVERY = 19.5 / 1000
FANOUT_WATCHERS = 50
EDGE_DELIVERY_US = 14.8 - FANOUT_CALLS_PER_DELIVERY * LANE_CALL_US / 2
# The shard's cost per edge reached, from the micro-benchmark of its pure fan-out path and mail
# step (bench/profiles/fanout_core.py at ca4e8cc, 1,000 x 50, 1 / 2 / 8 / 20 / 50 edges: 33.1 /
# 36.7 / 53.4 / 90.2 / 188.7 µs per change: 3.1-3.2 µs per edge beyond the first).
SHARD_EDGE_US = 3.1
# The rest of the shards' 6.8 µs per delivery is per change: at one edge, 50 deliveries a change,
# less its call, the shard's part of the change itself (in APPLY_US) and the one edge's share:
# ~255 µs, against ~30 µs for the pure path in the micro-benchmark. The difference is the shell
# (the lane's receive and reply, the mail's encoding, the event loop) and the shards' CPU at rest
# (0.02 cores in that run: ~25 µs a change at 800/s); not profiled yet.
SHARD_CHANGE_US = (
    6.8 * FANOUT_WATCHERS
    - FANOUT_CALLS_PER_DELIVERY * FANOUT_WATCHERS * LANE_CALL_US / 2
    - SHARD_APPLY_US
    - SHARD_EDGE_US
)
CONNECT_US = 2_000.0  # bench connections f3ecb88: 978 identified connects/s with the edge and shards busy
# Memory per connected account: the sans-I/O edge's RSS per idle identified socket (bench edge
# 2443416, 9,000 sockets: 4.96 KiB; 15.4 KiB on websockets' asyncio server before issue 28) and
# the shard's state per account with one socket, watching 50, friends with its 50 watchers, in
# two servers (bench/profiles/fanout_core.py --memory at ffc1c26, with the watched-targets index
# of relation changes: 15.0 KiB under tracemalloc; 13.5 at ca4e8cc; 10.5 KiB on the code before
# fan-out per edge, 85ebc02^; bench connections f3ecb88's 9.9 KiB was an earlier probe).
EDGE_KIB_PER_SOCKET = 4.96
SHARD_KIB_PER_ACCOUNT = 15.0
MEMORY_KIB = EDGE_KIB_PER_SOCKET + SHARD_KIB_PER_ACCOUNT


@dataclass(frozen=True)
class Workload:
    heartbeat_s: float = 25.0
    changes_per_h: float = 12.0
    watchers: int = 50
    churn_per_min: float = 0.01
    shards_per_node: int = 2
    usable_cores: float = 1.4  # of 2: 70 % busy at the planned load
    memory_gib: float = 20.0  # of 23.5
    # A busy line's round trip, fitted to bench fanout at 800 changes/s: 4 lines (one edge, two
    # shards, both directions), 768 calls/s on the direct lanes (67328d7), one per 5.2 ms each. A
    # quiet line sends one call per operation whatever this is.
    rtt_ms: float = 5.2
    call_us: float = LANE_CALL_US


# The road before the direct lanes: Ray calls, and their busy round trip fitted to bench fanout
# de3d3fb (4 lines, 248 calls/s: one per 16 ms each).
RAY_ROAD = {"rtt_ms": 16.0, "call_us": CALL_US}


@dataclass(frozen=True)
class NodeLoad:
    accounts: float
    changes_per_s: float
    deliveries_per_s: float
    calls_per_s: float
    cores: dict[str, float]


def _line_calls(ops_per_s: float, rtt_s: float) -> float:
    """Calls on one line carrying `ops_per_s`: one per operation while quiet, one per round
    trip once they arrive faster (they batch)."""
    return min(ops_per_s, 1.0 / rtt_s)


def node_load(w: Workload, nodes: int, accounts: float) -> NodeLoad:
    """What one of `nodes` identical nodes carries with `accounts` accounts each."""
    shards = w.shards_per_node * nodes
    rtt_s = w.rtt_ms / 1000
    changes = accounts * w.changes_per_h / 3600
    deliveries = changes * w.watchers
    # Edges a change's watchers sit on, placed at random: each gets one mail item for it.
    edges_reached = nodes * (1 - (1 - 1 / nodes) ** w.watchers)
    apply_calls = shards * _line_calls(changes / shards, rtt_s)
    mail_items = changes * edges_reached  # arriving at this node's edge, from every shard
    mail_calls = shards * _line_calls(mail_items / shards, rtt_s)
    connects = accounts * w.churn_per_min / 60
    cores = {
        "heartbeats": accounts / w.heartbeat_s * HEARTBEAT_US / 1e6,
        "changes": changes * APPLY_US / 1e6,
        "fan-out": changes * (SHARD_CHANGE_US + SHARD_EDGE_US * edges_reached) / 1e6,
        "deliveries": deliveries * EDGE_DELIVERY_US / 1e6,
        # an arrival's subscribe sync: about half the ids it watches are online, each an answer
        "connects": connects * (CONNECT_US + w.watchers * EDGE_DELIVERY_US / 2) / 1e6,
        "calls": (apply_calls + mail_calls) * w.call_us / 1e6,
    }
    return NodeLoad(accounts, changes, deliveries, apply_calls + mail_calls, cores)


def capacity(w: Workload, nodes: int) -> tuple[NodeLoad, str]:
    """The most accounts a node carries, and what limits it."""
    by_memory = w.memory_gib * 1024 * 1024 / MEMORY_KIB
    lo, hi = 0.0, by_memory
    if sum(node_load(w, nodes, hi).cores.values()) <= w.usable_cores:
        return node_load(w, nodes, hi), "memory"
    for _ in range(60):
        mid = (lo + hi) / 2
        if sum(node_load(w, nodes, mid).cores.values()) <= w.usable_cores:
            lo = mid
        else:
            hi = mid
    load = node_load(w, nodes, lo)
    return load, "CPU: " + max(load.cores, key=lambda k: load.cores[k])


def table(w: Workload, sizes: list[int]) -> str:
    head = (
        "| nodes | accounts per node | cluster accounts | changes/s per node | deliveries/s per node"
        " | calls/s per node | CPU share of the calls | runs out first |"
    )
    rows = [head, "| " + " | ".join(["---"] * 8) + " |"]
    for n in sizes:
        load, limit = capacity(w, n)
        total = sum(load.cores.values())
        rows.append(
            f"| {n} | {load.accounts:,.0f} | {load.accounts * n:,.0f} | {load.changes_per_s:,.0f}"
            f" | {load.deliveries_per_s:,.0f} | {load.calls_per_s:,.0f}"
            f" | {load.cores['calls'] / total:.0%} | {limit} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n\n")[0])
    p.add_argument("--changes-per-h", type=float, default=Workload.changes_per_h)
    p.add_argument("--watchers", type=int, default=Workload.watchers)
    p.add_argument("--heartbeat-s", type=float, default=Workload.heartbeat_s)
    p.add_argument("--nodes", default="1,2,4,8,16,32,64")
    p.add_argument("--road", choices=("direct", "ray"), default="direct", help="edge ↔ shard calls")
    p.add_argument("--check", action="store_true", help="the model at the fanout benchmark's measured load")
    args = p.parse_args(argv)
    w = Workload(heartbeat_s=args.heartbeat_s, changes_per_h=args.changes_per_h, watchers=args.watchers)
    if args.road == "ray":
        w = replace(w, **RAY_ROAD)
    if args.check:
        # bench fanout: 10,000 accounts x 50 watchers on one node, 800 changes/s (no heartbeats
        # or churn in its window): measured 0.86 cores for the edge and shards with fan-out per
        # edge (267bdf7: 21.6 µs per delivery); 1.16 by the Ray road (de3d3fb), 0.80 by the
        # direct lanes (67328d7) before it. The costs and round trips were fitted there, so this
        # checks the arithmetic, not the prediction.
        fan = replace(w, changes_per_h=800 / 10_000 * 3600, heartbeat_s=1e12, churn_per_min=0.0)
        load = node_load(fan, 1, 10_000)
        print(f"model at bench fanout's load: {sum(load.cores.values()):.2f} cores ({load.cores})")
        return 0
    sizes = [int(n) for n in args.nodes.split(",")]
    print(table(w, sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
