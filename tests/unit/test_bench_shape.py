"""bench/ stays readable: no function (nor method, nor nested function) longer than
`MAX_LINES` lines, counted with `ast` from its `def` (decorators excluded) to its last line.

A benchmark that grows past that is split into named steps (start the pair, measure one window,
aggregate, print, record), as every benchmark here is (issue 27 item 7: 25 functions were over the
limit, up to 180 lines).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 60


def long_functions(root: Path, max_lines: int = MAX_LINES) -> dict[str, int]:
    """Every function under `root` (a folder of .py files) longer than `max_lines`, by
    "relative/path.py:Outer.inner" -> its line count."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        _visit(ast.parse(path.read_text(), str(path)), rel, "", max_lines, found)
    return found


def _visit(node: ast.AST, rel: str, prefix: str, max_lines: int, found: dict[str, int]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = prefix + child.name
            if not isinstance(child, ast.ClassDef):
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > max_lines:
                    found[f"{rel}:{name}"] = lines
            _visit(child, rel, name + ".", max_lines, found)
        else:
            _visit(child, rel, prefix, max_lines, found)


def test_no_function_in_bench_is_longer_than_the_limit() -> None:
    found = long_functions(ROOT / "bench")
    assert not found, f"functions over {MAX_LINES} lines in bench/ (split them): {found}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def short():\n" + "    pass\n" * 59, {}),  # 60 lines: fits
        ("def long():\n" + "    pass\n" * 60, {"bench/m.py:long": 61}),
        ("async def long():\n" + "    pass\n" * 60, {"bench/m.py:long": 61}),
        ("class C:\n    def m(self):\n" + "        pass\n" * 60, {"bench/m.py:C.m": 61}),
        (  # a nested function counts on its own, and inside its parent
            "def outer():\n    def inner():\n" + "        pass\n" * 60 + "    return inner\n",
            {"bench/m.py:outer": 63, "bench/m.py:outer.inner": 61},
        ),
        (  # under an `if` at module level
            "if True:\n    def hidden():\n" + "        pass\n" * 60,
            {"bench/m.py:hidden": 61},
        ),
    ],
)
def test_a_planted_long_function_is_found(tmp_path: Path, source: str, expected: dict[str, int]) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "m.py").write_text(source)
    assert long_functions(bench) == expected


def test_the_check_fails_on_a_planted_violation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "m.py").write_text("def long():\n" + "    pass\n" * 60)
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=re.escape("bench/m.py:long")):
        test_no_function_in_bench_is_longer_than_the_limit()
