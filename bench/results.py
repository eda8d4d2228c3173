"""Where benchmark figures go: a JSON file per run, and a row in the repository's `bench/RESULTS.md`.

Both live under `bench/` in the current directory. The JSON files
(`bench/results/<name>-<timestamp>.json`) are the full record of a run and are not
committed. `RESULTS.md` is committed: one section per benchmark, one table row per recorded run,
so the history of a figure on a given machine can be read in review.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The code's folder (for the commit it was run at) and where results go: `bench/` under the
# current directory, never the installed package (in a checkout's root that is the committed
# bench/RESULTS.md; `bench all --results-dir D` and each benchmark's `--output` put JSON elsewhere).
BENCH_DIR = Path(__file__).resolve().parent
OUT_DIR = Path.cwd() / "bench"
RESULTS_DIR = OUT_DIR / "results"
RESULTS_MD = OUT_DIR / "RESULTS.md"

_MD_PREAMBLE = """# Benchmark results

Rows are appended by the benchmarks themselves (`presence bench NAME`; `--no-record` skips it).
Every figure in a row was measured in one invocation on the machine named in the row, and every
ratio compares designs measured in that same run. The full record of each run is the JSON file
the benchmark wrote under `bench/results/` (not committed).
"""


def utc_now() -> datetime:
    return datetime.now(UTC)


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))  # what `nproc` prints
    except AttributeError:
        return os.cpu_count() or 1


def git_commit() -> str:
    """Short hash of HEAD, with `+dirty` when the working tree has uncommitted changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=BENCH_DIR, capture_output=True, text=True, check=True
        ).stdout.strip()
        # The results file itself does not count: `bench all` appends to it as it goes.
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/RESULTS.md"],
            cwd=BENCH_DIR.parent, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def machine_info() -> dict[str, Any]:
    return {
        "cpus": _cpus(),
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(terse=True),
        "machine": platform.machine(),
        "commit": git_commit(),
        # Other work on the machine slows real-time figures (write-through's load factor, runtimes).
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }


def machine_summary(info: dict[str, Any]) -> str:
    mem = f"{info['memory_gib']:g} GiB" if info.get("memory_gib") is not None else "? GiB"
    load = info.get("load_average_1m")
    return f"{info['cpus']} CPU, {mem}, Python {info['python']}" + (
        "" if load is None else f", load {load:g}"
    )


def write_json(name: str, payload: dict[str, Any], path: Path | None = None) -> Path:
    """Write a run's full record; default `bench/results/<name>-<UTC timestamp>.json`."""
    if path is None:
        stamp = utc_now().strftime("%Y%m%dT%H%M%SZ")
        path = RESULTS_DIR / f"{name}-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def append_row(
    name: str,
    title: str,
    header: list[str],
    row: list[str],
    notes: str = "",
    path: Path = RESULTS_MD,
) -> None:
    """Append `row` to the table of the section `## name`, creating the file or section if needed.

    A section is a heading, optional notes, and one table; rows go after the table's last row, so
    sections of other benchmarks and anything written by hand around them stay where they are.
    """
    if len(row) != len(header):
        raise ValueError(f"row has {len(row)} cells, header {len(header)}")
    text = path.read_text() if path.exists() else _MD_PREAMBLE
    lines = text.splitlines()
    heading = f"## {name}"
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == heading)
    except StopIteration:
        section = ["", heading, ""]
        if title:
            section += [title, ""]
        if notes:
            section += [notes.rstrip(), ""]
        section += [_md_row(header), _md_row(["---"] * len(header)), _md_row(row)]
        while lines and not lines[-1].strip():
            lines.pop()
        path.write_text("\n".join(lines + section) + "\n")
        return
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    table_rows = [i for i in range(start + 1, end) if lines[i].lstrip().startswith("|")]
    if not table_rows:  # a section written by hand before its first run: the table after its text
        insert_at = end
        while insert_at > start + 1 and not lines[insert_at - 1].strip():
            insert_at -= 1
        new = ["", _md_row(header), _md_row(["---"] * len(header)), _md_row(row)]
    else:
        insert_at = table_rows[-1] + 1
        new = [_md_row(row)]
    lines[insert_at:insert_at] = new
    path.write_text("\n".join(lines).rstrip("\n") + "\n")


# ------------------------------------------------------------------------------------ one report

