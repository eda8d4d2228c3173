"""docs/openapi.yaml describes exactly the routes edge/http.py serves, as valid OpenAPI 3.1."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "docs" / "openapi.yaml"
HTTP = ROOT / "edge" / "http.py"


def served_routes() -> tuple[set[str], set[str]]:
    """(exact paths, path prefixes) that `InternalApi.handle` dispatches on, read from its source."""
    tree = ast.parse(HTTP.read_text())
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def text(node: ast.expr) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            parts = []
            for part in node.values:
                if isinstance(part, ast.FormattedValue):
                    assert isinstance(part.value, ast.Name), ast.dump(part)
                    parts.append(constants[part.value.id])
                else:
                    parts.append(text(part))
            return "".join(parts)
        raise AssertionError(f"route not a constant: {ast.dump(node)}")

    (api,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InternalApi"]
    (handle,) = [n for n in api.body if isinstance(n, ast.AsyncFunctionDef) and n.name == "handle"]
    exact: set[str] = set()
    prefixes: set[str] = set()
    for node in ast.walk(handle):
        if (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Name)
            and node.left.id == "path"
            and isinstance(node.ops[0], ast.Eq)
        ):
            exact.add(text(node.comparators[0]))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "startswith"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "path"
        ):
            prefixes.add(text(node.args[0]))
    return exact, prefixes


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    loaded = yaml.safe_load(SPEC.read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_route_reader_finds_the_known_routes() -> None:
    exact, prefixes = served_routes()
    assert "/healthz" in exact and "/metrics" in exact
    assert "/api/v1/internal/presence/users/" in prefixes


def test_lists_exactly_the_served_routes(spec: dict[str, Any]) -> None:
    assert str(spec["openapi"]).startswith("3.1")
    exact, prefixes = served_routes()
    documented_exact = {p for p in spec["paths"] if "{" not in p}
    templated = {p for p in spec["paths"] if "{" in p}
    assert documented_exact == exact
    documented_prefixes = set()
    for path in templated:
        prefix, _, rest = path.partition("{")
        assert re.fullmatch(r"\w+\}", rest), f"{path}: one trailing path parameter expected"
        documented_prefixes.add(prefix)
    assert documented_prefixes == prefixes


def test_every_route_is_a_get_with_its_parameters(spec: dict[str, Any]) -> None:
    for path, item in spec["paths"].items():
        assert set(item) == {"get"}, path
        op = item["get"]
        assert "200" in op["responses"], path
        for name in re.findall(r"\{(\w+)\}", path):
            assert any(p["name"] == name and p["in"] == "path" for p in op.get("parameters", [])), path
    source = HTTP.read_text()
    for path, item in spec["paths"].items():
        for param in item["get"].get("parameters", []):
            if param["in"] == "query":
                assert f'query.get("{param["name"]}")' in source, (path, param["name"])


def test_is_valid_openapi_3_1() -> None:
    validator = pytest.importorskip(
        "openapi_spec_validator", reason="openapi-spec-validator is not installed"
    )
    validator.validate(yaml.safe_load(SPEC.read_text()))
