"""The edge's road to the shards: operations up, routed, retried and batched; events down.

Every operation of the edge goes through here, in three layers. `to_users` / `to_channels` /
`to_user` / `to_channel` route by the slot map and send again what a shard answers MOVED (its
slots are migrating) once the map has flipped; `to_shard` retries one operation while its shard
restarts; both within one budget (`call_retry_s`), after which `ShardUnavailable` is raised (the
edge closes the socket with 1011). `until_landed` retries past that budget what must not be lost
(departures). Underneath, `call` queues operations per shard; they leave as one call when the
batch is `window_ms` old (`idle_window_ms` if no call to that shard is in flight) or `max_ops`
long, whichever comes first: one call per frame would cap the edge at a few thousand frames a
second. That rule is a pure object (`edge.batching.Lines`); the router keeps its timers. Events
come back through one long-poll per shard (`pull`), at-least-once with sequence numbers. A shard
that answers with a new incarnation has restarted and lost its memory; the router tells the
server, which registers its live sockets there again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from actors.clients import ActorDied, MapTuple
from actors.core import ops
from actors.core.backoff import Backoff
from actors.core.contract import (
    MOVED,
    PULL_BATCH,
    UNAVAILABLE,
    Address,
    ApplyReply,
    Mail,
    MailChunk,
    MailItem,
    ShardStats,
)
from actors.core.slots import SlotMap, channel_key
from actors.metrics import Metrics
from actors.retry import retry
from edge.batching import KEEP_TIMER, SEND_NOW, Lines

log = logging.getLogger("presence.router")

Deliver = Callable[[Address, str], None]
OnRestart = Callable[[int], Awaitable[None]]

# A failed pull is retried within at most a second: a restarted shard is noticed (and registered
# again) within about a second of coming back, which the watchers' resync counts on. Jittered, so
# that the edges do not all call the new incarnation in the same instant.
PULL_RETRY = Backoff(first_s=0.2, cap_s=1.0)
DIRECTORY_WAIT_S = 60.0  # an edge starting while the directory restarts waits this long for it
# An operation whose shard restarts (Ray brings it back in seconds) is retried within
# `call_retry_s`, jittered so that the edges do not all call the new incarnation in the same
# instant.
CALL_RETRY = Backoff(first_s=0.1, cap_s=2.0)
# A departure (or its replay to a restarted shard) is retried past that window, until it lands.
DEPARTURE_RETRY = Backoff(first_s=1.0, cap_s=30.0)

T = TypeVar("T")
A = TypeVar("A")
# A first try that applied nothing (routed's slow road takes over): the slots moved, or it failed.
_MOVED, _FAILED = object(), object()
# The figures observed for every batch and every chunk of mail, their keys made once.
_BATCH_OPS = Metrics.figure_key("edge_batch_ops")
_CALL_SECONDS = Metrics.figure_key("edge_actor_call_seconds")
_DELIVERY_SECONDS = Metrics.figure_key("edge_delivery_seconds")
_PULL_ITEMS = Metrics.figure_key("edge_pull_items")
# An operation waiting in its shard's line, with the future that gets its answer's wire form
# (read into the typed answer by the operation itself, `Operation.read`, once routing is done).
Queued = tuple[ops.Operation[object], "asyncio.Future[object]"]


class Shard(Protocol):
    """One shard as the edge calls it: `actors.clients.ShardClient`, a fake in the unit tests."""

    index: int

    async def apply_and_collect(
        self, edge_id: str, ops: list[ops.Operation[object]], incarnation: str | None, acked_seq: int
    ) -> ApplyReply: ...
    async def pull(
        self, edge_id: str, incarnation: str | None, acked_seq: int, wait_s: float, resend: bool = False
    ) -> Mail: ...
    async def stats(self, timeout_s: float) -> ShardStats: ...
    async def is_focused(self, user_id: str, channel_id: str, timeout_s: float) -> bool: ...
    async def operator_view(self, user_id: str, timeout_s: float) -> dict[str, object] | None: ...
    async def server_members(self, server_id: str, timeout_s: float) -> list[str]: ...
    async def postgres_ok(self, timeout_s: float) -> bool: ...
    def close_lane(self) -> None: ...


class Shards(Protocol):
    """Where the router finds the pool (injected, as a Ray Serve deployment receives the handles
    it calls): the directory's slot map and a client per shard. `actors.clients.ShardClients`."""

    async def get_map(self) -> MapTuple: ...
    def shard(self, index: int) -> Shard: ...