# A results row as (column, cell) pairs: a column and its cell are written side by side, so the
# header and the row of a benchmark cannot drift apart.
Columns = Sequence[tuple[str, str]]


def row_date() -> str:
    """The date cell of a results row (UTC, to the minute)."""
    return utc_now().strftime("%Y-%m-%d %H:%M")


def args_json(args: Any) -> dict[str, Any]:
    """A benchmark's arguments (an argparse namespace) as JSON values (paths and the like as strings)."""
    plain = (int, float, bool)
    return {k: (v if v is None or isinstance(v, plain) else str(v)) for k, v in vars(args).items()}


def run_record(
    name: str, started_at: str, runtime_s: float, machine: dict[str, Any], args: Any = None
) -> dict[str, Any]:
    """The fields every benchmark's JSON record starts with."""
    record: dict[str, Any] = {
        "benchmark": name,
        "started_at": started_at,
        "runtime_s": round(runtime_s, 1),
        "machine": machine,
    }
    if args is not None:
        record["args"] = args_json(args)
    return record


def lead_columns(machine: dict[str, Any]) -> list[tuple[str, str]]:
    """The first cells of every row: when, on which machine, at which commit."""
    return [("date", row_date()), ("machine", machine_summary(machine)), ("commit", machine["commit"])]


def target(name: str, figure: float, unit: str, goal: str, met: bool | None) -> dict[str, Any]:
    """One target of a benchmark, as `bench all` summarises them; `met` None: not measured at this
    size (--quick)."""
    return {
        "name": name,
        "figure": figure,
        "unit": unit,
        "target": goal,
        "met": None if met is None else bool(met),
    }


def met_text(met: bool | None) -> str:
    return "not at this size" if met is None else ("met" if met else "missed")


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], align_left: int = 1) -> str:
    """A plain-text table: the first `align_left` columns left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(
            c.ljust(widths[i]) if i < align_left else c.rjust(widths[i]) for i, c in enumerate(cells)
        )

    return "\n".join([line(header), "-+-".join("-" * w for w in widths), *(line(r) for r in rows)])


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]], align_left: int = 1) -> None:
    print(format_table(header, rows, align_left))


def record(
    name: str,
    payload: dict[str, Any],
    args: Any,
    title: str,
    columns: Columns,
    notes: str = "",
    row: bool = True,
) -> Path:
    """Every benchmark's last step: write the JSON record (`args.output`, else
    bench/results/NAME-TIME.json), print where it is (`bench all` reads that `results:` line), and
    append the row to bench/RESULTS.md unless `args.no_record` (or `row` is False)."""
    path = write_json(name, payload, args.output)
    appended = row and not args.no_record
    print(f"\nresults: {path}" + (f"; row appended to {RESULTS_MD}" if appended else ""))
    if appended:
        append_columns(name, title, columns, notes)
    return path


def append_columns(name: str, title: str, columns: Columns, notes: str = "") -> None:
    """`append_row` with the row given as (column, cell) pairs, to bench/RESULTS.md."""
    append_row(name, title, [c for c, _ in columns], [v for _, v in columns], notes, RESULTS_MD)


class Progress:
    """One updating status line on stderr (a plain line every ~10 % when stderr is not a terminal)."""

    def __init__(self, label: str, total: int, min_interval_s: float = 0.2) -> None:
        self.label = label
        self.total = max(total, 1)
        self.tty = sys.stderr.isatty()
        self.min_interval_s = min_interval_s
        self._last = 0.0
        self._last_decile = -1
        self._width = 0

    def update(self, done: int, text: str, now: float) -> None:
        if self.tty:
            if now - self._last < self.min_interval_s and done < self.total:
                return
            self._last = now
            line = f"[{self.label}] {text}"
            pad = max(self._width - len(line), 0)
            self._width = len(line)
            sys.stderr.write("\r" + line + " " * pad)
            sys.stderr.flush()
            return
        decile = done * 10 // self.total
        if decile != self._last_decile:
            self._last_decile = decile
            sys.stderr.write(f"[{self.label}] {text}\n")
            sys.stderr.flush()

    def done(self, text: str) -> None:
        if self.tty:
            line = f"[{self.label}] {text}"
            sys.stderr.write("\r" + line + " " * max(self._width - len(line), 0) + "\n")
        else:
            sys.stderr.write(f"[{self.label}] {text}\n")
        sys.stderr.flush()
