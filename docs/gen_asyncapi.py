"""Generate docs/asyncapi.yaml (AsyncAPI 2.6) from the frame models in edge/protocol.py.

    python docs/gen_asyncapi.py            # rewrite docs/asyncapi.yaml
    python docs/gen_asyncapi.py --check    # exit 1 when the committed file is out of date

The payload schemas are pydantic's `model_json_schema` of `CLIENT_FRAMES` (validation mode: what
the edge accepts) and `SERVER_FRAMES` (serialization mode: what it sends), so the document cannot
drift from the code; tests/unit/test_asyncapi_sync.py regenerates it in memory and compares. The
summaries and examples below are the contract's own words (docs/protocol.md has the decisions).
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edge import protocol as p  # noqa: E402

OUT = ROOT / "docs" / "asyncapi.yaml"
WS_PATH = "/ws/presence"  # fixed by the contract (edge.server.WS_PATH)
REF = "#/components/schemas/{model}"

# What each frame means, in the contract's words: (summary, example payload).
CLIENT: dict[str, tuple[str, dict[str, Any]]] = {
    "identify": (
        "Authenticate as the first frame (or send `Authorization: Bearer TOKEN` on the upgrade). "
        "Within 10 s, else close 4001.",
        {"type": "identify", "token": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ1MSJ9.c2lnbmF0dXJl"},
    ),
    "heartbeat": (
        "Keeps the socket alive; answered with heartbeat.ack. Any frame refreshes liveness; "
        "a socket silent for 90 s is closed (4000).",
        {"type": "heartbeat"},
    ),
    "presence.update": (
        "Choose online, dnd or invisible for the account; idle marks only this socket "
        "(online also wakes it).",
        {"type": "presence.update", "status": "dnd"},
    ),
    "presence.subscribe": (
        "Start receiving the changes of these accounts; answered once with presence.sync.",
        {"type": "presence.subscribe", "userIds": ["u2", "u3"]},
    ),
    "presence.unsubscribe": (
        "Stop receiving their changes.",
        {"type": "presence.unsubscribe", "userIds": ["u3"]},
    ),
    "presence.query": (
        "Ask for status and last-seen, at most 100 ids; answered with one presence.changed per "
        "visible id, in the order asked.",
        {"type": "presence.query", "userIds": ["u2", "u3"]},
    ),
    "focus": ("The channel this socket has focused; null for none.", {"type": "focus", "channelId": "c1"}),
    "channel.subscribe": (
        "Receive the channel's typing and voice events (needs membership of its server).",
        {"type": "channel.subscribe", "channelId": "c1"},
    ),
    "channel.unsubscribe": ("Stop.", {"type": "channel.unsubscribe", "channelId": "c1"}),
    "typing.start": (
        "The account is typing in the channel; lapses after 10 s unless repeated.",
        {"type": "typing.start", "channelId": "c1"},
    ),
    "typing.stop": ("Stopped typing.", {"type": "typing.stop", "channelId": "c1"}),
    "voice.join": (
        "This socket joins the channel's voice roster (leaving any other).",
        {"type": "voice.join", "channelId": "c1"},
    ),
    "voice.leave": ("This socket leaves its voice roster.", {"type": "voice.leave"}),
    "settings.update": (
        "Who may read this account's last-seen time: everyone, friends or nobody (reciprocal). "
        "Durable, effective at once, no answer frame.",
        {"type": "settings.update", "lastSeenVisibility": "friends"},
    ),
}
SERVER: dict[str, tuple[str, dict[str, Any]]] = {
    "ready": (
        "After authentication; status is the account's real status (may be invisible or dnd).",
        {
            "type": "ready",
            "userId": "u1",
            "socketId": "s-3f9c2a",
            "status": "online",
            "heartbeatIntervalMs": 30000,
        },
    ),
    "heartbeat.ack": ("Answer to heartbeat.", {"type": "heartbeat.ack"}),
    "presence.sync": (
        "Once after each presence.subscribe: the current status of every id of that frame the "
        "caller may see. Never carries lastSeenAt.",
        {
            "type": "presence.sync",
            "users": [{"userId": "u2", "status": "idle"}, {"userId": "u3", "status": "offline"}],
        },
    ),
    "presence.changed": (
        "A subscribed account's visible status changed (no lastSeenAt), or the answer to "
        "presence.query (lastSeenAt only when shown offline, a time exists and the account's "
        "setting admits the caller; truncated to the minute).",
        {
            "type": "presence.changed",
            "userId": "u3",
            "status": "offline",
            "lastSeenAt": "2026-12-02T08:47:00.000Z",
        },
    ),
    "presence.self": (
        "The account's own real status changed (to all its sockets).",
        {"type": "presence.self", "status": "invisible"},
    ),
    "typing": (
        "The account started typing in a channel this socket subscribed to (not sent to the typist).",
        {"type": "typing", "channelId": "c1", "userId": "u2"},
    ),
    "voice.roster": (
        "The channel's voice roster, after channel.subscribe and after each change; each account once.",
        {"type": "voice.roster", "channelId": "c1", "userIds": ["u2", "u1"]},
    ),
    "error": (
        "A frame was refused; the socket stays open.",
        {"type": "error", "code": "too_many_ids", "message": "at most 100 ids per query"},
    ),
}

CLOSE_CODES: list[tuple[int, str]] = [
    (p.CLOSE_AUTH, "bad, expired or missing token, or no identify within 10 s"),
    (p.CLOSE_TOO_BIG, "a frame over the size limit (16 KiB by default)"),
    (p.CLOSE_POLICY, "a sustained flood (100 refused frames in a row)"),
    (p.CLOSE_SILENT, "no frame for 90 s"),
    (p.CLOSE_TOO_MANY_CONNECTIONS, "too many connections"),
    (p.CLOSE_UNAVAILABLE, "the account's shard stayed unreachable for 10 s; reconnect at once, to any edge"),
    (p.CLOSE_SERVICE_RESTART, "the edge is draining (service restart); reconnect at once, to any edge"),
    (1001, "the edge was stopped at once; reconnect"),
]

DESCRIPTION = """\
The public websocket protocol of presence-cluster: statuses (online, idle, dnd, invisible,
offline), last-seen, typing indicators, voice rosters and focus.