class ShardUnavailable(RuntimeError):
    """An operation found no shard to apply it within the retry window (or its shard could not
    load what it needs): nothing of it was applied."""


# What a shard call fails with while its shard restarts (ValueError: not registered with Ray yet).
CALL_ERRORS = (*ActorDied, ValueError, TimeoutError, ShardUnavailable)


@dataclass
class Inbox:
    """The mail of one shard for this edge, put back in order (see actors.core.contract.MailChunk).

    Chunks come by two roads, the replies of `apply` and of `pull`, which can overtake each other:
    a chunk is delivered once it follows what was delivered (`prev` ≤ `delivered`; items already
    delivered are skipped, so a chunk sent again is harmless), else it waits here for the ones
    before it. A new incarnation of the shard starts over. `resend`: the next pull asks for
    everything after `delivered` again (a reply was lost, or a gap did not close by itself)."""

    incarnation: str | None = None
    delivered: int = 0
    early: dict[int, tuple[int, list[MailItem]]] = field(default_factory=dict)
    resend: bool = False

    def receive(self, incarnation: str, chunk: MailChunk) -> list[MailItem]:
        """The items of `chunk` (and of chunks it unblocks) to deliver now, in order."""
        if incarnation != self.incarnation:
            self.incarnation, self.delivered, self.early = incarnation, 0, {}
        prev, last, items = chunk
        if prev > self.delivered:
            if items:
                self.early[prev] = (last, items)
            return []
        out = self._take(last, items)
        while self.early:
            ready = sorted(p for p in self.early if p <= self.delivered)
            if not ready:
                break
            for p in ready:
                out += self._take(*self.early.pop(p))
        return out

    def _take(self, last: int, items: list[MailItem]) -> list[MailItem]:
        # Items are contiguous and end at `last`; those up to `delivered` were delivered already.
        skip = max(0, self.delivered + 1 - (last - len(items) + 1))
        self.delivered = max(self.delivered, last)
        return items[skip:]

    def pull_args(self) -> tuple[str | None, int, bool]:
        """(incarnation, acknowledged, resend) for the next pull."""
        resend = self.resend or bool(self.early)
        self.resend = False
        return self.incarnation, self.delivered, resend


