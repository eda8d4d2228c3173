"""A multi-node Ray cluster on this machine (Ray's own cluster_utils): a head and two worker
nodes, a shard and an edge on each worker, clients on both edges. Run as its own process by
test_multinode.py, since a process can belong to one Ray cluster only. Prints one JSON line."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import ray
from ray.cluster_utils import Cluster

from actors import clients
from actors.pool import start_pool, stop_pool
from actors.presence import ShardConfig
from edge.server import Edge, EdgeConfig
from edge.tokens import mint_token

SECRET = "multinode-secret-of-at-least-thirty-two-bytes"


@ray.remote
class EdgeOnNode:
    """An edge inside a Ray actor, so that Ray places it on a chosen node of this one machine (a
    deployment runs `presence edge` as a plain process on each host instead)."""

    def __init__(self, config: EdgeConfig) -> None:
        self.config = config
        self.edge: Edge | None = None

    async def start(self) -> dict[str, Any]:
        self.edge = Edge(self.config)
        await self.edge.start()
        return {
            "ws_port": self.edge.ws_port,
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    async def stop(self) -> None:
        if self.edge is not None:
            await self.edge.stop()


async def start_edge(config: EdgeConfig, resources: dict[str, float]) -> tuple[Any, dict[str, Any]]:
    handle = EdgeOnNode.options(num_cpus=0, resources=resources, max_concurrency=10_000).remote(config)  # type: ignore[attr-defined]
    return handle, await handle.start.remote()


async def scenario(result: dict[str, object]) -> None:
    from tests.integration.wsclient import Client, changed, of_type

    edge_a, info_a = await start_edge(
        EdgeConfig(
            secret=SECRET,
            redis_url=os.environ["MN_REDIS_URL"],
            ws_host="127.0.0.1",
            ws_port=0,
            internal_port=0,
            pull_wait_s=1.0,
        ),
        resources={"node_a": 0.01},
    )
    edge_b, info_b = await start_edge(
        EdgeConfig(
            secret=SECRET,
            redis_url=os.environ["MN_REDIS_URL"],
            ws_host="127.0.0.1",
            ws_port=0,
            internal_port=0,
            pull_wait_s=1.0,
        ),
        resources={"node_b": 0.01},
    )
    result["edge_nodes"] = [info_a["node_id"], info_b["node_id"]]
    result["shard_nodes"] = [(await clients.ShardClient(i).stats(timeout_s=10)).node_id for i in range(2)]
    alice, bob = os.environ["MN_ALICE"], os.environ["MN_BOB"]
    url_a = f"ws://127.0.0.1:{info_a['ws_port']}/ws/presence"
    url_b = f"ws://127.0.0.1:{info_b['ws_port']}/ws/presence"
    a = await Client.connect(url_a, mint_token(alice, SECRET))
    await a.request({"type": "presence.subscribe", "userIds": [bob]}, of_type("presence.sync"))
    b = await Client.connect(url_b, mint_token(bob, SECRET))
    await a.expect(changed(bob, "online"), timeout=10)
    await b.send({"type": "presence.update", "status": "dnd"})
    await a.expect(changed(bob, "dnd"), timeout=10)
    await b.close()
    await a.expect(changed(bob, "offline"), timeout=10)
    await a.close()
    result["seen"] = [f["status"] for f in a.log if f.get("type") == "presence.changed"]
    for e in (edge_a, edge_b):
        await e.stop.remote()


def main() -> int:
    started = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    node_a = cluster.add_node(num_cpus=0, resources={"node_a": 1})
    node_b = cluster.add_node(num_cpus=0, resources={"node_b": 1})
    cluster.wait_for_nodes()
    result: dict[str, object] = {
        "nodes": {"head": cluster.head_node.node_id, "a": node_a.node_id, "b": node_b.node_id}
    }
    try:
        clients.connect(cluster.address, "multinode")
        config = ShardConfig(
            shard_index=0,
            database_url=os.environ["MN_DATABASE_URL"],
            redis_url=os.environ["MN_REDIS_URL"],
            socket_timeout_s=8.0,
            lane_host="node",  # as in a real cluster: each shard's lane on its node's address
        )
        start_pool(2, config, 0.2, 1000, shard_resources=[{"node_a": 0.01}, {"node_b": 0.01}])
        asyncio.run(scenario(result))
        stop_pool(drain_timeout_s=5)
    finally:
        ray.shutdown()
        cluster.shutdown()
    result["seconds"] = time.monotonic() - started
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
