"""The rules of losing Ray and of fencing a shard cut off (actors/core/liveness.py), and the
edge's watch that acts on them (cluster/edge_process.py `watch`) on a fake edge and clock."""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.liveness import CutOff, Fence, GcsAnswer, LossWatch, Standing, gcs_answer, majority
from cluster import edge_process


def test_a_loss_is_every_probe_failing_for_the_whole_grace_without_a_break() -> None:
    watch = LossWatch(5.0)
    assert not watch.observe(False, 100.0)
    assert not watch.observe(False, 104.9)
    assert not watch.observe(True, 105.0)  # one answer starts the count again
    assert not watch.observe(False, 106.0)
    assert watch.failing_for(110.0) == 4.0
    assert watch.observe(False, 111.0)


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 3)), max_size=40))
def test_lost_exactly_when_the_last_unbroken_run_of_failures_spans_the_grace(
    probes: list[tuple[bool, float]],
) -> None:
    watch, now, since = LossWatch(5.0), 0.0, None
    for ok, step in probes:
        now += step
        since = None if ok else (now if since is None else since)
        assert watch.observe(ok, now) == (since is not None and now - since >= 5.0)


def test_an_edge_remembers_when_it_was_last_cut_off_after_the_heal() -> None:
    """A partition (testbed, 30 s): the edge finds most shards silent at 115 (15 s after the cut),
    is healed at 131, and learns of its abandoned sockets' loss after that: the start of the cut
    off is still known then, and a later cut off replaces it."""
    cut = CutOff()
    cut.observe(False, 1.0)  # starting: never reached the shards yet, so never cut off
    assert cut.since is None
    cut.observe(True, 2.0)
    assert cut.since is None
    for t in (115.0, 116.0, 130.0):
        cut.observe(False, t)
    assert cut.since == 115.0
    cut.observe(True, 131.0)
    cut.observe(True, 132.0)
    assert cut.since == 115.0  # healed: remembered
    cut.observe(False, 400.0)
    cut.observe(False, 401.0)
    assert cut.since == 400.0


@given(st.lists(st.tuples(st.booleans(), st.floats(0, 3)), max_size=40))
def test_cut_off_since_the_first_failed_look_of_the_latest_run_after_having_served(
    looks: list[tuple[bool, float]],
) -> None:
    cut, now, served, since, out = CutOff(), 0.0, False, None, False
    for ok, step in looks:
        now += step
        cut.observe(ok, now)
        if ok:
            served, out = True, False
        elif served and not out:
            since, out = now, True
        assert cut.since == since


def test_majority_counts_this_node_and_a_pool_on_one_node_always_has_it() -> None:
    assert majority(1, 1) and majority(2, 3) and majority(3, 4)
    assert not majority(1, 3) and not majority(1, 2) and not majority(2, 4)


def test_the_gcs_replaced_a_shard_whose_node_it_declared_dead() -> None:
    assert gcs_answer(True) is GcsAnswer.CURRENT
    assert gcs_answer(False) is GcsAnswer.REPLACED
    assert gcs_answer(None) is GcsAnswer.CURRENT  # not listed: nobody else serves yet


def test_a_node_cut_off_alone_suspends_its_shards_within_the_lease_and_they_serve_again_after() -> None:
    fence = Fence(lease_s=8.0)
    fence.started(0.0)
    assert fence.observe(GcsAnswer.CURRENT, 3, 3, 1.0) is Standing.SERVING
    # Cut off: no GCS, neither other node answers.
    for t in range(2, 10):
        assert fence.observe(GcsAnswer.NO_ANSWER, 1, 3, float(t)) is Standing.SERVING
    assert fence.observe(GcsAnswer.NO_ANSWER, 1, 3, 9.5) is Standing.SUSPENDED
    # The checks themselves stuck (a GCS call that hangs): the lease runs out all the same.
    assert Fence(8.0, _quorum_at=0.0).decide(8.1) is Standing.SUSPENDED
    # Healed before Ray's verdict: the same incarnation serves again.
    assert fence.observe(GcsAnswer.CURRENT, 3, 3, 30.0) is Standing.SERVING


