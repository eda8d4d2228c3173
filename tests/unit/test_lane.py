"""The direct lane (actors/lane.py) on loopback, no Ray: calls and their replies, order, the
secret, failures as an edge must see them (a shard that dies mid-call, a wrong secret, a frame too
big, a handler that raises, a pull that times out)."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import socket
import struct
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from actors import lane
from actors.core.contract import OLDEST_EDGE
from actors.lane import Handler, LaneBroken, LaneClient, LaneRemoteError, LaneServer


class Shard:
    """Handlers that record what they were asked, in order, and can be held back."""

    def __init__(self) -> None:
        self.applied: list[Any] = []
        self.release = asyncio.Event()
        self.unpickled = 0

    async def apply_and_collect(self, edge_id: str, ops: list[Any], incarnation: Any, acked: int) -> Any:
        self.applied.append(ops)
        return "inc-1", [f"ok:{op}" for op in ops], (0, 0, [])

    async def pull(self, edge_id: str, incarnation: Any, acked: int, wait_s: float, resend: bool) -> Any:
        await asyncio.wait_for(self.release.wait(), wait_s)
        return "inc-1", (0, 1, [(("s1",), "frame")])

    async def fail(self) -> None:
        raise KeyError("secret-free message")


def _handlers(shard: Shard) -> dict[str, Handler]:
    return {"apply_and_collect": shard.apply_and_collect, "pull": shard.pull, "fail": shard.fail}


async def _serve(shard: Shard) -> tuple[LaneServer, str, int]:
    server = LaneServer(_handlers(shard))
    host, port = await server.start("127.0.0.1")
    return server, host, port


@contextlib.asynccontextmanager
async def _lane(handlers: dict[str, Handler]) -> AsyncIterator[tuple[LaneServer, LaneClient]]:
    """A shard's lane serving `handlers` on loopback and an edge connected to it; both closed after."""
    server = LaneServer(handlers)
    host, port = await server.start("127.0.0.1")
    client = await LaneClient.open(host, port, server.secret)
    try:
        yield server, client
    finally:
        client.close()
        await server.close()


async def test_a_call_returns_what_the_shard_answered() -> None:
    shard = Shard()
    async with _lane(_handlers(shard)) as (_, client):
        incarnation, results, chunk = await client.call("apply_and_collect", "edge-1", ["a", "b"], None, 0)
        assert (incarnation, results, chunk) == ("inc-1", ["ok:a", "ok:b"], (0, 0, []))


async def test_batches_are_applied_in_the_order_sent_and_a_waiting_pull_does_not_block_them() -> None:
    shard = Shard()
    async with _lane(_handlers(shard)) as (_, client):
        pull = asyncio.ensure_future(client.call("pull", "edge-1", None, 0, 5.0, False))
        batches = [client.call("apply_and_collect", "edge-1", [i], None, 0) for i in range(50)]
        answers = await asyncio.gather(*batches)
        assert shard.applied == [[i] for i in range(50)]
        assert [a[1] for a in answers] == [[f"ok:{i}"] for i in range(50)]
        assert not pull.done()  # replies come back out of order: the pull still waits
        shard.release.set()
        assert await pull == ("inc-1", (0, 1, [(("s1",), "frame")]))


