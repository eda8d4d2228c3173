"""A tiny in-process metrics registry rendered as Prometheus text.

Counters, gauges, histograms and summaries keyed by name and labels. Shards keep one each and
ship a snapshot to the edge that renders `/metrics`; no client library, no background thread.

`observe` makes a histogram with the fixed buckets `BUCKETS_SECONDS` for names ending in
`_seconds` (so p99 can be computed in Prometheus across processes), and a summary (count, sum)
for everything else (sizes). Both also get a `_max` gauge. Every family carries `# HELP` (from
`actors.metric_help`) and `# TYPE`.
"""

from __future__ import annotations

import bisect
import os
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from actors.metric_help import HELP

# Upper bounds of the latency buckets, in seconds (the `+Inf` bucket is implicit).
BUCKETS_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

Key = tuple[str, tuple[tuple[str, str], ...]]
# Where a histogram's list keeps its count, sum and max, after one count per bucket and `+Inf`.
_COUNT, _SUM, _MAX = len(BUCKETS_SECONDS) + 1, len(BUCKETS_SECONDS) + 2, len(BUCKETS_SECONDS) + 3


def _key(name: str, labels: dict[str, str]) -> Key:
    # Called for every frame in and out: skip the sort when it cannot change anything.
    items = tuple(labels.items())
    return (name, items if len(items) < 2 else tuple(sorted(items)))


class KeysByLabel:
    """A counter's keys by the value of one label (`Metrics.keys_by`): `keys[value]`. The values
    must come from a bounded set (a frame type of the contract), as the counters' own do."""

    __slots__ = ("_keys", "label", "name")

    def __init__(self, name: str, label: str) -> None:
        self.name = name
        self.label = label
        self._keys: dict[str, Key] = {}

    def __getitem__(self, value: str) -> Key:
        key = self._keys.get(value)
        if key is None:
            key = self._keys[value] = _key(self.name, {self.label: value})
        return key