def test_a_shard_ray_replaced_never_serves_again() -> None:
    fence = Fence(lease_s=8.0)
    fence.started(0.0)
    assert fence.observe(GcsAnswer.REPLACED, 3, 3, 70.0) is Standing.FENCED
    assert fence.observe(GcsAnswer.CURRENT, 3, 3, 71.0) is Standing.FENCED
    assert fence.decide(72.0) is Standing.FENCED


def test_the_workers_go_on_serving_while_the_head_and_its_gcs_are_away() -> None:
    fence = Fence(lease_s=8.0)
    fence.started(0.0)
    for t in range(1, 120):  # two minutes of a head restart: the other worker answers
        assert fence.observe(GcsAnswer.NO_ANSWER, 2, 3, float(t)) is Standing.SERVING


def test_a_head_cut_off_alone_stops_even_though_its_gcs_answers_it() -> None:
    fence = Fence(lease_s=8.0)
    fence.started(0.0)
    for t in range(1, 20):
        standing = fence.observe(GcsAnswer.CURRENT, 1, 3, float(t))
    assert standing is Standing.SUSPENDED


@given(st.lists(st.tuples(st.sampled_from(list(GcsAnswer)), st.integers(1, 5), st.floats(0, 4)), max_size=50))
def test_a_shard_serves_only_within_a_lease_of_hearing_a_majority_and_never_after_being_replaced(
    rounds: list[tuple[GcsAnswer, int, float]],
) -> None:
    fence, now, heard, replaced = Fence(lease_s=8.0), 0.0, 0.0, False
    fence.started(0.0)
    for answer, reachable, step in rounds:
        now += step
        replaced = replaced or answer is GcsAnswer.REPLACED
        if majority(reachable, 5):
            heard = now
        standing = fence.observe(answer, reachable, 5, now)
        if replaced:
            assert standing is Standing.FENCED
        else:
            assert (standing is Standing.SERVING) == (now - heard <= 8.0)


# ---------------------------------------------------------------------------- the edge's watch


@dataclass
class FakeRouter:
    health: list[bool] = field(default_factory=list)

    def healthy(self) -> bool:
        return self.health.pop(0) if len(self.health) > 1 else self.health[0]


@dataclass
class FakeEdge:
    router: FakeRouter
    edge_id: str = "e1"
    draining: bool = False
    cut_off_since: float | None = None

    def drain(self, cut_off_since: float | None = None) -> None:
        self.draining, self.cut_off_since = True, cut_off_since


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 1.0  # one watch round a second
        return self.now


@pytest.fixture(autouse=True)
def fast_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(edge_process, "WATCH_S", 0.001)


def test_an_edge_whose_raylet_stops_answering_says_so_in_one_line_and_stops(
    capsys: pytest.CaptureFixture[str],
) -> None:
    edge = FakeEdge(FakeRouter([True]))
    answers = [True, True, *[False] * 10]
    stop = asyncio.Event()
    why = asyncio.run(
        edge_process.watch(edge, stop, lambda: answers.pop(0), 5.0, 15.0, clock=Clock())  # type: ignore[arg-type]
    )
    assert why == edge_process.LOST_RAY and stop.is_set() and not edge.draining
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lost Ray" in err[0] and "exiting" in err[0]
    assert len(answers) == 10 - 6  # lost at the sixth failed probe: 5 s of failures


