"""The pure parts of `presence bench rollout`: which frames are not real changes, who watches whom,
which edge a client tries next, and the figures computed from what the generators recorded (phases,
fan-out latency, lost changes, reconnect times, the old/new ratios and the targets)."""

from __future__ import annotations

import argparse
import math
from array import array
from collections import Counter

import orjson
import pytest

from bench import loadgen as lg
from bench import rollout as ro


def test_only_a_switch_between_idle_and_online_is_a_real_change() -> None:
    assert ro.classify(ro.ONLINE, ro.IDLE) is None
    assert ro.classify(ro.IDLE, ro.ONLINE) is None
    assert ro.SPURIOUS[ro.classify(ro.ONLINE, ro.OFFLINE)] == "offline frame"  # type: ignore[index]
    assert ro.SPURIOUS[ro.classify(ro.OFFLINE, ro.ONLINE)] == "back after offline"  # type: ignore[index]
    assert ro.SPURIOUS[ro.classify(ro.IDLE, ro.IDLE)] == "repeat"  # type: ignore[index]
    assert ro.code_of("dnd") == ro.OFFLINE  # never made by the load: not a real change either


def test_view_index_is_the_position_among_the_accounts_watched() -> None:
    accounts, subs = 100, 5
    for w in (0, 42, 97):
        targets = lg.fanout_targets(w, accounts, subs)
        assert [ro.view_index(w, t, accounts, subs) for t in targets] == list(range(subs))
        others = set(range(accounts)) - set(targets)
        assert all(ro.view_index(w, t, accounts, subs) is None for t in others)


def test_a_drained_edges_clients_spread_evenly_over_the_others() -> None:
    edges = 3
    orders = [ro.edge_order(i, edges) for i in range(600)]
    assert all(sorted(o) == list(range(edges)) and o[0] == i % edges for i, o in enumerate(orders))
    next_of_edge0 = Counter(o[1] for o in orders if o[0] == 0)
    assert next_of_edge0 == {1: 100, 2: 100}


def _raw(**fields: list[float] | list[int]) -> ro.Raw:
    raw = ro.Raw()
    for name, values in fields.items():
        target = getattr(raw, name)
        if isinstance(target, array):
            target.extend(values)
        else:
            target.extend(int(v) for v in values)
    return raw


def test_merge_joins_what_each_generator_recorded() -> None:
    a, b = _raw(sends_u=[1], sends_s=[1], sends_t=[0.5]), _raw(sends_u=[2], sends_s=[0], sends_t=[0.7])
    parts = [
        {n: bytes(v) if isinstance(v, bytearray) else v.tobytes() for n, v in vars(r).items()} for r in (a, b)
    ]
    merged = ro.merge(parts)
    assert (
        list(merged.sends_u) == [1, 2]
        and list(merged.sends_s) == [1, 0]
        and list(merged.sends_t) == [0.5, 0.7]
    )


def test_a_receipt_belongs_to_the_latest_change_to_its_status_before_it() -> None:
    raw = _raw(
        sends_u=[7, 7, 7, 8],
        sends_s=[1, 0, 1, 1],
        sends_t=[1.0, 2.0, 3.0, 1.5],
        rec_w=[0, 0, 0, 0],
        rec_u=[7, 7, 7, 8],
        rec_s=[1, 0, 1, 0],
        rec_t=[1.01, 2.5, 3.02, 1.6],
    )
    assert list(ro.match(raw)) == [0, 1, 2, -1]  # account 8 never went online: unmatched


def test_a_receipt_of_a_change_older_than_one_already_had_is_a_flicker() -> None:
    """idle, then online, then idle again at the watcher, while the account only went online
    then idle (an old departure overtaken by a reconnect): the third receipt is of the first
    change, older than the second one already had."""
    raw = _raw(
        sends_u=[7, 7], sends_s=[0, 1], sends_t=[1.0, 2.0],
        rec_w=[0, 0, 0, 3], rec_u=[7, 7, 7, 7], rec_s=[0, 1, 0, 1], rec_t=[1.1, 2.1, 2.2, 2.05],
    )  # fmt: skip
    found = ro.match(raw)
    assert list(found) == [0, 1, 0, 1]
    assert list(ro.stale(raw, found)) == [2.2]  # watcher 3's single receipt is not compared with 0's


def test_fan_out_is_timed_to_watchers_subscribed_from_the_send_to_the_receipt() -> None:
    """Watcher 0 is subscribed all along; watcher 3 lost its socket at 3.0, before the change of
    2.0 reached it, and was back at 40.0, when it was told (its resync): no fan-out of 38 s. A
    repeat of a receipt counts once."""
    raw = _raw(
        sends_u=[7], sends_s=[1], sends_t=[2.0],
        rec_w=[0, 0, 3], rec_u=[7, 7, 7], rec_s=[1, 1, 1], rec_t=[2.01, 2.5, 40.1],
        rc_u=[3], rc_lost=[3.0], rc_ready=[39.9], rc_synced=[40.0],
    )  # fmt: skip
    sent_at, latency = ro.fanout_latencies(raw, ro.match(raw), _shape(end=60.0))
    assert list(sent_at) == [2.0]
    assert [round(x, 3) for x in latency] == [0.01]


