"""The wire contract as pydantic models: every client frame, every server frame.

Client frames are validated strictly (unknown types, wrong field types and extra fields are all
`bad_frame`), through one discriminated union so that pydantic's Rust core parses and validates a
frame in a single pass. Server frames are built as plain dicts on the hot path by
`actors.core.frames` (the one builder) and serialised with orjson; their models here document them
(and generate docs/asyncapi.yaml), and tests/unit/test_frames.py checks the builder against them.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
)

from actors.core.ids import MAX_ID_LENGTH, MIN_ID_LENGTH, check_id

# Ids obey the id rule (actors/core/ids.py), validated at the edge so that nothing odd reaches an
# actor, a log line or a database. The length bounds are repeated as constraints only so that the
# generated schema shows them; `check_id` is the rule.
Id = Annotated[
    str,
    StringConstraints(min_length=MIN_ID_LENGTH, max_length=MAX_ID_LENGTH),
    AfterValidator(check_id),
    Field(
        description="an id: 1-128 characters, no control, format or surrogate code point "
        "(Unicode Cc, Cf, Cs), no U+2028/U+2029"
    ),
]
ClientStatus = Literal["online", "idle", "dnd", "invisible"]
Status = Literal["online", "idle", "dnd", "invisible", "offline"]
Visibility = Literal["everyone", "friends", "nobody"]

# Lists are bounded here only against absurd input; the contract's own limits (100 ids per
# query, the per-socket subscription cap) are applied by the session with `too_many_ids`.
MAX_LIST = 10_000


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class IdentifyFrame(_Frame):
    type: Literal["identify"]
    token: Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class HeartbeatFrame(_Frame):
    type: Literal["heartbeat"]


class PresenceUpdateFrame(_Frame):
    type: Literal["presence.update"]
    status: ClientStatus


class PresenceSubscribeFrame(_Frame):
    type: Literal["presence.subscribe"]
    userIds: Annotated[list[Id], Field(max_length=MAX_LIST)]


class PresenceUnsubscribeFrame(_Frame):
    type: Literal["presence.unsubscribe"]
    userIds: Annotated[list[Id], Field(max_length=MAX_LIST)]


class PresenceQueryFrame(_Frame):
    type: Literal["presence.query"]
    userIds: Annotated[list[Id], Field(max_length=MAX_LIST)]


class FocusFrame(_Frame):
    type: Literal["focus"]
    channelId: Id | None


class ChannelSubscribeFrame(_Frame):
    type: Literal["channel.subscribe"]
    channelId: Id


class ChannelUnsubscribeFrame(_Frame):
    type: Literal["channel.unsubscribe"]
    channelId: Id


class TypingStartFrame(_Frame):
    type: Literal["typing.start"]
    channelId: Id


class TypingStopFrame(_Frame):
    type: Literal["typing.stop"]
    channelId: Id


class VoiceJoinFrame(_Frame):
    type: Literal["voice.join"]
    channelId: Id


class VoiceLeaveFrame(_Frame):
    type: Literal["voice.leave"]


class SettingsUpdateFrame(_Frame):
    type: Literal["settings.update"]
    lastSeenVisibility: Visibility


ClientFrame = Annotated[
    IdentifyFrame
    | HeartbeatFrame
    | PresenceUpdateFrame
    | PresenceSubscribeFrame
    | PresenceUnsubscribeFrame
    | PresenceQueryFrame
    | FocusFrame
    | ChannelSubscribeFrame
    | ChannelUnsubscribeFrame
    | TypingStartFrame
    | TypingStopFrame
    | VoiceJoinFrame
    | VoiceLeaveFrame
    | SettingsUpdateFrame,
    Field(discriminator="type"),
]

CLIENT_FRAME: TypeAdapter[ClientFrame] = TypeAdapter(ClientFrame)

# The hot frame, recognised without parsing. Any other spelling goes through the full parser.
HEARTBEAT = HeartbeatFrame(type="heartbeat")
# The other frame a busy socket sends most, as compact JSON spells it (the JavaScript and Python
# clients do): recognised by its text, like a heartbeat, without the validator. Frozen models,
# so one instance serves every such frame.
FAST_FRAMES: dict[str, ClientFrame] = {
    '{"type":"heartbeat"}': HEARTBEAT,
    '{"type": "heartbeat"}': HEARTBEAT,
    **{
        f'{{"type":"presence.update","status":"{status}"}}': PresenceUpdateFrame(
            type="presence.update", status=status
        )
        for status in get_args(ClientStatus)
    },
}


class FrameError(ValueError):
    """A frame that is not a valid client frame; answered with `bad_frame`. `frame_type`: its
    `type` when that was one of the contract's (the fault is in its other fields), else ""."""

    def __init__(self, message: str, frame_type: str = "") -> None:
        super().__init__(message)
        self.frame_type = frame_type


