"""The CPU of one `presence.query` for 100 ids without Ray, the lane or sockets: a micro-benchmark
of what the shard does with it (the shell's load decision, `apply`, the answer's wire form) and
what the edge does with the answer (reading it back, one `presence.changed` per id).

    python bench/profiles/query_core.py [--accounts 2000] [--ids 100] [--rounds 2000] [--profile]

Every target is loaded and in the reader's audience (friends), as in `presence bench query`; the
whole query lands on one shard here (in the benchmark it splits over the shards by slot). Prints
µs of CPU per query for each side. Runs against any checkout (`PYTHONPATH=<checkout> python ...`),
so before/after are the same script.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable

import orjson

from actors.core import frames
from actors.core.answers import wire
from actors.core.apply import apply
from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.core.ops import Query
from actors.core.shard import ShardState


def world(accounts: int, ids: int) -> tuple[ShardState, Query]:
    s = ShardState(status_publications=10**9)
    users = [f"u{i}" for i in range(accounts)]
    targets = tuple(users[1 : ids + 1])
    s.set_relations("u0", Relations(frozenset(targets), frozenset({"g"}), "everyone"), 0.0)
    for u in users[1:]:
        s.set_relations(u, Relations(frozenset({"u0"}), frozenset({"g"}), "everyone"), 0.0)
        s.load_account(u, AccountRow(), 0.0)
    s.load_account("u0", AccountRow(), 0.0)
    for i, u in enumerate(targets):
        s.connect(u, f"s{i}", "e0", 0.0)
    s.outbox.drain()
    return s, Query("u0", "everyone", targets)


def shard_side(s: ShardState, q: Query) -> object:
    """What the shard does with the query (PresenceShard._preload's decision for a batch whose
    relations and accounts are all in memory, then apply and the wire form)."""
    relations, _, _ = q.needs()
    assert not s.missing_relations(relations)
    # (the code before accounts_to_load_for_query tested the audience of every target)
    loader = getattr(s, "accounts_to_load_for_query", s.audience_of_query)
    acc_ids = loader(q.reader, q.targets)
    assert not [u for u in dict.fromkeys(acc_ids) if not s.has_account(u)]
    return wire(apply(s, "e0", q, 1.0))


def edge_side(q: Query, raw: object) -> list[bytes]:
    """What the edge does with the answer (Edge._charged): read it, one frame per id, in order."""
    found = {a.user_id: a for a in q.read(raw)}
    return [
        orjson.dumps(frames.changed(u, found[u].status, found[u].last_seen_at))
        for u in q.targets
        if u in found
    ]


def timed(step: Callable[[], object], rounds: int) -> float:
    started = time.process_time()
    for _ in range(rounds):
        step()
    return (time.process_time() - started) / rounds * 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--accounts", type=int, default=2_000)
    p.add_argument("--ids", type=int, default=100)
    p.add_argument("--rounds", type=int, default=2_000)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    s, q = world(a.accounts, a.ids)
    raw = orjson.loads(orjson.dumps(shard_side(s, q)))  # as it arrives: lists, strings, None
    assert len(edge_side(q, raw)) == a.ids
    timed(lambda: shard_side(s, q), 200)  # warm
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
    shard_us = timed(lambda: shard_side(s, q), a.rounds)
    edge_us = timed(lambda: edge_side(q, raw), a.rounds)
    if a.profile:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    print(f"query of {a.ids} ids: shard {shard_us:.1f} µs, edge {edge_us:.1f} µs of CPU per query")


if __name__ == "__main__":
    main()
