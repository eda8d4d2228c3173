"""The layering of the service, enforced: every rule below is computed from the source with `ast`
(every import statement, also those inside functions and under `if TYPE_CHECKING:`, which are
dependencies of the types) over the project's own modules, and each rule has a planted-violation
test proving that it can fail.

1. **The core is pure.** `actors/core/` imports itself, orjson and an allowed list of standard
   modules that do no I/O and read no clock (`CORE_STDLIB`: no asyncio, time, socket, random,
   os...), and never calls a clock (`datetime.now()` and the like).
2. **Actors know nothing of their callers**: nothing under `actors/` imports `edge` or `cluster`.
3. **An edge process stays small**: the transitive import closure of what `presence edge` runs
   (the `edge` package, `actors.clients`, `cluster.edge_process`, and what `cluster/cli.py` loads
   for the `edge` subcommand) reaches neither asyncpg nor the shard shell (`actors.presence`,
   `actors.flush`, `actors.pgstore`, `actors.directory`, `actors.pool`) nor `bench`.
4. **No cycles**: no two files import each other (directly or around a longer loop), and no two
   packages do, anywhere in the project (`actors`, `edge`, `cluster`, `bench`, `presence_client`).
5. **The service never imports bench.** bench is a client of the service: it imports the service,
   never the reverse. `presence bench` is the one door from the command line into it, and it names
   `bench.cli` as data (`cluster/cli.py` `BENCH_RUNNER`, loaded by `importlib` when that subcommand
   runs), not as an import: see docs/architecture.md "Layers".
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("actors", "edge", "cluster", "bench", "presence_client")
SERVICE = ("actors", "edge", "cluster", "presence_client")

# The standard modules the core may use: data structures, text, arithmetic, hashing of ids. Not
# asyncio, time, socket, os, random, threading, logging...: I/O, clocks and entropy are the shells'.
CORE_STDLIB = frozenset(
    {
        "__future__",
        "bisect",
        "collections",
        "collections.abc",
        "dataclasses",
        "datetime",  # for formatting given times only: reading its clock is rule 1's second half
        "enum",
        "functools",
        "heapq",
        "itertools",
        "math",
        "re",
        "typing",
        "unicodedata",
        "zlib",
    }
)
CORE_THIRD_PARTY = frozenset({"orjson"})
CLOCK_READS = frozenset({"now", "utcnow", "today"})

# What an edge process must never load: the database driver, what runs inside the actors, bench.
EDGE_FORBIDDEN = (
    "asyncpg",
    "actors.presence",
    "actors.flush",
    "actors.pgstore",
    "actors.directory",
    "actors.pool",
)
# `presence edge`: cluster/cli.py loads a subcommand's modules inside the function that runs it;
# these are the functions the `edge` subcommand runs there.
CLI_EDGE_FUNCTIONS = ("main", "build_parser", "_settings", "_open_files", "cmd_edge")


@dataclass(frozen=True)
class Import:
    line: int
    module: str


@dataclass
class Project:
    """The project's modules (name → path) and the imports of each, resolved to module names."""

    root: Path
    modules: dict[str, Path]

    @classmethod
    def read(cls, root: Path, packages: Iterable[str] = PACKAGES) -> Project:
        modules = {}
        for package in packages:
            for path in sorted((root / package).rglob("*.py")):
                parts = list(path.relative_to(root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                modules[".".join(parts)] = path
        return cls(root, modules)

    def imports(self, module: str, functions: Iterable[str] | None = None) -> list[Import]:
        """Every import of `module` (only those at module level and inside `functions`, if given),
        as the modules it names: `from a import b` names `a`, and `a.b` too when that is a module."""
        path = self.modules[module]
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        if functions is None:
            nodes: Iterable[ast.AST] = ast.walk(tree)
        else:
            wanted = set(functions)
            nodes = [
                *(n for top in tree.body if not isinstance(top, _DEFS) for n in ast.walk(top)),
                *(
                    n
                    for top in tree.body
                    if isinstance(top, _DEFS) and top.name in wanted
                    for n in ast.walk(top)
                ),
            ]
        found = []
        for node in nodes:
            if isinstance(node, ast.Import):
                found += [Import(node.lineno, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join([*parts[: len(parts) - (node.level - 1)], *([base] if base else [])])
                found.append(Import(node.lineno, base))
                found += [
                    Import(node.lineno, f"{base}.{alias.name}")
                    for alias in node.names
                    if f"{base}.{alias.name}" in self.modules
                ]
        return found

    def depends_on(self, module: str) -> set[str]:
        """The project modules `module` imports, with the packages whose `__init__` that runs
        (not its own parents: importing a package's module never cycles through the package)."""
        out = set()
        for imp in self.imports(module):
            parts = imp.module.split(".")
            for n in range(1, len(parts) + 1):
                name = ".".join(parts[:n])
                if name in self.modules and name != module and not module.startswith(name + "."):
                    out.add(name)
        return out

    def closure(self, roots: Iterable[str]) -> set[str]:
        """Every module (the project's and third parties', by name) that importing `roots` loads."""
        seen: set[str] = set()
        todo = list(roots)
        while todo:
            module = todo.pop()
            if module in seen:
                continue
            seen.add(module)
            if module in self.modules:
                for imp in self.imports(module):
                    parts = imp.module.split(".")
                    todo += [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
        return seen

    def package_of(self, module: str) -> str:
        return module if self.modules[module].name == "__init__.py" else module.rpartition(".")[0]


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _where(project: Project, module: str, imp: Import) -> str:
    return f"{project.modules[module].relative_to(project.root)}:{imp.line} imports {imp.module}"


# ---------------------------------------------------------------------------- the checks


def core_impurities(project: Project) -> list[str]:
    found = []
    for module in project.modules:
        if not under(module, "actors.core"):
            continue
        for imp in project.imports(module):
            top = imp.module.split(".")[0]
            if under(imp.module, "actors.core"):
                continue
            if top in CORE_THIRD_PARTY or imp.module in CORE_STDLIB:
                continue
            found.append(_where(project, module, imp))
        path = project.modules[module]
        for node in ast.walk(ast.parse(path.read_text())):
            called = node.func if isinstance(node, ast.Call) else None
            if isinstance(called, ast.Attribute) and called.attr in CLOCK_READS:
                found.append(f"{path.relative_to(project.root)}:{node.lineno} reads a clock")
    return found


def forbidden_imports(project: Project, packages: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    return [
        _where(project, module, imp)
        for module in project.modules
        if any(under(module, p) for p in packages)
        for imp in project.imports(module)
        if any(under(imp.module, f) for f in forbidden)
    ]


def edge_process_roots(project: Project) -> list[str]:
    roots = [m for m in project.modules if under(m, "edge")] + ["actors.clients", "cluster.edge_process"]
    if "cluster.cli" in project.modules:
        roots += [imp.module for imp in project.imports("cluster.cli", CLI_EDGE_FUNCTIONS)]
    return [r for r in roots if r in project.modules or "." not in r]


def edge_process_leaks(project: Project) -> list[str]:
    loaded = project.closure(edge_process_roots(project))
    return sorted(m for m in loaded if any(under(m, f) for f in (*EDGE_FORBIDDEN, "bench")))


def cycles(nodes: set[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, set()) & nodes)))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, set()) & nodes))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def file_cycles(project: Project) -> list[list[str]]:
    return cycles(set(project.modules), {m: project.depends_on(m) for m in project.modules})


def package_cycles(project: Project) -> list[list[str]]:
    edges: dict[str, set[str]] = {}
    for module in project.modules:
        mine = project.package_of(module)
        for other in project.depends_on(module):
            theirs = project.package_of(other)
            if theirs != mine and not under(mine, theirs):
                edges.setdefault(mine, set()).add(theirs)
    return cycles({project.package_of(m) for m in project.modules}, edges)


# ---------------------------------------------------------------------------- the rules


@pytest.fixture(scope="module")
def project() -> Project:
    return Project.read(ROOT)


def test_the_core_is_pure(project: Project) -> None:
    assert core_impurities(project) == []


def test_actors_import_neither_the_edge_nor_the_cluster_tools(project: Project) -> None:
    assert forbidden_imports(project, ("actors",), ("edge", "cluster")) == []


def test_an_edge_process_reaches_neither_asyncpg_nor_the_shard_shell(project: Project) -> None:
    assert edge_process_leaks(project) == []


def test_no_file_imports_itself_around_a_loop(project: Project) -> None:
    assert file_cycles(project) == []


def test_no_package_imports_itself_around_a_loop(project: Project) -> None:
    assert package_cycles(project) == []


def test_the_service_never_imports_bench(project: Project) -> None:
    assert forbidden_imports(project, SERVICE, ("bench",)) == []


def test_an_edge_process_really_loads_none_of_it() -> None:
    """The same as the closure rule, at run time (an import by name would escape `ast`)."""
    probe = (
        "import sys, cluster.cli, cluster.edge_process, cluster.runtime, edge.server, edge.http\n"
        f"print(','.join(m for m in {(*EDGE_FORBIDDEN, 'bench')!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


# ---------------------------------------------------------------------------- each rule can fail

CLEAN = {
    "actors/__init__.py": "",
    "actors/core/__init__.py": "",
    "actors/core/shard.py": "from __future__ import annotations\nimport math\nfrom . import ops\n",
    "actors/core/ops.py": "from dataclasses import dataclass\nimport orjson\n",
    "actors/clients.py": "from actors.core import ops\n",
    "actors/presence.py": "import asyncpg\nfrom actors.core import shard\n",
    "edge/__init__.py": "",
    "edge/server.py": "from edge import http\nfrom actors import clients\n",
    "edge/http.py": "from actors.clients import ShardClient\n",
    "cluster/__init__.py": "",
    "cluster/cli.py": "import argparse\ndef cmd_edge():\n    from cluster import edge_process\n"
    "def cmd_up():\n    from cluster import up\n",
    "cluster/edge_process.py": "from edge.server import Edge\n",
    "cluster/up.py": "from actors import presence\n",
    "bench/__init__.py": "",
    "bench/cli.py": "from cluster import up\n",
}


def planted(tmp_path: Path, changes: dict[str, str]) -> Project:
    for name, text in {**CLEAN, **changes}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Project.read(tmp_path)


def test_the_clean_tree_passes_every_check(tmp_path: Path) -> None:
    p = planted(tmp_path, {})
    assert core_impurities(p) == []
    assert forbidden_imports(p, ("actors",), ("edge", "cluster")) == []
    assert edge_process_leaks(p) == []
    assert file_cycles(p) == []
    assert package_cycles(p) == []
    assert forbidden_imports(p, SERVICE, ("bench",)) == []


@pytest.mark.parametrize(
    "source",
    [
        "import asyncio\n",
        "import time\n",
        "from socket import socket\n",
        "def f():\n    import random\n",
        "from actors import clients\n",
        "import datetime\ndef f():\n    return datetime.datetime.now()\n",
    ],
)
def test_a_planted_impurity_in_the_core_is_found(tmp_path: Path, source: str) -> None:
    assert core_impurities(planted(tmp_path, {"actors/core/ops.py": source})) != []


def test_a_planted_import_of_the_edge_from_the_actors_is_found(tmp_path: Path) -> None:
    p = planted(tmp_path, {"actors/clients.py": "def f():\n    from edge.server import Edge\n"})
    assert forbidden_imports(p, ("actors",), ("edge", "cluster")) == [
        "actors/clients.py:2 imports edge.server"
    ]


@pytest.mark.parametrize(
    "changes",
    [
        # two steps away, as edge → ray_api → asyncpg was
        {"actors/clients.py": "from actors import presence\n"},
        {"edge/http.py": "from actors.presence import Shard\n"},
        {"edge/http.py": "import asyncpg\n"},
        # inside a function of the edge subcommand, and in its module
        {"cluster/cli.py": "def cmd_edge():\n    from cluster import up\n"},
        {"cluster/edge_process.py": "from cluster.up import shard_config\n"},
        {"edge/server.py": "from bench import cli\n"},
    ],
)
def test_a_planted_road_from_an_edge_to_the_shard_shell_is_found(
    tmp_path: Path, changes: dict[str, str]
) -> None:
    assert edge_process_leaks(planted(tmp_path, changes)) != []


def test_another_subcommand_may_load_the_shell(tmp_path: Path) -> None:
    # `cmd_up` imports cluster.up (and the shard shell): not the edge's road.
    assert edge_process_leaks(planted(tmp_path, {})) == []


def test_a_planted_file_cycle_is_found(tmp_path: Path) -> None:
    # edge/http.py ↔ edge/server.py, through a TYPE_CHECKING import as it was
    p = planted(
        tmp_path,
        {
            "edge/http.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edge.server import Edge\n"
            )
        },
    )
    assert file_cycles(p) == [["edge.http", "edge.server"]]


def test_a_planted_longer_file_cycle_is_found(tmp_path: Path) -> None:
    p = planted(tmp_path, {"actors/core/ops.py": "from actors.core import shard\n"})
    assert file_cycles(p) == [["actors.core.ops", "actors.core.shard"]]


def test_a_planted_package_cycle_is_found(tmp_path: Path) -> None:
    # cluster ↔ bench, as cluster/cli.py importing bench made it
    p = planted(tmp_path, {"cluster/cli.py": "def cmd_bench():\n    from bench.cli import run\n"})
    assert package_cycles(p) == [["bench", "cluster"]]
    assert forbidden_imports(p, SERVICE, ("bench",)) == ["cluster/cli.py:2 imports bench.cli"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from cluster import db\n", ["cluster", "cluster.db"]),
        ("def f():\n    from edge.server import Edge\n", ["edge.server"]),
        ("import actors.presence\n", ["actors.presence"]),
        ("from . import shard\n", ["actors.core", "actors.core.shard"]),
        ("from .. import clients\n", ["actors", "actors.clients"]),
    ],
)
def test_the_checker_sees_every_kind_of_import(tmp_path: Path, source: str, expected: list[str]) -> None:
    p = planted(tmp_path, {"actors/core/probe.py": source, "cluster/db.py": ""})
    assert [i.module for i in p.imports("actors.core.probe")] == expected
