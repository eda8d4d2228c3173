"""docs/operations.md cannot drift: its configuration table lists every setting of
cluster/config.py with its environment variable and default, and its metrics table every metric
the code exports."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from cluster.config import Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
PREFIX = "presence_"


def section(name: str) -> list[list[str]]:
    """The rows of the table between `<!-- name:start -->` and `<!-- name:end -->`, as cells."""
    text = DOC.read_text()
    m = re.search(rf"<!-- {name}:start -->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert m, f"docs/operations.md has no {name} table"
    rows = [line for line in m[1].splitlines() if line.startswith("|")][2:]  # header, rule
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def unquote(cell: str) -> str:
    assert cell.startswith("`") and cell.endswith("`"), cell
    return cell[1:-1]


def shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return json.dumps(list(value))  # how the environment spells it
    return str(value)


def env_var(name: str) -> str:
    alias = Settings.model_fields[name].validation_alias
    if alias is not None:
        choices = getattr(alias, "choices", [alias])
        return str(choices[0])
    return f"{Settings.model_config.get('env_prefix', '')}{name}".upper()


def test_settings_table_matches_settings() -> None:
    rows = section("settings-table")
    documented = {unquote(r[0]): (unquote(r[1]), unquote(r[2])) for r in rows}
    assert len(documented) == len(rows), "a setting is listed twice"
    fields = Settings.model_fields
    assert set(documented) == set(fields), (
        f"missing: {sorted(set(fields) - set(documented))}, unknown: {sorted(set(documented) - set(fields))}"
    )
    for name, field in fields.items():
        assert documented[name] == (env_var(name), shown(field.default)), name
    for row in rows:
        assert row[3], f"{row[0]} has no description"


def test_every_documented_variable_is_read(monkeypatch: Any) -> None:
    """Set each documented variable to something other than its default; Settings must see it."""
    expected: dict[str, Any] = {}
    for row in section("settings-table"):
        name, var = unquote(row[0]), unquote(row[1])
        default = Settings.model_fields[name].default
        value: Any
        if isinstance(default, bool):
            value = not default
        elif isinstance(default, int | float):
            value = default + 1
        elif isinstance(default, Path):
            value = Path("/tmp/elsewhere")
        elif isinstance(default, tuple):
            value = tuple(x + 1 for x in default)
        elif get_origin(Settings.model_fields[name].annotation) is Literal:
            value = next(v for v in get_args(Settings.model_fields[name].annotation) if v != default)
        elif name == "token_secret":
            value = "changed-to-a-secret-of-32-bytes-or-more"  # shorter ones are refused
        else:
            value = "changed"
        monkeypatch.setenv(var, str(value).lower() if isinstance(value, bool) else shown(value))
        expected[name] = value
    settings = Settings()
    assert {name: getattr(settings, name) for name in expected} == expected


def exported_metrics() -> dict[str, str]:
    """Every metric name the code exports, from the source: name → kind."""
    found: dict[str, str] = {}
    # `Metrics.key(...)`: a counter's key made once, for `inc_key` or the counters themselves.
    # `Metrics.figure_key(...)`: a summary's or a histogram's, for `observe_key`; `Metrics.keys_by`:
    # a counter's keys by one label's value.
    kinds = {
        "inc": "counter",
        "key": "counter",
        "set": "gauge",
        "observe": "summary",
        "figure_key": "summary",
        "keys_by": "counter",
    }
    pattern = r"[mM]etrics\.(inc|key|set|observe|figure_key|keys_by)\(\s*\"(\w+)\""
    for path in [*(ROOT / "actors").rglob("*.py"), *(ROOT / "edge").rglob("*.py")]:
        for method, name in re.findall(pattern, path.read_text()):
            kind = kinds[method]
            found[PREFIX + name] = "histogram" if kind == "summary" and name.endswith("_seconds") else kind
    # The shard gauges that edge/http.py adds from each shard's stats, and the FlushActor's figures.
    http = (ROOT / "edge" / "http.py").read_text()
    m = re.search(r"for k in \(([^)]*)\)", http)
    assert m, "edge/http.py no longer lists the shard gauges the way this test reads them"
    for name in re.findall(r"\"(\w+)\"", m[1]):
        found[f"{PREFIX}shard_{name}"] = "gauge"
    tuples = {
        target.id: [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
        for node in ast.parse(http).body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    if "FLUSH_COUNTERS" in http:
        assert 'f"flush_{k}_total"' in http and 'f"flush_{k}"' in http, "flush series are named otherwise"
        for name in tuples["FLUSH_COUNTERS"]:
            found[f"{PREFIX}flush_{name}_total"] = "counter"
        for name in tuples["FLUSH_GAUGES"]:
            found[f"{PREFIX}flush_{name}"] = "gauge"
    return found


def test_metrics_table_matches_the_code() -> None:
    rows = section("metrics")
    documented = {unquote(r[0]): r[1] for r in rows}
    exported = exported_metrics()
    assert len(exported) > 20
    assert set(documented) == set(exported), (
        f"undocumented: {sorted(set(exported) - set(documented))}, "
        f"not exported: {sorted(set(documented) - set(exported))}"
    )
    for name, kind in exported.items():
        assert documented[name] == kind, name


def test_help_lines_say_what_the_table_says() -> None:
    """`# HELP` on /metrics (actors/metric_help.py) and the table's meaning are the same text."""
    from actors.metric_help import HELP

    rows = {
        unquote(r[0]).removeprefix(PREFIX): r[-1].lstrip("| ").replace("`", "") for r in section("metrics")
    }
    assert set(HELP) == set(rows), sorted(set(HELP) ^ set(rows))
    for name, meaning in rows.items():
        assert HELP[name] == meaning, name


def test_every_metric_named_in_the_text_exists() -> None:
    exported = exported_metrics()
    suffixes = ("_count", "_sum", "_max")
    for name in set(re.findall(r"`(presence_\w+)[`{]", DOC.read_text())):
        base = next(
            (name[: -len(s)] for s in suffixes if name.endswith(s) and name[: -len(s)] in exported), name
        )
        assert base in exported, name