def test_subscribed_spans_end_at_each_loss_and_start_again_at_each_resync() -> None:
    raw = _raw(rc_u=[3, 3], rc_lost=[10.0, 20.0], rc_ready=[10.5, math.nan], rc_synced=[10.6, math.nan])
    assert ro.intervals(raw, 0.0, 30.0) == {3: [(0.0, 10.0), (10.6, 20.0)]}  # gave up at 20


def _shape(**kw: float) -> ro.Shape:
    return ro.Shape(
        accounts=10, subscriptions=2, sample=1, start=kw.get("start", 0.0), end=kw.get("end", 100.0)
    )


def test_a_change_is_lost_only_for_watchers_subscribed_all_along() -> None:
    # Account 5 is watched by 4 and 3. Its change at 10 reaches 4 only; 3 was reconnecting then.
    raw = _raw(
        sends_u=[5], sends_s=[1], sends_t=[10.0],
        rec_w=[4], rec_u=[5], rec_s=[1], rec_t=[10.01],
        rc_u=[3], rc_lost=[9.5], rc_ready=[10.5], rc_synced=[10.6],
    )  # fmt: skip
    missing, expected = ro.lost_changes(raw, ro.match(raw), _shape())
    assert (list(missing), expected) == ([], 1)
    raw.rec_w[0] = 9  # nobody it expected got it
    missing, expected = ro.lost_changes(raw, ro.match(raw), _shape())
    assert (list(missing), expected) == ([10.0], 1)


def test_a_change_sent_just_before_its_own_socket_went_may_never_have_arrived() -> None:
    raw = _raw(sends_u=[5, 5], sends_s=[1, 0], sends_t=[10.0, 30.0], rc_u=[5], rc_lost=[10.5],
               rc_ready=[11.0], rc_synced=[11.1])  # fmt: skip
    assert ro.uncertain(raw) == {0}
    missing, expected = ro.lost_changes(raw, ro.match(raw), _shape())
    assert expected == 2 and list(missing) == [30.0, 30.0]  # only the second one counts


def test_sampled_watchers_are_every_nth_account_among_the_watchers() -> None:
    shape = ro.Shape(accounts=100, subscriptions=10, sample=5, start=0.0, end=1.0)
    assert sorted(shape.sampled_watchers(12)) == [5, 10]  # 2 … 11 watch 12
    assert all(12 in lg.fanout_targets(w, 100, 10) for w in shape.sampled_watchers(12))


def test_each_figure_goes_to_the_phase_it_happened_in() -> None:
    phases = [ro.Phase(ro.STEADY, 0.0, 10.0, 0.0), ro.Phase(ro.ROLL, 10.0, 30.0, 15.0)]
    assert [ro.phase_of(phases, t) for t in (-1.0, 0.0, 9.9, 10.0, 29.9, 30.0)] == [None, 0, 0, 1, 1, None]
    raw = _raw(
        sends_u=[5, 5], sends_s=[1, 0], sends_t=[5.0, 20.0],
        rec_w=[4, 3, 4, 3], rec_u=[5, 5, 5, 5], rec_s=[1, 1, 0, 0], rec_t=[5.01, 5.02, 20.2, 20.3],
        spur_t=[21.0, 22.0], spur_k=[2, 0],
        rc_u=[9], rc_lost=[12.0], rc_ready=[12.5], rc_synced=[12.6],
    )  # fmt: skip
    steady, roll = ro.analyse(raw, phases, _shape(end=32.0))
    assert steady["spurious_total"] == 0 and steady["reconnects"] == 0 and steady["changes"] == 1
    assert steady["fanout_ms"]["p99"] == pytest.approx(20.0)
    assert roll["spurious"] == {
        "offline frame": 1,
        "back after offline": 0,
        "repeat": 1,
        "offline in a resync": 0,
        ro.OLDER: 0,
    }
    assert roll["reconnect_ms"]["p50"] == pytest.approx(500.0)
    assert roll["resubscribed_ms"]["p50"] == pytest.approx(600.0)
    assert roll["fanout_ms"]["p99"] == pytest.approx(300.0) and roll["lost"] == 0 and roll["wall_s"] == 20.0


def test_ratios_say_how_the_new_way_compares_with_the_old() -> None:
    assert ro.ratio(0.0, 40.0) == 0.0
    assert ro.ratio(3.0, 0.0) == math.inf
    assert math.isnan(ro.ratio(0.0, 0.0)) and math.isnan(ro.ratio(math.nan, 1.0))
    old = {
        "spurious_total": 400,
        "reconnect_ms": {"p99": 2000.0},
        "fanout_ms": {"p99": 80.0},
        "action_s": 20.0,
    }
    new = {"spurious_total": 0, "reconnect_ms": {"p99": 1000.0}, "fanout_ms": {"p99": 40.0}, "action_s": 50.0}
    assert ro.comparison(old, new) == {
        "spurious_frames": 0.0,
        "reconnect_p99": 0.5,
        "fanout_p99": 0.5,
        "wall": 2.5,
    }


