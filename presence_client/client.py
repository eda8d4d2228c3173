"""The asyncio presence client for back-end services and bots: the behaviour of the JavaScript
client (`clients/js`), over the `websockets` package.

    async with PresenceClient("ws://127.0.0.1:8765/ws/presence", token=my_token) as client:
        await client.subscribe(["bob", "carol"])
        client.on("change", lambda change: print(change.user_id, change.entry))
        answers = await client.query(["dave"])

How answers are matched to requests: an edge handles one socket's frames in order and writes each
answer before it reads the next frame, so a heartbeat sent right after a request is acknowledged
only after the request's answers. Every request (a subscribe chunk, a query chunk) is followed by
a heartbeat; its answers are what arrives between the previous heartbeat's acknowledgement and
its own.

The outgoing queue (paced under the edge's per-socket limit) is bounded and coalescing: a frame
that supersedes one still queued takes its place (see `_overrides`), and past
MAX_QUEUED_FRAMES an application's frame is refused with PresenceError("queue_full").
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import math
import random as _random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from presence_client.backoff import (
    DEFAULT_BACKOFF,
    RESTART_CLOSE_CODES,
    THROTTLING_CLOSE_CODES,
    BackoffPolicy,
    reconnect_delay,
    restart_delay,
)
from presence_client.picture import (
    PRESENT,
    TYPING_LAPSE_S,
    Change,
    Entry,
    Frame,
    Picture,
    PresenceError,
    QueryAnswer,
    Typing,
    chunk_ids,
    malformed,
    merge_query,
    refusal,
)

__all__ = ["MAX_QUEUED_FRAMES", "ConnectionState", "PresenceClient", "TokenContext"]

log = logging.getLogger("presence_client")

ConnectionState = Literal["idle", "connecting", "open", "reconnecting", "closed"]
CHOSEN = frozenset({"online", "idle", "dnd", "invisible"})
VISIBILITY = frozenset({"everyone", "friends", "nobody"})
CLOSE_DEAD = 4000  # the code this client records for a connection it gave up on
# Frames waiting for the pacing at most: at the default 15 a second, about a minute's worth. An
# application that outruns the pacing with frames nothing supersedes is told (queue_full) instead
# of filling memory with frames that would reach the edge ever later.
MAX_QUEUED_FRAMES = 1000
# The reason of the edge's 4001 for a socket that sent no identify in time (10 s after it opened):
# edge/session.py IDENTIFY_DEADLINE, the same text (a copy, as this package does not import the
# edge; tests/unit/test_client_core.py keeps them equal). Not the token's fault (a loaded edge,
# its opening gate, a slow network can delay a healthy client's identify): reconnect as usual.
IDENTIFY_DEADLINE = "no identify within the time allowed"

# A part of the socket's state at the edge that a frame sets (see _overrides).
_Part = tuple[str, str]
_IDLE_FLAG: _Part = ("presence.update", "idle flag")
_CHOSEN_STATUS: _Part = ("presence.update", "chosen status")
_NOTHING: frozenset[_Part] = frozenset()


def _overrides(frame: Frame) -> frozenset[_Part]:
    """The parts of the socket's state at the edge that `frame` sets, each wholly: a queued frame
    whose every part a later frame sets again is superseded by it (the later one takes its place).
    Empty for frames that are never merged: heartbeats (they count for request windows and
    choices), requests, presence.unsubscribe, voice (each join and leave is seen by others)."""
    kind = frame.get("type")
    if kind == "presence.update":
        status = frame.get("status")
        if status == "idle":
            return frozenset({_IDLE_FLAG})
        if status == "online":  # also wakes this socket
            return frozenset({_IDLE_FLAG, _CHOSEN_STATUS})
        return frozenset({_CHOSEN_STATUS})
    if kind == "settings.update":
        return frozenset({("settings.update", "last-seen visibility")})
    if kind == "focus":
        return frozenset({("focus", "focus")})
    channel = str(frame.get("channelId"))
    if kind in ("channel.subscribe", "channel.unsubscribe"):
        return frozenset({("channel", channel)})
    if kind == "typing.start":
        # Typing, and the broadcast watchers may see: a later typing.stop sends nothing, so it
        # must not swallow a start still queued.
        return frozenset({("typing", channel), ("typing broadcast", channel)})
    if kind == "typing.stop":
        return frozenset({("typing", channel)})
    return _NOTHING


def _interval_s(interval_ms: Any) -> float:
    """ready's heartbeatIntervalMs in seconds; anything but a positive number (a server's mistake
    must not end the connection's task) means the contract's 30 s, as in the JavaScript client."""
    try:
        ms = float(interval_ms)
    except (TypeError, ValueError):
        return 30.0
    return ms / 1000 if math.isfinite(ms) and ms > 0 else 30.0


@dataclass(frozen=True)
class TokenContext:
    attempt: int
    rejected: bool  # the previous token was refused (4001): fetch a fresh one (the same one stops the client)


TokenProvider = Callable[[TokenContext], "str | Awaitable[str]"]


@dataclass
class _Window:
    future: asyncio.Future[list[Frame]]
    start_after: int | None = None
    end_at: int | None = None
    received: list[Frame] = field(default_factory=list)


class PresenceClient:
    """One socket to /ws/presence, kept alive and kept right (see the module's docstring).

    `url`: one URL, a list (tried in turn on each reconnect) or a function returning one.
    `token`: a string, or a (sync or async) function of a TokenContext, called on every connect.
    A fixed token that is refused (4001) stops the client (state closed, error `unauthorized`), and
    so does a provider that hands back the very token just refused. A 4001 for an identify that
    came too late (IDENTIFY_DEADLINE) refused no token: the client reconnects as usual.
    """

    def __init__(
        self,
        url: str | Sequence[str] | Callable[[], str],
        token: str | TokenProvider,
        *,
        heartbeat_interval_s: float | None = None,
        dead_after_s: float | None = None,
        connect_timeout_s: float = 10.0,
        stable_after_s: float = 5.0,
        typing_throttle_s: float = 8.0,
        track_last_seen: bool = False,
        max_subscriptions: int = 1000,
        rate_burst: float = 40,
        rate_per_s: float = 15,
        backoff: BackoffPolicy = DEFAULT_BACKOFF,
        random: Callable[[], float] = _random.random,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._token = token
        self.heartbeat_interval_s = heartbeat_interval_s
        self.dead_after_s = dead_after_s
        self.connect_timeout_s = connect_timeout_s
        self.stable_after_s = stable_after_s
        self.typing_throttle_s = typing_throttle_s
        self.track_last_seen = track_last_seen
        self.max_subscriptions = max_subscriptions
        self.rate_burst = rate_burst
        self.rate_per_s = rate_per_s
        self.backoff = backoff
        self._random = random
        self._clock = clock

        self.state: ConnectionState = "idle"
        self.user_id: str | None = None
        self.socket_id: str | None = None
        self.status: str | None = None  # the account's real status (ready, presence.self)
        self.synced = False  # every remembered subscription confirmed on the current socket
        self.url: str | None = None
        self.reconnect_delays: list[float] = []  # every wait chosen, for the curious and for tests

        self.picture = Picture()
        self._typing = Typing()
        self._rosters: dict[str, list[str]] = {}
        self._channels: dict[str, None] = {}
        self._idle = False
        self._focus: str | None = None
        self._voice: str | None = None
        # online, dnd or invisible (a setting below), for the next ready: chosen while disconnected,
        # or on a socket that closed before its edge surely read it (_end_connection)
        self._pending_status: str | None = None
        self._pending_visibility: str | None = None
        self._typing_sent: dict[str, float] = {}
        self._last_seen_wanted: set[str] = set()
        self._last_seen_task: asyncio.Task[None] | None = None  # gathering them (0.25 s)
        self._listeners: dict[str, list[Callable[..., Any]]] = {}
        # subscribe() calls made while connecting: settled by the next socket's resubscribe
        self._sync_waiters: list[asyncio.Future[None]] = []

        self._task: asyncio.Task[None] | None = None
        self._stopped = True
        self._attempt = 0
        self._url_index = 0
        self._rejected = False
        # The token the last 4001 refused, until a ready: a provider that hands it back has nothing
        # fresh, and trying it again would be refused again, for ever.
        self._refused_token: str | None = None
        self._token_in_use: str | None = None  # the token of the current (or last) attempt
        self._state_changed = asyncio.Event()  # set (and replaced) at every change of state
        self._close_error: PresenceError | None = None  # why it closed, for wait_open
        self._ws: ClientConnection | None = None
        self._aux: set[asyncio.Task[Any]] = set()  # the current connection's tasks (_spawn)
        self._typing_handle: asyncio.TimerHandle | None = None
        self._reset_connection()

    # ------------------------------------------------------------------ events

    def on(self, event: str, callback: Callable[..., Any]) -> Callable[[], None]:
        """Listen: "state" (state, info), "ready" (frame), "change" (Change), "sync" (client)
        after any change of the picture, "self" (status), "typing" (channel_id, user_ids),
        "roster" (channel_id, user_ids), "error" (PresenceError), "frame" (every frame).
        Returns a function that stops listening (calling it again does nothing, as in the
        JavaScript client)."""
        listeners = self._listeners.setdefault(event, [])
        listeners.append(callback)
        stopped = False

        def stop() -> None:
            nonlocal stopped
            if not stopped:
                stopped = True
                listeners.remove(callback)

        return stop

    def on_sync(self, callback: Callable[[PresenceClient], Any]) -> Callable[[], None]:
        """Phoenix style: called with the client after every change of the presence picture."""
        return self.on("sync", callback)

    def _emit(self, event: str, *args: Any) -> None:
        for callback in list(self._listeners.get(event, [])):
            try:
                callback(*args)
            except Exception:
                log.exception("a %r listener raised", event)

    def _set_state(self, state: ConnectionState, **info: Any) -> None:
        if self.state == state and state != "reconnecting":
            return
        self.state = state
        changed, self._state_changed = self._state_changed, asyncio.Event()
        changed.set()
        self._emit("state", state, info)

    def _changed(self, changes: Iterable[Change]) -> None:
        any_change = False
        for change in changes:
            any_change = True
            self._emit("change", change)
            if (
                self.track_last_seen
                and change.entry is not None
                and change.entry.status not in PRESENT
                and not change.entry.last_seen_known
                and (change.previous is None or change.previous.status in PRESENT)
            ):
                self._want_last_seen(change.user_id)
        if any_change:
            self._emit("sync", self)

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> PresenceClient:
        self.connect()
        try:
            await self.wait_open()
        except BaseException:
            # Not open (a refused token, the timeout, a cancellation): __aexit__ will not be
            # called, and nothing may go on reconnecting behind the failed `async with`.
            await self.close()
            raise
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def connect(self) -> None:
        """Start connecting, and stay connected until close()."""
        if not self._stopped:
            return
        self._stopped = False
        self._attempt = 0
        self._close_error = None
        self._task = asyncio.create_task(self._run(), name="presence-client")

    async def wait_open(self, timeout: float | None = 30.0) -> None:
        """Wait until the socket is open (ready received). Raises PresenceError at once if the
        client closes instead (a fixed token refused: `unauthorized`; close(): `disconnected`)."""
        async with asyncio.timeout(timeout):
            while self.state != "open":
                if self.state == "closed" and self._close_error is not None:
                    raise self._close_error
                await self._state_changed.wait()

    async def wait_synced(self, timeout: float | None = 30.0) -> None:
        """Wait until every remembered subscription is confirmed on the current socket."""
        async with asyncio.timeout(timeout):
            while not (self.state == "open" and self.synced):
                await asyncio.sleep(0.02)

    async def close(self) -> None:
        """Close for good (code 1000); nothing is retried."""
        self._stopped = True
        ws = self._ws
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close(1000, "bye")
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        error = PresenceError("disconnected", "closed by the application")
        self._end_connection(error)
        self._settle_sync_waiters(error)
        if self._typing_handle is not None:
            self._typing_handle.cancel()
        if self.state != "closed":
            self._close_error = error
        self._set_state("closed", code=1000, reason="closed by the application")

    def _next_url(self) -> str:
        url = self._url
        if callable(url):
            return url()
        if isinstance(url, str):
            return url
        chosen = url[self._url_index % len(url)]
        self._url_index += 1
        return chosen

    async def _get_token(self) -> str:
        if isinstance(self._token, str):
            return self._token
        got = self._token(TokenContext(self._attempt, self._rejected))
        return await got if inspect.isawaitable(got) else got

    async def _run(self) -> None:
        while not self._stopped:
            code, reason, lived = await self._one_connection()
            if self._stopped:
                return
            if lived >= self.stable_after_s:
                self._attempt = 0
            if code == 1000:
                self._stopped = True
                self._close_error = PresenceError("disconnected", "closed by the server (1000)")
                self._settle_sync_waiters(self._close_error)
                self._set_state("closed", code=code, reason=reason)
                return
            # A 4001 for a missed identify deadline refused no token: the usual backoff below,
            # the provider not told of a rejection, a fixed token kept.
            if code == 4001 and reason != IDENTIFY_DEADLINE:
                if isinstance(self._token, str):
                    self._give_up_unauthorized(code, reason, "the token was refused (4001)")
                    return
                if self._refused_token is not None and self._token_in_use == self._refused_token:
                    self._give_up_unauthorized(
                        code, reason, "the token provider returned the token just refused (4001)"
                    )
                    return
                self._refused_token = self._token_in_use
                self._rejected = True  # the provider is told, so it fetches a fresh token
            throttled = code in THROTTLING_CLOSE_CODES
            if code in RESTART_CLOSE_CODES:
                # The server restarts this edge (or lost a shard) and holds our place: back at
                # once, to any edge; a failure after that backs off from the first window.
                self._attempt = 0
                delay = restart_delay(self.backoff, self._random)
            else:
                delay = reconnect_delay(self._attempt, throttled, self.backoff, self._random)
            self.reconnect_delays.append(delay)
            attempt, self._attempt = self._attempt, self._attempt + 1
            self._set_state(
                "reconnecting", code=code, reason=reason, attempt=attempt, delay_s=delay, throttled=throttled
            )
            await asyncio.sleep(delay)

    def _give_up_unauthorized(self, code: int, reason: str, message: str) -> None:
        """Stop for good: the token at hand would be refused again (a fixed one, or the one a
        provider just handed back)."""
        self._stopped = True
        self._close_error = PresenceError("unauthorized", message)
        self._emit("error", self._close_error)
        self._settle_sync_waiters(self._close_error)
        self._set_state("closed", code=code, reason=reason)

    async def _one_connection(self) -> tuple[int | None, str, float]:
        """One socket from connect to close: (close code or None, reason, seconds it was open)."""
        self._set_state("connecting", attempt=self._attempt)
        try:
            # Under the connect timeout too: a provider that never answers would leave the client
            # "connecting" for good instead of trying again.
            async with asyncio.timeout(self.connect_timeout_s):
                token = await self._get_token()
        except TimeoutError:
            self._emit("error", PresenceError("token", f"no token within {self.connect_timeout_s:g} s"))
            return None, "token provider timed out", 0.0
        except Exception as e:
            self._emit("error", PresenceError("token", str(e)))
            return None, "token provider failed", 0.0
        self._token_in_use = token
        if self._refused_token is not None and token == self._refused_token:
            return 4001, "the token provider returned the token just refused", 0.0
        url = self._next_url()
        self.url = url
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                ws = await connect(url, ping_interval=None, max_size=2**22, open_timeout=None)
                try:
                    await ws.send(json.dumps({"type": "identify", "token": token}))
                    ready = json.loads(await ws.recv())
                except BaseException:
                    ws.transport.abort()
                    raise
        except ConnectionClosed as e:
            return (e.rcvd.code if e.rcvd else 1006), (e.rcvd.reason if e.rcvd else "closed"), 0.0
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI, ValueError) as e:
            return None, f"could not connect: {type(e).__name__}", 0.0
        if not isinstance(ready, dict) or ready.get("type") != "ready":
            ws.transport.abort()
            return None, "no ready", 0.0
        self._reset_connection()
        self._ws = ws
        opened_at = self._clock()
        self._on_ready(ready)
        try:
            async for raw in ws:
                self._on_frame(raw)
        except ConnectionClosed:
            pass
        lived = self._clock() - opened_at
        if self._dropped:
            code: int | None = CLOSE_DEAD
            reason = "no answer to a heartbeat"
        else:
            code = ws.close_code if ws.close_code is not None else 1006
            reason = ws.close_reason or ""
        self._end_connection(PresenceError("disconnected", f"socket closed ({code})"))
        return code, reason, lived

    def _reset_connection(self) -> None:
        # (frame, its request's window or None, _overrides(frame)), in the order they are written
        self._queue: deque[tuple[Frame, _Window | None, frozenset[_Part]]] = deque()
        self._wake = asyncio.Event()
        self._tokens = float(self.rate_burst)
        self._tokens_at = self._clock()
        self._probe: asyncio.TimerHandle | None = None
        self._hb_written = 0
        self._hb_acked = 0
        self._hb_queued = 0
        # type -> (frame, hb): the latest account choice (status, setting) queued on this socket,
        # after `hb` heartbeats; the edge has read it once a heartbeat queued after it is answered.
        self._unconfirmed: dict[str, tuple[Frame, int]] = {}
        self._windows: list[_Window] = []
        self._dropped = False
        self._heartbeat_s = 30.0
        self.synced = False

    def _end_connection(self, error: PresenceError) -> None:
        for task in self._aux:
            task.cancel()
        self._aux = set()
        # Cancelled with the rest: the ids it was gathering stay wanted, for the next socket.
        self._last_seen_task = None
        # A choice still queued behind the pacing, or sent with no heartbeat after it answered, may
        # never have been read (an invisible lost would show the account online): it is sent again
        # after the next ready, as one made while disconnected is.
        for frame, hb in self._unconfirmed.values():
            if self._hb_acked > hb:
                continue
            if frame["type"] == "presence.update":
                self._pending_status = frame["status"]
            else:
                self._pending_visibility = frame["lastSeenVisibility"]
        self._unconfirmed = {}
        if self._probe is not None:
            self._probe.cancel()
        for w in self._windows:
            if not w.future.done():
                w.future.set_exception(error)
                w.future.exception()  # retrieved: nobody may be waiting
        self._windows = []
        self._ws = None
        self._queue.clear()
        self.synced = False

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task of the current connection, cancelled when it ends, and forgotten as soon as it is
        done: a long connection starts one per last-seen query and resubscribe retry."""
        task = asyncio.create_task(coro, name=name)
        self._aux.add(task)
        task.add_done_callback(self._aux.discard)
        return task

    def _drop(self) -> None:
        """Give up on a socket that stopped answering: do not wait for its close handshake."""
        if self._ws is not None:
            self._dropped = True
            self._ws.transport.abort()

    # ------------------------------------------------------------------ sending

    def _is_open(self) -> bool:
        return self._ws is not None and self.state == "open"

    def _send(self, frame: Frame, window: _Window | None = None, *, bounded: bool = True) -> bool:
        """Queue a frame for the current socket; False when there is none (what the client
        remembers is restored on the next). A frame that supersedes queued ones takes the place of
        the first (_supersede). Otherwise, past MAX_QUEUED_FRAMES, PresenceError("queue_full"),
        unless not `bounded`: the client's own frames (heartbeats, what it restores after ready,
        requests whose room the caller checked) are few, and never refused."""
        if self._ws is None:
            return False
        parts = _NOTHING if window is not None else _overrides(frame)
        if parts and self._supersede(frame, parts):
            return True
        if bounded:
            self._check_room(1)
        if frame["type"] == "heartbeat":
            self._hb_queued += 1
        self._queue.append((frame, window, parts))
        self._wake.set()
        return True

    def _check_room(self, frames: int) -> None:
        """Raise queue_full unless `frames` more fit in the current socket's queue."""
        if self._ws is not None and len(self._queue) + frames > MAX_QUEUED_FRAMES:
            raise PresenceError(
                "queue_full",
                f"{len(self._queue)} frames wait to be sent ({self.rate_per_s:g} a second), at most "
                f"{MAX_QUEUED_FRAMES}: nothing was queued",
            )

    def _supersede(self, frame: Frame, parts: frozenset[_Part]) -> bool:
        """Put `frame` in the place of the queued frames it supersedes (every part of theirs is
        one of its own): the first of them takes it, the others go. False if there is none.

        Only frames queued after the last request are looked at: nothing moves past a request
        (a query's answer depends on the last-seen setting before it), nor past its heartbeat, so
        request windows keep their frames and their markers. Moving `frame` up to the first one's
        place reorders nothing that matters: a frame left between that shared a part with it would
        set a part it does not, so be `online` or typing.start, each setting every part of its
        family, and that frame superseded the first one when it was queued. Heartbeats are never
        merged, so the count that confirms choices (_unconfirmed) stays exact; the choice is
        recorded with the count at its call, which only a heartbeat behind its new place can
        reach."""
        superseded: list[int] = []  # indexes, last first
        for index in range(len(self._queue) - 1, -1, -1):
            _, window, queued_parts = self._queue[index]
            if window is not None:
                break
            if queued_parts and queued_parts <= parts:
                superseded.append(index)
        if not superseded:
            return False
        self._queue[superseded[-1]] = (frame, None, parts)
        for index in superseded[:-1]:  # from the last: the indexes before stay right
            del self._queue[index]
        return True

    def _send_choice(self, frame: Frame, *, bounded: bool = True) -> bool:
        """Send a choice of the account (a chosen status, a setting), kept until the edge read it."""
        if not self._send(frame, bounded=bounded):
            return False
        self._unconfirmed[frame["type"]] = (frame, self._hb_queued)
        return True

    async def _sender(self, ws: ClientConnection) -> None:
        """Writes queued frames, paced by a token bucket under the edge's per-socket limit."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                now = self._clock()
                self._tokens = min(self.rate_burst, self._tokens + (now - self._tokens_at) * self.rate_per_s)
                self._tokens_at = now
                if self._tokens < 1:
                    await asyncio.sleep((1 - self._tokens) / self.rate_per_s)
                    continue
                self._tokens -= 1
                frame, window, _ = self._queue.popleft()
                if window is not None and window.start_after is None:
                    window.start_after = self._hb_written
                if frame["type"] == "heartbeat":
                    self._hb_written += 1
                    if window is not None:
                        window.end_at = self._hb_written
                    if self._probe is None:
                        dead_after = self.dead_after_s or self._heartbeat_s
                        self._probe = asyncio.get_running_loop().call_later(dead_after, self._drop)
                try:
                    await ws.send(json.dumps(frame))
                except ConnectionClosed:
                    return

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            self._send({"type": "heartbeat"}, bounded=False)

    async def _request(self, frames: Sequence[Frame]) -> list[Frame]:
        """Send `frames` and a heartbeat; the frames received in between (see the module doc).
        Never refused for room: an application's request checks it first (_check_room), for all
        its chunks at once, so that none is sent without the others."""
        if not self._is_open():
            raise PresenceError("not_connected", "not connected")
        window = _Window(asyncio.get_running_loop().create_future())
        self._windows.append(window)
        for frame in frames:
            self._send(frame, window, bounded=False)
        self._send({"type": "heartbeat"}, window, bounded=False)
        return await window.future

    # ------------------------------------------------------------------ receiving

    def _on_frame(self, raw: str | bytes) -> None:
        try:
            frame = json.loads(raw)
        except ValueError:
            return
        if not isinstance(frame, dict):
            return
        if self._probe is not None:
            self._probe.cancel()
            self._probe = None
        # A frame of a known type that cannot be applied is dropped whole, before any window takes
        # it: one bad frame must neither end the connection's task (the client would stay "open",
        # deaf, never reconnecting) nor leave half of itself in the picture.
        why = malformed(frame)
        if why is not None:
            log.warning("dropped a malformed %s frame: %s", frame.get("type"), why)
            self._emit("error", PresenceError("malformed_frame", f"{frame.get('type')}: {why}"))
            return
        kind = frame.get("type")
        if kind == "heartbeat.ack":
            self._hb_acked += 1
            for w in list(self._windows):
                if w.end_at is not None and self._hb_acked >= w.end_at:
                    self._windows.remove(w)
                    if not w.future.done():
                        w.future.set_result(w.received)
            return
        for w in self._windows:
            if w.start_after is not None and self._hb_acked >= w.start_after:
                w.received.append(frame)
        self._emit("frame", frame)
        try:
            self._apply(kind, frame)
        except Exception as e:  # whatever slipped past `malformed`: reported, and the client carries on
            log.exception("could not apply a %s frame", kind)
            self._emit("error", PresenceError("malformed_frame", f"{kind}: {e}"))

    def _apply(self, kind: Any, frame: Frame) -> None:
        if kind in ("presence.sync", "presence.changed"):
            changes = self.picture.apply(frame)
            self._changed(changes)
            if kind == "presence.sync" and not changes:
                self._emit("sync", self)
        elif kind == "presence.self":
            self.status = str(frame.get("status"))
            self._emit("self", self.status)
        elif kind == "typing":
            self._on_typing(str(frame.get("channelId")), str(frame.get("userId")))
        elif kind == "voice.roster":
            channel_id, users = str(frame.get("channelId")), [str(u) for u in frame.get("userIds", [])]
            if channel_id not in self._channels:
                return  # sent before the edge read our unsubscribe: as for typing, not ours now
            self._rosters[channel_id] = users
            self._emit("roster", channel_id, list(users))
        elif kind == "error":
            self._emit("error", PresenceError(str(frame.get("code")), str(frame.get("message", ""))))

    def _on_ready(self, frame: Frame) -> None:
        assert self._ws is not None
        self._rejected = False
        self._refused_token = None
        self.user_id = str(frame.get("userId"))
        self.socket_id = str(frame.get("socketId"))
        self.status = str(frame.get("status"))
        server_s = _interval_s(frame.get("heartbeatIntervalMs"))
        cap = self.heartbeat_interval_s
        self._heartbeat_s = max(0.05, min(cap, server_s) if cap else server_s)
        self._spawn(self._sender(self._ws), "presence-client-send")
        self._spawn(self._heartbeats(), "presence-client-heartbeat")
        self._set_state("open", user_id=self.user_id, socket_id=self.socket_id)
        # What belongs to the socket, restored: the account's choices are durable upstream, the
        # socket's own (idle, focus, voice, subscriptions) are not.
        # Into an empty queue, and never refused (not bounded): a socket comes back whole.
        pending = self._pending_status
        if pending == "online" and self._idle and self.status in ("online", "idle"):
            # The account shows online chosen already (the edge read it before the close, or it
            # was the choice all along): `online` again would wake this idle socket for a moment,
            # and its watchers saw the account online, then idle (an idle tab moved by a drain
            # within 30 s of choosing online). The idle flag below is all there is to restore.
            pending = None
        if pending is not None:
            self._send_choice({"type": "presence.update", "status": pending}, bounded=False)
        elif not self._idle and self.status == "idle":
            # A resumed place keeps the idle flag of the socket it replaces (protocol.md "Drain and
            # resume"), and an `online` sent just before the server closed that socket may never
            # have been read: this socket is awake, so it says so.
            self._send({"type": "presence.update", "status": "online"}, bounded=False)
        if self._idle:  # the socket's own flag, whatever the account chose: restored after the choice
            self._send({"type": "presence.update", "status": "idle"}, bounded=False)
        self._pending_status = None
        if self._pending_visibility is not None:
            visibility = {"type": "settings.update", "lastSeenVisibility": self._pending_visibility}
            self._send_choice(visibility, bounded=False)
            self._pending_visibility = None
        if self._focus is not None:
            self._send({"type": "focus", "channelId": self._focus}, bounded=False)
        for channel_id in self._channels:
            self._send({"type": "channel.subscribe", "channelId": channel_id}, bounded=False)
        if self._voice is not None:
            self._send({"type": "voice.join", "channelId": self._voice}, bounded=False)
        self._emit("ready", frame)
        self._spawn(self._resubscribe(), "presence-client-resubscribe")

    # ------------------------------------------------------------------ presence

    async def subscribe(self, user_ids: Iterable[str]) -> None:
        """Watch these accounts (remembered across reconnects); returns once their sync is applied.
        While connecting (after connect(), also while reconnecting), that is the sync after the
        socket opens, so `await subscribe()` right after connect() finds the client open. Before
        connect() or after the client closed: at once (they are subscribed on connect). Raises
        PresenceError: the refusal (rate_limited: retried later all the same, too_many_ids), or
        disconnected / unauthorized when the client closes first, or queue_full (nothing
        remembered)."""
        ids = list(dict.fromkeys(user_ids))
        fresh = [u for u in ids if u not in self.picture.watched]
        if len(self.picture.watched) + len(fresh) > self.max_subscriptions:
            raise PresenceError("too_many_ids", f"at most {self.max_subscriptions} subscriptions")
        if fresh and self._is_open():
            self._check_room(2 * len(chunk_ids(fresh)))  # before anything is remembered
        self.picture.watch(fresh)
        if not fresh:
            return
        if self._is_open():
            await self._subscribe_chunks(fresh)
        elif not self._stopped:
            await self._next_resubscribe()

    async def _next_resubscribe(self) -> None:
        """Wait for the next socket's resubscribe (which includes every id watched by then)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sync_waiters.append(waiter)
        try:
            await waiter
        finally:
            # A caller that gave up (a timeout, a cancellation) leaves nothing behind.
            with contextlib.suppress(ValueError):
                self._sync_waiters.remove(waiter)

    def _settle_sync_waiters(self, error: PresenceError | None) -> None:
        """Return (error None) or raise in the subscribe() calls waiting for the next resubscribe."""
        waiters, self._sync_waiters = self._sync_waiters, []
        for waiter in waiters:
            if waiter.done():
                continue
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)

    def unsubscribe(self, user_ids: Iterable[str]) -> None:
        """Stop watching; their entries leave the picture. Raises PresenceError("queue_full")
        with nothing changed."""
        watched = [u for u in dict.fromkeys(user_ids) if u in self.picture.watched]
        chunks = chunk_ids(watched)
        self._check_room(len(chunks))
        _, changes = self.picture.unwatch(watched)
        for chunk in chunks:
            self._send({"type": "presence.unsubscribe", "userIds": chunk}, bounded=False)
        self._changed(changes)

    @property
    def watched(self) -> list[str]:
        return list(self.picture.watched)

    def get(self, user_id: str) -> Entry | None:
        """A watched account's entry, or None (unknown, or outside the audience)."""
        return self.picture.entries.get(user_id)

    @property
    def presence(self) -> dict[str, Entry]:
        return dict(self.picture.entries)

    async def _resubscribe(self) -> None:
        try:
            await self._subscribe_chunks(list(self.picture.watched))
        except PresenceError as e:
            # The socket went: the next one starts over, and the subscribe() calls waiting go on
            # waiting. A refusal is theirs too (as for a subscribe() on an open socket).
            if e.code not in ("disconnected", "not_connected"):
                self._settle_sync_waiters(e)
            return
        self.synced = True
        self._settle_sync_waiters(None)
        self._emit("sync", self)
        if self.track_last_seen:
            for user_id, entry in self.picture.entries.items():
                if entry.status not in PRESENT:
                    self._want_last_seen(user_id)

    async def _subscribe_chunks(self, ids: list[str]) -> None:
        chunks = chunk_ids(ids)
        windows = await asyncio.gather(
            *(self._request([{"type": "presence.subscribe", "userIds": chunk}]) for chunk in chunks)
        )
        refused: Frame | None = None
        changes: list[Change] = []
        for chunk, received in zip(chunks, windows, strict=True):
            if not any(f.get("type") == "presence.sync" for f in received):
                refused = refusal(received) or {"code": "rate_limited", "message": "no presence.sync"}
            changes += self.picture.reconcile(chunk, received)
        self._changed(changes)
        if refused is not None:
            # Budgets hold across reconnects: a refused resubscribe is retried, later.
            error = PresenceError(str(refused.get("code")), str(refused.get("message", "")))
            if refused.get("type") != "error":
                self._emit("error", error)
            delay = reconnect_delay(1, True, self.backoff, self._random)
            self._spawn(self._retry_resubscribe(delay), "presence-client-resubscribe-retry")
            raise error

    async def _retry_resubscribe(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._is_open():
            await self._resubscribe()

    def _want_last_seen(self, user_id: str) -> None:
        # One gathering task at a time, as the JavaScript client's timer (not "the set just became
        # non-empty": a task cancelled by a close left the set full, and nothing was asked again).
        self._last_seen_wanted.add(user_id)
        if self._last_seen_task is None and self._is_open():
            self._last_seen_task = self._spawn(self._ask_last_seen(), "presence-client-last-seen")

    async def _ask_last_seen(self) -> None:
        await asyncio.sleep(0.25)  # gather the ones that go together
        self._last_seen_task = None
        ids = [u for u in self._last_seen_wanted if u in self.picture.watched]
        self._last_seen_wanted = set()
        if not ids:
            return
        try:
            await self._query(chunk_ids(ids))  # the client's own: never refused for room
        except PresenceError as e:
            if e.code == "rate_limited":
                await asyncio.sleep(15)
                for u in ids:
                    self._want_last_seen(u)

    async def query(self, user_ids: Iterable[str]) -> dict[str, QueryAnswer]:
        """Status and last-seen of any number of accounts (split into <= 100-id frames, answers
        merged), in the order asked, without the ids outside the caller's audience. Raises
        PresenceError (rate_limited, too_many_ids, not_connected, disconnected, queue_full).
        Watched accounts' entries take the answers too."""
        chunks = chunk_ids(user_ids)
        self._check_room(2 * len(chunks))  # every chunk is sent, or none
        return await self._query(chunks)

    async def _query(self, chunks: list[list[str]]) -> dict[str, QueryAnswer]:
        windows = await asyncio.gather(
            *(self._request([{"type": "presence.query", "userIds": chunk}]) for chunk in chunks)
        )
        answers = merge_query(chunks, windows)
        self._changed(self.picture.settle_answers(answers))
        return answers

    # ------------------------------------------------------------------ own status

    def set_status(self, status: str) -> None:
        """Choose online, dnd or invisible for the account, or mark this socket idle (online
        wakes it)."""
        if status not in CHOSEN:
            raise ValueError(f"unknown status {status!r}")
        # Sent first: one refused (queue_full) leaves what the client remembers as it was. Idle is
        # not a choice of the account: the flag below restores it, and the pending choice (say
        # invisible) stays.
        if status == "idle":
            self._send({"type": "presence.update", "status": status})
        elif not self._send_choice({"type": "presence.update", "status": status}):
            self._pending_status = status
        if status in ("idle", "online"):
            self._idle = status == "idle"

    def set_last_seen_visibility(self, visibility: str) -> None:
        if visibility not in VISIBILITY:
            raise ValueError(f"unknown visibility {visibility!r}")
        if not self._send_choice({"type": "settings.update", "lastSeenVisibility": visibility}):
            self._pending_visibility = visibility

    def set_focus(self, channel_id: str | None) -> None:
        """The channel this socket has focused (None for none); restored after reconnects."""
        self._send({"type": "focus", "channelId": channel_id})
        self._focus = channel_id

    # ------------------------------------------------------------------ channels

    def subscribe_channel(self, channel_id: str) -> None:
        """Receive a channel's typing and voice events (remembered across reconnects)."""
        self._send({"type": "channel.subscribe", "channelId": channel_id})
        self._channels[channel_id] = None

    def unsubscribe_channel(self, channel_id: str) -> None:
        self._send({"type": "channel.unsubscribe", "channelId": channel_id})
        self._channels.pop(channel_id, None)
        self._typing.forget_channel(channel_id)
        self._rosters.pop(channel_id, None)

    def join_voice(self, channel_id: str) -> None:
        """Join a channel's voice roster with this socket (rejoined after reconnects)."""
        self._send({"type": "voice.join", "channelId": channel_id})
        self._voice = channel_id

    def leave_voice(self) -> None:
        self._send({"type": "voice.leave"})
        self._voice = None

    def roster(self, channel_id: str) -> list[str]:
        return list(self._rosters.get(channel_id, []))

    def typing(self, channel_id: str) -> bool:
        """Call on every keystroke: typing.start goes out at most once per typing_throttle_s."""
        now = self._clock()
        last = self._typing_sent.get(channel_id)
        if last is not None and now - last < self.typing_throttle_s:
            return False
        if not self._send({"type": "typing.start", "channelId": channel_id}):
            return False
        self._typing_sent[channel_id] = now
        return True

    def stop_typing(self, channel_id: str) -> None:
        last = self._typing_sent.get(channel_id)
        if last is not None and self._clock() - last < TYPING_LAPSE_S:
            self._send({"type": "typing.stop", "channelId": channel_id})
        self._typing_sent.pop(channel_id, None)

    def typers(self, channel_id: str) -> list[str]:
        """Who is typing in a channel now (sorted), lapsing 10 s after their last typing frame."""
        return self._typing.typers(channel_id, self._clock())

    def _on_typing(self, channel_id: str, user_id: str) -> None:
        if channel_id not in self._channels:
            return
        self._typing.typing(channel_id, user_id, self._clock())
        self._emit("typing", channel_id, self.typers(channel_id))
        self._arm_typing_lapse()

    def _arm_typing_lapse(self) -> None:
        if self._typing_handle is not None:
            self._typing_handle.cancel()
            self._typing_handle = None
        at = self._typing.next_lapse()
        if at is None:
            return
        self._typing_handle = asyncio.get_running_loop().call_later(max(0.0, at - self._clock()), self._lapse)

    def _lapse(self) -> None:
        self._typing_handle = None
        for channel_id in self._typing.expire(self._clock()):
            self._emit("typing", channel_id, self.typers(channel_id))
        self._arm_typing_lapse()
