"""tests/parallel.py's report of how the groups packed onto the workers of a parallel run."""

from __future__ import annotations

from pathlib import Path

from tests.parallel import LANES, PLAN, Packing


def test_the_worker_that_finished_last_comes_first_with_its_biggest_groups() -> None:
    now = [100.0]
    packing = Packing(clock=lambda: now[0])
    for worker, nodeid, seconds, at in (
        ("gw0", "tests/integration/test_a.py::t1", 10.0, 110.0),
        ("gw1", "tests/integration/test_b.py::t1", 3.0, 130.0),
        ("gw0", "tests/integration/test_a.py::t2", 5.0, 115.0),
        ("gw0", "tests/unit/test_c.py::t1@lane-unit", 1.0, 118.0),
        ("gw0", "tests/unit/test_d.py::t1@lane-unit", 2.0, 120.0),
    ):
        now[0] = at
        packing.add(worker, nodeid, seconds)
    assert packing.lines(top=1) == [
        "gw1: finished at 30 s, tests 3 s in 1 groups: tests/integration/test_b.py 3 s",
        "gw0: finished at 20 s, tests 18 s in 2 groups: tests/integration/test_a.py 15 s and 1 more",
    ]
    # A lane is one group of its modules; the modules' own seconds are listed for PLAN.
    assert packing.lines(top=2)[1].endswith("tests/integration/test_a.py 15 s, lane-unit 3 s")
    assert packing.modules() == [
        "   15.0 gw0 tests/integration/test_a.py",
        "    3.0 gw1 tests/integration/test_b.py",
        "    2.0 gw0 tests/unit/test_d.py",
        "    1.0 gw0 tests/unit/test_c.py",
    ]


def test_every_module_the_plan_and_the_lanes_name_exists() -> None:
    """A renamed or split module left in PLAN or LANES would silently count as light and run
    outside its lane (as `bench all --quick`'s halves must not)."""
    root = Path(__file__).resolve().parents[2]
    missing = [m for m in [*PLAN, *LANES] if not (root / m).is_file()]
    assert missing == []