def _row(phase: str, spurious: int = 0, lost: int = 0, p99: float = 10.0) -> dict[str, object]:
    return {"phase": phase, "spurious_total": spurious, "lost": lost, "fanout_ms": {"p99": p99}}


def test_targets_judge_the_new_way_and_every_phases_fan_out_but_the_old_restarts() -> None:
    rows = [
        _row(ro.STEADY),
        _row(ro.OLD, spurious=900, lost=3, p99=5_000.0),  # the baseline: compared with, not judged
        _row(ro.ROLL),
        _row(ro.ROLLOUT, p99=99.0),
    ]
    assert ro.judge(rows, 0, quick=False) == {"spurious": True, "lost": True, "fanout": True}
    assert ro.judge(rows, 1, quick=False)["lost"] is False  # a view that never converged
    assert ro.judge([*rows[:3], _row(ro.ROLLOUT, spurious=1, p99=120.0)], 0, quick=False) == {
        "spurious": False, "lost": True, "fanout": False,
    }  # fmt: skip
    assert ro.judge(rows, 0, quick=True)["fanout"] is None  # a shared machine's p99 says nothing


def test_the_full_size_is_the_issues_and_quick_is_small() -> None:
    full = ro.parse([])
    assert (full.sockets, full.edges, full.subscriptions, full.rate, full.shards) == (
        19_000,
        3,
        50,
        2_000.0,
        8,
    )
    quick = ro.parse(["--quick"])
    assert quick.sockets <= 1_500 and quick.generators == 1 and quick.shards >= 2
    with pytest.raises(SystemExit):
        ro.parse(["--shards", "1"])  # nothing to roll out onto
    with pytest.raises(SystemExit):
        ro.parse(["--edges", "1"])  # no other edge to reconnect to


class _Transport:
    """What a client socket's server does with a subscription: the sync and, in the same read,
    the changes it held back during the watch (an edge's `_release`)."""

    def __init__(self, conn: lg.WsConn, frames: list[bytes]) -> None:
        self.conn, self.frames = conn, frames

    def write(self, data: bytes) -> None:
        for frame in self.frames:  # one data_received: no await between them
            self.conn._text(frame)


async def test_a_change_right_behind_the_sync_reaches_the_watchers_view() -> None:
    """The bench dropped frames that came in the same read as the sync (before the watcher's
    coroutine resumed to install its handler): the change was missed and the next one counted
    as a repeat."""
    st = ro._Gen("p", accounts=10, subscriptions=3, connect_timeout_s=5.0)
    st.recording = True
    client = ro._Client(0, "p0", b"", [0], bytearray(3), sampled=True)
    conn = lg.WsConn("127.0.0.1", 1, lg.WS_PATH)
    sync = {"type": "presence.sync", "users": [{"userId": f"p{u}", "status": "online"} for u in (1, 2, 3)]}
    changed = {"type": "presence.changed", "userId": "p2", "status": "idle"}
    conn.transport = _Transport(conn, [orjson.dumps(sync), orjson.dumps(changed)])  # type: ignore[assignment]
    client.conn = conn
    await ro._subscribe(st, client)
    assert client.view[ro.view_index(0, 2, 10, 3)] == ro.IDLE  # type: ignore[index]
    assert list(st.raw.rec_u) == [2] and not st.raw.spur_k


def test_a_benchmarks_edges_stop_without_draining_but_the_rollouts_drain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PRESENCE_DRAIN_GRACE_S", raising=False)
    monkeypatch.setenv("PRESENCE_DRAIN_WINDOW_S", "7")
    plain = lg.edge_process_env(None)
    assert plain["PRESENCE_DRAIN_GRACE_S"] == plain["PRESENCE_DRAIN_WINDOW_S"] == "0"
    # The new way's edges: the arguments, else the environment's value, else the default.
    new_way = lg.edge_process_env(ro._edge_env(argparse.Namespace(drain_grace_s=None, drain_window_s=None)))
    assert (new_way["PRESENCE_DRAIN_GRACE_S"], new_way["PRESENCE_DRAIN_WINDOW_S"]) == ("4.0", "7")
    given = lg.edge_process_env(ro._edge_env(argparse.Namespace(drain_grace_s=0.5, drain_window_s=30.0)))
    assert (given["PRESENCE_DRAIN_GRACE_S"], given["PRESENCE_DRAIN_WINDOW_S"]) == ("0.5", "30.0")
    old_way = lg.edge_process_env(ro.OLD_WAY_ENV)
    assert old_way["PRESENCE_RESUME_S"] == "0"
