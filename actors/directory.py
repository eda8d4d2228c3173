"""The slot directory: which shard owns which slot, and which edges are alive. A plain class;
`actors.pool` runs it as the named actor every edge asks."""

from __future__ import annotations

import time
from typing import Any

from actors.core.slots import SlotMap


class SlotDirectory:
    def __init__(self, shard_count: int, shard_config: dict[str, Any] | None = None) -> None:
        self.map = SlotMap.even(shard_count)
        self.edges: dict[str, dict[str, Any]] = {}
        self.started = time.monotonic()
        # What new shards are created with when the pool grows (`presence scale`).
        self.shard_config = shard_config or {}

    async def get_shard_config(self) -> dict[str, Any]:
        return self.shard_config

    async def get_map(self) -> tuple[int, tuple[int, ...], int]:
        return self.map.version, self.map.owners, self.map.shard_count

    async def set_map(self, owners: tuple[int, ...], shard_count: int) -> int:
        """Install a new assignment (a resize); returns its version."""
        self.map = SlotMap(self.map.version + 1, tuple(owners), shard_count)
        return self.map.version

    async def restore(self, version: int, owners: tuple[int, ...], shard_count: int) -> int:
        """Put back the map a replaced directory served (`presence rollout`): a restarted
        directory begins with the even map of its creation; edges take any version they have
        not seen, so the next one is above both. Returns the version now served."""
        self.map = SlotMap(max(version, self.map.version) + 1, tuple(owners), shard_count)
        return self.map.version

    async def age_s(self) -> float:
        """Seconds since this directory was made: one younger than an edge's registration interval
        (a replaced or restarted directory) does not know every edge yet."""
        return time.monotonic() - self.started

    async def register_edge(self, edge_id: str, info: dict[str, Any]) -> None:
        self.edges[edge_id] = {**info, "seen_at": time.time()}

    async def edges_on(self, node_ids: list[str]) -> list[str]:
        """The edges registered from these Ray nodes, however long ago they last registered (an
        edge whose node died stops registering; it is remembered for 10 x 30 s)."""
        wanted = set(node_ids)
        return sorted(e for e, info in self.edges.items() if info.get("node_id") in wanted)

    async def list_edges(self, max_age_s: float = 30.0) -> dict[str, dict[str, Any]]:
        """The edges that registered within `max_age_s` and have not said they stopped (an edge's
        last registration says `stopped` once it has closed its sockets: edge/server.py
        `_unregister`)."""
        now = time.time()
        for edge_id in [e for e, i in self.edges.items() if now - i["seen_at"] > 10 * max_age_s]:
            del self.edges[edge_id]
        return {
            e: i for e, i in self.edges.items() if now - i["seen_at"] <= max_age_s and not i.get("stopped")
        }
