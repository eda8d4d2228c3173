"""bench.capacity: the model's arithmetic (pure; its inputs are the recorded measurements)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.capacity import RAY_ROAD, Workload, capacity, main, node_load

FANOUT = {"changes_per_h": 800 / 10_000 * 3600, "heartbeat_s": 1e12, "churn_per_min": 0.0}


def test_the_model_reproduces_the_fanout_benchmark_it_was_fitted_to() -> None:
    direct = sum(node_load(replace(Workload(), **FANOUT), 1, 10_000).cores.values())
    assert abs(direct - 0.62) < 0.03  # bench fanout 074947d: 15.56 µs per delivery x 40,000/s
    by_ray = sum(node_load(replace(Workload(), **FANOUT, **RAY_ROAD), 1, 10_000).cores.values())
    assert by_ray > direct


def test_the_shards_fan_out_costs_per_edge_reached_and_the_edges_per_delivery() -> None:
    """Fan-out per edge (issue 28 item 1): on one node every change reaches one edge, so more
    watchers cost the edge their deliveries and the shards nothing; over many nodes the shards'
    cost follows the edges a change reaches, which grows slower than its watchers."""
    few, many = Workload(watchers=10), Workload(watchers=100)
    one_few, one_many = node_load(few, 1, 10_000), node_load(many, 1, 10_000)
    assert one_many.cores["fan-out"] == pytest.approx(one_few.cores["fan-out"])
    assert one_many.cores["deliveries"] == pytest.approx(10 * one_few.cores["deliveries"])
    wide_few, wide_many = node_load(few, 64, 10_000), node_load(many, 64, 10_000)
    assert one_few.cores["fan-out"] < wide_few.cores["fan-out"] < wide_many.cores["fan-out"]
    assert wide_many.cores["fan-out"] < 10 * wide_few.cores["fan-out"]


def test_quiet_lines_make_every_mail_item_a_call() -> None:
    w = Workload()
    small = node_load(w, 64, 1_000)
    # 1,000 accounts x 12 changes an hour = 3.3 changes/s, each reaching ~40 of 64 edges.
    changes = 1_000 * 12 / 3600
    assert small.calls_per_s > changes * 30


def test_a_node_is_full_at_its_usable_cores_and_calls_take_over_as_nodes_are_added() -> None:
    for w, last_share in ((replace(Workload(), **RAY_ROAD), 0.9), (Workload(), 0.4)):
        shares = []
        for nodes in (1, 2, 8, 64):
            load, limit = capacity(w, nodes)
            assert limit.startswith("CPU") and abs(sum(load.cores.values()) - w.usable_cores) < 1e-3
            shares.append(load.cores["calls"] / w.usable_cores)
        assert shares == sorted(shares) and shares[-1] > last_share


def test_the_direct_lanes_carry_more_accounts_than_ray_calls_at_every_size() -> None:
    for nodes in (1, 2, 8, 64):
        direct, _ = capacity(Workload(), nodes)
        by_ray, _ = capacity(replace(Workload(), **RAY_ROAD), nodes)
        assert direct.accounts > by_ray.accounts


def test_the_table_prints(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["--nodes", "1,64"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 4 and "| 64 |" in out