All frames are JSON text frames with camelCase fields; times are ISO 8601 UTC with milliseconds
and `Z`. Authenticate with `Authorization: Bearer TOKEN` on the upgrade request or an `identify`
first frame (HS256 JWT, `sub` = the account). Anybody outside an account's audience (a shared
server or an accepted friendship) is answered with silence, never with a refusal.

Generated from edge/protocol.py by docs/gen_asyncapi.py; the rules and every decision the
contract leaves open are in docs/protocol.md.
"""


def _project_version() -> str:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return str(data["project"]["version"])


def _frame_type(model: type[BaseModel]) -> str:
    (value,) = get_args(model.model_fields["type"].annotation)
    return str(value)


def _tidy(schema: dict[str, Any], server: bool) -> dict[str, Any]:
    """Drop pydantic's per-property titles; for server frames, `type` is always sent and an
    optional field is absent rather than null (frames are built as dicts without the key)."""
    props = schema.get("properties", {})
    for prop in props.values():
        prop.pop("title", None)
    if server:
        required = list(schema.get("required", []))
        for name, prop in props.items():
            any_of = prop.get("anyOf")
            if any_of and {"type": "null"} in any_of and prop.get("default", ...) is None:
                (only,) = [s for s in any_of if s != {"type": "null"}]
                prop.pop("anyOf")
                prop.pop("default")
                prop.update(only)
                if name == "lastSeenAt":
                    prop["format"] = "date-time"
        if "type" in props and "type" not in required:
            required.insert(0, "type")
        schema["required"] = required
    return schema


def build() -> dict[str, Any]:
    pairs: list[tuple[type[BaseModel], Any]] = [(m, "validation") for m in p.CLIENT_FRAMES]
    pairs += [(m, "serialization") for m in p.SERVER_FRAMES]
    _, top = models_json_schema(pairs, ref_template=REF)
    defs: dict[str, Any] = top["$defs"]
    server_names = {m.__name__ for m in p.SERVER_FRAMES} | {"UserStatus"}
    schemas = {name: _tidy(schema, name in server_names) for name, schema in sorted(defs.items())}

    messages: dict[str, Any] = {}

    def message(model: type[BaseModel], table: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, str]:
        name = _frame_type(model)
        summary, example = table[name]
        messages[name] = {
            "name": name,
            "title": model.__name__,
            "summary": summary,
            "contentType": "application/json",
            "payload": {"$ref": REF.format(model=model.__name__)},
            "examples": [{"name": name, "payload": example}],
        }
        return {"$ref": f"#/components/messages/{name}"}

    client = [message(m, CLIENT) for m in p.CLIENT_FRAMES]
    server = [message(m, SERVER) for m in p.SERVER_FRAMES]
    error_codes = list(get_args(p.ErrorCode))

    return {
        "asyncapi": "2.6.0",
        "id": "urn:presence-cluster:ws-presence",
        "info": {
            "title": "presence-cluster websocket protocol",
            "version": _project_version(),
            "description": DESCRIPTION,
            "license": {"name": "see the repository"},
        },
        "servers": {
            "local": {
                "url": "127.0.0.1:8765",
                "protocol": "ws",
                "description": "`presence up` on this machine; in production, the public load balancer "
                "in front of every edge's websocket port.",
            }
        },
        "defaultContentType": "application/json",
        "channels": {
            WS_PATH: {
                "description": "One socket per device. Frames of one socket are handled in order.",
                "bindings": {
                    "ws": {
                        "bindingVersion": "0.1.0",
                        "headers": {
                            "type": "object",
                            "properties": {
                                "Authorization": {
                                    "type": "string",
                                    "pattern": "^Bearer ",
                                    "description": "optional; else send identify first",
                                }
                            },
                        },
                    }
                },
                "publish": {
                    "operationId": "clientFrames",
                    "summary": "Frames a client sends to the service.",
                    "message": {"oneOf": client},
                },
                "subscribe": {
                    "operationId": "serverFrames",
                    "summary": "Frames the service sends to a client.",
                    "message": {"oneOf": server},
                },
            }
        },
        "components": {"schemas": schemas, "messages": messages},
        "x-error-codes": error_codes,
        "x-close-codes": [{"code": code, "meaning": meaning} for code, meaning in CLOSE_CODES],
    }


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the descriptions read as written."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    header = "# Generated by docs/gen_asyncapi.py from edge/protocol.py; do not edit by hand.\n"
    body = yaml.dump(build(), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return header + body


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python docs/gen_asyncapi.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