class Router:
    def __init__(
        self,
        edge_id: str,
        deliver: Deliver,
        on_restart: OnRestart,
        metrics: Metrics,
        pool: Shards,
        window_ms: float = 2.0,
        max_ops: int = 500,
        pull_wait_s: float = 5.0,
        pull_gather_ms: float = 0.0,
        call_retry_s: float = 10.0,
        max_in_flight: int = 2,
        idle_window_ms: float = 0.2,
        connect_window_ms: float = 0.0,
        forget: Callable[[Callable[[str], bool]], None] | None = None,
        unreachable_after_s: float = 15.0,
    ) -> None:
        self.edge_id = edge_id
        self.deliver = deliver
        # Told, before the first mail of a shard's new incarnation is delivered, which accounts'
        # decisions went with the old one (the edge's index of watchers forgets them): see
        # `_lost_with`.
        self.forget = forget
        self.on_restart = on_restart
        self.metrics = metrics
        self.window_s = window_ms / 1000
        self.idle_window_s = min(idle_window_ms, window_ms) / 1000
        self.connect_window_s = max(connect_window_ms, window_ms) / 1000 if connect_window_ms > 0 else 0.0
        self.pull_wait_s = pull_wait_s
        self.pull_gather_s = pull_gather_ms / 1000
        self.call_retry_s = call_retry_s
        self.unreachable_after_s = unreachable_after_s
        self.pool = pool
        self.map: SlotMap | None = None
        self.shards: dict[int, Shard] = {}
        self.incarnations: dict[int, str] = {}
        self.last_contact: dict[int, float] = {}
        # Per shard, the map this edge routed by when mail of the shard's current incarnation last
        # came: what that incarnation owned, as far as this edge can tell, when last heard from.
        self._map_heard: dict[int, SlotMap] = {}
        # The batching rule (edge/batching.py); the timers it asks for are kept here.
        self.lines: Lines[Queued] = Lines(
            window_s=self.window_s,
            idle_window_s=self.idle_window_s,
            connect_window_s=self.connect_window_s,
            max_ops=max_ops,
            max_in_flight=max_in_flight,
            is_lazy=self._lazy,
        )
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._pullers: dict[int, asyncio.Task[None]] = {}
        self.inboxes: dict[int, Inbox] = {}
        self._closed = False
        # Looks at the slot map go one at a time (`refresh_map`): looks begun, and the last one
        # that finished with an answer installed.
        self._map_lock = asyncio.Lock()
        self._looks_begun = 0
        self._looks_done = 0

    async def start(self) -> None:
        # The directory may be restarting (a rollout has just replaced it, its node died): an
        # edge starting then waits for it, bounded, instead of failing its start at once.
        await retry(
            self.refresh_map, PULL_RETRY, retry_on=CALL_ERRORS, deadline=time.monotonic() + DIRECTORY_WAIT_S
        )
        # One round trip to every shard: learns their incarnations, takes their leases and
        # makes /healthz true as soon as the edge can really reach its actors.
        await asyncio.gather(*(self.call(i, ops.PING) for i in self.shards))

    async def refresh_map(self) -> None:
        """A fresh look at the slot map: one begun after this call came.

        Looks go one at a time. Two overlapping looks could be answered in either order, and the
        older answer installed last put the edge back on a map it had left; any version it has not
        seen is taken (a restarted directory starts over), so only the order can keep it from
        that. The edge then routed slots by a map the directory had heard it leave, and `presence
        rollout` could replace an actor the edge still sent them to (the likely cause of a failure
        of tests/integration/test_rollout.py on a loaded machine). A caller that comes while a
        look is out waits for it and takes the next one's answer, or the answer of one begun after
        it came, if that one is done already."""
        wanted = self._looks_begun + 1
        async with self._map_lock:
            if self._looks_done >= wanted:
                return
            self._looks_begun += 1
            look = self._looks_begun
            version, owners, count = await self.pool.get_map()
            if self.map is None or self.map.version != version:
                self.map = SlotMap(version, tuple(owners), count)
            self._looks_done = look
        # Every look at the map also starts a puller that is missing (a shard index back after a
        # shrink retired it, or one that ended anyway): each shard's mail must keep coming.
        for i in range(self.map.shard_count):
            if i not in self.shards:
                self.shards[i] = self.pool.shard(i)
            puller = self._pullers.get(i)
            # A shard index may come back after a shrink retired it (its puller has ended).
            if puller is None or puller.done():
                self._pullers[i] = asyncio.create_task(self._pull_loop(i))
                if self.incarnations:  # a shard added by a resize: take its lease at once
                    self.call(i, ops.PING).add_done_callback(lambda f: f.exception())

    async def close(self) -> None:
        self._closed = True
        for t in self._pullers.values():
            t.cancel()
        for timer in self._timers.values():
            timer.cancel()
        for shard in self.shards.values():
            shard.close_lane()

    # ------------------------------------------------------------------ addressing

    def shard_of_user(self, user_id: str) -> int:
        assert self.map is not None
        return self.map.shard_of(user_id)

    def shard_of_channel(self, channel_id: str) -> int:
        assert self.map is not None
        return self.map.shard_of(channel_key(channel_id))

    async def wait_for_map_after(self, version: int, deadline: float) -> bool:
        """Wait until the directory publishes a map newer than `version` (a slot flip).

        The directory itself may be restarting meanwhile (`presence rollout` replaces it last,
        right after the shards' flips): it is asked again until `deadline`, like a restarting
        shard, instead of failing the operation (its socket closed 1011 during a rollout)."""
        while time.monotonic() < deadline:
            with contextlib.suppress(*CALL_ERRORS):
                await self.refresh_map()
            if self.map is not None and self.map.version != version:
                return True
            await asyncio.sleep(0.01)
        return False

    def healthy(self, max_silence_s: float | None = None) -> bool:
        """This edge can serve: more than half of the shards answered it within `max_silence_s`
        (default `unreachable_after_s`).

        Not "every shard": a shard restarting somewhere (its node died, Ray brings it back
        elsewhere) is the same for every edge, and a balancer that checks /healthz would pull
        them all at once; the operations that need that shard wait or are refused meanwhile, the
        rest go on. An edge that cannot reach most of the pool (its node cut off) is pulled."""
        if self.map is None:
            return False
        now = time.monotonic()
        if max_silence_s is None:
            max_silence_s = self.unreachable_after_s
        answered = sum(
            1 for i in range(self.map.shard_count) if now - self.last_contact.get(i, 0.0) < max_silence_s
        )
        return 2 * answered > self.map.shard_count

    # ------------------------------------------------------------------ operations, routed and retried

    async def to_user(self, user_id: str, op: ops.Operation[A]) -> A:
        """`op` (about `user_id`) applied by the account's shard; its answer."""
        return (await self.routed([user_id], self.shard_of_user, lambda _: op))[0]

    async def to_channel(self, channel_id: str, op: ops.Operation[A]) -> A:
        return (await self.routed([channel_id], self.shard_of_channel, lambda _: op))[0]

    async def to_users(
        self, user_ids: Sequence[str], make_op: Callable[[list[str]], ops.Operation[A]]
    ) -> list[A]:
        """`make_op(the accounts of one shard)` sent to each owning shard; their answers."""
        return await self.routed(list(user_ids), self.shard_of_user, make_op)

    async def to_channels(
        self, channel_ids: Sequence[str], make_op: Callable[[list[str]], ops.Operation[A]]
    ) -> list[A]:
        return await self.routed(list(channel_ids), self.shard_of_channel, make_op)

    async def routed(
        self,
        keys: list[str],
        shard_of: Callable[[str], int],
        make_op: Callable[[list[str]], ops.Operation[A]],
    ) -> list[A]:
        """Send `make_op(keys of one shard)` to each owning shard; keys whose shard answers
        MOVED (their slots are migrating) are sent again once the slot map has changed. One
        budget for all of it: migrations and restarts together get `call_retry_s`."""
        deadline: float | None = None
        if keys:
            # The common case in one await, without a task per shard or a retry frame: every key
            # on one shard, which answers. Anything else (several shards, MOVED, UNAVAILABLE, a
            # restarting shard: nothing of the operation was applied) takes the road below, as if
            # this had been its first attempt.
            shard = shard_of(keys[0])
            if all(shard_of(k) == shard for k in keys[1:]):
                assert self.map is not None
                version = self.map.version
                op = make_op(keys)
                answer = await self._first_try(shard, op)
                if answer is not _FAILED and answer is not _MOVED:
                    return [op.read(answer)]
                deadline = time.monotonic() + self.call_retry_s
                if answer is _MOVED:
                    self.metrics.inc("edge_moved_total")
                    if not await self.wait_for_map_after(version, deadline):
                        raise ShardUnavailable("slots stayed in migration past the retry window")
                else:  # what to_shard does after a failed attempt: a fresh map, a jittered wait
                    with contextlib.suppress(Exception):
                        await self.refresh_map()
                    await asyncio.sleep(CALL_RETRY.delay(0, random.random))
        if deadline is None:
            deadline = time.monotonic() + self.call_retry_s
        results: list[A] = []
        pending = keys
        while pending:
            assert self.map is not None
            version = self.map.version
            groups: dict[int, list[str]] = {}
            for key in pending:
                groups.setdefault(shard_of(key), []).append(key)
            sent = [(group, make_op(group)) for group in groups.values()]
            answers = await asyncio.gather(
                *(self._retried(shard, op, deadline) for shard, (_, op) in zip(groups, sent, strict=True))
            )
            pending = []
            for (group, op), answer in zip(sent, answers, strict=True):
                if answer == MOVED:
                    pending.extend(group)
                else:
                    results.append(op.read(answer))
            if pending:
                self.metrics.inc("edge_moved_total")
                if not await self.wait_for_map_after(version, deadline):
                    raise ShardUnavailable("slots stayed in migration past the retry window")
        return results

    async def _first_try(self, shard: int, op: ops.Operation[object]) -> object:
        """One attempt: the answer's wire form, or `_MOVED` / `_FAILED` when the operation was
        not applied."""
        try:
            answer = await self.call(shard, op)
        except CALL_ERRORS:
            return _FAILED
        if isinstance(answer, str) and answer in (MOVED, UNAVAILABLE):
            return _MOVED if answer == MOVED else _FAILED
        return answer

    async def to_shard(self, shard: int, op: ops.Operation[object]) -> bool:
        """One operation on one shard (re-registering a restarted shard), retried while the shard
        restarts, within `call_retry_s`. False: not applied there, its slots live elsewhere now
        (MOVED, or a shrink retired the shard meanwhile)."""
        return await self._retried(shard, op, time.monotonic() + self.call_retry_s) != MOVED

    async def _retried(self, shard: int, op: ops.Operation[object], deadline: float) -> object:
        """`op` on `shard`, retried while the shard restarts, until `deadline`: the answer's wire
        form, or MOVED (also if a shrink retired the shard meanwhile)."""

        async def attempt() -> object:
            try:
                result = await self.call(shard, op)
                if result == UNAVAILABLE:
                    raise ShardUnavailable("the shard could not load what this operation needs")
                return result
            except CALL_ERRORS:
                with contextlib.suppress(Exception):
                    await self.refresh_map()
                if self.map is not None and shard >= self.map.shard_count:
                    return MOVED  # retired by a shrink: its slots live elsewhere now
                raise

        try:
            return await retry(attempt, CALL_RETRY, retry_on=CALL_ERRORS, deadline=deadline)
        except CALL_ERRORS as e:
            raise ShardUnavailable(f"shard {shard} unavailable: {type(e).__name__}") from e

    async def until_landed(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """Retry `call` past the retry window, with backoff, until it succeeds (departures and
        their replays: losing one would leave a ghost or an old last-seen). Each retry is safe:
        the shard records a departure at most once, and last-seen never moves back."""

        def failed(e: BaseException, wait: float) -> None:
            self.metrics.inc("edge_departure_retries_total")
            log.warning("%s not recorded yet (%s); trying again in %.1f s", what, e, wait)

        return await retry(call, DEPARTURE_RETRY, retry_on=ShardUnavailable, on_retry=failed)

    # ------------------------------------------------------------------ operations, batched

    def call(self, shard: int, op: ops.Operation[object]) -> asyncio.Future[object]:
        """Queue `op` on its shard's line; the future gets its answer once the batch is back.

        When the line leaves is `Lines.add`'s rule (edge/batching.py): Nagle's on an idle line,
        `window_ms` on a busy one, `connect_window_ms` for a busy line of connects only."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[object] = loop.create_future()
        wait = self.lines.add(shard, (op, fut))
        if wait == SEND_NOW:
            self._send_now(shard)
        elif wait != KEEP_TIMER:
            timer = self._timers.pop(shard, None)
            if timer is not None:
                timer.cancel()
            self._timers[shard] = loop.call_later(wait, self._send_now, shard)
        return fut

    def _lazy(self, item: Queued) -> bool:
        """An operation that may wait `connect_window_ms` on a busy line."""
        return self.connect_window_s > 0 and isinstance(item[0], ops.Connect)

    def _send_now(self, shard: int) -> None:
        timer = self._timers.pop(shard, None)
        if timer is not None:
            timer.cancel()
        batch = self.lines.take(shard)
        if batch is not None:
            asyncio.get_running_loop().create_task(self._send(shard, batch))

    def _came_back(self, shard: int) -> None:
        """A call to `shard` returned: send what waited for it, if the rule lets it leave."""
        if self.lines.came_back(shard):
            self._send_now(shard)

    async def _send(self, shard: int, batch: list[Queued]) -> None:
        started = time.perf_counter()
        self.metrics.observe_key(_BATCH_OPS, len(batch))
        inbox = self.inboxes.setdefault(shard, Inbox())
        try:
            client = self.shards.get(shard)
            if client is None:  # dropped after a shrink retired it: the caller learns MOVED
                raise ShardUnavailable(f"shard {shard} was retired by a resize")
            incarnation, results, mail = await client.apply_and_collect(
                self.edge_id, [op for op, _ in batch], inbox.incarnation, inbox.delivered
            )
        except Exception as e:
            self._came_back(shard)
            inbox.resend = True  # the reply may have carried mail: the next pull asks again
            self.metrics.inc("edge_call_errors_total", shard=str(shard))
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(e)
            return
        except BaseException:
            self._came_back(shard)
            raise
        # Before the incarnation check: re-registering a restarted shard sends calls of its own.
        self._came_back(shard)
        self.metrics.observe_seconds_key(_CALL_SECONDS, time.perf_counter() - started)
        self.last_contact[shard] = time.monotonic()
        for (_, fut), result in zip(batch, results, strict=True):
            if not fut.done():
                fut.set_result(result)
        self._deliver_mail(shard, incarnation, mail)
        await self._check_incarnation(shard, incarnation)

    def _deliver_mail(self, shard: int, incarnation: str, chunk: MailChunk) -> None:
        """A chunk of a shard's mail, from either road, to the sockets in order."""
        inbox = self.inboxes.setdefault(shard, Inbox())
        if inbox.incarnation not in (None, incarnation) and self.forget is not None:
            self.forget(self._lost_with(shard))
        items = inbox.receive(incarnation, chunk)
        if self.map is not None:
            self._map_heard[shard] = self.map
        if items:
            started = time.perf_counter()
            for address, payload in items:
                self.deliver(address, payload)
            self.metrics.observe_seconds_key(_DELIVERY_SECONDS, time.perf_counter() - started)

    def _lost_with(self, shard: int) -> Callable[[str], bool]:
        """The accounts whose decisions went with a shard's old incarnation: those it owned when
        last heard from and owns now. Not the ones it owns by the current map alone: a shard that
        `presence rollout` replaced had handed every slot away first, and the slots it was given
        back came with their watchers and decisions, which still hold; forgetting them left their
        watchers told nothing until the resync, seconds later (the fan-out p99 of 1-4 s during each
        actor's turn in `bench rollout`). Nor the ones it owned when last heard from alone: an
        edge that heard last on an older map would forget accounts another shard now decides."""
        now, then = self.map, self._map_heard.get(shard, self.map)
        if now is None or then is None:
            return lambda _user_id: False
        return lambda user_id: now.shard_of(user_id) == shard and then.shard_of(user_id) == shard

    async def _check_incarnation(self, shard: int, incarnation: str) -> None:
        known = self.incarnations.get(shard)
        self.incarnations[shard] = incarnation
        if known is not None and known != incarnation:
            log.warning(
                "shard %d restarted or forgot this edge (incarnation %s → %s); registering sockets again",
                shard,
                known,
                incarnation,
            )
            self.metrics.inc("edge_shard_restarts_total", shard=str(shard))
            await self.on_restart(shard)

    # ------------------------------------------------------------------ events, long-polled

    def _drop_retired(self, shard: int) -> None:
        """A shard a shrink retired, its mail all collected: its client goes, so the operator
        page, /cluster and /metrics show exactly the shards of the current map."""
        if self._closed or self.map is None or shard < self.map.shard_count:
            return
        client = self.shards.pop(shard, None)
        if client is not None:
            client.close_lane()
        self.last_contact.pop(shard, None)

    async def _still_alive(self, shard: int) -> bool:
        try:
            await self.shards[shard].stats(timeout_s=2.0)
        except Exception:
            return False
        return True

    async def _pull_loop(self, shard: int) -> None:
        inbox = self.inboxes.setdefault(shard, Inbox())
        for counter in ("edge_call_errors_total", "edge_shard_restarts_total", "edge_pull_failures_total"):
            self.metrics.declare(counter, shard=str(shard))

        async def pull() -> Mail | None:
            """The next mail, or None once there is none to collect any more."""
            if self._closed:
                return None
            if self.map is not None and shard >= self.map.shard_count and not await self._still_alive(shard):
                return None  # retired by a shrink, its mail all collected
            seen, acked, resend = inbox.pull_args()
            try:
                return await self.shards[shard].pull(self.edge_id, seen, acked, self.pull_wait_s, resend)
            except BaseException:
                inbox.resend = True  # its reply may have carried mail
                raise

        def failed(e: BaseException, wait: float) -> None:
            log.info("pull from shard %d failed (%s); retrying", shard, type(e).__name__)

        while True:
            pulled = await retry(pull, PULL_RETRY, on_retry=failed)
            if pulled is None:
                self._drop_retired(shard)
                return
            incarnation, chunk = pulled
            self.last_contact[shard] = time.monotonic()
            items = chunk[2]
            try:
                self._deliver_mail(shard, incarnation, chunk)
                self.metrics.observe_key(_PULL_ITEMS, len(items))
                await self._check_incarnation(shard, incarnation)
            except Exception:
                # The next look at the map (`refresh_map`, every few seconds) would start a puller
                # that ended here again, but this shard's mail meanwhile would go untold to this
                # edge's watchers: the puller logs the bug and pulls on.
                self.metrics.inc("edge_pull_failures_total", shard=str(shard))
                log.exception("shard %d: delivering its mail failed; pulling on", shard)
            if 0 < len(items) < PULL_BATCH and self.pull_gather_s > 0:
                await asyncio.sleep(self.pull_gather_s)  # the next call carries more; a backlog goes at once