async def test_an_immediate_handler_answers_without_a_task_and_later_calls_wait_behind_a_task() -> None:
    """A shard answers a batch it can apply at once without a task (`immediate`); one that must
    wait (it answers LATER) goes to the coroutine handler, and every later call of the same
    connection goes to a task behind it, started in order, so one edge's batches still apply in
    the order sent."""
    applied: list[Any] = []
    release = asyncio.Event()

    def now(edge_id: str, ops: list[Any], incarnation: Any, acked: int) -> Any:
        if ops == ["slow"]:
            return lane.LATER
        applied.append(ops)
        return "inc-1", ["now"], (0, 0, [])

    turn = asyncio.Lock()  # as the shard's per-edge order: tasks apply in the order they started

    async def later(edge_id: str, ops: list[Any], incarnation: Any, acked: int) -> Any:
        async with turn:
            if ops == ["slow"]:
                await release.wait()
            applied.append(ops)
        return "inc-1", ["later"], (0, 0, [])

    server = LaneServer({"apply_and_collect": later}, immediate={"apply_and_collect": now})
    host, port = await server.start("127.0.0.1")
    client = await LaneClient.open(host, port, server.secret)
    try:
        assert (await client.call("apply_and_collect", "e", ["a"], None, 0))[1] == ["now"]
        slow = asyncio.ensure_future(client.call("apply_and_collect", "e", ["slow"], None, 0))
        behind = asyncio.ensure_future(client.call("apply_and_collect", "e", ["b"], None, 0))
        # A window in which both must keep waiting for the slow one: nothing marks that they wait.
        done, _ = await asyncio.wait({slow, behind}, timeout=0.05)
        assert not done
        release.set()
        assert (await slow)[1] == ["later"] and (await behind)[1] == ["later"]
        assert (await client.call("apply_and_collect", "e", ["c"], None, 0))[1] == ["now"]  # caught up
        assert applied == [["a"], ["slow"], ["b"], ["c"]]
    finally:
        client.close()
        await server.close()


async def test_a_timeout_fails_that_call_only_and_the_lane_stays_open() -> None:
    shard = Shard()
    async with _lane(_handlers(shard)) as (_, client):
        with pytest.raises(TimeoutError):
            await client.call("pull", "edge-1", None, 0, 5.0, False, timeout_s=0.05)
        assert not client.broken
        assert (await client.call("apply_and_collect", "e", ["x"], None, 0))[1] == ["ok:x"]


async def test_an_exception_in_the_shard_reaches_the_caller_by_type_and_keeps_the_lane() -> None:
    shard = Shard()
    async with _lane(_handlers(shard)) as (_, client):
        with pytest.raises(LaneRemoteError, match="KeyError"):
            await client.call("fail")
        with pytest.raises(LaneRemoteError, match="LookupError: no lane method 'drop_tables'"):
            await client.call("drop_tables")
        assert not client.broken


class ShardSuspended(TimeoutError):
    """As actors/pool.py's: a refusal the edge retries."""


async def test_a_refusal_of_a_timeout_subclass_reaches_the_edge_as_a_timeout_it_retries() -> None:
    """A suspended shard's refusal: the edge's retry rules know TimeoutError, not the subclass.
    Before, it came back as a LaneRemoteError, which nothing retried (a cut-off edge's drain
    lost its departures when its own node's shard was still suspended after the heal)."""

    async def suspended() -> None:
        raise ShardSuspended("shard 5 is suspended (cut off from most nodes)")

    async with _lane({"suspended": suspended}) as (_, client):
        with pytest.raises(TimeoutError, match="TimeoutError: ShardSuspended: shard 5 is suspended"):
            await client.call("suspended")
        assert not client.broken


def test_a_refusal_named_by_a_shard_of_the_release_before_is_a_timeout_too() -> None:
    """Shards before this change sent the subclass's own name."""
    error = lane._remote_error("ShardSuspended", "shard 5 is suspended")
    assert type(error) is TimeoutError and str(error) == "ShardSuspended: shard 5 is suspended"
    assert type(lane._remote_error("KeyError", "x")) is LaneRemoteError


async def test_a_shard_that_goes_away_fails_every_call_in_flight_and_every_later_one() -> None:
    async with _lane(_handlers(Shard())) as (server, client):
        pulls = [asyncio.ensure_future(client.call("pull", "e", None, 0, 30.0, False)) for _ in range(3)]
        await asyncio.sleep(0)  # one turn of the loop: the three calls are sent
        await server.close()  # the shard's process died: its connections close with it
        for pull in pulls:
            with pytest.raises(LaneBroken):
                await asyncio.wait_for(pull, 5.0)
        assert client.broken
        with pytest.raises(LaneBroken):
            await client.call("apply_and_collect", "e", ["x"], None, 0)


