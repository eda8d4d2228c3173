"""bench/fanout.py's pieces that need no servers: the bare broadcast server's command line, and
when `bench query`'s queries leave (bench/loadgen.py)."""

from __future__ import annotations

import itertools

import pytest

from bench import fanout, fanout_server, loadgen


@pytest.mark.parametrize("secret", ["plain_secret", "-starts-with-a-dash", "--looks-like-an-option", "-"])
def test_the_bare_servers_command_line_carries_any_secret(secret: str) -> None:
    """`token_urlsafe` secrets begin with "-" one time in 64; given as a word of its own such a
    secret was read as an option and the server exited at start (a `bench all` run lost its
    fanout so)."""
    argv = fanout.bare_server_argv(secret)
    assert argv[:2] == ["-m", "bench.fanout_server"]
    assert fanout_server.parse(argv[2:]).secret == secret


def test_queries_leave_at_random_moments_of_their_own_intervals() -> None:
    """`bench query`'s schedule: the rate holds (query k within its k-th interval), and the
    queries are not on the grid from `t0` that the status changes are on: on it, every query left
    in the same turn as a change and found its line busy with that change's call."""
    t0, rate = 1_000.0, 10.0
    moments = list(itertools.islice(loadgen.query_moments(t0, rate, seed=3), 200))
    for k, at in enumerate(moments):
        assert t0 + k / rate <= at < t0 + (k + 1) / rate
    offsets = [round((at - t0) * rate % 1.0, 6) for at in moments]
    assert len(set(offsets)) == len(offsets)  # no two at the same phase
    assert min(offsets) < 0.1 and max(offsets) > 0.9  # spread over the whole interval
    assert moments == list(itertools.islice(loadgen.query_moments(t0, rate, seed=3), 200))  # seeded
