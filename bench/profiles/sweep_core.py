"""The shard's once-a-second sweep, without Ray: its time at 5,000 and 50,000 accounts, in the
steady state (a sweep a second) and in the minute's relations round.

    PYTHONPATH=<checkout> python bench/profiles/sweep_core.py [--accounts 5000 50000]

The world is `fanout_core.world`: every account connected on one edge, watching 50 others and
friends with its 50 watchers. It was built in one go, so the first seconds are those after a mass
connect (every account's publication window and lookup bucket spent at once); "max" includes
them. Runs against any checkout, so before/after are the same script.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from bench.profiles.fanout_core import world


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--accounts", type=int, nargs="+", default=[5_000, 50_000])
    p.add_argument("--seconds", type=int, default=124, help="sweeps, one a simulated second (default 124)")
    args = p.parse_args()
    for n in args.accounts:
        s, _ = world(n, 50, 1, friends=True)
        gc.collect()
        gc.freeze()  # as the shard's gc policy does after start-up: the collector is not measured
        steady: list[float] = []
        rounds: list[float] = []
        for k in range(1, args.seconds + 1):
            now = float(k)
            s.refresh_edge("e0", now)
            relations_round = now - s._relations_swept_at >= s.relations_sweep_s
            started = time.perf_counter()
            s.sweep(now)
            took = (time.perf_counter() - started) * 1e3
            (rounds if relations_round else steady).append(took)
            s.outbox.drain()
        print(
            f"{n:>7,} accounts: sweep a second median {statistics.median(steady):.2f} ms, "
            f"max {max(steady):.2f} ms; with the relations round "
            + ", ".join(f"{r:.1f}" for r in rounds)
            + " ms"
        )


if __name__ == "__main__":
    main()
