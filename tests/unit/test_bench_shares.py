"""The pure parts of `bench scale` (a size measured there and back is the mean of its phases) and of
`bench fanout`/`bench query` (which generator process connects which accounts and queriers)."""

from __future__ import annotations

import pytest

from bench import fanout, scale


def test_a_size_measured_twice_is_the_mean_of_its_phases_in_first_seen_order() -> None:
    measured = [(1, 100.0), (2, 90.0), (8, 70.0), (2, 80.0), (1, 60.0)]
    phases = [{"shards": s, "ops_per_s": v} for s, v in measured]
    sizes = scale.per_size(phases)
    assert list(sizes) == [1, 2, 8]
    assert sizes[1] == {"phases": [100.0, 60.0], "ops_per_s": 80.0}
    assert sizes[2]["ops_per_s"] == 85.0 and sizes[8]["phases"] == [70.0]


def test_there_and_back_cancels_a_steady_drift() -> None:
    # The machine slows by 10 % a phase; the pool itself scales perfectly (every size the same).
    order = [1, 2, 4, 8, 4, 2, 1]
    phases = [{"shards": s, "ops_per_s": 100.0 * (1 - 0.1 * k)} for k, s in enumerate(order)]
    sizes = scale.per_size(phases)
    assert sizes[8]["ops_per_s"] / sizes[1]["ops_per_s"] == pytest.approx(1.0)
    one_way = {ph["shards"]: ph["ops_per_s"] for ph in phases[:4]}
    assert one_way[8] / one_way[1] == pytest.approx(0.7)  # what one direction alone would report


@pytest.mark.parametrize("own_process", [False, True])
def test_every_account_and_querier_is_connected_by_exactly_one_generator(own_process: bool) -> None:
    queries = fanout.Queries(queriers=7, ids=3, rate=1.0, own_process=own_process)
    shares = fanout.generator_shares(3, queries)
    assert len(shares) == (4 if own_process else 3)
    accounts = [i for s in shares for i in range(*_bounds(s["account_share"], 20))]
    assert sorted(accounts) == list(range(20))
    queriers = [j for s in shares for j in s["my_queriers"]]
    assert sorted(queriers) == list(range(7))
    if own_process:  # the last process has every querier and no account
        assert shares[-1] == {"account_share": (0, 0), "my_queriers": list(range(7))}
        assert all(not s["my_queriers"] for s in shares[:-1])


def test_without_queries_the_generators_share_the_accounts_only() -> None:
    assert fanout.generator_shares(2, None) == [
        {"account_share": (0, 2), "my_queriers": []},
        {"account_share": (1, 2), "my_queriers": []},
    ]


def _bounds(share: tuple[int, int], accounts: int) -> tuple[int, int, int]:
    k, n = share
    return (k, accounts, n) if n else (0, 0, 1)
