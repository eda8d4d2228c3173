"""docs/asyncapi.yaml is generated from edge/protocol.py and must stay in step with it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from edge import protocol as p

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "docs" / "gen_asyncapi.py"
COMMITTED = ROOT / "docs" / "asyncapi.yaml"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_asyncapi", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_committed_asyncapi_matches_the_models() -> None:
    assert COMMITTED.exists(), "docs/asyncapi.yaml is missing: run python docs/gen_asyncapi.py"
    assert COMMITTED.read_text() == gen.render(), (
        "docs/asyncapi.yaml is out of date with edge/protocol.py: run python docs/gen_asyncapi.py"
    )


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    loaded = yaml.safe_load(COMMITTED.read_text())
    assert isinstance(loaded, dict)
    return loaded


def _types(models: tuple[type[Any], ...]) -> list[str]:
    return [gen._frame_type(m) for m in models]


def test_every_frame_is_a_message_in_its_direction(doc: dict[str, Any]) -> None:
    assert doc["asyncapi"] == "2.6.0"
    channel = doc["channels"]["/ws/presence"]
    refs = {
        direction: [r["$ref"].rsplit("/", 1)[1] for r in channel[direction]["message"]["oneOf"]]
        for direction in ("publish", "subscribe")
    }
    assert refs["publish"] == _types(p.CLIENT_FRAMES)  # publish: what clients send (AsyncAPI 2.x)
    assert refs["subscribe"] == _types(p.SERVER_FRAMES)
    messages = doc["components"]["messages"]
    assert set(messages) == set(refs["publish"]) | set(refs["subscribe"])
    for name, message in messages.items():
        target = message["payload"]["$ref"].rsplit("/", 1)[1]
        assert target in doc["components"]["schemas"], name
        assert doc["components"]["schemas"][target]["properties"]["type"]["const"] == name
        assert "type" in doc["components"]["schemas"][target]["required"]


def test_examples_are_frames_the_code_accepts_and_sends(doc: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    components = doc["components"]
    by_type = {gen._frame_type(m): m for m in (*p.CLIENT_FRAMES, *p.SERVER_FRAMES)}
    client = set(_types(p.CLIENT_FRAMES))
    for name, message in components["messages"].items():
        for example in message["examples"]:
            payload = example["payload"]
            schema = {"$ref": message["payload"]["$ref"], "components": components}
            jsonschema.Draft202012Validator(schema).validate(payload)
            if name in client:
                assert p.parse_client_frame(json.dumps(payload)) is not None
            else:
                by_type[name].model_validate(payload)


def test_schemas_refuse_what_the_edge_refuses(doc: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    components = doc["components"]

    def valid(model: str, payload: dict[str, Any]) -> bool:
        schema = {"$ref": f"#/components/schemas/{model}", "components": components}
        return bool(jsonschema.Draft202012Validator(schema).is_valid(payload))

    assert not valid("PresenceUpdateFrame", {"type": "presence.update", "status": "offline"})
    assert not valid("PresenceUpdateFrame", {"type": "presence.update", "status": "online", "extra": 1})
    assert not valid("PresenceQueryFrame", {"type": "presence.query", "userIds": [""]})
    assert not valid("SettingsUpdateFrame", {"type": "settings.update", "lastSeenVisibility": "some"})
    # Server frames: an optional field is absent, never null.
    assert valid("PresenceChanged", {"type": "presence.changed", "userId": "u", "status": "offline"})
    assert not valid(
        "PresenceChanged",
        {"type": "presence.changed", "userId": "u", "status": "offline", "lastSeenAt": None},
    )


def test_close_and_error_codes_are_listed(doc: dict[str, Any]) -> None:
    codes = {c["code"] for c in doc["x-close-codes"]}
    for name in dir(p):
        if name.startswith("CLOSE_"):
            assert getattr(p, name) in codes, name
    assert doc["x-error-codes"] == ["bad_frame", "too_many_ids", "rate_limited", "not_allowed"]
