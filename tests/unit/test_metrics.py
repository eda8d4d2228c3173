"""The metrics registry and its Prometheus text rendering.

The text format wants, per metric family, one `# TYPE` line followed by all of that family's
samples (never interleaved with another family's), label values escaped (backslash, double quote,
line feed), and one sample per line. The output is checked with a small strict parser below.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path
from typing import Any

import pytest

from actors.metrics import BUCKETS_SECONDS, Metrics, render

SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r'(?:\{(?P<labels>(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\[\\"n])*",?)*)\})?'
    r" (?P<value>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|inf|nan|Inf|NaN))$"
)
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')


def parse(text: str) -> list[tuple[str, str, list[tuple[str, str, dict[str, str], float]]]]:
    """Families in order: (name, type, samples); raises AssertionError on anything malformed."""
    assert text.endswith("\n")
    families: list[tuple[str, str, list[tuple[str, str, dict[str, str], float]]]] = []
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert kind in ("counter", "gauge", "summary", "histogram", "untyped")
            families.append((name, kind, []))
            continue
        assert not line.startswith("#"), line
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        assert families, "a sample before any TYPE line"
        name, kind, samples = families[-1]
        allowed = {name} if kind in ("counter", "gauge") else {name, f"{name}_count", f"{name}_sum"}
        if kind == "histogram":
            allowed.add(f"{name}_bucket")
        assert m["name"] in allowed, f"{m['name']} under the TYPE line of {name}"
        labels = {
            k: v.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
            for k, v in LABEL.findall(m["labels"] or "")
        }
        samples.append((m["name"], line, labels, float(m["value"])))
    names = [f[0] for f in families]
    assert len(names) == len(set(names)), f"a TYPE line repeated: {names}"
    return families


def family(fams: list[Any], name: str) -> tuple[str, list[tuple[str, str, dict[str, str], float]]]:
    (found,) = [(kind, samples) for n, kind, samples in fams if n == name]
    return found


def test_counters_gauges_summaries() -> None:
    m = Metrics()
    m.inc("ops_total", op="connect")
    m.inc("ops_total", 2, op="connect")
    m.inc("ops_total", op="watch")
    m.set("open_connections", 7)
    m.set("open_connections", 5)
    m.observe("batch_ops", 3)
    m.observe("batch_ops", 10)
    fams = parse(render([({}, m.snapshot())]))
    kind, samples = family(fams, "presence_ops_total")
    assert kind == "counter"
    assert {(s[2]["op"], s[3]) for s in samples} == {("connect", 3.0), ("watch", 1.0)}
    kind, samples = family(fams, "presence_open_connections")
    assert kind == "gauge" and [s[3] for s in samples] == [5.0]
    kind, samples = family(fams, "presence_batch_ops")
    assert kind == "summary"
    assert {s[0]: s[3] for s in samples} == {"presence_batch_ops_count": 2.0, "presence_batch_ops_sum": 13.0}
    kind, samples = family(fams, "presence_batch_ops_max")
    assert kind == "gauge" and [s[3] for s in samples] == [10.0]


def test_one_type_line_per_metric_and_samples_grouped_across_registries() -> None:
    shards = []
    for i in range(3):
        m = Metrics()
        m.inc("shard_ops_total", op="connect")
        m.inc("events_total", type="presence.changed")
        m.observe("apply_seconds", 0.001 * (i + 1))
        m.set("accounts", 10 * i)
        m.inc("shard_ops_total", op="query")
        shards.append(({"shard": str(i)}, m.snapshot()))
    edge = Metrics()
    edge.inc("events_total", type="typing")
    text = render([*shards, ({"edge": "edge-1"}, edge.snapshot())])
    fams = parse(text)  # asserts grouping and a single TYPE line per family
    assert sum(1 for line in text.splitlines() if line.startswith("# TYPE presence_shard_ops_total ")) == 1
    _, samples = family(fams, "presence_shard_ops_total")
    assert len(samples) == 6
    assert {s[2]["shard"] for s in samples} == {"0", "1", "2"}
    _, samples = family(fams, "presence_events_total")
    assert {tuple(sorted(s[2].items())) for s in samples} == {
        (("shard", "0"), ("type", "presence.changed")),
        (("shard", "1"), ("type", "presence.changed")),
        (("shard", "2"), ("type", "presence.changed")),
        (("edge", "edge-1"), ("type", "typing")),
    }
    _, samples = family(fams, "presence_apply_seconds")
    assert len(samples) == 3 * (len(BUCKETS_SECONDS) + 3)  # buckets, +Inf, count and sum per shard
    assert math.isclose(sum(s[3] for s in samples if s[0].endswith("_sum")), 0.006)


def test_label_values_are_escaped() -> None:
    m = Metrics()
    m.inc("odd_total", reason='say "hi"', path="C:\\x")
    fams = parse(render([({"edge": "e\\1"}, m.snapshot())]))
    (_, _, labels, value) = family(fams, "presence_odd_total")[1][0]
    assert labels == {"reason": 'say "hi"', "path": "C:\\x", "edge": "e\\1"}
    assert value == 1.0


def test_line_feed_in_label_value_is_escaped() -> None:
    m = Metrics()
    m.inc("odd_total", reason="two\nlines")
    text = render([({}, m.snapshot())])
    fams = parse(text)
    assert family(fams, "presence_odd_total")[1][0][2] == {"reason": "two\nlines"}


def test_labels_are_sorted_and_extra_labels_come_last() -> None:
    m = Metrics()
    m.inc("x_total", b="2", a="1")
    text = render([({"shard": "0"}, m.snapshot())])
    assert 'presence_x_total{a="1",b="2",shard="0"} 1.0' in text.splitlines()


def test_no_labels() -> None:
    m = Metrics()
    m.inc("plain_total")
    assert render([({}, m.snapshot())]).splitlines() == [
        "# HELP presence_plain_total plain_total",
        "# TYPE presence_plain_total counter",
        "presence_plain_total 1.0",
    ]


def test_prefix() -> None:
    m = Metrics()
    m.inc("x_total")
    assert "# TYPE edge_x_total counter" in render([({}, m.snapshot())], prefix="edge_")


def test_nothing_to_render() -> None:
    assert parse(render([])) == []
    assert parse(render([({}, Metrics().snapshot())])) == []


def test_snapshot_is_plain_data() -> None:
    m = Metrics()
    m.inc("a_total", k="v")
    m.set("g", 1.5)
    m.observe("s", 2.0)
    snap = m.snapshot()
    assert snap == {
        "counters": [("a_total", [("k", "v")], 1.0)],
        "gauges": [("g", [], 1.5)],
        "summaries": [("s", [], [1.0, 2.0, 2.0])],
        "histograms": [],
    }


@pytest.mark.parametrize("values", [[1.0], [3.0, 1.0, 2.0], [0.0, 0.25]])
def test_observe_keeps_count_sum_max(values: list[float]) -> None:
    m = Metrics()
    for v in values:
        m.observe("s", v)
    ((_, _, (count, total, peak)),) = m.snapshot()["summaries"]
    assert (count, total) == (len(values), sum(values))
    assert peak == max(values)


@pytest.mark.parametrize("values", [[1.0], [3.0, 1.0, 2.0], [0.0, 0.25], [0.0004, 7.0, 0.003, 30.0]])
def test_a_key_made_once_observes_what_the_name_does(values: list[float]) -> None:
    """The shard's per-batch summaries and histogram go through keys made once
    (`observe_key`, `observe_seconds_key`): the same page as `observe` by name and labels."""
    by_name, by_key = Metrics(), Metrics()
    items, apply_s = (
        Metrics.figure_key("shard_reply_items"),
        Metrics.figure_key("shard_apply_seconds", shard="0"),
    )
    for v in values:
        by_name.observe("shard_reply_items", v)
        by_name.observe("shard_apply_seconds", v, shard="0")
        by_key.observe_key(items, v)
        by_key.observe_seconds_key(apply_s, v)
    assert by_key.snapshot() == by_name.snapshot()
    assert by_key.snapshot()["histograms"]


def test_keys_by_a_label_are_the_keys_by_name_made_once_each() -> None:
    """`Metrics.keys_by` (the shard's `events_total`, the edge's `frames_in_total` by type): the
    same key `Metrics.key` makes with that label, made at its value's first use and kept."""
    by_type = Metrics.keys_by("frames_in_total", "type")
    first = by_type["presence.update"]
    assert first == Metrics.key("frames_in_total", type="presence.update")
    assert by_type["presence.update"] is first
    assert by_type["heartbeat"] == Metrics.key("frames_in_total", type="heartbeat") != first


