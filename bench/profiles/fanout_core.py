"""The shard's own work per delivery, without Ray, the lane or sockets: a micro-benchmark of the
pure state and the shell's mail step (`PresenceShard._carry_out`: serialise, queue per edge).

    python bench/profiles/fanout_core.py [--accounts 1000] [--watchers 50] [--edges 1] [--profile]
    python bench/profiles/fanout_core.py --memory [--accounts 4000]

`--memory`: the shard's state per connected account instead (tracemalloc over building the world:
each account with one socket, watching `--watchers` others, friends with its `--watchers` watchers
and in two servers), the capacity model's input (bench/capacity.py).

Every account is watched by `--watchers` sockets of other accounts (all in its audience: a
shared server), spread over `--edges` edges; each account then toggles online/dnd. Prints µs of
CPU per status change and per delivery (a delivery: one watcher socket told). Runs against any
checkout (`PYTHONPATH=/work/main python ...` for main's), so before/after are the same script.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
import tracemalloc

from actors.core import frames
from actors.core.audience import Relations
from actors.core.contract import AccountRow
from actors.core.mailbox import Mailbox
from actors.core.shard import ShardState


def world(accounts: int, watchers: int, edges: int, friends: bool = False) -> tuple[ShardState, list[str]]:
    s = ShardState(status_publications=10**9)
    users = [f"u{i}" for i in range(accounts)]
    shared = Relations(frozenset(), frozenset({"g"}), "everyone")
    for i, u in enumerate(users):
        rel = shared
        if friends:  # its watchers (the ring's previous `watchers` accounts) are its friends
            ring = frozenset(users[(i - k) % accounts] for k in range(1, watchers + 1))
            rel = Relations(ring, frozenset({"g", "h"}), "everyone")
        s.set_relations(u, rel, 0.0)
        s.load_account(u, AccountRow(), 0.0)
    for i, u in enumerate(users):
        edge = f"e{i % edges}"
        s.connect(u, f"s{i}", edge, 0.0)
        targets = [users[(i + k) % accounts] for k in range(1, watchers + 1)]
        s.watch(u, f"s{i}", edge, targets, 0.0)
    s.outbox.drain()
    return s, users


def carry_out(s: ShardState, boxes: dict[str, Mailbox]) -> int:
    """What the shell does with the effects' frames; returns the deliveries (sockets told)."""
    made = 0
    last: object = None
    text = ""
    for e in s.outbox.drain():
        frame = getattr(e, "frame", None)
        if frame is None:
            continue
        if frame is not last:
            last, text = frame, frames.text(frame)
        ids = getattr(e, "socket_ids", None)
        if ids is not None:
            boxes[e.edge_id].add(ids, text)  # type: ignore[attr-defined]
            made += len(ids)
        else:
            boxes[e.edge_id].add((e.user_id, e.own), text)  # type: ignore[attr-defined]
            made += e.watchers  # type: ignore[attr-defined]
    for box in boxes.values():
        box.ack(box.seq)
    return made


def run(s: ShardState, users: list[str], boxes: dict[str, Mailbox], rounds: int) -> tuple[float, int, int]:
    made = changes = 0
    started = time.process_time()
    for r in range(rounds):
        status = "dnd" if r % 2 == 0 else "online"
        for i, u in enumerate(users):
            s.set_status(u, f"s{i}", status, 1.0 + r)
            made += carry_out(s, boxes)
            changes += 1
    return time.process_time() - started, changes, made


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--accounts", type=int, default=1_000)
    p.add_argument("--watchers", type=int, default=50)
    p.add_argument("--edges", type=int, default=1)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--memory", action="store_true", help="KiB of shard state per connected account")
    a = p.parse_args()
    if a.memory:
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        s, users = world(a.accounts, a.watchers, a.edges, friends=True)
        kib = (tracemalloc.get_traced_memory()[0] - before) / 1024 / a.accounts
        print(
            f"{a.accounts} accounts, each watching {a.watchers} and friends with its watchers: "
            f"{kib:.1f} KiB each"
        )
        return
    s, users = world(a.accounts, a.watchers, a.edges)
    boxes = {f"e{i}": Mailbox() for i in range(a.edges)}
    run(s, users, boxes, 2)  # warm
    if a.profile:
        prof = cProfile.Profile()
        prof.enable()
    cpu, changes, made = run(s, users, boxes, a.rounds)
    if a.profile:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    print(
        f"{a.accounts} accounts x {a.watchers} watchers on {a.edges} edge(s): "
        f"{cpu / changes * 1e6:.1f} µs per change, {cpu / made * 1e6:.3f} µs per delivery "
        f"({made / changes:.0f} deliveries per change)"
    )


if __name__ == "__main__":
    main()
