"""What the edges and the shards share (actors/core/contract.py): internal frames are recognised
from their serialised payload exactly as the shard writes them, and never mistaken for client
frames (or the other way round)."""

from __future__ import annotations

import pickle

import orjson

from actors.core import contract as c
from tests.unit.conftest import T0


def payload(frame: dict[str, object]) -> str:
    return orjson.dumps(frame).decode()  # what the shard puts in the mail


def test_internal_frames_are_read_back_as_notes() -> None:
    assert c.internal_note(payload(c.settings_frame("nobody", T0))) == c.SettingsNote("nobody", T0)
    assert c.internal_note(payload(c.chosen_frame("dnd", T0 + 1))) == c.ChosenNote("dnd", T0 + 1)
    assert c.is_internal(payload(c.settings_frame("friends", T0)))


def test_client_frames_are_not_internal() -> None:
    for frame in (
        {"type": "presence.changed", "userId": "_x", "status": "online"},
        {"type": "presence.self", "status": "dnd"},
        {"type": "error", "code": "bad_frame", "message": "_settings"},
    ):
        assert not c.is_internal(payload(frame))
        assert c.internal_note(payload(frame)) is None


def test_an_unknown_internal_frame_is_kept_from_clients_but_means_nothing() -> None:
    text = payload({"type": "_future", "x": 1})
    assert c.is_internal(text) and c.internal_note(text) is None


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
