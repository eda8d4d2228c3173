"""A tiny in-process metrics registry rendered as Prometheus text.

Counters and summaries (count and sum) keyed by name and labels. Shards keep one each and ship a
snapshot to the edge that renders `/metrics`; no client library, no background thread.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

Key = tuple[str, tuple[tuple[str, str], ...]]


def _key(name: str, labels: dict[str, str]) -> Key:
    # Called for every frame in and out: skip the sort when it cannot change anything.
    items = tuple(labels.items())
    return (name, items if len(items) < 2 else tuple(sorted(items)))


class Metrics:
    def __init__(self) -> None:
        self.counters: dict[Key, float] = defaultdict(float)
        self.summaries: dict[Key, list[float]] = {}
        self.gauges: dict[Key, float] = {}

    def inc(self, name: str, n: float = 1, **labels: str) -> None:
        self.counters[_key(name, labels)] += n

    def set(self, name: str, value: float, **labels: str) -> None:
        self.gauges[_key(name, labels)] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        s = self.summaries.setdefault(_key(name, labels), [0.0, 0.0, 0.0])
        s[0] += 1
        s[1] += value
        s[2] = max(s[2], value)

    def snapshot(self) -> dict[str, Any]:
        return {
            "counters": [(n, list(lab), v) for (n, lab), v in self.counters.items()],
            "gauges": [(n, list(lab), v) for (n, lab), v in self.gauges.items()],
            "summaries": [(n, list(lab), v) for (n, lab), v in self.summaries.items()],
        }


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
    lines: list[str] = []
    for name, (kind, samples) in groups.items():
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(samples)
    return "\n".join(lines) + "\n"
