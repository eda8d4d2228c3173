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

# Measured costs, µs of CPU, refitted for issue 28 on the quiet 2-core machine of 2026-12-05, all
# at 074947d (the service's code is the same at e04727e): the median of the three consecutive
# `presence bench all` runs (11:20-11:54 UTC) unless said otherwise. The per-operation costs are
# the measured ones less their share of the calls that carried them.
# A Ray call, and a call on a shard's direct lane (actors/lane.py), over the whole machine, back to
# back (bench rtt at e04727e, three runs, load 0.3-0.6, medians): 1,393 µs (1,373-1,577) and 97 µs
# (76-130).
CALL_US = 1_393.0
LANE_CALL_US = 97.0
# bench edge: 130,922 heartbeats per CPU-second of the edge (127,187-131,319; the sans-I/O edge,
# the answers to one read's frames in one send()).
HEARTBEAT_US = 1e6 / 130_922
# bench scale, 1 shard, the median run: the router (inside the load generators) 5.93 µs/frame, the
# shard the rest of the machine, (2 - 0.986 cores) / 155,852 frames/s = 6.51 µs (154,499-157,508
# frames/s over the three), with 2.15 calls per 1,000 frames.
ROUTE_US, SHARD_APPLY_US = 5.93, (2 - 0.986) / 155_852 * 1e6
APPLY_US = ROUTE_US + SHARD_APPLY_US - 2.15 * LANE_CALL_US / 1000
# Fan-out per edge, bench fanout at 800 changes/s of 10,000 accounts x 50 watchers on one edge:
# 11.87 µs (edge) + 3.67 µs (shards) per delivery (11.32-12.05 and 3.27-3.69 over the three runs),
# 19.61 shard calls per 1,000 deliveries (about one call per change); a call's CPU is taken out,
# half from each end.
FANOUT_CALLS_PER_DELIVERY = 19.61 / 1000
FANOUT_WATCHERS = 50
EDGE_DELIVERY_US = 11.87 - FANOUT_CALLS_PER_DELIVERY * LANE_CALL_US / 2
# The shard's cost per edge reached, from the micro-benchmark of its pure fan-out path and mail
# step (bench/profiles/fanout_core.py at e04727e, quiet, 1,000 x 50 at 1 / 2 / 8 / 20 / 50 edges:
# 9.8 / 11.6 / 18.2 / 34.6 / 78.0 µs per change: 1.4 µs per edge, the least-squares slope; 1.3 at
# 0d69d89, 3.1 on the loaded machine of ca4e8cc).
SHARD_EDGE_US = 1.4
# The rest of the shards' 3.67 µs per delivery is per change: at one edge, 50 deliveries a change,
# less its call, the shard's part of the change itself (in APPLY_US) and the one edge's share:
# ~130 µs, against ~10 µs for the pure path in the micro-benchmark: the shell (the lane's receive
# and reply, the mail's encoding, the event loop woken per change, cold caches between changes)
# and Ray's threads at rest (bench/profiles/README.md, "The shard's shell per change").
SHARD_CHANGE_US = (
    3.67 * FANOUT_WATCHERS
    - FANOUT_CALLS_PER_DELIVERY * FANOUT_WATCHERS * LANE_CALL_US / 2
    - SHARD_APPLY_US
    - SHARD_EDGE_US
)
# bench connections: 3,564 identified connects/s (2,892-3,636) into one edge and its shards, the
# whole machine busy: 2 cores / 3,564 = 561 µs (bench edge's handshake CPU, by process, agrees:
# 504-511 µs of the whole machine per handshake to `ready`).
CONNECT_US = 2e6 / 3_564
# Memory per connected account: the sans-I/O edge's RSS per idle identified socket (bench edge and
# bench connections: 4.98-5.00 KiB at 18,000-19,000 sockets) and the shard's state per account
# with one socket, watching 50, friends with its 50 watchers, in two servers
# (bench/profiles/fanout_core.py --memory at e04727e: 15.0 KiB under tracemalloc, as at 0d69d89).
EDGE_KIB_PER_SOCKET = 4.99
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
        # or churn in its window): 0.62 cores for the edge and shards in the median run at 074947d
        # (15.56 µs per delivery x 40,000/s; 0.58-0.63 over the three). The costs and round trips
        # were fitted there, so this checks the arithmetic, not the prediction.
        fan = replace(w, changes_per_h=800 / 10_000 * 3600, heartbeat_s=1e12, churn_per_min=0.0)
        load = node_load(fan, 1, 10_000)
        print(f"model at bench fanout's load: {sum(load.cores.values()):.2f} cores ({load.cores})")
        return 0
    sizes = [int(n) for n in args.nodes.split(",")]
    print(table(w, sizes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
