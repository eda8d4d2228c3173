"""Which node each shard runs on: the placement policy, pure (the pool shell asks Ray for the
alive nodes and carries the answer out with node-affinity scheduling).

Policy (docs/architecture.md "Placement"):

- the nodes that may carry shards are the alive Ray nodes with the `presence_shard` resource
  (ray_cluster.yaml gives it to every node; a node started without it carries edges only); when no
  node has it (a Ray of `presence up`'s own, a hand-made cluster), every alive node may;
- new shards go, one at a time, to the eligible node with the fewest shards (ties: the node that
  sorts first), so any pool spreads as evenly as it can: 8 on 3 nodes is 3/3/2, 12 is 4/4/4;
- a rebalance moves the fewest shards that make the counts differ by at most one, from the most
  loaded nodes (and from nodes that may no longer carry shards) to the least loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SHARD_RESOURCE = "presence_shard"


def eligible(nodes: Mapping[str, Mapping[str, float]]) -> list[str]:
    """The nodes (id → resources, alive ones only) that may carry shards, in a stable order."""
    marked = sorted(n for n, resources in nodes.items() if resources.get(SHARD_RESOURCE, 0) > 0)
    return marked if marked else sorted(nodes)


def place(count: int, current: Mapping[int, str | None], nodes: Sequence[str]) -> list[str]:
    """Nodes for `count` new shards, given where the existing ones run (`current`: shard → node,
    None or a node not in `nodes` when it runs nowhere that counts)."""
    if not nodes:
        raise ValueError("no node may carry shards")
    load = dict.fromkeys(nodes, 0)
    for node in current.values():
        if node in load:
            load[node] += 1
    order = {n: i for i, n in enumerate(nodes)}
    chosen = []
    for _ in range(count):
        node = min(nodes, key=lambda n: (load[n], order[n]))
        load[node] += 1
        chosen.append(node)
    return chosen


def rebalance(current: Mapping[int, str | None], nodes: Sequence[str]) -> dict[int, str]:
    """shard → its new node, for the fewest moves after which every eligible node carries
    ⌊n/k⌋ or ⌈n/k⌉ of the n shards (and none runs on a node outside `nodes`)."""
    if not nodes:
        raise ValueError("no node may carry shards")
    order = {n: i for i, n in enumerate(nodes)}
    by_node: dict[str, list[int]] = {n: [] for n in nodes}
    homeless = []
    for shard, node in sorted(current.items()):
        if node in by_node:
            by_node[node].append(shard)
        else:
            homeless.append(shard)
    base, extra = divmod(len(current), len(nodes))
    # The most loaded nodes keep the ⌈n/k⌉ places, so the fewest shards move.
    ranked = sorted(nodes, key=lambda n: (-len(by_node[n]), order[n]))
    quota = {n: base + (1 if i < extra else 0) for i, n in enumerate(ranked)}
    movers = list(homeless)
    for node in nodes:
        surplus = len(by_node[node]) - quota[node]
        if surplus > 0:
            movers.extend(by_node[node][-surplus:])
            del by_node[node][-surplus:]
    moves: dict[int, str] = {}
    for shard in sorted(movers):
        target = min(nodes, key=lambda n: (len(by_node[n]) - quota[n], order[n]))
        by_node[target].append(shard)
        moves[shard] = target
    return moves
