"""The clients of the pool (actors/clients.py): the typed face of each actor checked against the
class Ray runs (actors/pool.py), so a call and its actor cannot drift apart unnoticed (Ray's
handles are untyped: the protocols are what mypy checks calls by). That an edge process loads
none of actors/pool.py's world is tests/unit/test_layers.py's."""

from __future__ import annotations

import asyncio
import inspect
import logging
import typing
from typing import Any

import pytest

from actors import clients, pool
from actors.directory import SlotDirectory

# What runs inside the actors: an edge never loads it (asyncpg alone costs ~30 MB per process).
SHELL_MODULES = (
    "asyncpg",
    "actors.presence",
    "actors.flush",
    "actors.pgstore",
    "actors.directory",
    "actors.pool",
)


def _remote_members(protocol: type) -> dict[str, tuple[list[Any], Any]]:
    """name → (argument types, answer type) of each `Remote[[args], answer]` member."""
    out = {}
    for name, hint in typing.get_type_hints(protocol, vars(clients) | vars(pool) | globals()).items():
        args, answer = typing.get_args(hint)
        out[name] = (list(args), answer)
    return out


def _signature(cls: type, name: str) -> tuple[list[Any], list[bool], Any]:
    """(argument types, whether each has a default, answer type) of `cls.name`."""
    method = getattr(cls, name)
    hints = typing.get_type_hints(method)
    # Ray's tracing adds a `_ray_trace_ctx` keyword to the classes it hosts.
    params = [p for p in inspect.signature(method).parameters.values() if p.name in hints]
    return [hints[p.name] for p in params], [p.default is not p.empty for p in params], hints["return"]


@pytest.mark.parametrize(
    ("protocol", "actor"),
    [
        (clients.ShardActor, pool.ShardHost),
        (clients.DirectoryActor, SlotDirectory),
        (clients.DirectoryActor, pool.DirectoryHost),
        (clients.FlushActorCalls, pool.FlushHost),
        (pool._FlushDrain, pool.FlushHost),
    ],
)
def test_each_client_call_matches_its_actor_method(protocol: type, actor: type) -> None:
    members = _remote_members(protocol)
    assert members
    for name, (args, answer) in members.items():
        actor_args, defaults, actor_answer = _signature(actor, name)
        # The call passes the leading arguments; the rest keep their defaults.
        assert actor_args[: len(args)] == args, name
        assert all(defaults[len(args) :]), name
        assert actor_answer == answer, name


def test_the_check_sees_a_mismatch() -> None:
    class Drifted(typing.Protocol):
        stats: clients.Remote[[int], int]

    args, answer = _remote_members(Drifted)["stats"]
    assert (_signature(pool.ShardHost, "stats")[0], _signature(pool.ShardHost, "stats")[2]) != (args, answer)


class _Answer:
    """A Ray method seen through a fake handle: `.remote()` gives an awaitable answer."""

    def __init__(self, value: Any, calls: list[str], name: str) -> None:
        self.value, self.calls, self.name = value, calls, name

    def remote(self, *args: Any) -> Any:
        self.calls.append(self.name)

        async def answer() -> Any:
            return self.value

        return answer()


class _FakeShard:
    def __init__(self, version: int, calls: list[str]) -> None:
        self.wire_version = _Answer(version, calls, "wire_version")
        self.apply_and_collect = _Answer(("inc", [], (0, 0, [])), calls, "apply_and_collect")


async def test_the_ray_road_checks_the_wire_version_once_per_shard_incarnation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from actors.core.contract import WIRE_VERSION
    from actors.lane import WireMismatch, _told

    _told.clear()
    calls: list[str] = []
    client = clients.ShardClient(0, direct=False)
    client._handle = _FakeShard(WIRE_VERSION + 1, calls)  # type: ignore[assignment]
    await client.apply_and_collect("e", [], None, 0)
    await client.apply_and_collect("e", [], None, 0)
    assert calls == ["wire_version", "apply_and_collect", "apply_and_collect"]  # asked once
    far = clients.ShardClient(1, direct=False)
    with caplog.at_level("ERROR", logger="presence.lane"):
        for _ in range(3):
            far._handle = _FakeShard(WIRE_VERSION + 2, calls)  # type: ignore[assignment]
            with pytest.raises(WireMismatch, match="shard 1 speaks version"):
                await far.apply_and_collect("e", [], None, 0)
    assert calls.count("apply_and_collect") == 2  # nothing sent to the mismatched shard
    assert len([r for r in caplog.records if "version mismatch" in r.getMessage()]) == 1


