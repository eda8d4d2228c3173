"""How the long-lived processes (edges and shards) use CPython's cycle collector.

Why it needs a policy: refcounting frees almost everything these processes allocate; the cycle
collector exists for the rare reference cycle. With CPython's default thresholds (700, 10, 10)
it runs a young collection every 700 net allocations and, as the heap grows, full collections
that walk every tracked container. An edge holding 10,000 sockets tracks ~800,000 containers and
a shard ~150,000: `presence bench fanout` measured full collections every few seconds under load,
0.3-0.9 s each on the 2-core machine, finding nothing to collect, while every frame in flight
waited (fan-out p99 0.2-1.2 s). With this policy: p99 95 ms in the same run set-up.

The policy, applied once a process has started:

- `gc.freeze()`: what is alive then (imported modules, Ray, pydantic, asyncpg, the first
  connections) moves to the permanent generation; it is never garbage and is never scanned again.
- Thresholds from Settings (`PRESENCE_GC_THRESHOLDS`, default 50,000 / 50 / 100): young
  collections after 50,000 net allocations (most objects of a frame's life are gone by then, so
  fewer survive into older generations), full collections rare. Cycles are still collected. The
  middle generation walks what survived the young collections since its last run; while a shard
  grows (20,000 member lists of 100 put on screen in `presence bench bigserver`) nearly
  everything survives, and that walk paused the shard for 0.44 s. At 50,000 / 5 / 1,000 it was
  80 ms, but the more frequent middle collections lengthened the fan-out's tail in a reconnect
  storm (37-46 → 57-66 ms, 238 ms in one `bench all`), so the default stays
  (bench/profiles/README.md, "The sweep and the collector at a million members").
- Every collection's pause is measured into the process's Metrics (`gc_pause_seconds` by
  generation, with its max), so an operator sees what the collector costs.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from actors.metrics import Metrics

_installed: list[Any] = []


def apply(thresholds: tuple[int, int, int] | list[int], metrics: Metrics | None = None) -> None:
    """Freeze what is alive, set the thresholds, and measure pauses into `metrics`."""
    gen0, gen1, gen2 = (int(t) for t in thresholds)
    if metrics is not None:
        watch_pauses(metrics)
    gc.collect()  # what start-up left as garbage goes now, not into the permanent generation
    gc.freeze()
    gc.set_threshold(gen0, gen1, gen2)


def watch_pauses(metrics: Metrics) -> None:
    """Record each collection's pause (one callback per process, the latest registry wins)."""
    for callback in _installed:
        gc.callbacks.remove(callback)
    _installed.clear()
    started = [0.0]

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pause = time.perf_counter() - started[0]
            metrics.observe("gc_pause_seconds", pause, generation=str(info["generation"]))

    gc.callbacks.append(on_gc)
    _installed.append(on_gc)
