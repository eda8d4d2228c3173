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


def test_a_publication_is_told_from_named_sockets_in_both_wire_forms() -> None:
    """Version 3's plain `(user_id, own)` and a version 2 shard's `Watching` read alike; socket
    ids are strings, so two of them are never a publication."""
    assert c.publication(("alice", True)) == ("alice", True)
    assert c.publication(("alice", False)) == ("alice", False)
    assert c.publication(c.Watching("alice", False)) == ("alice", False)
    for named in [("s1",), ("s1", "s2"), ("s1", "s2", "s3"), ()]:
        assert c.publication(named) is None


def test_a_refused_peer_is_told_which_side_to_upgrade() -> None:
    far = c.wire_mismatch(c.WIRE_VERSION, c.WIRE_VERSION + 2, "the shard")
    assert "more than one version apart" in far and "upgrade the older side first" in far
    old_edge = c.wire_mismatch(c.WIRE_VERSION, c.OLDEST_EDGE - 1, "an edge")
    assert f"edges of version {c.OLDEST_EDGE} or later: upgrade the edges first" in old_edge
    assert c.serves_edge(c.WIRE_VERSION, c.WIRE_VERSION)
    assert not c.serves_edge(c.WIRE_VERSION, c.OLDEST_EDGE - 1)