class Metrics:
    def __init__(self, counters: Iterable[str] = ()) -> None:
        """`counters`: the unlabelled counters this process may count, exported at 0 until they
        move (a series that appears only at its first event makes `rate()` and an alert on "above
        0" blind to it until then)."""
        self.counters: dict[Key, float] = defaultdict(float)
        self.summaries: dict[Key, list[float]] = {}
        self.gauges: dict[Key, float] = {}
        self.histograms: dict[Key, list[float]] = {}
        for name in counters:
            self.declare(name)

    def declare(self, name: str, **labels: str) -> None:
        """Export the counter `name{labels}` from now on, at 0 if it has not moved: for a labelled
        one once its label value is known (a shard's index, a loop's name)."""
        self.counters[_key(name, labels)] += 0

    def inc(self, name: str, n: float = 1, **labels: str) -> None:
        self.counters[_key(name, labels)] += n

    @staticmethod
    def key(name: str, **labels: str) -> Key:
        """A counter's key, made once, for `inc_key` on a path taken for every frame."""
        return _key(name, labels)

    @staticmethod
    def keys_by(name: str, label: str) -> KeysByLabel:
        """The keys of the counter `name` by the value of one label, each made at its first use,
        for `inc_key` on a path taken for every frame where the value is known only then."""
        return KeysByLabel(name, label)

    @staticmethod
    def figure_key(name: str, **labels: str) -> Key:
        """A summary's or a histogram's key (a `_seconds` name), made once, for `observe_key` or
        `observe_seconds_key` on a path taken for every batch. The same key as `key`; its own
        name tells a reader (and the operations doc's test) which kind of series it feeds."""
        return _key(name, labels)

    def inc_key(self, key: Key, n: float = 1) -> None:
        self.counters[key] += n

    def set(self, name: str, value: float, **labels: str) -> None:
        self.gauges[_key(name, labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        """A value into the summary `name{labels}`, or into its histogram if `name` ends in
        `_seconds`."""
        key = _key(name, labels)
        if name.endswith("_seconds"):
            self.observe_seconds_key(key, value)
        else:
            self.observe_key(key, value)

    def observe_key(self, key: Key, value: float) -> None:
        """`observe` into a summary whose key was made once (`figure_key`): for a path taken for
        every batch, where making the key each time is most of the cost."""
        s = self.summaries.get(key)
        if s is None:
            s = self.summaries[key] = [0.0, 0.0, 0.0]
        s[0] += 1
        s[1] += value
        if value > s[2]:
            s[2] = value

    def observe_seconds_key(self, key: Key, value: float) -> None:
        """`observe` into a histogram (a `_seconds` name) whose key was made once."""
        h = self.histograms.get(key)
        if h is None:
            # per-bucket counts (not cumulative), then count, sum, max
            h = self.histograms[key] = [0.0] * (len(BUCKETS_SECONDS) + 4)
        h[bisect.bisect_left(BUCKETS_SECONDS, value)] += 1
        h[_COUNT] += 1
        h[_SUM] += value
        if value > h[_MAX]:
            h[_MAX] = value

    def snapshot(self) -> dict[str, Any]:
        return {
            "counters": [(n, list(lab), v) for (n, lab), v in self.counters.items()],
            "gauges": [(n, list(lab), v) for (n, lab), v in self.gauges.items()],
            "summaries": [(n, list(lab), v) for (n, lab), v in self.summaries.items()],
            "histograms": [(n, list(lab), list(v)) for (n, lab), v in self.histograms.items()],
        }

    def sample_process(self) -> None:
        """Process gauges: open files and their limit, resident memory, CPU time."""
        sample_process(self)


def sample_process(metrics: Metrics) -> None:
    import resource

    import psutil

    proc = psutil.Process()
    with proc.oneshot():
        metrics.set("process_open_fds", proc.num_fds())
        metrics.set("process_resident_memory_bytes", proc.memory_info().rss)
        times = proc.cpu_times()
        metrics.set("process_cpu_seconds", times.user + times.system)
    metrics.set("process_max_fds", resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    metrics.set("process_pid", os.getpid())


def _escape(value: object) -> str:
    """A label value as the text format wants it: backslash, double quote and line feed escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: list[tuple[str, str]] | tuple[tuple[str, str], ...], extra: dict[str, str]) -> str:
    items = [*labels, *extra.items()]
    if not items:
        return ""
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in items)
    return "{" + body + "}"


def render(snapshots: list[tuple[dict[str, str], dict[str, Any]]], prefix: str = "presence_") -> str:
    """Prometheus text for several registries, each with labels of its own (shard, edge).

    The format wants every sample of one metric in one group under one TYPE line, so samples are
    gathered per metric before they are written.
    """
    groups: dict[str, tuple[str, list[str]]] = {}

    def add(name: str, kind: str, labels: str, value: float) -> None:
        groups.setdefault(name, (kind, []))[1].append(f"{name}{labels} {value}")

    for extra, snap in snapshots:
        for name, labels, value in snap.get("counters", []):
            add(prefix + name, "counter", _labels(labels, extra), value)
        for name, labels, value in snap.get("gauges", []):
            add(prefix + name, "gauge", _labels(labels, extra), value)
        for name, labels, (count, total, peak) in snap.get("summaries", []):
            lab = _labels(labels, extra)
            groups.setdefault(prefix + name, ("summary", []))[1].extend(
                [f"{prefix}{name}_count{lab} {count}", f"{prefix}{name}_sum{lab} {total}"]
            )
            add(prefix + name + "_max", "gauge", lab, peak)
        for name, labels, values in snap.get("histograms", []):
            n = len(BUCKETS_SECONDS) + 1
            lab = _labels(labels, extra)
            out = groups.setdefault(prefix + name, ("histogram", []))[1]
            cumulative = 0.0
            for bound, count in zip((*BUCKETS_SECONDS, "+Inf"), values[:n], strict=True):
                cumulative += count
                le = _labels(labels, {**extra, "le": str(bound)})
                out.append(f"{prefix}{name}_bucket{le} {cumulative}")
            out.extend([f"{prefix}{name}_count{lab} {values[n]}", f"{prefix}{name}_sum{lab} {values[n + 1]}"])
            add(prefix + name + "_max", "gauge", lab, values[n + 2])
    lines: list[str] = []
    for name, (kind, samples) in groups.items():
        lines.append(f"# HELP {name} {_escape_help(help_text(name.removeprefix(prefix)))}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


def help_text(name: str) -> str:
    """The HELP line of a family (without the prefix); `_max` gauges describe their base."""
    if name in HELP:
        return HELP[name]
    base = name.removesuffix("_max")
    if base != name and base in HELP:
        return f"largest value observed since the process started: {HELP[base]}"
    return name


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")
