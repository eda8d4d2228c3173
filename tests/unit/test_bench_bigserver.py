"""The pure parts of `presence bench bigserver`: who watches whom, and who the probes are."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.bigserver import WINDOWS, list_window, parse, probe_ids, window_of


@pytest.mark.parametrize(("members", "connected", "watch"), [(1_000_000, 20_000, 100), (20_000, 1_000, 100)])
def test_member_lists_cover_the_server_evenly(members: int, connected: int, watch: int) -> None:
    """Each connected member watches `watch` others (never itself), the windows together cover every
    member, and each is watched by about watch x connected / members sockets (2 at the full size)."""
    watched: Counter[int] = Counter()
    for i in range(connected):
        window = list_window(i, members, connected, watch)
        assert len(window) == len(set(window)) == watch and i not in window
        watched.update(window)
    assert len(watched) >= members - 1
    assert max(watched.values()) <= watch * connected // members + 2


@pytest.mark.parametrize("argv", [[], ["--quick"]])
def test_probes_are_members_apart_from_the_connected_and_the_windows(argv: list[str]) -> None:
    args = parse(argv)
    for server, size in (("big", args.members), ("small", args.small_members)):
        probes = set(probe_ids(args, server))
        windows = {m for w in range(WINDOWS) for m in window_of(args, server, w)}
        connected = {f"big{i}" for i in range(args.connected)} if server == "big" else set()
        assert len(probes) == args.probes and len(windows) == WINDOWS * args.watch
        assert not probes & windows and not probes & connected and not windows & connected
        assert all(int(m[len(server) :]) < size for m in probes | windows)


def test_the_full_size_spreads_its_sockets_over_two_edges() -> None:
    """This container caps a process at 20,000 files: 20,000 members and the probes need two."""
    assert parse([]).edges == 2 and parse(["--quick"]).edges == 1