def parse_client_frame(raw: str | bytes) -> ClientFrame:
    if isinstance(raw, str):
        fast = FAST_FRAMES.get(raw)
        if fast is not None:
            return fast
    try:
        return CLIENT_FRAME.validate_json(raw)
    except ValidationError as e:
        loc = e.errors(include_url=False, include_context=False, include_input=False)[0]["loc"]
        raise FrameError(_describe(e), str(loc[0]) if len(loc) > 1 else "") from None
    except UnicodeDecodeError:
        raise FrameError("frame is not valid UTF-8") from None


def _describe(e: ValidationError) -> str:
    err = e.errors(include_url=False, include_context=False, include_input=False)[0]
    where = ".".join(str(p) for p in err["loc"]) or "frame"
    if err["type"] == "json_invalid":
        return "frame is not valid JSON"
    if err["type"] == "union_tag_invalid":
        return "unknown frame type"
    if err["type"] == "union_tag_not_found":
        return "frame has no type"
    return f"{where}: {err['msg'].removeprefix('Value error, ')}"[:200]


# --------------------------------------------------------------------------- server frames


class Ready(_Frame):
    type: Literal["ready"] = "ready"
    userId: str
    socketId: str
    status: Status
    heartbeatIntervalMs: int


class HeartbeatAck(_Frame):
    type: Literal["heartbeat.ack"] = "heartbeat.ack"


class UserStatus(_Frame):
    userId: str
    status: Status


class PresenceSync(_Frame):
    type: Literal["presence.sync"] = "presence.sync"
    users: list[UserStatus]


class PresenceChanged(_Frame):
    type: Literal["presence.changed"] = "presence.changed"
    userId: str
    status: Status
    lastSeenAt: str | None = Field(default=None, description="only in query answers; see the visibility rule")


class PresenceSelf(_Frame):
    type: Literal["presence.self"] = "presence.self"
    status: Status


class TypingEvent(_Frame):
    type: Literal["typing"] = "typing"
    channelId: str
    userId: str


class VoiceRoster(_Frame):
    type: Literal["voice.roster"] = "voice.roster"
    channelId: str
    userIds: list[str]


ErrorCode = Literal["bad_frame", "too_many_ids", "rate_limited", "not_allowed"]


class Error(_Frame):
    type: Literal["error"] = "error"
    code: ErrorCode
    message: str


SERVER_FRAMES: tuple[type[_Frame], ...] = (
    Ready,
    HeartbeatAck,
    PresenceSync,
    PresenceChanged,
    PresenceSelf,
    TypingEvent,
    VoiceRoster,
    Error,
)
CLIENT_FRAMES: tuple[type[_Frame], ...] = (
    IdentifyFrame,
    HeartbeatFrame,
    PresenceUpdateFrame,
    PresenceSubscribeFrame,
    PresenceUnsubscribeFrame,
    PresenceQueryFrame,
    FocusFrame,
    ChannelSubscribeFrame,
    ChannelUnsubscribeFrame,
    TypingStartFrame,
    TypingStopFrame,
    VoiceJoinFrame,
    VoiceLeaveFrame,
    SettingsUpdateFrame,
)
# Their `type` values, in the same order.
CLIENT_FRAME_TYPES: tuple[str, ...] = tuple(
    get_args(frame.model_fields["type"].annotation)[0] for frame in CLIENT_FRAMES
)


# Close codes (the contract fixes 4001, 1008 and 1009; the rest are ours, documented in docs/).
CLOSE_AUTH = 4001
CLOSE_SILENT = 4000  # no frame for socket_timeout_s
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_TOO_MANY_CONNECTIONS = 4029
# Closed by the server for its own reasons: the client reconnects at once, to any edge, and its
# account keeps its presence meanwhile (protocol.md "Drain and resume").
CLOSE_UNAVAILABLE = 1011  # a shard out of reach past the retry budget
CLOSE_SERVICE_RESTART = 1012  # the edge drains