def test_an_edge_cut_off_from_most_shards_drains_but_one_never_healthy_is_left_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    edge = FakeEdge(FakeRouter([True, True, *[False] * 30]))
    before = time.time()
    why = asyncio.run(edge_process.watch(edge, asyncio.Event(), lambda: True, 5.0, 15.0, clock=Clock()))  # type: ignore[arg-type]
    assert why == edge_process.CUT_OFF and edge.draining
    # The drain is told since when (wall clock) the shards were out of reach: 15 rounds before.
    assert edge.cut_off_since is not None and before - 15.0 <= edge.cut_off_since <= time.time() - 15.0
    assert "draining its sockets (1012)" in capsys.readouterr().err

    async def never_healthy() -> str | None:
        stop = asyncio.Event()
        edge = FakeEdge(FakeRouter([False]))
        task = asyncio.create_task(edge_process.watch(edge, stop, None, 5.0, 15.0, clock=Clock()))  # type: ignore[arg-type]
        await asyncio.sleep(0.2)  # well over 30 rounds
        stop.set()
        return await task

    assert asyncio.run(never_healthy()) is None


def test_joining_a_ray_whose_gcs_does_not_answer_gives_up_at_the_deadline_saying_where_it_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket
    import time

    def give_up(why: str) -> None:
        raise SystemExit(why)

    monkeypatch.setattr(edge_process, "_give_up", give_up)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed: nothing listens
    started = time.monotonic()
    # A progress line every 0.5 s instead of 10 (the same rule, without waiting out 11 s).
    with pytest.raises(SystemExit, match=f"GCS at 127.0.0.1:{port} did not answer within 2 s"):
        edge_process.join_ray(f"127.0.0.1:{port}", "presence", None, 2.0, progress_s=0.5)
    assert 2.0 <= time.monotonic() - started < 6.0
    assert capsys.readouterr().out.count("still waiting for Ray's GCS") >= 2


def test_joining_a_ray_that_refuses_at_once_gives_up_in_one_line_saying_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a partition longer than Ray's verdict the node's raylet is gone and `ray.init` fails
    at once ("No node info found matching attributes: '<node ip>'"): one line and the exit its
    supervisor restarts, not a traceback (before: the ConnectionError escaped, exit 1)."""
    import socket

    def give_up(why: str) -> None:
        raise SystemExit(why)

    def refused(*_: object, **__: object) -> None:
        try:
            raise RuntimeError("No node info found matching attributes: '10.225.25.13' when trying ...")
        except RuntimeError as e:
            raise ConnectionError("Failed to connect to Ray cluster at 10.225.25.11:6379") from e

    monkeypatch.setattr(edge_process, "_give_up", give_up)
    monkeypatch.setattr(edge_process.clients, "connect", refused)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()  # the GCS's port answers
        port = s.getsockname()[1]
        with pytest.raises(SystemExit) as gave_up:
            edge_process.join_ray(f"127.0.0.1:{port}", "presence", "10.225.25.13", 30.0)
    why = str(gave_up.value)
    assert why.startswith(f"could not join Ray at 127.0.0.1:{port} (Failed to connect to Ray cluster")
    assert "No node info found matching attributes: '10.225.25.13'" in why
    assert "\n" not in why


def test_joining_ray_in_its_thread_says_nothing_about_sigterm(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ray.init` in a thread but the main one warns that it set no SIGTERM handler; `presence
    edge` joins in one on purpose and keeps its own handler (SIGTERM drains it), but printed
    Ray's line at every start, as if SIGTERM would not. Only that line is left out."""
    import logging
    import socket

    ray_worker = logging.getLogger("ray._private.worker")

    def connect(*_: object, **__: object) -> None:  # what ray.init says, from the joining thread
        ray_worker.warning("SIGTERM handler is not set because current thread is not the main thread.")
        ray_worker.warning("something else Ray says")

    handler = logging.StreamHandler(sys.stderr)
    ray_worker.addHandler(handler)
    monkeypatch.setattr(edge_process.clients, "connect", connect)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            s.listen()  # the GCS's port answers
            edge_process.join_ray(f"127.0.0.1:{s.getsockname()[1]}", "presence", None, 30.0)
    finally:
        ray_worker.removeHandler(handler)
    err = capsys.readouterr().err
    assert "SIGTERM handler" not in err and "something else Ray says" in err
    assert not ray_worker.filters  # the filter goes with the join
