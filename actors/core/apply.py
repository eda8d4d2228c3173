"""One operation applied to a shard's state, and its typed answer: the core's dispatch.

The shell (`actors.presence`) loads what the operation needs, checks the slot is its own, then
calls `apply`; what comes back is the operation's answer (`actors.core.answers`), which the shell
puts on the wire in its plain form (`answers.wire`). Pure: no I/O, no clock (`now` is given).
"""

from __future__ import annotations

from . import ops
from .answers import Answer, Connected, Found, Shown, Verdict
from .contract import iso_ms
from .shard import ShardState


def apply(state: ShardState, edge_id: str, op: ops.Operation[object], now: float) -> Answer:
    """Apply `op` from `edge_id` at `now`. Raises `NotLoaded` for what the shell did not load."""
    s = state
    match op:
        case ops.Connect(user_id, socket_id, idle, claim):
            if claim is not None:
                s.claim(user_id, claim, now)
            # With its idle flag in the same step, so its watchers see no `online` in between.
            status = s.connect(user_id, socket_id, edge_id, now, idle=idle)
            return Connected(status, s.relations[user_id].last_seen_visibility)
        case ops.Disconnect(user_id, socket_id, at, resume_s):
            s.disconnect(user_id, socket_id, now, at=at, resume_s=resume_s)
            return None
        case ops.Departed(user_id, at, claim):
            s.departed(user_id, at, now, claim)
            return None
        case ops.SetStatus(user_id, socket_id, status):
            return s.set_status(user_id, socket_id, status, now)
        case ops.Watch(user_id, socket_id, targets):
            shown = s.watch(user_id, socket_id, edge_id, targets, now)
            return [Shown(target, status) for target, status in shown]
        case ops.Unwatch(socket_id, targets):
            s.unwatch(socket_id, edge_id, targets)
            return None
        case ops.Query(reader, reader_visibility, targets):
            return [
                Found(a.user_id, a.status, iso_ms(a.last_seen_at) if a.last_seen_at is not None else None)
                for a in s.query(reader, reader_visibility, targets, now)
            ]
        case ops.Focus(user_id, socket_id, channel_id):
            s.set_focus(user_id, socket_id, channel_id)
            return None
        case ops.Settings(user_id, visibility):
            s.set_visibility(user_id, visibility, now)
            return None
        case ops.ChannelSubscribe(channel_id, user_id, socket_id):
            return _verdict(s.channels.subscribe(channel_id, user_id, socket_id, edge_id))
        case ops.ChannelUnsubscribe(channel_id, socket_id):
            s.channels.unsubscribe(channel_id, socket_id)
            return None
        case ops.TypingStart(channel_id, user_id):
            return _verdict(s.channels.typing_start(channel_id, user_id, now))
        case ops.TypingStop(channel_id, user_id):
            s.channels.typing_stop(channel_id, user_id)
            return None
        case ops.VoiceJoin(channel_id, user_id, socket_id, own):
            # A client's own join is charged to its voice budget (at `now`); one registered
            # again after a restart is not.
            joined = s.channels.voice_join(channel_id, user_id, socket_id, edge_id, now if own else None)
            return Verdict.RATE_LIMITED if joined == "rate_limited" else _verdict(joined is True)
        case ops.VoiceLeave(channel_id, socket_id):
            s.channels.voice_leave(channel_id, socket_id)
            return None
        case ops.DropSocket(socket_id, channel_ids):
            s.channels.drop_socket(socket_id, channel_ids)
            return None
        case ops.Spend(user_id, budget, n):
            return s.spend(user_id, budget, n, now)
        case ops.Ping():
            return None
    raise ValueError(f"unknown operation {op!r}")


def _verdict(allowed: bool) -> Verdict:
    return Verdict.ALLOWED if allowed else Verdict.NOT_ALLOWED
