"""`presence scale N`: resize the PresenceActor pool of a running cluster, live.

Slots move in groups: the old owner exports them (from then on it answers their operations with
MOVED), the new owner imports them, and the directory flips the map; edges that were told MOVED
wait for the flip and send the operation again, so every socket's frames still apply in order.
No socket, status, subscription, roster entry or unflushed last-seen is lost, and nobody is told
anything, because nothing changed but the address.

From Python, for experiments (a driver already joined to the cluster):

    from actors import ray_api
    summary = await ray_api.resize(6)      # {"from": 2, "to": 6, "moved_slots": 2730, "seconds": …}
"""

from __future__ import annotations

import asyncio
import sys

from actors import ray_api
from cluster.config import Settings
from cluster.runtime import cluster_info_or_exit


def scale(settings: Settings, shards: int) -> int:
    if shards < 1:
        print("presence scale: a pool needs at least one shard", file=sys.stderr)
        return 2
    info = cluster_info_or_exit(settings)
    ray_api.connect(info.ray_address, info.ray_namespace)
    try:
        summary = asyncio.run(ray_api.resize(shards, progress=lambda line: print(f"  {line}", flush=True)))
    finally:
        ray_api.shutdown()
    print(
        f"pool resized from {summary['from']} to {summary['to']} shards: "
        f"{summary['moved_slots']} slots moved in {summary['seconds']:.2f} s"
    )
    return 0