async def test_nothing_is_unpickled_from_a_connection_that_cannot_prove_the_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shard = Shard()
    server, host, port = await _serve(shard)
    loads = pickle.loads
    calls: list[bytes] = []

    def counting_loads(data: bytes, /, **kwargs: Any) -> Any:
        calls.append(data)
        return loads(data, **kwargs)

    monkeypatch.setattr(pickle, "loads", counting_loads)  # the module the lane unpickles with
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"n" * lane.EDGE_HELLO_BYTES)
    await reader.readexactly(lane.SHARD_HELLO_BYTES)  # the shard's nonce, version and proof
    writer.write(b"x" * 32)  # not the proof
    writer.write(lane.encode(pickle.dumps((1, "apply_and_collect", ("e", ["evil"], None, 0)))))
    assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed, nothing answered
    assert calls == [] and shard.applied == []
    assert server.refused == 1
    writer.close()
    await server.close()


async def test_the_secret_never_crosses_the_wire() -> None:
    server, host, port = await _serve(Shard())
    seen = bytearray()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                seen.extend(data)
                dst.write(data)
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer), return_exceptions=True)

    spy = await asyncio.start_server(relay, "127.0.0.1", 0)
    client = await LaneClient.open("127.0.0.1", spy.sockets[0].getsockname()[1], server.secret)
    assert (await client.call("apply_and_collect", "e", ["x"], None, 0))[1] == ["ok:x"]
    assert server.secret not in bytes(seen)
    client.close()
    spy.close()
    await server.close()


async def test_an_edge_sends_nothing_to_a_listener_that_does_not_know_the_secret() -> None:
    received = bytearray()
    hung_up = asyncio.Event()

    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.extend(await reader.readexactly(lane.EDGE_HELLO_BYTES))
        writer.write(b"s" * lane.SHARD_HELLO_BYTES)
        received.extend(await reader.read())  # everything until the client hangs up
        hung_up.set()

    squatter = await asyncio.start_server(impostor, "127.0.0.1", 0)
    with pytest.raises(LaneBroken, match="does not know the shard's secret"):
        await LaneClient.open("127.0.0.1", squatter.sockets[0].getsockname()[1], b"k" * 32)
    await asyncio.wait_for(hung_up.wait(), 5.0)
    assert len(received) == lane.EDGE_HELLO_BYTES  # its hello, then nothing: no proof, no call
    squatter.close()


async def test_a_silent_connection_is_dropped_and_handshakes_over_the_cap_wait_their_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lane, "HANDSHAKE_S", 0.3)
    monkeypatch.setattr(lane, "HANDSHAKES_PER_SOURCE", 3)
    monkeypatch.setattr(lane, "WAITING_PER_SOURCE", 1)
    server, host, port = await _serve(Shard())
    silent = [await asyncio.open_connection(host, port) for _ in range(3)]
    await _until(lambda: server.handshakes_in_progress == 3)
    # The fourth from the same address waits its turn (issue 29: queued, not refused) ...
    waiting = asyncio.create_task(LaneClient.open(host, port, server.secret))
    # A window in which it must keep waiting: nothing marks that it was not let in.
    await asyncio.sleep(0.05)
    assert not waiting.done()
    # ... and a fifth finds the line full: refused.
    reader, writer = await asyncio.open_connection(host, port)
    assert await asyncio.wait_for(reader.read(), 5.0) == b""
    for r, w in silent:  # each dropped once its handshake time ran out
        assert await asyncio.wait_for(r.read(), 5.0) == b""
        w.close()
    client = await asyncio.wait_for(waiting, 5.0)  # its turn came
    assert (await client.call("apply_and_collect", "e", ["x"], None, 0))[1] == ["ok:x"]
    client.close()
    writer.close()
    await server.close()


async def _until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        # The polling interval.
        await asyncio.sleep(0.01)


