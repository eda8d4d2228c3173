"""How the suite runs in parallel (pytest-xdist): which tests share a worker, in which order.

`python -m pytest` runs with `-n auto --dist loadgroup` (pyproject.toml). Each worker is a pytest
session of its own, so the session fixtures (the Ray pool, the embedded PostgreSQL and Redis, the
edges: tests/conftest.py, tests/integration/conftest.py) start once per worker, in their own
`mkdtemp` directories, on free ports, in their own Ray instance and namespace. Inside a worker the
tests run one after the other, as in a serial run, so a test that stops its worker's PostgreSQL or
kills a shard disturbs nobody else.

The unit of work is a whole module (a test file): its module fixtures are started once, and its
tests run in their written order on one worker. Tests marked `pytest.mark.xdist_group("name")`
run together on one worker, whatever their modules; so do the modules of one lane (`LANES`):
a module that loads both cores for a minute and one whose checks are timed to the second never
run side by side, and the unit tier (CPU-bound, some of it timed to the millisecond) is one lane
beside the integration tests. Modules run heaviest first (the expected
seconds below, from `--durations`), so that a long one does not start last and leave one worker
running alone at the end; a module not listed counts as a light one. The servers and Ray
instances of the workers start one at a time (`one_start_at_a_time`): side by side on two cores
they starve each other.

More workers than cores pays off because the integration tests mostly wait (on a timeout, an
aging period, a restart); `auto` is two per core, at most `MAX_WORKERS`. External servers
(`PRESENCE_DATABASE_URL`, `PRESENCE_REDIS_URL`, `RAY_ADDRESS`) are shared by every worker, and
some tests empty or restart them: with any of them set the run is serial.
`PYTEST_XDIST_AUTO_NUM_WORKERS=N` chooses the number; `-n 0` runs in one process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler.protocol import Scheduling

MAX_WORKERS = 6
WORKERS_PER_CORE = 2
EXTERNAL_SERVERS = ("PRESENCE_DATABASE_URL", "PRESENCE_REDIS_URL", "RAY_ADDRESS")

# Expected seconds of the heavier modules (serial runs with --durations on the 2-core machine,
# most of them loaded; only their order matters: a long module that starts last leaves one worker
# running alone at the end). A run with TEST_PACKING_FILE=FILE writes every module's seconds.
PLAN: dict[str, float] = {
    "tests/integration/test_doc_examples.py": 110,
    # With bench bigserver --quick in its own process (~100-130 s at load 12-20).
    "tests/integration/test_bench_smoke.py": 110,
    "tests/integration/test_command_line.py": 100,
    "tests/integration/test_outages.py": 70,
    "tests/integration/test_faults_history.py": 60,
    "tests/integration/test_conformance.py": 58,
    "tests/integration/test_bench_smoke_more.py": 50,
    "tests/integration/test_bench_smoke_fanout.py": 45,
    "tests/integration/test_embedded.py": 40,
    "tests/integration/test_admin_browser.py": 35,
    "tests/integration/test_bench_scale_smoke.py": 35,
    "tests/integration/test_drain.py": 30,
    "tests/integration/test_multinode.py": 28,
    "tests/integration/test_resize.py": 25,
    "tests/integration/test_rollout.py": 25,
    "tests/integration/test_views.py": 22,
    "tests/integration/test_demo_browser.py": 20,
    "tests/integration/test_durable.py": 20,
    "tests/integration/test_internal_http.py": 20,
    "tests/integration/test_rolling.py": 20,
    "tests/integration/test_edge_ray_loss.py": 20,
    "tests/integration/test_lastseen_ws.py": 25,
    "tests/integration/test_failures.py": 15,
    "tests/integration/test_security.py": 15,
    "tests/integration/test_presence_ws.py": 15,
    "tests/integration/test_bench_rtt_smoke.py": 14,
    "tests/integration/test_active.py": 12,
    "tests/integration/test_fuzz.py": 12,
    "tests/integration/test_ray_security.py": 12,
    "tests/integration/test_clients_live.py": 12,
    "tests/integration/test_flush.py": 11,
    "tests/integration/test_packaging.py": 11,
    "tests/integration/test_hostile.py": 10,
    # The unit lane's heaviest (hypothesis), half of what they took on a loaded machine.
    "tests/unit/test_shard.py": 17,
    "tests/unit/test_flush_buffer.py": 16,
    "tests/unit/test_tokens.py": 13,
    "tests/unit/test_layers.py": 6,
    "tests/unit/test_budgets.py": 6,
    "tests/unit/test_slots.py": 6,
    "tests/unit/test_channels.py": 5,
}
# Lanes: modules one worker runs one after the other. The benchmark smoke runs, `presence up`
# (test_command_line, test_doc_examples) and the conformance suite each keep both cores busy for a
# minute: run side by side, each takes twice as long. They are spread over three lanes of about
# 130-160 s each on a quiet machine, beside the unit lane: `bench all --quick` is split in two
# halves (test_bench_smoke_more, test_bench_smoke_fanout), which as one module followed by its
# history made a lane of about 300 s on a loaded run (the run's end). The recorded histories,
# whose checks are timed to the second (test_faults_history, test_views), follow a load in lane-a
# rather than meet three others.
LANES: dict[str, str] = {
    "tests/integration/test_bench_smoke_more.py": "lane-a",
    "tests/integration/test_faults_history.py": "lane-a",
    "tests/integration/test_views.py": "lane-a",
    "tests/integration/test_command_line.py": "lane-b",
    "tests/integration/test_conformance.py": "lane-b",
    "tests/integration/test_bench_smoke_fanout.py": "lane-c",
    "tests/integration/test_doc_examples.py": "lane-c",
}
# The unit tier keeps one core busy from start to end (hypothesis, pure code) and some of its tests
# time real event-loop windows of a few milliseconds: side by side with itself on two cores it is
# no faster and less reliable, so it is one lane, beside the integration tests (which mostly wait).
UNIT_LANE = "lane-unit"
UNLISTED_INTEGRATION_S = 5.0
UNLISTED_UNIT_S = 1.5


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def expected_s(module: str) -> float:
    if module in PLAN:
        return PLAN[module]
    return UNLISTED_INTEGRATION_S if "/integration/" in module else UNLISTED_UNIT_S


def lane_of(module: str) -> str | None:
    if module in LANES:
        return LANES[module]
    return UNIT_LANE if module.startswith("tests/unit/") else None


def heaviest_first(items: list[pytest.Item]) -> None:
    """Heaviest module (or lane) first, a lane's modules together, each module's tests in their
    written order; the lanes' tests marked with `xdist_group`."""
    lanes: dict[str, float] = {}
    for module in {module_of(item.nodeid) for item in items}:
        if lane := lane_of(module):
            lanes[lane] = lanes.get(lane, 0.0) + expected_s(module)

    def weight(item: pytest.Item) -> tuple[float, str]:
        module = module_of(item.nodeid)
        if lane := lane_of(module):
            item.add_marker(pytest.mark.xdist_group(lane))
            return -lanes[lane], lane
        return -expected_s(module), module

    items.sort(key=weight)  # stable


