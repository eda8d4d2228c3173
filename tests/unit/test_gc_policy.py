"""actors.gc_policy: thresholds set, start-up heap frozen, every collection's pause measured."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from actors import gc_policy
from actors.metrics import BUCKETS_SECONDS, Metrics


@pytest.fixture(autouse=True)
def _restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    callbacks = list(gc.callbacks)
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    gc.callbacks[:] = callbacks
    gc_policy._installed.clear()


def _pauses(metrics: Metrics) -> dict[str, list[float]]:
    """Count, sum and max of the pause histogram, by generation."""
    n = len(BUCKETS_SECONDS) + 1
    return {
        dict(labels)["generation"]: v[n : n + 3]
        for (name, labels), v in metrics.histograms.items()
        if name == "gc_pause_seconds"
    }


def test_apply_sets_thresholds_and_freezes_what_is_alive() -> None:
    survivor = [object() for _ in range(1000)]
    gc_policy.apply((50_000, 50, 100))
    assert gc.get_threshold() == (50_000, 50, 100)
    assert gc.get_freeze_count() >= len(survivor)


def test_each_collection_is_measured_by_generation() -> None:
    metrics = Metrics()
    gc_policy.apply([1000, 10, 10], metrics)
    gc.collect(0)
    gc.collect(2)
    pauses = _pauses(metrics)
    assert pauses["0"][0] >= 1 and pauses["2"][0] >= 1
    _count, total, peak = pauses["2"]
    assert 0 <= peak <= total


def test_a_second_registry_replaces_the_first() -> None:
    first, second = Metrics(), Metrics()
    gc_policy.watch_pauses(first)
    gc_policy.watch_pauses(second)
    gc.collect(1)
    assert not _pauses(first) and _pauses(second)["1"][0] == 1
