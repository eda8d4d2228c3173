"""The shard's Python per status change, in one process: no lane, no socket, no other process
waking it. What `shard_shell.py` measures minus the event loop's wakes and the lane's frames.

    python bench/profiles/shard_path.py [--accounts 2000] [--watchers 50] [--changes 4000]
                                        [--rounds 7] [--profile]

A `PresenceShard` (an in-memory store, no PostgreSQL, no Redis) gets `--accounts` sockets of one
edge, each watching the next `--watchers` accounts, then status changes through the lane's
immediate road (`apply_and_collect_now`, one change a call, each account alternating idle and
online), each request unpickled and each reply pickled as the lane would (the request in the
form the checkout's edge sends: plain tuples from wire version 3 on). The shard's clock is the
script's, 2.5 ms a change (400 changes a second, as in `presence bench fanout`), so every change
is published (the publication budget admits it) and no lease runs out. Printed: µs per change
in each round of `--changes`, and their median; `--profile` adds a cProfile of one more round.

`PYTHONPATH=<checkout>` runs it against any commit, so before/after are the same script.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pickle
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any


async def connected_shard(accounts: int, watchers: int) -> tuple[Any, dict[str, Any], list[str]]:
    """A started shard with `accounts` sockets of edge e0, each watching the next `watchers`
    accounts; with the edge's mail state (incarnation, acknowledged) and the account ids."""
    from actors.core import ops
    from actors.core.audience import Relations
    from actors.core.contract import AccountRow
    from actors.presence import PresenceShard, ShardConfig
    from cluster.config import Settings

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tests.unit.fake_store import FakeStore

    n = accounts
    users = [f"u{i}" for i in range(n)]
    everyone = Relations(frozenset(), frozenset({"g"}), "everyone")
    store = FakeStore({u: AccountRow() for u in users}, {u: everyone for u in users})

    async def flush_write(entries: list[tuple[str, float]]) -> None:
        return None

    config = ShardConfig(0, database_url="", redis_url=None, gc_thresholds=Settings().gc_thresholds)
    shard = PresenceShard(config, flush_write=flush_write, store=store)  # type: ignore[arg-type]
    await shard.start()
    mail: dict[str, Any] = {"incarnation": None, "acked": 0}

    async def apply(batch: list[Any]) -> None:
        reply = await shard.apply_and_collect("e0", batch, mail["incarnation"], mail["acked"])
        mail["incarnation"], mail["acked"] = reply[0], max(mail["acked"], reply[2][1])

    for start in range(0, n, 500):
        await apply([ops.Connect(u, f"s{i}") for i, u in enumerate(users[start : start + 500], start)])
    for start in range(0, n, 100):
        await apply([
            ops.Watch(users[i], f"s{i}", tuple(users[(i + k) % n] for k in range(1, watchers + 1)))
            for i in range(start, min(n, start + 100))
        ])  # fmt: skip
    return shard, mail, users


async def measure(args: argparse.Namespace) -> None:
    from actors.core import ops

    shard, mail, users = await connected_shard(args.accounts, args.watchers)
    n = len(users)
    now = [shard.clock()]
    shard.clock = lambda: now[0]

    # The batch as the edge pickles it (its wire form, where the checkout has one: wire version 3).
    wire = getattr(ops, "to_wire", lambda batch: batch)

    def requests(first: int) -> list[bytes]:
        out = []
        for c in range(first, first + args.changes):
            i = c % n
            status = "idle" if (c // n) % 2 == 0 else "online"
            batch = wire([ops.SetStatus(users[i], f"s{i}", status)])
            request = (1, "apply_and_collect", ("e0", batch))
            out.append(pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL))
        return out

    def changes(sent: list[bytes]) -> None:
        """The shard's part of each change: the request unpickled, applied, the reply pickled."""
        for data in sent:
            now[0] += 0.0025
            _, _, (edge_id, batch) = pickle.loads(data)
            reply = shard.apply_and_collect_now(edge_id, batch, mail["incarnation"], mail["acked"])
            assert reply is not None, "everything is in memory: the immediate road applies"
            mail["incarnation"], mail["acked"] = reply[0], max(mail["acked"], reply[2][1])
            pickle.dumps((1, True, reply), protocol=pickle.HIGHEST_PROTOCOL)

    rounds = []
    for r in range(args.rounds):
        sent = requests(r * args.changes)
        started = time.perf_counter()
        changes(sent)
        rounds.append((time.perf_counter() - started) / args.changes * 1e6)
    print("µs per change, by round:", ", ".join(f"{x:.1f}" for x in rounds))
    print(f"median {statistics.median(rounds):.1f} µs per change ({n:,} x {args.watchers}, one edge)")
    if args.profile:
        profile = cProfile.Profile()
        sent = requests(args.rounds * args.changes)
        profile.enable()
        changes(sent)
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--accounts", type=int, default=2_000)
    p.add_argument("--watchers", type=int, default=50)
    p.add_argument("--changes", type=int, default=4_000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--profile", action="store_true")
    asyncio.run(measure(p.parse_args()))


if __name__ == "__main__":
    main()