def auto_workers() -> int:
    if named := os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(named)
    if any(os.environ.get(name) for name in EXTERNAL_SERVERS):
        return 0
    cores = len(os.sched_getaffinity(0)) or 1  # the cores this run may use
    return min(MAX_WORKERS, WORKERS_PER_CORE * cores)


def make_scheduler(config: pytest.Config, log: Producer) -> Scheduling | None:
    """loadgroup with a module (not a single test) as the unit of work when a test has no group."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ByModuleOrGroup(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = super()._split_scope(nodeid)
            return group if group != nodeid else module_of(nodeid)

    config.option.loadscopereorder = False  # keep the heaviest-first order of the collection
    return ByModuleOrGroup(config, log)


@contextlib.contextmanager
def one_start_at_a_time() -> Iterator[None]:
    """Held while a parallel worker starts its servers or its Ray instance: started side by side
    on two cores they starve each other (Ray gives its raylet 30 s to register, then fails), one
    after the other each takes seconds. Nothing to wait for in a serial run."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:
        yield
        return
    with open(Path(tempfile.gettempdir()) / f"presence-test-{run}.start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@dataclass
class Packing:
    """How the groups packed onto the workers, for the end of a parallel run: the longest worker
    decides the wall time, so the run prints, per worker, when it finished and its groups (a lane,
    an `xdist_group` or a module) with the seconds their tests took (setup, call and teardown as
    pytest measured them). Fed on the controller with every test report as it arrives.
    `TEST_PACKING_FILE=FILE` also writes every module's seconds there (for `PLAN`)."""

    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    # worker -> module -> seconds, in the order the modules started on it
    seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    last_report: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.started = self.clock()

    def add(self, worker: str, nodeid: str, duration: float) -> None:
        modules = self.seconds.setdefault(worker, {})
        module = module_of(nodeid)
        modules[module] = modules.get(module, 0.0) + duration
        self.last_report[worker] = self.clock() - self.started

    def lines(self, top: int = 6) -> list[str]:
        """One line per worker, the last to finish first: finished at, busy seconds, its biggest
        groups."""
        out = []
        for worker in sorted(self.seconds, key=lambda w: -self.last_report[w]):
            groups: dict[str, float] = {}
            for module, s in self.seconds[worker].items():
                group = lane_of(module) or module
                groups[group] = groups.get(group, 0.0) + s
            busy = sum(groups.values())
            biggest = sorted(groups.items(), key=lambda kv: -kv[1])[:top]
            shown = ", ".join(f"{name} {s:.0f} s" for name, s in biggest)
            rest = len(groups) - len(biggest)
            more = f" and {rest} more" if rest > 0 else ""
            out.append(
                f"{worker}: finished at {self.last_report[worker]:.0f} s, tests {busy:.0f} s in "
                f"{len(groups)} groups: {shown}{more}"
            )
        return out

    def modules(self) -> list[str]:
        """Every module, slowest first: seconds, worker, module (the figures `PLAN` wants)."""
        rows = [(s, w, m) for w, modules in self.seconds.items() for m, s in modules.items()]
        return [f"{s:7.1f} {w} {m}" for s, w, m in sorted(rows, reverse=True)]
