"""What the edges and the shards share (actors/core/contract.py). The internal frames are
actors/core/frames.py's: tests/unit/test_frames.py."""

from __future__ import annotations

import pickle

from actors.core import contract as c


def test_shard_stats_keep_their_json_form() -> None:
    stats = c.ShardStats(0, "abc", 1, 2, 1, 1, 0, 3, 0, 512, None, None, True, {"counters": []})
    assert pickle.loads(pickle.dumps(stats)) == stats
    assert list(stats.as_dict()) == [
        "shard",
        "incarnation",
        "accounts",
        "sockets",
        "online",
        "edges",
        "pending_last_seen",
        "watched",
        "channels",
        "slots",
        "node_id",
        "node_ip",
        "redis_ok",
        "metrics",
    ]