async def test_callers_racing_on_a_broken_lane_open_one_new_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batches and the pull of an edge all find a restarted shard's lane broken at once: they
    must open one lane between them, not one each (each a handshake the shard takes in turn)."""
    from actors.lane import LaneClient, LaneServer

    async def apply_and_collect(edge_id: str, ops: list[Any], incarnation: Any, acked: int) -> Any:
        return "inc-1", [], (0, 0, [])

    server = LaneServer({clients.LANE_APPLY: apply_and_collect})
    host, port = await server.start("127.0.0.1")
    opened: list[LaneClient] = []
    real_open = LaneClient.open

    async def counted_open(*args: Any, **kwargs: Any) -> LaneClient:
        lane = await real_open(*args, **kwargs)
        opened.append(lane)
        return lane

    async def address() -> tuple[str, int, bytes]:
        return host, port, server.secret

    monkeypatch.setattr(LaneClient, "open", counted_open)
    client = clients.ShardClient(0, direct=True)
    monkeypatch.setattr(client, "_lane_address", address)
    try:
        await client.apply_and_collect("e", [], None, 0)
        opened[0].close()  # the shard restarted: the lane is broken
        await asyncio.gather(*(client.apply_and_collect("e", [], None, 0) for _ in range(20)))
        assert len(opened) == 2
    finally:
        client.close_lane()
        await server.close()


class _Recorded(_Answer):
    """`_Answer`, keeping the arguments of each call."""

    def __init__(self, value: Any, calls: list[str], name: str) -> None:
        super().__init__(value, calls, name)
        self.args: list[tuple[Any, ...]] = []

    def remote(self, *args: Any) -> Any:
        self.args.append(args)
        return super().remote(*args)


@pytest.mark.parametrize("version", [3, 2])
async def test_the_ray_road_sends_each_shard_the_form_its_version_reads(version: int) -> None:
    """Wire version 3's plain tuples to a shard of version 3; to a version 2 shard (a rolling
    upgrade, edges first) the typed operations it matches on."""
    from actors.core import ops

    batch: list[ops.Operation[object]] = [ops.SetStatus("alice", "s1", "dnd"), ops.PING]
    calls: list[str] = []
    shard = _FakeShard(version, calls)
    shard.apply_and_collect = _Recorded(("inc", [None, None], (0, 0, [])), calls, "apply_and_collect")
    client = clients.ShardClient(0, direct=False)
    client._handle = shard  # type: ignore[assignment]
    await client.apply_and_collect("e", batch, None, 0)
    (sent,) = shard.apply_and_collect.args
    if version >= 3:
        assert sent[1] == ops.to_wire(batch) and all(type(op) is tuple for op in sent[1])
    else:
        assert sent[1] == batch and [type(op) for op in sent[1]] == [ops.SetStatus, ops.Ping]


@pytest.mark.parametrize("version", [3, 2])
async def test_the_lane_sends_each_shard_the_form_its_version_reads(
    version: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same on the direct lane, whose handshake tells the edge the shard's version: what the
    shard unpickles is plain tuples from version 3 on, the typed operations for version 2."""
    from actors.core import ops
    from actors.lane import LaneServer

    received: list[list[Any]] = []

    async def apply_and_collect(edge_id: str, batch: list[Any], incarnation: Any, acked: int) -> Any:
        received.append(batch)
        return "inc-1", [None] * len(batch), (0, 0, [])

    server = LaneServer({clients.LANE_APPLY: apply_and_collect}, version=version)
    host, port = await server.start("127.0.0.1")

    async def address() -> tuple[str, int, bytes]:
        return host, port, server.secret

    client = clients.ShardClient(0, direct=True)
    monkeypatch.setattr(client, "_lane_address", address)
    batch: list[ops.Operation[object]] = [ops.SetStatus("a", "s1", "dnd"), ops.Watch("b", "s2", ("a",))]
    try:
        await client.apply_and_collect("e", batch, None, 0)
    finally:
        client.close_lane()
        await server.close()
    (sent,) = received
    if version >= 3:
        assert [type(op) for op in sent] == [tuple, tuple] and ops.from_wire(sent) == batch
    else:
        assert [type(op) for op in sent] == [ops.SetStatus, ops.Watch] and sent == batch


def test_joining_ray_leaves_this_process_logging_as_it_was(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ray.init(logging_config=…)` applies the config to the driver too (a handler of Ray's on the
    root logger, beside ours): `presence up` printed each of its edge's lines twice, the second
    in Ray's format. `connect` keeps the process's own logging."""
    from cluster import logs

    def init(**kwargs: Any) -> None:
        kwargs["logging_config"]._apply()  # what ray.init does with it in the driver

    monkeypatch.setattr(clients.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(clients.ray, "init", init)
    logs.configure("WARNING")
    try:
        clients.connect(None, "presence", logging_config=logs.ray_logging_config("INFO", False))
        logging.getLogger("presence.edge").warning("edge draining")
        logging.getLogger("presence.edge").info("not shown")
    finally:
        logs.configure("WARNING")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].endswith("WARNING presence.edge: edge draining"), lines
