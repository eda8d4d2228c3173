"""cluster/edge_process.py `interrupt`: a stop asked for during the start-up is not lost where
Python ignores the KeyboardInterrupt it raises. Once in a full suite, `kill -INT` landed while
Ray started its processes, in an at-fork callback ("Exception ignored in: <function
_releaseLock>"); `presence up` came up anyway and was killed 150 s later. Real signals to this
process; the handler is put back after each test."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from cluster import edge_process
from cluster.edge_process import interrupt, raise_if_interrupted, step


@pytest.fixture
def interruptible() -> Iterator[None]:
    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        edge_process._interrupted.clear()


def swallowed_interrupt() -> str:
    """A step during which the signal lands where its KeyboardInterrupt is swallowed."""
    try:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1_000_000):  # the handler runs at the next bytecode boundary
            pass
    except KeyboardInterrupt:
        pass  # as Python does in an at-fork callback or a finaliser
    return "done"


def test_a_stop_swallowed_during_a_step_stops_the_start_up_after_it(interruptible: None) -> None:
    with pytest.raises(KeyboardInterrupt):
        step("starting something", swallowed_interrupt)


def test_without_a_stop_the_steps_go_on(interruptible: None) -> None:
    assert step("starting something", lambda: "done") == "done"
    raise_if_interrupted()  # nothing asked for: no KeyboardInterrupt


def test_the_handler_still_raises_where_the_signal_lands(interruptible: None) -> None:
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1_000_000):
            pass
    with pytest.raises(KeyboardInterrupt):
        raise_if_interrupted()  # and it is remembered


def test_a_signal_while_the_edge_starts_lets_the_start_end_then_stops_it(
    interruptible: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop's handlers are in place before the edge starts: a SIGTERM then no longer raises
    KeyboardInterrupt inside the loop, halfway through the edge's Ray calls (closing the loop
    then waited for ever on them, and `presence up` was killed 150 s later); the start ends, the
    edge stops, and the start-up's way out follows (KeyboardInterrupt)."""
    import asyncio

    from edge.server import Edge, EdgeConfig

    happened: list[str] = []

    async def start(self: Edge) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.sleep(0.05)  # the start's own work, during which the signal is handled
        happened.append("started")

    async def stop(self: Edge) -> None:
        happened.append("stopped")

    monkeypatch.setattr(Edge, "start", start)
    monkeypatch.setattr(Edge, "stop", stop)
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(
                edge_process.serve_edge(
                    EdgeConfig(secret="s" * 32, redis_url=None), lambda edge: happened.append("served")
                )
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert happened == ["started", "stopped"]


def test_a_stop_swallowed_before_the_edge_serves_starts_no_edge(
    interruptible: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    from edge.server import Edge, EdgeConfig

    started: list[bool] = []

    async def start(self: Edge) -> None:
        started.append(True)

    monkeypatch.setattr(Edge, "start", start)
    edge_process._interrupted.append(signal.SIGINT)  # as `interrupt` left it, its exception lost
    with pytest.raises(KeyboardInterrupt):
        asyncio.run(edge_process.serve_edge(EdgeConfig(secret="s" * 32, redis_url=None), lambda edge: None))
    assert started == []


def test_an_edge_drained_over_the_internal_api_does_not_say_it_is_stopping(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`presence drain` on one machine: `presence up` starts a new edge on the ports and goes on,
    but printed `stopping: closing sockets …` first (the sockets were closed already, and nothing
    was stopping). A signal's stop still says it."""
    import asyncio

    from edge.server import Edge, EdgeConfig

    async def nothing(self: Edge) -> None:
        pass

    monkeypatch.setattr(Edge, "start", nothing)
    monkeypatch.setattr(Edge, "stop", nothing)
    config = EdgeConfig(secret="s" * 32, redis_url=None)
    why = asyncio.run(edge_process.serve_edge(config, lambda edge: edge.drained.set()))
    assert why == edge_process.DRAINED
    assert "stopping" not in capsys.readouterr().out

    async def interrupted() -> str | None:
        before = signal.getsignal(signal.SIGINT)
        served = asyncio.create_task(edge_process.serve_edge(config, lambda edge: None))
        async with asyncio.timeout(5):  # until the loop's handler is in place, not a guess at when
            while signal.getsignal(signal.SIGINT) is before:
                await asyncio.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)  # the loop's handler: stop
        return await served

    assert asyncio.run(interrupted()) is None
    assert "stopping: closing sockets" in capsys.readouterr().out