# ---------------------------------------------------------------- what operators' tools accept


# Every name the code exports, with made-up samples: a page as the edge renders it.
def full_page() -> str:
    from actors.metric_help import HELP

    edge, shard, flush = Metrics(), Metrics(), Metrics()
    for name in HELP:
        target = flush if name.startswith("flush_") else shard if name.startswith("shard_") else edge
        if name.endswith("_total"):
            target.inc(name, 3)
        elif name.endswith("_seconds") and name != "process_cpu_seconds":
            for v in (0.0002, 0.003, 0.003, 0.7, 30.0):
                target.observe(name, v)
        elif name in (
            "edge_batch_ops",
            "edge_pull_items",
            "shard_batch_ops",
            "shard_pull_items",
            "shard_reply_items",
        ):
            target.observe(name, 12)
        else:
            target.set(name, 5)
    edge.sample_process()
    return render(
        [({"edge": "e1"}, edge.snapshot()), ({"shard": "0"}, shard.snapshot()), ({}, flush.snapshot())]
    )


def test_prometheus_client_parses_every_family_with_help_and_type() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from actors.metric_help import HELP

    text = full_page()
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "two families share a name (e.g. a gauge X and a counter X_total)"
    exported = {f.name.removeprefix("presence_") for f in families}
    assert {n for n in HELP if not n.endswith("_total")} <= exported
    for f in families:
        assert f.type in ("counter", "gauge", "histogram", "summary"), (f.name, f.type)
        assert f.documentation and f.documentation != f.name.removeprefix("presence_"), (
            f"no HELP for {f.name}"
        )
    # Every family has its own HELP and TYPE line, in that order, once.
    helps = [ln.split(" ")[2] for ln in text.splitlines() if ln.startswith("# HELP ")]
    types = [ln.split(" ")[2] for ln in text.splitlines() if ln.startswith("# TYPE ")]
    assert helps == types and len(types) == len(set(types))


