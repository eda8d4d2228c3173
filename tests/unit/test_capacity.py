"""bench.capacity: the model's arithmetic (pure; its inputs are the recorded measurements)."""

from __future__ import annotations

from dataclasses import replace

from bench.capacity import Workload, capacity, main, node_load


def test_the_model_reproduces_the_fanout_benchmark_it_was_fitted_to() -> None:
    fan = replace(Workload(), changes_per_h=800 / 10_000 * 3600, heartbeat_s=1e12, churn_per_min=0.0)
    cores = sum(node_load(fan, 1, 10_000).cores.values())
    assert abs(cores - 1.16) < 0.1  # measured: 1.16 cores for the edge and the shards


def test_quiet_lines_make_every_mail_item_a_call() -> None:
    w = Workload()
    small = node_load(w, 64, 1_000)
    # 1,000 accounts x 12 changes an hour = 3.3 changes/s, each reaching ~40 of 64 edges.
    changes = 1_000 * 12 / 3600
    assert small.calls_per_s > changes * 30


def test_a_node_is_full_at_its_usable_cores_and_calls_take_over_as_nodes_are_added() -> None:
    w = Workload()
    shares = []
    for nodes in (1, 2, 8, 64):
        load, limit = capacity(w, nodes)
        assert limit.startswith("CPU") and abs(sum(load.cores.values()) - w.usable_cores) < 1e-3
        shares.append(load.cores["ray calls"] / w.usable_cores)
    assert shares == sorted(shares) and shares[-1] > 0.9


def test_the_table_prints(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--nodes", "1,64"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 4 and "| 64 |" in out
