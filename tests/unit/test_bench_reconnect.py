"""The pure parts of `presence bench reconnect` and of the query baseline: who watches whom, the
sizes the benchmark accepts, the bare query server's answers, and where a results row goes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import orjson
import pytest

from bench import reconnect
from bench.query_server import answers
from bench.results import append_row


def test_every_watched_account_has_as_many_watchers() -> None:
    watched, watchers, per_watcher = 1_000, 150, 50
    seen = Counter(i for j in range(watchers) for i in reconnect.watched_by(j, watched, per_watcher))
    assert set(seen) == set(range(watched))
    assert set(seen.values()) <= {7, 8}  # 7,500 watches over 1,000 accounts, spread evenly


def test_full_size_fits_one_edge_and_quick_is_small() -> None:
    full = reconnect.parse([])
    assert full.sockets == 19_000
    assert full.sockets + full.watchers + full.load_accounts <= reconnect.EDGE_SOCKETS_MAX
    quick = reconnect.parse(["--quick"])
    assert quick.sockets <= 500 and quick.generators == 1


def test_sizes_that_would_leave_an_account_unwatched_are_refused() -> None:
    with pytest.raises(SystemExit):
        reconnect.parse(["--watched", "1000", "--watchers", "10", "--per-watcher", "50"])
    with pytest.raises(SystemExit):
        reconnect.parse(["--sockets", "19500"])  # edge B's open files


def test_storm_addresses_never_share_one_with_the_load_or_the_watchers() -> None:
    from bench.loadgen import source_address

    load = {source_address(k) for k in range(1_000)}
    watchers = {source_address(reconnect.WATCHER_BASE + k) for k in range(1_000)}
    storm = {source_address(reconnect.STORM_BASE + k) for k in range(19_000)}
    assert not (load & storm) and not (watchers & storm) and not (load & watchers)


def test_bare_query_server_answers_one_frame_per_id_in_order() -> None:
    frames = [orjson.loads(f) for f in answers(["a", "b", "c"], [1, 0, 1])]
    assert frames == [
        {"type": "presence.changed", "userId": "a", "status": "online"},
        {"type": "presence.changed", "userId": "b", "status": "offline"},
        {"type": "presence.changed", "userId": "c", "status": "online"},
    ]


def test_first_row_of_a_hand_written_section_goes_after_its_text(tmp_path: Path) -> None:
    path = tmp_path / "RESULTS.md"
    path.write_text("# r\n\n## reconnect\n\nHow it is measured.\n\n## other\n\ntext\n")
    append_row("reconnect", "title", ["a", "b"], ["1", "2"], path=path)
    append_row("reconnect", "title", ["a", "b"], ["3", "4"], path=path)
    assert path.read_text() == (
        "# r\n\n## reconnect\n\nHow it is measured.\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n| 3 | 4 |\n"
        "\n## other\n\ntext\n"
    )
