"""The direct lane: an edge's hot calls to a shard over one TCP connection instead of Ray calls.

A Ray actor call costs ~1.5 ms of CPU over both ends here (bench/profiles/README.md "lane"),
however small: a submission through the core worker, gRPC both ways, the task's bookkeeping.
An edge sends each shard a batch (`apply_and_collect`) every few ms and keeps a long-poll
(`pull`) open; at 800 changes/s that overhead was most of the shards' CPU. The lane carries just
those two calls as length-prefixed pickled frames over a connection the edge opens to the shard:
~0.1 ms of CPU a call. Ray still places, restarts and finds the actors, and carries everything
else (resizes, stats, drains); the lane's address and its secret come through a Ray call, so
only a process the Ray cluster admits can learn them.

Wire: first a handshake of fixed-size fields in which each end proves it knows the shard's secret
without sending it (the edge's 16-byte nonce and its 2-byte internal wire version; the shard's
nonce, its version and HMAC-SHA256(secret, "shard" + both nonces + both versions); the edge's
HMAC(secret, "edge" + the same)), so nothing is unpickled by either end before the other proved
itself: not by the shard from a stranger, not by the edge from whatever listens on a port the
shard gave up. Each end then checks the other's version (`actors.core.contract.WIRE_VERSION`:
adjacent releases work together) and refuses a mismatch with one clear log line, before any
pickle crosses: an edge and a shard too far apart never meet an object they cannot read.

Then, both ways, a 4-byte big-endian length and that many
bytes of pickle: requests `(id, method, args)` and replies `(id, ok, result)`, where a failed
call's result is `(exception type name, message)`. Replies may come in any order (a pull waits);
the shard starts the requests in the order they arrived, so one edge's batches are applied in
order, as with Ray's calls to an async actor.

Failure semantics match a Ray call to an actor that died: when the connection goes (the shard's
process died, or its node), every call on it fails with `LaneBroken`, and the next call asks Ray
for the address again (a restarted shard listens on a new port with a new secret). A node that
vanished without closing anything is noticed within ~8 s (TCP keepalive while idle, a user
timeout on unacknowledged data while busy), before Ray's own health checks declare it dead. As
with a Ray call that fails with ActorUnavailableError, a batch on a connection that broke while
its shard lived may or may not have been applied; the shard cancels that connection's waiting
pulls, so their mail stays for the next one.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import itertools
import logging
import pickle
import secrets
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any, cast

from actors.core.contract import WIRE_VERSION, serves_edge, wire_compatible, wire_mismatch
from actors.core.handshake_gate import Entry, HandshakeGate

log = logging.getLogger("presence.lane")
# Mismatches already logged (peer, its version): one line each, however often it retries.
_told: set[tuple[str, int]] = set()

_LENGTH = struct.Struct("!I")
# After the handshake: a batch of 500 operations is tens of KiB, a chunk of 5,000 mail items a few
# MiB; a frame announcing more is a bug, and the connection is dropped rather than the memory taken.
MAX_FRAME_BYTES = 512 * 1024 * 1024
SECRET_BYTES = 32
NONCE_BYTES = 16
_PROOF_BYTES = hashlib.sha256().digest_size
_VERSION = struct.Struct("!H")
EDGE_HELLO_BYTES = NONCE_BYTES + _VERSION.size
SHARD_HELLO_BYTES = NONCE_BYTES + _VERSION.size + _PROOF_BYTES
# A handshake not finished in this long is dropped; at most this many at once per shard, and
# at most HANDSHAKES_PER_SOURCE of them from one address (actors/core/handshake_gate.py). More wait
# their turn unread, up to HANDSHAKE_QUEUE_S (under the edge's 5-s patience), at most
# WAITING_PER_SOURCE per address and WAITING_HANDSHAKES in all; past those they are refused.
HANDSHAKE_S = 2.0
MAX_HANDSHAKES = 64
HANDSHAKES_PER_SOURCE = 8
HANDSHAKE_QUEUE_S = 4.0
WAITING_PER_SOURCE = 64
WAITING_HANDSHAKES = 1024
# Keepalive: first probe after 5 s idle, then every second, 3 unanswered → the connection is dead;
# data left unacknowledged for 8 s (a busy connection to a vanished node) → dead too. Before Ray's
# verdict on a dead node (10-65 s): an edge whose pull waited on a shard of that node found it
# restarted elsewhere only when the lane broke, and its watchers heard of accounts that died with
# the node 20 s after the shard was back (30 s then; the testbed's node death, 2026-12-04). A
# peer's kernel answers the probes however busy its process is: only a silent network breaks it.
_KEEPALIVE = (5, 1, 3)
_USER_TIMEOUT_MS = 8_000
# Exceptions whose type the edge's retry rules know (a Ray call re-raises a shard's exception as
# an instance of its own class, so a subclass still matches them there; the lane carries names).
_KNOWN_REMOTE: dict[str, type[Exception]] = {"ValueError": ValueError, "TimeoutError": TimeoutError}
# Names of subclasses that shards of the release before sent as they were: a suspended shard's
# refusal (actors/pool.py) must still reach the edge as a TimeoutError it retries.
_KNOWN_SUBCLASSES: dict[str, type[Exception]] = {"ShardSuspended": TimeoutError}

Handler = Callable[..., Awaitable[Any]]


class LaneBroken(ConnectionError):
    """The connection to the shard went away: the call may or may not have been applied, as with
    a Ray call to an actor that died (the shard lost its memory, or the reply was lost)."""


class WireMismatch(LaneBroken):
    """The shard speaks an internal wire version this edge cannot talk to (see WIRE_VERSION)."""


def tell_mismatch(ours: int, theirs: int, peer: str) -> str:
    """Log the mismatch (once per peer and version, however often it retries); the message."""
    message = wire_mismatch(ours, theirs, peer)
    if (peer, theirs) not in _told:
        _told.add((peer, theirs))
        log.error("lane: %s", message)
    return message


class LaneRemoteError(RuntimeError):
    """The shard raised while carrying out the call (the message names the exception's type)."""


def _proof(secret: bytes, role: bytes, edge_hello: bytes, shard_hello: bytes) -> bytes:
    """HMAC over both ends' nonces and versions: neither can be changed on the way."""
    return hmac.new(secret, role + edge_hello + shard_hello, hashlib.sha256).digest()


def encode(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


def _keepalive(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is None:
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    if hasattr(socket, "TCP_USER_TIMEOUT"):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, _USER_TIMEOUT_MS)
    idle, interval, count = _KEEPALIVE
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", interval), ("TCP_KEEPCNT", count)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class _Framed(asyncio.Protocol):
    """One end of a lane's connection, on its transport: the handshake's fixed-size fields read
    with `read_exactly`, then length-prefixed frames handed to `on_frame` as they arrive, several
    per read when they came together. No stream reader, no task per frame: a call costs one
    callback at each end (bench/profiles/README.md, "the lane's CPU per call")."""

    # Before the handshake is over, a peer gets this much buffered, then reading pauses.
    UNPROVEN_BUFFER = 64 * 1024

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.framing = False
        self.closed = False
        self._buffer = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast("asyncio.Transport", transport)
        _keepalive(transport)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self.framing:
            self._frames()
            return
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        if len(self._buffer) > self.UNPROVEN_BUFFER and self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the lane's connection closed"))

    async def read_exactly(self, n: int, timeout_s: float) -> bytes:
        """The next `n` bytes of the handshake (TimeoutError, or ConnectionError if it closed)."""
        async with asyncio.timeout(timeout_s):
            while len(self._buffer) < n:
                if self.closed:
                    raise ConnectionResetError("the lane's connection closed")
                self._waiter = asyncio.get_running_loop().create_future()
                await self._waiter
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        return data

    def start_framing(self) -> None:
        """The handshake is over: frames from now on (those already buffered first)."""
        self.framing = True
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        self._frames()

    def write(self, payload: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_LENGTH.pack(len(payload)) + payload)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _frames(self) -> None:
        buffer = self._buffer
        start = 0
        try:
            while len(buffer) - start >= _LENGTH.size and not self.closed:
                (length,) = _LENGTH.unpack_from(buffer, start)
                if length > MAX_FRAME_BYTES:
                    raise ValueError(f"lane frame of {length} bytes")
                end = start + _LENGTH.size + length
                if len(buffer) < end:
                    break
                frame = buffer[start + _LENGTH.size : end]
                start = end
                self.on_frame(frame)
        except Exception as e:
            self.unreadable(e)
        finally:
            del buffer[:start]

    def on_frame(self, frame: bytearray) -> None:
        raise NotImplementedError

    def unreadable(self, error: Exception) -> None:
        """A frame this end cannot read: the connection goes."""
        self.closed = True
        self.close()


# What an immediate handler answers when the call must wait (the lane then runs the coroutine
# handler of the same name in a task).
LATER = None


class _ShardConnection(_Framed):
    """The shard's end of one edge's connection."""

    def __init__(self, server: LaneServer) -> None:
        super().__init__()
        self.server = server
        self.pulls: set[asyncio.Task[None]] = set()
        # Calls other than pulls still running in tasks: while there are any, later calls go
        # behind them (one edge's batches apply in the order they arrived).
        self.behind = 0
        self._opening: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server._connections.add(self)
        self._opening = asyncio.get_running_loop().create_task(self._open())

    async def _open(self) -> None:
        try:
            proven = await self.server._handshake(self)
        except (ConnectionError, TimeoutError):
            proven = False
        if proven and not self.closed:
            self.start_framing()
        else:
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        # A pull still waiting would hand its mail to nobody: cancelled, the mail stays.
        for pull in self.pulls:
            pull.cancel()
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
        self.server._connections.discard(self)

    def on_frame(self, frame: bytearray) -> None:
        request_id, method, args = pickle.loads(frame)
        server = self.server
        if not self.behind:
            now = server.immediate.get(method)
            if now is not None:
                try:
                    result = now(*args)
                except Exception as e:
                    self.reply(request_id, method, _failure(method, e))
                    return
                if result is not LATER:
                    self.reply(request_id, method, (True, result))
                    return
        task = asyncio.get_running_loop().create_task(self._answer(request_id, method, args))
        server._tasks.add(task)
        task.add_done_callback(server._tasks.discard)
        if method == "pull":
            self.pulls.add(task)
            task.add_done_callback(self.pulls.discard)
        else:
            self.behind += 1
            task.add_done_callback(self._caught_up)

    def _caught_up(self, _: object) -> None:
        self.behind -= 1

    def unreadable(self, error: Exception) -> None:
        if not isinstance(error, (ValueError, pickle.PickleError)):
            log.error("lane: a request could not be read; connection closed", exc_info=error)
        super().unreadable(error)

    async def _answer(self, request_id: int, method: str, args: tuple[Any, ...]) -> None:
        handler = self.server.handlers.get(method)
        try:
            if handler is None:
                raise LookupError(f"no lane method {method!r}")
            outcome: tuple[bool, Any] = (True, await handler(*args))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            outcome = _failure(method, e)
        self.reply(request_id, method, outcome)

    def reply(self, request_id: int, method: str, outcome: tuple[bool, Any]) -> None:
        if self.closed:
            return
        try:
            frame = pickle.dumps((request_id, *outcome), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            log.exception("lane: the answer to %s could not be pickled", method)
            frame = pickle.dumps((request_id, False, (type(e).__name__, str(e))))
        self.write(frame)


def _failure(method: str, e: Exception) -> tuple[bool, Any]:
    """A failed call's outcome: the edge sees it as it would see a failed Ray call."""
    if isinstance(e, TimeoutError):  # a refusal the edge retries (a suspended shard): no traceback
        log.info("lane: %s refused: %s", method, e)
    else:
        log.error("lane: %s failed", method, exc_info=e)
    return False, _wire_failure(e)


def _wire_failure(e: Exception) -> tuple[str, str]:
    """(kind, message): kind the nearest class of `e` the edge's retry rules know, so a subclass
    is retried as its base would be (before, a suspended shard's refusal reached the edge as a
    `LaneRemoteError`, which nothing retries: a cut-off edge's drain lost its departures)."""
    name = type(e).__name__
    for cls in type(e).__mro__:
        if cls.__name__ in _KNOWN_REMOTE:
            return cls.__name__, str(e) if cls.__name__ == name else f"{name}: {e}"
    return name, str(e)


def _remote_error(kind: str, message: str) -> Exception:
    """The exception a failed call raises at the edge (by kind; unknown kinds: LaneRemoteError)."""
    known = _KNOWN_REMOTE.get(kind) or _KNOWN_SUBCLASSES.get(kind) or LaneRemoteError
    return known(f"{kind}: {message}")


class LaneServer:
    """The shard's end: serves `handlers` (method name → coroutine function) to whoever proves
    it knows the secret. `immediate` (method name → plain function) answers a call without a task
    when it can, or says `LATER` and the coroutine handler takes it."""

    def __init__(
        self,
        handlers: dict[str, Handler],
        version: int = WIRE_VERSION,
        immediate: dict[str, Callable[..., Any]] | None = None,
    ) -> None:
        self.handlers = handlers
        self.immediate = immediate or {}
        self.version = version
        self.secret = secrets.token_bytes(SECRET_BYTES)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[_ShardConnection] = set()
        self._gate: HandshakeGate[asyncio.Future[None]] = HandshakeGate(
            MAX_HANDSHAKES, HANDSHAKES_PER_SOURCE, WAITING_PER_SOURCE, WAITING_HANDSHAKES
        )
        self.refused = 0  # connections that failed the handshake or found the line full

    async def start(self, host: str) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _ShardConnection(self), host, 0)
        port = self._server.sockets[0].getsockname()[1]
        return host, int(port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for connection in list(self._connections):  # Server.close leaves open connections open
            connection.close()

    @property
    def handshakes_in_progress(self) -> int:
        return self._gate.in_progress

    async def _take_turn(self, source: str) -> bool:
        """Wait until `source` may handshake (actors/core/handshake_gate.py); False: refused or
        waited too long. True obliges the caller to `_turn_over(source)`."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = self._gate.enter(source, turn)
        if entry is Entry.GO:
            return True
        if entry is Entry.WAIT:
            try:
                await asyncio.wait({turn}, timeout=HANDSHAKE_QUEUE_S)
            except BaseException:  # the shard is closing: give back the place or the turn
                if turn.done():
                    self._turn_over(source)
                else:
                    self._gate.withdraw(source, turn)
                raise
            if turn.done():
                return True
            self._gate.withdraw(source, turn)  # waited too long
        self.refused += 1
        return False

    def _turn_over(self, source: str) -> None:
        for _, turn in self._gate.leave(source):
            turn.set_result(None)

    async def _handshake(self, connection: _ShardConnection) -> bool:
        """The edge proves it knows the secret, after the shard proved it (module docstring)."""
        assert connection.transport is not None
        peer = connection.transport.get_extra_info("peername")
        source = str(peer[0]) if peer else "?"
        if not await self._take_turn(source):
            return False
        try:
            edge_hello = await connection.read_exactly(EDGE_HELLO_BYTES, HANDSHAKE_S)
            shard_hello = secrets.token_bytes(NONCE_BYTES) + _VERSION.pack(self.version)
            connection.transport.write(shard_hello + _proof(self.secret, b"shard", edge_hello, shard_hello))
            offered = await connection.read_exactly(_PROOF_BYTES, HANDSHAKE_S)
        finally:
            self._turn_over(source)
        if hmac.compare_digest(offered, _proof(self.secret, b"edge", edge_hello, shard_hello)):
            (theirs,) = _VERSION.unpack(edge_hello[NONCE_BYTES:])
            if serves_edge(self.version, theirs):
                return True
            self.refused += 1
            tell_mismatch(self.version, theirs, "an edge")
            return False
        self.refused += 1
        if self.refused in (1, 10, 100) or self.refused % 1000 == 0:  # never a flood of lines
            log.warning("lane: %d connection(s) refused so far (no proof of the secret)", self.refused)
        return False


class _EdgeConnection(_Framed):
    """The edge's end of one lane: replies matched to the calls waiting for them."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: dict[int, asyncio.Future[Any]] = {}
        self.broken: BaseException | None = None

    def on_frame(self, frame: bytearray) -> None:
        request_id, ok, result = pickle.loads(frame)
        reply = self.waiting.get(request_id)
        if reply is not None and not reply.done():
            reply.set_result((ok, result))

    def unreadable(self, error: Exception) -> None:  # a reply this process cannot read: broken
        self.fail(LaneBroken(f"{type(error).__name__}: {error}"))
        super().unreadable(error)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.fail(LaneBroken(f"closed ({type(exc).__name__})" if exc is not None else "closed"))

    def fail(self, error: BaseException) -> None:
        if self.broken is None:
            self.broken = error
        for reply in self.waiting.values():
            if not reply.done():
                reply.set_exception(LaneBroken(str(error)))
        self.waiting.clear()


class LaneClient:
    """The edge's end of one lane: calls multiplexed over one connection."""

    def __init__(self, connection: _EdgeConnection, peer_version: int = WIRE_VERSION) -> None:
        self._connection = connection
        # The shard's wire version, from the handshake: what it can read (`ShardClient`).
        self.peer_version = peer_version
        self._ids = itertools.count(1)
        self._loop = asyncio.get_running_loop()
        connection.start_framing()

    @classmethod
    async def open(
        cls, host: str, port: int, secret: bytes, timeout_s: float = 5.0, version: int = WIRE_VERSION
    ) -> LaneClient:
        loop = asyncio.get_running_loop()
        try:
            transport, connection = await asyncio.wait_for(
                loop.create_connection(_EdgeConnection, host, port), timeout_s
            )
        except (OSError, TimeoutError) as e:
            raise LaneBroken(f"lane to {host}:{port}: {type(e).__name__}") from e
        try:
            edge_hello = secrets.token_bytes(NONCE_BYTES) + _VERSION.pack(version)
            transport.write(edge_hello)
            answer = await connection.read_exactly(SHARD_HELLO_BYTES, timeout_s)
            shard_hello, proof = answer[:-_PROOF_BYTES], answer[-_PROOF_BYTES:]
            if not hmac.compare_digest(proof, _proof(secret, b"shard", edge_hello, shard_hello)):
                raise LaneBroken(f"lane to {host}:{port}: the listener does not know the shard's secret")
            (theirs,) = _VERSION.unpack(shard_hello[NONCE_BYTES:])
            if not wire_compatible(version, theirs):
                raise WireMismatch(tell_mismatch(version, theirs, f"the shard at {host}:{port}"))
            transport.write(_proof(secret, b"edge", edge_hello, shard_hello))
        except LaneBroken:  # before OSError: it is one
            transport.close()
            raise
        except (OSError, TimeoutError) as e:
            transport.close()
            raise LaneBroken(f"lane to {host}:{port}: handshake {type(e).__name__}") from e
        return cls(connection, theirs)

    @property
    def broken(self) -> bool:
        # A lane lives on the loop that opened it. Once that loop is closed (one asyncio.run of a
        # benchmark's phase ended) nothing reads its socket: a call on it would wait forever.
        return self._connection.broken is not None or self._loop.is_closed()

    async def call(self, method: str, *args: Any, timeout_s: float | None = None) -> Any:
        connection = self._connection
        if connection.broken is not None:
            raise LaneBroken(str(connection.broken))
        request_id = next(self._ids)
        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        connection.waiting[request_id] = reply
        try:
            connection.write(pickle.dumps((request_id, method, args), protocol=pickle.HIGHEST_PROTOCOL))
            ok, result = await (reply if timeout_s is None else asyncio.wait_for(reply, timeout_s))
        finally:
            connection.waiting.pop(request_id, None)
        if not ok:
            raise _remote_error(*result)
        return result

    def close(self) -> None:
        self._connection.fail(LaneBroken("closed"))
        self._connection.close()
