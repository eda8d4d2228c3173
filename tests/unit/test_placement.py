"""The placement policy (actors/core/placement.py): spread, eligibility, fewest moves."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from actors.core.placement import SHARD_RESOURCE, eligible, place, rebalance


def test_only_nodes_with_the_shard_resource_carry_shards_when_any_has_it() -> None:
    nodes = {"b": {SHARD_RESOURCE: 1.0, "CPU": 2}, "a": {"CPU": 2}, "c": {SHARD_RESOURCE: 1.0}}
    assert eligible(nodes) == ["b", "c"]
    assert eligible({"b": {"CPU": 2}, "a": {}}) == ["a", "b"]


def test_a_pool_of_eight_on_three_nodes_is_three_three_two_and_twelve_is_four_each() -> None:
    nodes = ["n1", "n2", "n3"]
    first = place(8, {}, nodes)
    assert Counter(first) == {"n1": 3, "n2": 3, "n3": 2}
    current: dict[int, str | None] = dict(enumerate(first))
    grown = place(4, current, nodes)
    assert Counter([*first, *grown]) == {"n1": 4, "n2": 4, "n3": 4}


def test_a_pool_placed_on_the_head_alone_is_spread_by_a_rebalance_with_the_fewest_moves() -> None:
    current: dict[int, str | None] = dict.fromkeys(range(8), "head")
    moves = rebalance(current, ["head", "w1", "w2"])
    assert len(moves) == 5
    after = Counter({**current, **moves}.values())
    assert sorted(after.values()) == [2, 3, 3]


def test_shards_on_a_node_that_left_are_moved_and_a_balanced_pool_is_left_alone() -> None:
    assert rebalance({0: "a", 1: "b", 2: "c"}, ["a", "b", "c"]) == {}
    moves = rebalance({0: "a", 1: "b", 2: "gone", 3: None}, ["a", "b"])
    assert set(moves) == {2, 3} and Counter(moves.values()) == {"a": 1, "b": 1}


@given(
    st.dictionaries(st.integers(0, 40), st.sampled_from(["a", "b", "c", "d", "x", None]), max_size=40),
    st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=4, unique=True),
)
def test_after_a_rebalance_counts_differ_by_at_most_one_and_no_balanced_node_loses_a_shard(
    current: dict[int, str | None], nodes: list[str]
) -> None:
    moves = rebalance(current, nodes)
    after = {**current, **moves}
    counts = Counter(after.values())
    assert all(node in nodes for node in after.values())
    loads = [counts.get(n, 0) for n in nodes]
    assert max(loads) - min(loads) <= 1
    # A move never leaves from a node that ends at or below its fair share.
    low = len(current) // len(nodes)
    for shard in moves:
        source = current[shard]
        if source in nodes:
            assert Counter(current.values())[source] > low
    # New shards keep the spread too.
    more = place(5, after, nodes)
    counts2 = Counter([*after.values(), *more])
    loads2 = [counts2.get(n, 0) for n in nodes]
    assert max(loads2) - min(loads2) <= 1


def test_presence_up_waits_for_the_nodes_ray_up_launched(tmp_path: Path) -> None:
    from cluster.config import Settings
    from cluster.up import expected_shard_nodes

    bootstrap = tmp_path / "ray_bootstrap_config.yaml"
    assert expected_shard_nodes(Settings(), bootstrap) == 1  # no such file: place at once
    bootstrap.write_text("provider: {type: local, head_ip: 10.0.0.10, worker_ips: [10.0.0.11, 10.0.0.12]}\n")
    assert expected_shard_nodes(Settings(), bootstrap) == 3
    assert expected_shard_nodes(Settings(shard_nodes=5), bootstrap) == 5


def test_a_node_back_after_its_shards_moved_gets_its_share_by_the_fewest_moves() -> None:
    """`presence scale 12` at 12: a worker died, its 4 shards went to the others (6/6), it came
    back empty: 4 shards move to it, 2 from each of the others, and nothing else moves."""
    current: dict[int, str | None] = {i: ("head" if i < 6 else "w1") for i in range(12)}
    moves = rebalance(current, ["head", "w1", "w2"])
    assert len(moves) == 4 and set(moves.values()) == {"w2"}
    assert Counter(current[s] for s in moves) == {"head": 2, "w1": 2}
    assert sorted(Counter({**current, **moves}.values()).values()) == [4, 4, 4]
    assert rebalance({**current, **moves}, ["head", "w1", "w2"]) == {}