async def test_a_real_edge_connects_while_another_source_holds_the_maximum() -> None:
    """Issue 29: 64 silent connections from 127.0.0.2 (the old cap for everybody) and more
    behind them; the edge on 127.0.0.1 still connects at once."""
    server, host, port = await _serve(Shard())
    attackers = []
    for _ in range(lane.MAX_HANDSHAKES + 16):
        attackers.append(await asyncio.open_connection(host, port, local_addr=("127.0.0.2", 0)))
    await _until(lambda: server.handshakes_in_progress >= lane.HANDSHAKES_PER_SOURCE)
    await asyncio.sleep(0.05)  # every attacker's connection reached the shard
    for _ in range(8):
        client = await LaneClient.open(host, port, server.secret, timeout_s=1.0)
        assert (await client.call("apply_and_collect", "e", ["x"], None, 0))[1] == ["ok:x"]
        client.close()
    assert server.handshakes_in_progress <= lane.HANDSHAKES_PER_SOURCE
    for _, w in attackers:
        w.close()
    await server.close()


async def test_a_frame_longer_than_the_limit_closes_the_connection_before_reading_it() -> None:
    async with _lane(_handlers(Shard())) as (_, client):
        transport = client._connection.transport
        assert transport is not None
        transport.write(struct.pack("!I", lane.MAX_FRAME_BYTES + 1))
        with pytest.raises(LaneBroken):
            await asyncio.wait_for(client.call("pull", "e", None, 0, 5.0, False), 5.0)


async def test_errors_the_edge_retries_keep_their_type_and_an_answer_that_cannot_be_sent_fails_its_call() -> (
    None
):
    class Local:  # defined in a function: pickle cannot name it
        pass

    async def value_error() -> None:
        raise ValueError("not registered yet")

    async def unpicklable() -> Any:
        return Local()

    async with _lane({"value_error": value_error, "unpicklable": unpicklable}) as (_, client):
        with pytest.raises(ValueError, match="not registered yet"):
            await client.call("value_error")
        with pytest.raises(LaneRemoteError):
            await asyncio.wait_for(client.call("unpicklable"), 5.0)
        assert not client.broken


async def test_a_connection_that_goes_cancels_its_waiting_pulls_so_their_mail_stays() -> None:
    cancelled, pulling = asyncio.Event(), asyncio.Event()

    async def pull(*_args: Any) -> Any:
        pulling.set()
        try:
            # A pull that waits for mail which never comes: it only ends by being cancelled.
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with _lane({"pull": pull}) as (_, client):
        waiting = asyncio.ensure_future(client.call("pull"))
        await asyncio.wait_for(pulling.wait(), 5.0)  # the shard is in the pull
        client.close()
        await asyncio.wait_for(cancelled.wait(), 5.0)
        with pytest.raises(LaneBroken):
            await waiting


async def test_a_shard_that_does_not_listen_is_a_broken_lane() -> None:
    server, host, port = await _serve(Shard())
    await server.close()
    with pytest.raises(LaneBroken):
        await LaneClient.open(host, port, server.secret, timeout_s=2.0)


async def test_adjacent_wire_versions_work_together() -> None:
    """A rolling upgrade runs edges and shards of two consecutive releases side by side."""
    shard = Shard()
    server = LaneServer(_handlers(shard), version=lane.WIRE_VERSION + 1)
    host, port = await server.start("127.0.0.1")
    client = await LaneClient.open(host, port, server.secret)  # this release's version
    assert (await client.call("apply_and_collect", "e", ["x"], None, 0))[1] == ["ok:x"]
    client.close()
    await server.close()