def test_names_carry_units_and_never_clash() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(full_page()))
    seen: set[str] = set()
    for f in families:
        assert not re.search(r"_(s|ms|secs?|millis)(_|$)", f.name), f"{f.name}: spell the unit out (_seconds)"
        base = f.name.removesuffix("_total")
        assert base not in seen, f"{f.name} clashes with another family"
        seen.add(base)
    gauges = {f.name for f in families if f.type == "gauge"}
    counters = {f.name for f in families if f.type == "counter"}
    assert not {g for g in gauges if f"{g}_total" in counters}, "a gauge X beside a counter X_total"


@pytest.mark.parametrize(
    "name",
    ["presence_edge_actor_call_seconds", "presence_edge_delivery_seconds", "presence_flush_write_seconds"],
)
def test_latencies_are_histograms_with_fixed_buckets(name: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    (fam,) = [f for f in text_string_to_metric_families(full_page()) if f.name == name]
    assert fam.type == "histogram"
    buckets = [s for s in fam.samples if s.name == f"{name}_bucket"]
    bounds = [s.labels["le"] for s in buckets]
    assert [float(b) for b in bounds[:-1]] == list(BUCKETS_SECONDS) and bounds[-1] == "+Inf"
    counts = [s.value for s in buckets]
    assert counts == sorted(counts), "buckets are cumulative"
    assert counts[-1] == 5 and counts[BUCKETS_SECONDS.index(0.005)] == 3  # 0.0002, 0.003, 0.003 <= 5 ms
    (count,) = [s.value for s in fam.samples if s.name == f"{name}_count"]
    assert count == 5


def test_process_metrics_are_real() -> None:
    m = Metrics()
    m.sample_process()
    gauges = {n: v for n, _, v in m.snapshot()["gauges"]}
    assert gauges["process_open_fds"] >= 3
    assert gauges["process_max_fds"] >= gauges["process_open_fds"]
    assert gauges["process_resident_memory_bytes"] > 1_000_000


def test_declared_counters_are_exported_at_zero_until_they_move() -> None:
    m = Metrics(["things_total"])
    m.declare("errors_total", shard="3")
    text = render([({"edge": "e1"}, m.snapshot())])
    assert 'presence_things_total{edge="e1"} 0.0' in text
    assert 'presence_errors_total{shard="3",edge="e1"} 0.0' in text
    m.inc("things_total", 2)
    m.declare("things_total")  # declaring again does not reset it
    assert ("things_total", [], 2.0) in m.snapshot()["counters"]


def _unlabelled_counters(paths: list[Path]) -> set[str]:
    """The names of the counters these modules count without a label: `metrics.inc("x")`,
    `metrics.inc("x", n=...)` and `Metrics.key("x")`."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("inc", "key")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
                and node.args[0].value.endswith("_total")
                and all(k.arg == "n" for k in node.keywords)
            ):
                found.add(node.args[0].value)
    return found


@pytest.mark.parametrize(
    ("process", "sources"),
    [("edge.server", ["edge"]), ("actors.presence", ["actors/presence.py"])],
)
def test_each_process_declares_exactly_the_unlabelled_counters_it_counts(
    process: str, sources: list[str]
) -> None:
    import importlib

    from actors.metric_help import HELP

    root = Path(__file__).resolve().parents[2]
    paths = [p for s in sources for p in ((root / s).rglob("*.py") if (root / s).is_dir() else [root / s])]
    declared = importlib.import_module(process).COUNTERS
    assert set(declared) == _unlabelled_counters(paths)
    assert not [name for name in declared if name not in HELP]
