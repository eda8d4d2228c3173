"""`presence bench edge`'s arguments, turns and open-file limit (the run itself: the bench smoke test)."""

from __future__ import annotations

import resource

import pytest

from bench import edge, loadgen


def test_quick_is_small_and_the_full_size_is_the_target() -> None:
    full = edge.parse([])
    assert full.sockets is None  # decided at the start by the open-file limit
    assert edge.sockets_allowed(1_048_576) == edge.TARGET_SOCKETS == 100_000
    assert edge.sockets_allowed(20_000) == 18_000  # bench all in this container: measured, not at the size
    quick = edge.parse(["--quick"])
    assert (quick.sockets, quick.connections) == (500, 50)


def test_the_heartbeating_connections_are_part_of_the_sockets() -> None:
    with pytest.raises(SystemExit):
        edge.parse(["--sockets", "100", "--connections", "200"])


def test_every_server_gets_as_many_windows_each_side_of_the_others() -> None:
    assert edge._order(2) == ["bare", "floor", "ours", "ours", "floor", "bare"]
    assert edge._order(1) == ["bare", "floor", "ours"]


def test_the_open_file_limit_is_raised_where_allowed_and_reported_where_not() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        got = loadgen.raise_nofile(hard + 10)
        now = resource.getrlimit(resource.RLIMIT_NOFILE)
        if got >= hard + 10:  # privileged: both limits moved
            assert now == (hard + 10, hard + 10)
        else:  # not: the soft limit reached the hard one, and the caller is told so
            assert got == hard and now == (hard, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # lowering is always allowed


def test_the_handshake_ceiling_puts_the_floor_in_ours_place_and_its_shards_at_nothing() -> None:
    def side(server: float, shards: float, generators: float) -> dict[str, object]:
        return {"handshake_cpu_us": {"server": server, "shards": shards, "generators": generators}}

    idle = {"bare": side(577, 0, 418), "floor": side(284, 0, 314), "ours": side(532, 365, 410)}
    assert edge.handshake_ceiling(idle) == pytest.approx((577 + 418) / (284 + 410))
    assert edge.handshake_ceiling(idle) < 1.5  # one run of 2026-12-04 17:28 (others: 1.51-1.67x)