async def test_a_wire_version_too_far_is_refused_with_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """Not an unpickling error: the edge refuses before any pickle crosses, and says why once,
    however often its router tries again."""
    lane._told.clear()
    shard = Shard()
    server = LaneServer(_handlers(shard), version=lane.WIRE_VERSION + 2)
    host, port = await server.start("127.0.0.1")
    with caplog.at_level("ERROR", logger="presence.lane"):
        for _ in range(3):
            with pytest.raises(lane.WireMismatch, match="version mismatch"):
                await LaneClient.open(host, port, server.secret)
    lines = [r.getMessage() for r in caplog.records if "version mismatch" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"speaks version {lane.WIRE_VERSION + 2}, this process {lane.WIRE_VERSION}" in lines[0]
    assert shard.applied == []
    await server.close()


async def test_a_shard_refuses_an_edge_too_far_even_with_the_secret(caplog: pytest.LogCaptureFixture) -> None:
    """An edge of an old release that does not check: the shard refuses it after its proof,
    before unpickling anything, with one line."""
    lane._told.clear()
    shard = Shard()
    server, host, port = await _serve(shard)
    reader, writer = await asyncio.open_connection(host, port)
    edge_hello = b"n" * lane.NONCE_BYTES + struct.pack("!H", lane.WIRE_VERSION + 5)
    writer.write(edge_hello)
    answer = await reader.readexactly(lane.SHARD_HELLO_BYTES)
    shard_hello = answer[: lane.NONCE_BYTES + 2]
    with caplog.at_level("ERROR", logger="presence.lane"):
        writer.write(lane._proof(server.secret, b"edge", edge_hello, shard_hello))
        writer.write(lane.encode(pickle.dumps((1, "apply_and_collect", ("e", ["x"], None, 0)))))
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed, nothing answered
    assert shard.applied == [] and server.refused == 1
    assert any("an edge speaks version" in r.getMessage() for r in caplog.records)
    writer.close()
    await server.close()


async def test_an_edge_older_than_the_plain_wire_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    """Wire version 3 sends a publication's address as a plain `(user_id, own)`; a version 2 edge
    would take it for two socket ids and deliver nothing, so this release's shard refuses it, with
    one line that says which side to upgrade."""
    lane._told.clear()
    shard = Shard()
    server, host, port = await _serve(shard)
    refused = (lane.LaneBroken, ConnectionError, asyncio.IncompleteReadError, lane.WireMismatch)
    with caplog.at_level("ERROR", logger="presence.lane"), pytest.raises(refused):
        client = await LaneClient.open(host, port, server.secret, version=OLDEST_EDGE - 1)
        await client.call("apply_and_collect", "e", [], None, 0, timeout_s=5.0)
    assert shard.applied == [] and server.refused == 1
    lines = [r.getMessage() for r in caplog.records if "an edge speaks version" in r.getMessage()]
    assert len(lines) == 1 and f"an edge speaks version {OLDEST_EDGE - 1}" in lines[0], lines
    assert "upgrade the edges first" in lines[0]
    await server.close()


def test_a_lane_whose_loop_has_ended_is_broken_so_the_next_loop_opens_its_own() -> None:
    # A benchmark runs each phase in its own asyncio.run: a lane left from the last phase's loop
    # has nobody reading its socket, and a call on it used to wait forever.
    shard_loop = asyncio.new_event_loop()
    thread = threading.Thread(target=shard_loop.run_forever, daemon=True)
    thread.start()
    try:
        server, host, port = asyncio.run_coroutine_threadsafe(_serve(Shard()), shard_loop).result(10)

        async def open_and_call() -> LaneClient:
            client = await LaneClient.open(host, port, server.secret)
            assert await client.call("apply_and_collect", "edge-1", ["a"], None, 0)
            assert not client.broken
            return client

        client = asyncio.run(open_and_call())
        assert client.broken
        asyncio.run_coroutine_threadsafe(server.close(), shard_loop).result(10)
    finally:
        shard_loop.call_soon_threadsafe(shard_loop.stop)
        thread.join(10)
        shard_loop.close()


async def test_a_vanished_node_is_noticed_before_ray_declares_it_dead() -> None:
    """Both ends of a lane tell a silent peer dead within ~8 s, idle (keepalive) or busy
    (unacknowledged data): before Ray's earliest verdict on a dead node (10 s of failed health
    checks), so an edge whose pull waited on a shard of that node asks Ray for its restarted
    address as soon as it exists (with 30 s, its watchers heard 20 s after the shard was back)."""
    async with _lane({"pull": lambda: asyncio.sleep(0)}) as (_, client):
        transport = client._connection.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        idle = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE)
        interval = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL)
        count = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE)
        assert idle + interval * count <= 8
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) <= 8_000
