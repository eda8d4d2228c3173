"""The layering of the packages, read from the source with `ast` (every import, also the ones
inside functions): what the edge and the shard share lives in `actors.core` (the operations, the
contract), so neither side needs the other's shells.

- nothing under `actors/` imports `edge` or `cluster` (the shard does not know who calls it, nor
  the tools that deploy it);
- `edge/` reaches the shards only through `actors.clients` and shares `actors.core` and the small
  helpers (`actors.metrics`, `actors.counts`, `actors.gc_policy`...), never the actor shells
  (`actors.presence`, `actors.flush`, `actors.directory`), which would drag asyncpg into every
  edge;
- `actors/core/` is pure: the standard library, orjson, and itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHELLS = ("actors.presence", "actors.flush", "actors.directory", "actors.pgstore")


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])


def imports_of(path: Path, package: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in a file of `package`; relative imports
    resolved."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            # `from actors import presence` names a module too.
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def violations(directory: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / directory).rglob("*.py")):
        for line, module in imports_of(path, package_of(path)):
            if any(under(module, f) for f in forbidden):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


def test_actors_import_neither_the_edge_nor_the_cluster_tools() -> None:
    assert violations("actors", ("edge", "cluster")) == []


def test_the_edge_never_imports_the_actor_shells() -> None:
    assert violations("edge", SHELLS) == []


def test_the_core_is_pure() -> None:
    allowed_third_party = {"orjson"}
    found = []
    for path in sorted((ROOT / "actors" / "core").rglob("*.py")):
        for line, module in imports_of(path, package_of(path)):
            top = module.split(".")[0]
            if (top == "actors" and not under(module, "actors.core")) or (
                top != "actors" and top not in allowed_third_party and not _stdlib(top)
            ):
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert found == []


def _stdlib(top: str) -> bool:
    import sys

    return top in sys.stdlib_module_names or top == "__future__"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from cluster import db\n", ["cluster", "cluster.db"]),
        ("def f():\n    from edge.server import Edge\n", ["edge.server", "edge.server.Edge"]),
        ("import actors.presence\n", ["actors.presence"]),
        ("from . import shard\n", ["actors.core", "actors.core.shard"]),
    ],
)
def test_the_checker_sees_every_kind_of_import(tmp_path: Path, source: str, expected: list[str]) -> None:
    # The rules above pass only if the checker can fail: nested and relative imports included.
    path = tmp_path / "probe.py"
    path.write_text(source)
    assert [m for _, m in imports_of(path, "actors.core")] == expected
