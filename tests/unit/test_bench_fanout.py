"""bench/fanout.py's pieces that need no servers: the bare broadcast server's command line, and
when `bench query`'s queries leave (bench/loadgen.py), and how a run is judged."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import time
from array import array
from typing import Any, cast

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


def test_the_relay_floors_command_lines() -> None:
    """The bare server is told its owners' ports; an owner needs no secret, the server does."""
    args = fanout_server.parse(fanout.bare_server_argv("s3cret", [4001, 4002])[2:])
    assert (args.secret, args.owners, args.owner) == ("s3cret", "4001,4002", False)
    assert fanout_server.parse(fanout.OWNER_ARGV[2:]).owner
    with pytest.raises(SystemExit):
        fanout_server.parse([])


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


def _arrays(entries: list[tuple[int, int, float]]) -> tuple[bytes, bytearray, bytes]:
    users, statuses, times = array("i"), bytearray(), array("d")
    for user, status, at in entries:
        users.append(user)
        statuses.append(status)
        times.append(at)
    return users.tobytes(), statuses, times.tobytes()


def test_changes_that_came_short_of_their_watchers_are_listed_with_when_they_were_sent() -> None:
    """A window that lost deliveries says which changes lost them (the last ones of the window, one
    stretch, or scattered), not only how many."""
    sends = [(1, 1, 10.0), (2, 1, 10.5), (1, 0, 12.0)]
    receipts = [(1, 1, 10.01)] * 3 + [(2, 1, 10.51)] * 3 + [(1, 0, 12.01)] * 1
    res = [{"sends": _arrays(sends), "receipts": _arrays(receipts)}]
    d = fanout.match_deliveries(res, per_change=3)
    assert (d.changes, d.received, d.unmatched) == (3, 7, 0)
    assert d.short == [(2.0, 2)]  # account 1's second change, 2 s after the first, 2 of 3 missing
    assert fanout.match_deliveries(res).short == []  # not asked


async def test_a_generator_records_the_deliveries_that_come_before_it_wakes_for_the_window() -> None:
    """A delivery of another generator's first change can come before this generator's wait for
    the window's start has ended (its loop runs the socket's read before the woken task); it is
    recorded, not dropped (before, the window lost up to one change's watchers here)."""
    gen = loadgen.Generator(0, 1, {}, lambda _progress: None)
    gen.prefix = "u"
    run = asyncio.create_task(gen.fanout_run(time.monotonic() + 60.0, 0.0, 0.0, 0.01))
    await asyncio.sleep(0)  # the run now waits for the window's start
    gen._on_frame(cast(loadgen.WsConn, None), b'{"type":"presence.changed","userId":"u5","status":"idle"}')
    assert len(gen.receipts_t) == 1
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run


def _judged_window(rate: float, p99: float, total_us: float) -> dict[str, Any]:
    return {
        "rate": rate,
        "delivered_fraction": 1.0,
        "latency_ms": {"p50": p99 / 3, "p99": p99, "max": p99 * 2},
        "latency_ms_by_second": [{"second": 0, "p99": p99}],
        "cpu_us_per_delivery": {"edges": total_us - 1.0, "shards": 1.0, "total": total_us},
    }


@pytest.mark.parametrize(("bare_p99", "fell_behind"), [(3.0, False), (628.0, True)])
def test_the_ratios_to_a_bare_broadcast_that_fell_behind_are_not_judged(
    bare_p99: float, fell_behind: bool
) -> None:
    """`judge` as `bench fanout` prints it: a bare broadcast whose own p99 at 40,000/s is past the
    absolute bound is no baseline, so neither ratio to it is judged (bench/targets.py); the
    targets of ours alone are judged as before."""
    args = argparse.Namespace(subscriptions=50, quick=False)
    run = {
        "windows": [_judged_window(200, 5.0, 12.0), _judged_window(800, 5.0, 12.0)],
        "bare": _judged_window(800, bare_p99, 11.0),
    }
    met = fanout.judge(args, run)
    assert met["first"] is True and met["fast"] is True
    assert met["bare_fell_behind"] is fell_behind
    if fell_behind:
        assert met["ratio_met"] is None and met["p99_ratio_met"] is None
    else:
        assert met["ratio_met"] is True and met["p99_ratio_met"] is True
