"""The one frame builder (actors/core/frames.py) against the contract's models (edge/protocol.py).

Every kind of frame the builder makes validates against its pydantic model and serialises to the
bytes the model would (the same keys, in the builder's order); every server frame model has a
builder; internal frames are recognised from their payload exactly as the shard writes them and
never mistaken for client frames (or the other way round).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from actors.core import frames as f
from actors.core.contract import iso_ms
from edge import protocol as p
from tests.unit.conftest import T0

ids = st.text(min_size=1, max_size=20)
statuses = st.sampled_from(["online", "idle", "dnd", "invisible", "offline"])
visibilities = st.sampled_from(["everyone", "friends", "nobody"])
codes = st.sampled_from(["bad_frame", "too_many_ids", "rate_limited", "not_allowed"])
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)

# Arguments for each client builder (by the frame's type), drawn by hypothesis.
ARGUMENTS: dict[str, st.SearchStrategy[tuple[Any, ...]]] = {
    "ready": st.tuples(ids, ids, statuses, st.integers(0, 10**9)),
    "heartbeat.ack": st.just(()),
    "presence.sync": st.tuples(st.lists(st.tuples(ids, statuses), max_size=5)),
    "presence.changed": st.tuples(ids, statuses, st.none() | times.map(iso_ms)),
    "presence.self": st.tuples(statuses),
    "typing": st.tuples(ids, ids),
    "voice.roster": st.tuples(ids, st.lists(ids, max_size=5)),
    "error": st.tuples(codes, st.text(max_size=50)),
}
MODELS: dict[str, type[Any]] = {model.model_fields["type"].default: model for model in p.SERVER_FRAMES}


def test_every_server_model_has_a_builder_and_every_builder_a_model() -> None:
    assert set(MODELS) == set(f.CLIENT_BUILDERS) == set(ARGUMENTS)
    assert not set(f.INTERNAL_BUILDERS) & set(MODELS)
    assert all(kind.startswith("_") for kind in f.INTERNAL_BUILDERS)


@given(st.data())
def test_every_frame_the_builder_makes_is_its_models(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(sorted(f.CLIENT_BUILDERS)))
    builder: Callable[..., f.Frame] = f.CLIENT_BUILDERS[kind]  # type: ignore[assignment]
    frame = builder(*data.draw(ARGUMENTS[kind]))
    assert frame["type"] == kind
    assert next(iter(frame)) == "type"  # first: how a payload is recognised without parsing it
    model = MODELS[kind].model_validate(frame)
    # The same bytes as the model's own serialisation: no field added, renamed or reordered.
    assert f.text(frame) == model.model_dump_json(exclude_none=True)
    assert orjson.loads(f.text(frame)) == frame


def test_the_wire_bytes_of_the_builder() -> None:
    """Byte for byte what the conformance kit and the clients read."""
    assert f.text(f.changed("u1", "idle")) == '{"type":"presence.changed","userId":"u1","status":"idle"}'
    assert (
        f.text(f.changed("u1", "offline", "2026-12-02T08:47:00.000Z"))
        == '{"type":"presence.changed","userId":"u1","status":"offline",'
        '"lastSeenAt":"2026-12-02T08:47:00.000Z"}'
    )
    assert f.HEARTBEAT_ACK_TEXT == '{"type":"heartbeat.ack"}'
    assert (
        f.text(f.sync([("a", "online")]))
        == '{"type":"presence.sync","users":[{"userId":"a","status":"online"}]}'
    )
    assert (
        f.text(f.ready("u", "s-1", "dnd", 30000))
        == '{"type":"ready","userId":"u","socketId":"s-1","status":"dnd","heartbeatIntervalMs":30000}'
    )


@given(ids, statuses)
def test_a_change_is_read_back_from_its_payload(user: str, status: str) -> None:
    assert f.changed_about(f.text(f.changed(user, status))) == (user, status)
    assert f.changed_about(f.text(f.self_status(status))) is None
    assert f.changed_about(f.text(f.typing(user, user))) is None


@given(visibilities, statuses, times)
def test_internal_frames_are_read_back_as_notes(visibility: str, status: str, at: float) -> None:
    assert f.internal_note(f.text(f.settings_note(visibility, at))) == f.SettingsNote(visibility, at)
    assert f.internal_note(f.text(f.chosen_note(status, at))) == f.ChosenNote(status, at)
    assert f.is_internal(f.text(f.settings_note(visibility, at)))
    assert f.changed_about(f.text(f.chosen_note(status, at))) is None


@given(st.data())
def test_client_frames_are_not_internal(data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(sorted(f.CLIENT_BUILDERS)))
    builder: Callable[..., f.Frame] = f.CLIENT_BUILDERS[kind]  # type: ignore[assignment]
    payload = f.text(builder(*data.draw(ARGUMENTS[kind])))
    assert not f.is_internal(payload)
    assert f.internal_note(payload) is None


def test_ids_that_look_internal_are_not() -> None:
    for frame in (f.changed("_x", "online"), f.error("bad_frame", "_settings")):
        assert not f.is_internal(f.text(frame))


def test_an_unknown_internal_frame_is_kept_from_clients_but_means_nothing() -> None:
    text = f.text({"type": "_future", "x": 1})
    assert f.is_internal(text) and f.internal_note(text) is None
    assert f.internal_note(f.text(f.settings_note("nobody", T0))) == f.SettingsNote("nobody", T0)


def test_type_of_reads_the_type_orjson_writes_first() -> None:
    assert f.type_of(f.text(f.self_status("dnd"))) == "presence.self"
    assert f.type_of(f.text(f.changed("u1", "idle"))) == "presence.changed"
    assert f.type_of('{"userId":"u1"}') == ""
    assert f.type_of('{"type":"') == ""
