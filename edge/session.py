"""Per-socket logic without I/O: authentication state, limits, and frame → command.

The asyncio server feeds a `Session` the raw frames it reads and the current time, and carries
out the commands it returns (`Reply`, `Close`, or an upstream operation). The session keeps what
the socket has registered upstream (subscriptions, channels, voice, focus), which is what the
edge replays when a shard restarts, and enforces every per-socket limit of the contract.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.core import frames, ops
from actors.core.answers import Connected, Shown, Verdict
from actors.core.budgets import Bucket as TokenBucket
from actors.core.scan import SWEEP_AT_LEAST, SWEEP_CYCLE_S, RollingScan

from . import protocol as p
from .tokens import TokenError, verify_token


@dataclass(frozen=True, slots=True)
class Reply:
    frame: dict[str, Any]
    # The frame already serialised (constant replies on hot paths); a cache, not part of equality.
    text: str | None = field(default=None, compare=False)


# How long a socket whose lookup charge was refused confirms every charge before looking up: a
# minute, the unit the lookup budget refills by (actors/core/budgets.py).
LOOKUP_CAREFUL_S = 60.0
# The close reason of every refused token or Authorization header (4001), whatever was wrong.
BAD_TOKEN = "bad token"
# The close reason (4001 too) of a socket that sent no identify within identify_timeout_s of
# opening. Not the token's fault (a loaded edge, its opening gate, a slow network may delay a
# healthy client's identify): both clients tell it from BAD_TOKEN by this text and reconnect as
# usual (presence_client/client.py and clients/js/src/client.js hold a copy; a unit test keeps
# them equal).
IDENTIFY_DEADLINE = "no identify within the time allowed"

# The reply to most frames a server gets: built and serialised once, and the commands of an
# accepted heartbeat as one shared list (never mutated), which the edge recognises by identity and
# answers on its shortest road.
HEARTBEAT_ACK = Reply(frames.heartbeat_ack(), frames.HEARTBEAT_ACK_TEXT)
HEARTBEAT_ACKED: list[Command] = [HEARTBEAT_ACK]


@dataclass(frozen=True, slots=True)
class Close:
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Charged:
    """Upstream work charged to the account's lookup budget (kept by the account's shard) first:
    `charge` (None: nothing to charge, e.g. a subscription naming only ids already watched), then
    `op`. With `together`, both leave in the same round trip and a refused charge throws the
    answers away, so the client sees the same either way (one hop instead of two: see
    `Session.lookups_careful_until`); else `op` leaves only once the charge is accepted. Either
    way, a refused charge is answered by `budget_refused`."""

    charge: ops.Spend | None
    op: ops.Watch | ops.Query
    together: bool = False
    # The ids this frame added to the socket's subscriptions (forgotten again if refused).
    added: tuple[str, ...] = ()


# What the session asks of the edge: a frame to send, a close, or an operation for the shards
# (`actors.core.ops`, built here with this socket's ids), alone or charged to a budget first.
Command = (
    Reply
    | Close
    | ops.Connect
    | ops.SetStatus
    | ops.Focus
    | ops.Settings
    | ops.Unwatch
    | ops.ChannelOp
    | Charged
)


@dataclass(frozen=True, slots=True)
class Limits:
    identify_timeout_s: float = 10.0
    socket_timeout_s: float = 90.0
    max_subscriptions: int = 1_000
    max_query_ids: int = 100
    # Token bucket per socket: a burst of `rate_burst` frames, refilled at `rate_per_s`.
    rate_per_s: float = 20.0
    rate_burst: float = 60.0
    # Frames refused since the bucket was last full before the socket is closed with 1008: a
    # burst that calms down (the bucket refills) is forgiven, a flood at any rate over the limit
    # is not.
    flood_close_after: int = 100
    heartbeat_interval_ms: int = 30_000
    # Edge-wide, across sockets (see `Admission`): sockets per account and per client address on
    # one edge (one more is closed with 4029); per client address, connections still upgrading
    # or authenticating at once, and new connections (a token bucket). Past either, a new
    # connection is dropped at once. (Per-account budgets live in the account's shard.)
    max_sockets_per_account: int = 20
    max_sockets_per_ip: int = 1_000
    max_handshakes_per_ip: int = 100
    accepts_per_ip_per_s: float = 100.0
    accepts_per_ip_burst: float = 1_000.0
    # Edge-wide, over all addresses (edge/opening.py): connections being opened (upgraded and
    # authenticated) at once; past that a new connection waits its turn unread, at most
    # `max_opening_queued` of them and for at most `opening_queue_s`, else it is dropped.
    max_opening: int = 128
    # The places move between these two with the event loop's lateness (`OpeningPace`).
    min_opening: int = 16
    opening_lag_s: float = 0.020
    max_opening_queued: int = 4_096
    opening_queue_s: float = 5.0
    # While a connection from an address under this share of the places waits, an address over
    # it gives up a place held idle (no identify yet) for `opening_idle_evict_s` (edge/opening.py).
    opening_share_per_ip: int = 16
    opening_idle_evict_s: float = 2.0
    # Tokens whose `exp` lies further ahead than this are refused (4001) like expired ones.
    token_max_ttl_s: float = 24 * 3600


@dataclass
class Admission:
    """The limits of one edge that span its sockets. Pure; the edge keeps one and every session
    shares it.

    - connections per client address still upgrading or authenticating (`handshake_begin` at
      accept, `handshake_end` once authenticated or gone), and new connections per address (a
      token bucket, kept until it has refilled: `sweep`);
    - sockets per client address, counted from the upgrade (authenticated or not);
    - sockets per account, counted from authentication, before anything reaches an actor.

    Per-account budgets (status changes, lookups, voice joins) are not here: they must hold
    across edges, so the account's shard keeps them (actors/core/budgets.py).
    """

    limits: Limits = field(default_factory=Limits)
    by_ip: dict[str, int] = field(default_factory=dict)
    by_account: dict[str, set[str]] = field(default_factory=dict)
    handshakes: dict[str, int] = field(default_factory=dict)
    accepts: dict[str, TokenBucket] = field(default_factory=dict)
    # The buckets are forgotten in rolling slices, like the shard's (actors/core/scan.py): after a
    # reconnect storm from 100,000 addresses the sweep a second would walk them all at once.
    _accepts_scan: RollingScan[str] = field(
        default_factory=lambda: RollingScan(SWEEP_CYCLE_S, SWEEP_AT_LEAST), repr=False, compare=False
    )

    def handshake_begin(self, ip: str, now: float) -> str | None:
        """A connection from `ip` was accepted. None: counted (call `handshake_end` once); else
        why it must be dropped (nothing counted)."""
        n = self.handshakes.get(ip, 0)
        if n >= self.limits.max_handshakes_per_ip:
            cap = self.limits.max_handshakes_per_ip
            return f"too many connections opening from this address (at most {cap})"
        bucket = self.accepts.get(ip)
        if bucket is None:
            burst = self.limits.accepts_per_ip_burst
            bucket = self.accepts[ip] = TokenBucket(self.limits.accepts_per_ip_per_s, burst, burst, now)
        if not bucket.take(now):
            return "too many new connections from this address; slow down"
        self.handshakes[ip] = n + 1
        return None

    def handshake_end(self, ip: str) -> None:
        n = self.handshakes.get(ip, 0) - 1
        if n > 0:
            self.handshakes[ip] = n
        else:
            self.handshakes.pop(ip, None)

    def open(self, ip: str) -> Close | None:
        n = self.by_ip.get(ip, 0)
        if n >= self.limits.max_sockets_per_ip:
            return Close(
                p.CLOSE_TOO_MANY_CONNECTIONS,
                f"too many connections from this address (at most {self.limits.max_sockets_per_ip})",
            )
        self.by_ip[ip] = n + 1
        return None

    def closed(self, ip: str) -> None:
        n = self.by_ip.get(ip, 0) - 1
        if n > 0:
            self.by_ip[ip] = n
        else:
            self.by_ip.pop(ip, None)

    def join(self, user_id: str, socket_id: str) -> Close | None:
        sockets = self.by_account.setdefault(user_id, set())
        if socket_id not in sockets and len(sockets) >= self.limits.max_sockets_per_account:
            return Close(
                p.CLOSE_TOO_MANY_CONNECTIONS,
                f"too many connections for this account (at most {self.limits.max_sockets_per_account})",
            )
        sockets.add(socket_id)
        return None

    def leave(self, user_id: str, socket_id: str) -> None:
        sockets = self.by_account.get(user_id)
        if sockets is not None:
            sockets.discard(socket_id)
            if not sockets:
                del self.by_account[user_id]

    def sweep(self, now: float) -> None:
        """Forget the accept buckets of addresses that have refilled (a full one is a fresh one),
        a rolling slice of them a call."""
        for ip, bucket in self._accepts_scan.due_items(self.accepts, now):
            if bucket.level(now) >= bucket.burst:
                del self.accepts[ip]


def new_socket_id() -> str:
    return "s-" + secrets.token_urlsafe(12)


@dataclass
class Session:
    secret: str
    now: float
    limits: Limits = field(default_factory=Limits)
    socket_id: str = field(default_factory=new_socket_id)
    # The edge's cross-socket limits; None (unit tests of other rules) means none apply.
    admission: Admission | None = None
    ip: str | None = None
    # An edge serving the demo: the key of demo tokens (edge/tokens.py), valid for demo ids only.
    demo_key: str | None = None
    user_id: str | None = None
    status: str = "offline"
    visibility: str = "everyone"
    # The account's latest choices as this socket learnt them, with when they were made (0.0:
    # unknown): claimed when the socket is registered again on a restarted shard, so that a
    # choice acknowledged but not yet saved is not lost with the shard (see ShardState.claim).
    visibility_at: float = 0.0
    chosen: str | None = None
    chosen_at: float = 0.0
    subscriptions: set[str] = field(default_factory=set)
    # What this socket shows for each account it watches: the status it was last told (sync or
    # change). The edge uses it to drop repeats and to send only differences after a restart.
    view: dict[str, str] = field(default_factory=dict)
    channels: set[str] = field(default_factory=set)
    voice_channel: str | None = None
    focus: str | None = None
    idle: bool = False
    connected_at: float = 0.0
    last_frame_at: float = 0.0
    refused_in_a_row: int = 0  # refused since the bucket was last full
    # Until then this socket's queries wait for their lookup charge before looking anything up.
    # A query is normally charged and answered in the same round trip, its answers discarded if
    # the charge is refused: one hop instead of two (issue 16). A refusal makes the socket careful
    # for a budget window, so a client over its budget costs the shards at most one discarded
    # lookup per window and socket, never one per frame.
    lookups_careful_until: float = 0.0
    joined: bool = False
    last_frame_type: str = ""
    bucket: TokenBucket = field(init=False)

    def __post_init__(self) -> None:
        self.connected_at = self.last_frame_at = self.now
        self.bucket = TokenBucket(
            self.limits.rate_per_s, self.limits.rate_burst, self.limits.rate_burst, self.now
        )

    # ------------------------------------------------------------------ authentication

    @property
    def authenticated(self) -> bool:
        return self.user_id is not None

    def open(self) -> list[Command]:
        """The upgrade was accepted: count the socket against its address."""
        if self.admission is None or self.ip is None:
            return []
        refused = self.admission.open(self.ip)
        if refused is not None:
            self.ip = None  # not counted, so nothing to release
            return [refused]
        return []

    def gone(self) -> None:
        """The socket is closed: release what it held in the edge-wide limits (idempotent)."""
        if self.admission is None:
            return
        if self.ip is not None:
            self.admission.closed(self.ip)
            self.ip = None
        if self.joined and self.user_id is not None:
            self.admission.leave(self.user_id, self.socket_id)
            self.joined = False

    def authenticate_headers(self, values: Sequence[str], now: float) -> list[Command]:
        """Every `Authorization` line of the upgrade request, in order. None: wait for identify;
        more than one is a refused token (4001 `bad token`), as the internal API answers 401:
        which of them would name the account is nobody's to guess."""
        if len(values) > 1:
            return [Close(p.CLOSE_AUTH, BAD_TOKEN)]
        return self.authenticate_header(values[0] if values else None, now)

    def authenticate_header(self, authorization: str | None, now: float) -> list[Command]:
        """The upgrade request's `Authorization: Bearer …`, if any. No header: wait for identify."""
        if not authorization:
            return []
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return [Close(p.CLOSE_AUTH, BAD_TOKEN)]
        return self._identify(token.strip(), now)

    def _identify(self, token: str, now: float) -> list[Command]:
        try:
            user_id = verify_token(
                token, self.secret, now=now, max_ttl_s=self.limits.token_max_ttl_s, demo_key=self.demo_key
            )
        except TokenError:
            # Which check failed (signature, expiry, lifetime, subject) stays here: telling the
            # sender would help whoever is forging tokens, and never the holder of a real one.
            return [Close(p.CLOSE_AUTH, BAD_TOKEN)]
        if self.admission is not None:
            refused = self.admission.join(user_id, self.socket_id)
            if refused is not None:
                return [refused]
            self.joined = True
        self.user_id = user_id
        return [ops.Connect(user_id, self.socket_id)]

    def connected(self, answer: Connected) -> Reply:
        """The shard registered the socket; the client is told who it is."""
        status, visibility = answer.status, answer.visibility
        self.status = status
        if self.visibility_at == 0.0:
            # A setting that reached this socket before its registration was answered is newer
            # than the answer (the shard only tells sockets it has registered).
            self.visibility = visibility
        if self.chosen is None:
            self.chosen = "online" if status in ("online", "idle") else status
        assert self.user_id is not None
        return Reply(frames.ready(self.user_id, self.socket_id, status, self.limits.heartbeat_interval_ms))

    def deadline(self) -> float:
        """When this socket must be closed if nothing else happens."""
        if not self.authenticated:
            return self.connected_at + self.limits.identify_timeout_s
        return self.last_frame_at + self.limits.socket_timeout_s

    def expired(self, now: float) -> Close | None:
        if now < self.deadline():
            return None
        if not self.authenticated:
            return Close(p.CLOSE_AUTH, IDENTIFY_DEADLINE)
        return Close(p.CLOSE_SILENT, "no frame within the liveness timeout")

    # ------------------------------------------------------------------ frames

    def receive(self, raw: str | bytes, now: float) -> list[Command]:
        """One frame from the client."""
        self.last_frame_at = now
        self.last_frame_type = ""
        if not self._admitted(now):
            if self.refused_in_a_row >= self.limits.flood_close_after:
                return [Close(p.CLOSE_POLICY, "sustained flood")]
            if self.refused_in_a_row == 1 or self.refused_in_a_row % 20 == 0:
                return [Reply(frames.error("rate_limited", "too many frames; slow down"))]
            return []
        try:
            frame = p.parse_client_frame(raw)
            self.last_frame_type = frame.type
        except p.FrameError as e:
            self.last_frame_type = "invalid"
            if not self.authenticated:
                # An identify whose token is refused before it is checked (not a string, too
                # long, something beside it) is a refused token like any other: `bad token`.
                reason = BAD_TOKEN if e.frame_type == "identify" else "the first frame must be identify"
                return [Close(p.CLOSE_AUTH, reason)]
            return [Reply(frames.error("bad_frame", str(e)))]
        if not self.authenticated:
            if isinstance(frame, p.IdentifyFrame):
                return self._identify(frame.token, now)
            return [Close(p.CLOSE_AUTH, "the first frame must be identify")]
        return self._dispatch(frame, now)

    def control(self, now: float) -> list[Command]:
        """A ping or pong from the client (websockets has answered a ping already), or a fragment
        of a message before its last (the message, once whole, is `receive`d). It is a frame:
        it keeps the socket alive (protocol.md: "any frame refreshes the socket's liveness"; a
        client relying on its library's keepalive pings was closed 4000 after 90 s) and it is
        charged to the socket's bucket like any other, so a flood of pings is closed with 1008
        too (it was answered without limit). Over the limit it is still answered: no error frame
        goes back for a control frame, only the close once the flood is sustained."""
        self.last_frame_at = now
        if self._admitted(now) or self.refused_in_a_row < self.limits.flood_close_after:
            return []
        return [Close(p.CLOSE_POLICY, "sustained flood")]

    def _admitted(self, now: float) -> bool:
        """Take a frame's place from the bucket; False (and one more refusal in a row) if none."""
        if self.bucket.level(now) >= self.bucket.burst:
            self.refused_in_a_row = 0  # calmed down for long enough to refill: forgiven
        if self.bucket.take(now):
            return True
        self.refused_in_a_row += 1
        return False

    def _dispatch(self, frame: p.ClientFrame, now: float) -> list[Command]:
        user, sid = self.user_id, self.socket_id
        assert user is not None  # only an authenticated socket's frames get here
        match frame:
            case p.HeartbeatFrame():
                return HEARTBEAT_ACKED
            case p.IdentifyFrame():
                return [Reply(frames.error("bad_frame", "already identified"))]
            case p.PresenceUpdateFrame(status=status):
                if status in ("idle", "online"):
                    self.idle = status == "idle"
                return [ops.SetStatus(user, sid, status)]
            case p.PresenceSubscribeFrame(userIds=ids):
                unique = tuple(dict.fromkeys(ids))
                new = tuple(u for u in unique if u not in self.subscriptions)
                if not new:
                    # Every id is watched already: nothing new to look up, and nothing charged
                    # (only new ids are, protocol.md "Budgets"). The sync is what this socket
                    # shows of each (its view, kept by every sync and change it was sent), so
                    # no shard is asked: a frame of 1,000 ids sent again and again, 20 a second
                    # from each of an account's sockets, had the shards look them all up each
                    # time, for free (two sockets at 19 frames a second against `presence up`:
                    # its four shards 0.6 of a core, the edge 0.31; answered here, the edge 0.09).
                    view = self.view
                    return [Reply(frames.sync((u, view[u]) for u in unique if u in view))]
                if len(self.subscriptions) + len(new) > self.limits.max_subscriptions:
                    return [
                        Reply(
                            frames.error(
                                "too_many_ids",
                                f"a socket may subscribe to at most {self.limits.max_subscriptions} ids",
                            )
                        )
                    ]
                self.subscriptions.update(new)
                # The sync answers every id of the frame, also ones subscribed before; the new
                # ones are charged to the account's lookup budget first (a refusal: `budget_refused`).
                charge = ops.Spend(user, "lookups", len(new)) if new else None
                # Charged first: a watch registers state at the shards, which a refusal could not undo.
                return [Charged(charge, ops.Watch(user, sid, unique), added=new)]
            case p.PresenceUnsubscribeFrame(userIds=ids):
                gone = tuple(u for u in dict.fromkeys(ids) if u in self.subscriptions)
                self.subscriptions.difference_update(gone)
                for u in gone:
                    self.view.pop(u, None)
                return [ops.Unwatch(sid, gone)] if gone else []
            case p.PresenceQueryFrame(userIds=ids):
                if len(ids) > self.limits.max_query_ids:
                    return [
                        Reply(
                            frames.error(
                                "too_many_ids", f"a query may name at most {self.limits.max_query_ids} ids"
                            )
                        )
                    ]
                # Charged to the account's lookup budget (at its shard); nothing is answered
                # unless the charge is accepted.
                unique = tuple(dict.fromkeys(ids))
                return [
                    Charged(
                        ops.Spend(user, "lookups", len(unique)),
                        ops.Query(user, self.visibility, unique),
                        together=now >= self.lookups_careful_until,
                    )
                ]
            case p.FocusFrame(channelId=channel):
                self.focus = channel
                return [ops.Focus(user, sid, channel)]
            case p.ChannelSubscribeFrame(channelId=channel):
                return [ops.ChannelSubscribe(channel, user, sid)]
            case p.ChannelUnsubscribeFrame(channelId=channel):
                self.channels.discard(channel)
                return [ops.ChannelUnsubscribe(channel, sid)]
            case p.TypingStartFrame(channelId=channel):
                return [ops.TypingStart(channel, user)]
            case p.TypingStopFrame(channelId=channel):
                return [ops.TypingStop(channel, user)]
            case p.VoiceJoinFrame(channelId=channel):
                # A client's own join: charged to the account's voice budget. The roster it is in
                # is left once the join is accepted (`channel_result`): a refused join leaves the
                # socket where it was (protocol.md, "Budgets": "the roster stays as it was").
                return [ops.VoiceJoin(channel, user, sid, own=True)]
            case p.VoiceLeaveFrame():
                if self.voice_channel is None:
                    return []
                return [ops.VoiceLeave(self.voice_channel, sid)]
            case p.SettingsUpdateFrame(lastSeenVisibility=visibility):
                self.visibility, self.visibility_at = visibility, max(now, self.visibility_at)
                return [ops.Settings(user, visibility)]
        raise AssertionError(f"unhandled frame {frame!r}")  # pragma: no cover

    # ------------------------------------------------------------------ results of upstream work

    def budget_refused(self, cmd: Charged | None = None, now: float = 0.0) -> Reply:
        """The account's shard refused to charge a frame to a per-account budget (`cmd`: the
        lookup budget; None: the voice budget): nothing of it happened, so a subscription it
        added is forgotten again, and a refused query makes the socket careful for a minute."""
        if cmd is not None:
            self.subscriptions.difference_update(cmd.added)
            if isinstance(cmd.op, ops.Query):
                self.lookups_careful_until = now + LOOKUP_CAREFUL_S
        what = "voice" if cmd is None else "lookup"
        return Reply(frames.error("rate_limited", f"this account's {what} budget is spent; slow down"))

    def channel_result(self, cmd: ops.ChannelOp, verdict: Verdict | None) -> list[Command]:
        """What the channel's shard answered (None: an operation that is always allowed)."""
        if verdict is Verdict.RATE_LIMITED:
            return [self.budget_refused()]
        if verdict is Verdict.NOT_ALLOWED:
            return [
                Reply(
                    frames.error("not_allowed", f"not a member of the server of channel {cmd.channel_id!r}")
                )
            ]
        if isinstance(cmd, ops.ChannelSubscribe):
            self.channels.add(cmd.channel_id)
        elif isinstance(cmd, ops.VoiceJoin):
            left, self.voice_channel = self.voice_channel, cmd.channel_id
            if left is not None and left != cmd.channel_id:
                # Joined: now it leaves the other roster (for a moment it was in both, which a
                # refused join never makes it: it stays in the one it was in).
                return [ops.VoiceLeave(left, self.socket_id)]
        elif isinstance(cmd, ops.VoiceLeave) and self.voice_channel == cmd.channel_id:
            self.voice_channel = None
        return []

    def note_chosen(self, status: str, at: float) -> None:
        """The account's chosen status became `status` at `at` (the latest wins)."""
        if at >= self.chosen_at:
            self.chosen, self.chosen_at = status, at

    def acknowledged(self, status: str, at: float) -> None:
        """The shard applied this socket's own `presence.update` to `status` at about `at`:
        noted at once, so that a restarted shard is told of it even before the shard's own note
        (`note_chosen`) arrives. `idle` is no choice, and neither is a repeat of the choice this
        socket knows: it keeps the moment that choice was made (an account invisible since an
        unknown moment saying `invisible` again must not get a hide moment, and with it a
        last-seen, from that repeat)."""
        if status != "idle" and status != self.chosen:
            self.note_chosen(status, at)

    def note_visibility(self, visibility: str, at: float) -> None:
        """The account's last-seen visibility became `visibility` at `at` (the latest wins)."""
        if at >= self.visibility_at:
            self.visibility, self.visibility_at = visibility, at

    def claim(self) -> tuple[str | None, float, str, float]:
        """What this socket knows of its account's choices (see ShardState.claim)."""
        return self.chosen, self.chosen_at, self.visibility, self.visibility_at

    def tell(self, user_id: str, status: str) -> bool:
        """A status about `user_id` is about to go to this socket: False if the socket already
        shows exactly that (the frame would be noise), else the view takes it and True."""
        if user_id not in self.subscriptions:
            return True  # not part of a view (a frame in flight past an unsubscribe)
        if self.view.get(user_id) == status:
            return False
        self.view[user_id] = status
        return True

    def synced(self, users: Iterable[Shown]) -> None:
        """A `presence.sync` told these statuses."""
        for shown in users:
            if shown.user_id in self.subscriptions:
                self.view[shown.user_id] = shown.status

    def differences(self, answer: Iterable[Shown]) -> list[dict[str, Any]]:
        """The `presence.changed` frames that bring this socket's view to `answer` (a fresh
        watch answer: the truth at that moment), recording them in the view."""
        return [frames.changed(a.user_id, a.status) for a in answer if self.tell(a.user_id, a.status)]

    def touched_channels(self) -> list[str]:
        """Every channel this socket has state in, for clean-up when it goes."""
        out = set(self.channels)
        if self.voice_channel is not None:
            out.add(self.voice_channel)
        return sorted(out)
