"""PresenceActor: the shell around one shard's pure state.

It loads what the state needs from PostgreSQL before feeding it operations, then carries out the
effects the state leaves: frames into per-edge mailboxes (edges long-poll them), last-seen values
to the FlushActor, chosen statuses and settings to PostgreSQL, online counts to Redis. Nothing
here decides presence; `actors.core.shard` does. No Ray either: `actors.pool` hosts this class.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

from actors import gc_policy
from actors.core import activity, frames
from actors.core import ops as ops_
from actors.core.answers import wire
from actors.core.apply import apply
from actors.core.audience import Relations
from actors.core.backoff import Backoff
from actors.core.budgets import Allowance
from actors.core.contract import MOVED, UNAVAILABLE, Address, MailChunk, ShardStats, iso_ms
from actors.core.effects import (
    Activity,
    Deliver,
    EdgeForgotten,
    HeldPlaces,
    OnlineCount,
    PersistChosen,
    PersistVisibility,
    Publish,
    SocketCount,
)
from actors.core.loaded import NotLoaded
from actors.core.mailbox import Mailbox
from actors.core.ops import NOTHING, Batch, Operation, from_wire
from actors.core.shard import ShardState, SlotExport
from actors.core.slots import slot_of
from actors.counts import OnlineCounts
from actors.held import HeldStore, Places
from actors.metrics import Metrics
from actors.retry import retry, supervise
from actors.store import AudienceEvents, ShardStore

log = logging.getLogger("presence.shard")

# The unlabelled counters of a shard, exported at 0 from its start; tests/unit/test_metrics.py
# checks the list against the code.
COUNTERS = (
    "checkpoint_rows_total",
    "deliveries_total",
    "last_seen_acked_total",
    "last_seen_flush_failures_total",
    "mail_dropped_total",
    "shard_edges_forgotten_total",
    "shard_held_write_failures_total",
    "shard_ops_unavailable_total",
    "shard_preload_failures_total",
    "slots_exported_total",
    "slots_imported_total",
)

FlushWrite = Callable[[list[tuple[str, float]]], Awaitable[None]]

# Saving last-seen (to the FlushActor) and chosen statuses (to PostgreSQL) is retried until it
# lands: a restarting FlushActor or database only delays it. Jittered, so that the shards do not
# all come back at the same instant to a server that has just recovered.
SAVE_RETRY = Backoff(first_s=0.5, cap_s=30.0)


class EdgeMail(Mailbox):
    """An edge's mailbox (actors/core/mailbox.py) with what wakes the edge's waiting pull, and the
    incarnation the edge is told: the shard's, tagged with this box. A box goes when the shard
    forgets the edge (its lease ran out, its node was declared dead), and everything the edge
    registered here goes with it; to the edge, the next box is a new incarnation, so it registers
    its sockets again and starts its mail over (a box's numbers restart at 1: under the old name
    the edge would skip them as delivered). `known`: a call of the edge has carried this name
    since, so the edge has registered its sockets here again (it calls with a new name only after
    re-registering)."""

    __slots__ = ("event", "incarnation", "known")

    def __init__(self, incarnation: str) -> None:
        super().__init__()
        self.event = asyncio.Event()
        self.incarnation = incarnation
        self.known = False


@dataclass
class ShardConfig:
    shard_index: int
    database_url: str
    redis_url: str | None
    socket_timeout_s: float = 90.0
    last_seen_precision_s: int = 60
    typing_lapse_s: float = 10.0
    checkpoint_interval_s: float = 600.0
    count_refresh_s: float = 30.0
    count_ttl_s: float = 90.0
    sweep_interval_s: float = 1.0
    gc_thresholds: tuple[int, int, int] | None = None  # see actors/gc_policy.py; None: untouched
    # Per-account budgets (actors/core/budgets.py): status publications per window, and the
    # (per minute, burst) allowances of ids looked up and of voice joins.
    status_publications: int = 5
    lookup_allowance: tuple[float, float] = (1_200.0, 2_000.0)
    voice_allowance: tuple[float, float] = (30.0, 10.0)
    # How often held-back status changes are checked for being due (cheap when none is held).
    publish_tick_s: float = 0.05
    # Where the shard's direct lane for the edges listens (actors/lane.py): an address, or
    # "node" for the address its Ray node has (a cluster: edges on other nodes connect to it).
    lane_host: str = "127.0.0.1"


class PresenceShard:
    def __init__(
        self,
        config: ShardConfig,
        flush_write: FlushWrite,
        store: ShardStore,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.clock = clock
        self.flush_write = flush_write
        self.store = store
        self.incarnation = secrets.token_hex(8)
        self._boxes_made = itertools.count(1)
        self.state = ShardState(
            socket_timeout_s=config.socket_timeout_s,
            last_seen_precision_s=config.last_seen_precision_s,
            typing_lapse_s=config.typing_lapse_s,
            checkpoint_interval_s=config.checkpoint_interval_s,
            status_publications=config.status_publications,
            allowances={
                "lookups": Allowance(*config.lookup_allowance),
                "voice": Allowance(*config.voice_allowance),
            },
        )
        self.mail: dict[str, EdgeMail] = {}
        # One edge's batches apply in the order they arrive, even when an earlier one waits on
        # PostgreSQL and a later one needs nothing loaded (asyncio.Lock wakes waiters in order).
        self._edge_order: dict[str, asyncio.Lock] = {}
        # Per edge, its batches in `_apply` (waiting for their turn or a load): a batch that
        # could be applied at once waits behind them all the same (`_apply_now`).
        self._applying: dict[str, int] = {}
        # Accounts and channels that batches (and slot imports) waiting on PostgreSQL will apply
        # with, counted per waiter (`_in_use`): the sweep keeps them. What `_missing` found in
        # memory, or a load has just installed, is not referenced by the state yet (a subscriber's
        # relations, when its sockets live on another shard), and a sweep during the wait would
        # drop it: the batch would then apply without it (a member's subscribe refused).
        self._users_in_use: Counter[str] = Counter()
        self._channels_in_use: Counter[str] = Counter()
        self.metrics = Metrics(COUNTERS)
        # Labelled by a bounded set known now: at 0 from the start too, so that rate() sees the
        # first operation or event of a kind.
        for key in _OP_KEYS.values():
            self.metrics.counters[key] += 0
        for frame_type in EVENT_TYPES_COUNTED:
            self.metrics.counters[_EVENT_KEYS[frame_type]] += 0
        self.counts = OnlineCounts(config.redis_url, ttl_s=config.count_ttl_s, clock=clock)
        # Held places (actors/held.py): the latest of each account's, waiting to be written.
        self.held = HeldStore(config.redis_url) if config.redis_url else None
        self._held_dirty: dict[str, Places] = {}
        self._held_wake = asyncio.Event()
        # account → (value, when it was chosen): the newest choice waiting to be saved.
        self.persist_status: dict[str, tuple[str, float]] = {}
        self.persist_visibility: dict[str, tuple[str, float]] = {}
        # The batch being written now: not saved yet either (a reload must not see the older
        # stored value, nor may the account be evicted meanwhile).
        self._saving_status: dict[str, tuple[str, float]] = {}
        self._saving_visibility: dict[str, tuple[str, float]] = {}
        self._persist_wake = asyncio.Event()
        self._flush_wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._reload_users: set[str] = set()
        self._reload_channels: set[str] = set()
        # Set when an audience change is announced, and while status changes are held back: the
        # loops that handle them sleep otherwise (a shard at rest wakes for its sweeps only).
        self._reload_wake = asyncio.Event()
        self._held_back = asyncio.Event()
        # Slots this shard serves; None until the shell learns them from the slot directory.
        self.owned: set[int] | None = None
        self.node_id: str | None = None  # the Ray node it runs on, told by the Ray wrapper
        self.node_ip: str | None = None

    def set_owned(self, slots: set[int]) -> None:
        self.owned = set(slots)

    def _owns(self, op: Operation[object]) -> bool:
        return self.owned is None or all(slot_of(k) in self.owned for k in op.slot_keys())

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.store.start(
            AudienceEvents(
                on_user=self._reload_user,
                on_settings=self._reload_user,
                on_channel=self._reload_channel,
                on_reset=self._reload_everything,
            )
        )
        await self._restore_held()
        for loop in (
            self._held_loop,
            self._sweep_loop,
            self._flush_loop,
            self._persist_loop,
            self._count_loop,
            self._checkpoint_loop,
            self._reload_loop,
            self._publish_loop,
        ):
            self._tasks.append(asyncio.create_task(self._forever(loop)))
        if self.config.gc_thresholds is not None:
            gc_policy.apply(self.config.gc_thresholds, self.metrics)

    async def stop(self) -> None:
        await self.drain(timeout_s=10.0)
        for t in self._tasks:
            t.cancel()
        await self.counts.close()
        if self.held is not None:
            await self.held.close()
        await self.store.stop()

    async def _forever(self, loop: Callable[[], Awaitable[None]]) -> None:
        self.metrics.declare("shard_errors_total", loop=loop.__name__)

        def failed(e: Exception) -> None:
            log.error(
                "shard %s: %s failed; restarting it", self.config.shard_index, loop.__name__, exc_info=e
            )
            self.metrics.inc("shard_errors_total", loop=loop.__name__)

        await supervise(loop, restart_after_s=1.0, on_failure=failed)

    # ------------------------------------------------------------------ the edge-facing API

    async def apply(self, edge_id: str, ops: Batch) -> tuple[str, list[object]]:
        """One batch of operations from one edge, applied in order (each typed, or in its wire
        form: `ops.from_wire`). Returns the incarnation the edge is told (`EdgeMail`) and one
        result per op."""
        results = await self._apply(edge_id, from_wire(ops), collect=False)
        return self._box(edge_id).incarnation, results

    async def _apply(self, edge_id: str, ops: list[Operation[object]], collect: bool) -> list[object]:
        """`apply`; `collect`: the batch's reply takes the edge's mail (its pull is not woken)."""
        started = time.perf_counter()
        self._applying[edge_id] = self._applying.get(edge_id, 0) + 1
        try:
            async with self._order(edge_id):
                now = self.clock()
                self.state.refresh_edge(edge_id, now)
                self._box(edge_id)
                missing = self._missing(ops)
                if missing is None:  # nothing to wait for: applied in this same turn
                    results = self._apply_batch(edge_id, ops, collect)
                else:
                    with self._in_use(missing.users, missing.channels_used):
                        try:
                            await self._load(missing, now)
                        except self.store.errors as e:
                            self.metrics.inc("shard_preload_failures_total")
                            log.warning(
                                "shard %s: loading from PostgreSQL failed (%s); applying what is in memory",
                                self.config.shard_index,
                                type(e).__name__,
                            )
                        results = self._apply_batch(edge_id, ops, collect)
        finally:
            if self._applying[edge_id] == 1:
                del self._applying[edge_id]
            else:
                self._applying[edge_id] -= 1
        self._observe_batch(len(ops), started)
        return results

    def _apply_now(self, edge_id: str, ops: list[Operation[object]]) -> list[object] | None:
        """`_apply(collect=True)` without a turn of the event loop, when nothing makes it wait: no
        earlier batch of this edge still in progress, nothing to load. None: it would wait."""
        if edge_id in self._applying or self._missing(ops) is not None:
            return None
        started = time.perf_counter()
        self.state.refresh_edge(edge_id, self.clock())
        self._box(edge_id)
        results = self._apply_batch(edge_id, ops, collect=True)
        self._observe_batch(len(ops), started)
        return results

    def _apply_batch(self, edge_id: str, ops: list[Operation[object]], collect: bool) -> list[object]:
        now = self.clock()
        # Ownership is checked after any load, so a slot exported meanwhile is refused.
        owned = self.owned
        results = [
            self._apply_checked(edge_id, op, now) if owned is None or self._owns(op) else MOVED for op in ops
        ]
        self._carry_out(collecting=edge_id if collect else None)
        return results

    def _observe_batch(self, ops: int, started: float) -> None:
        self.metrics.observe_key(_BATCH_OPS, ops)
        self.metrics.observe_seconds_key(_APPLY_SECONDS, time.perf_counter() - started)

    def _box(self, edge_id: str) -> EdgeMail:
        box = self.mail.get(edge_id)
        if box is None:
            box = self.mail[edge_id] = EdgeMail(f"{self.incarnation}.{next(self._boxes_made)}")
        return box

    @contextlib.contextmanager
    def _in_use(self, users: Iterable[str], channels: Iterable[str] = ()) -> Iterator[None]:
        """Keep these accounts (row and relations) and channels from the sweep meanwhile."""
        held_users, held_channels = set(users), set(channels)
        self._users_in_use.update(held_users)
        self._channels_in_use.update(held_channels)
        try:
            yield
        finally:
            _release(self._users_in_use, held_users)
            _release(self._channels_in_use, held_channels)

    def _order(self, edge_id: str) -> asyncio.Lock:
        lock = self._edge_order.get(edge_id)
        if lock is None:
            lock = self._edge_order[edge_id] = asyncio.Lock()
        return lock

    async def apply_and_collect(
        self, edge_id: str, ops: Batch, incarnation: str | None, acked_seq: int
    ) -> tuple[str, list[object], MailChunk]:
        """`apply`, with the edge's mail not handed out yet in the same reply (the frames its batch
        caused, mostly: one call per change instead of two). `acked_seq` acknowledges like a pull's
        (for `incarnation`; an older incarnation's acknowledges nothing)."""
        self._acknowledge(edge_id, incarnation, acked_seq)
        results = await self._apply(edge_id, from_wire(ops), collect=True)
        return self._collect(edge_id, results)

    def apply_and_collect_now(
        self, edge_id: str, ops: Batch, incarnation: str | None, acked_seq: int
    ) -> tuple[str, list[object], MailChunk] | None:
        """`apply_and_collect` without a turn of the event loop (`_apply_now`); None: it would wait."""
        self._acknowledge(edge_id, incarnation, acked_seq)
        results = self._apply_now(edge_id, from_wire(ops))
        if results is None:
            return None
        return self._collect(edge_id, results)

    def _acknowledge(self, edge_id: str, incarnation: str | None, acked_seq: int) -> None:
        box = self.mail.get(edge_id)
        if box is not None and incarnation == box.incarnation:
            box.known = True
            box.ack(acked_seq)

    def _collect(self, edge_id: str, results: list[object]) -> tuple[str, list[object], MailChunk]:
        """The reply of an edge's batch: with its mail not handed out yet."""
        box = self._box(edge_id)
        chunk = box.hand_out()
        if box.unhanded():  # more than one reply carries: the pull takes the rest
            box.event.set()
        self.metrics.observe_key(_REPLY_ITEMS, len(chunk[2]))
        return box.incarnation, results, chunk

    async def pull(
        self, edge_id: str, incarnation: str | None, acked_seq: int, wait_s: float, resend: bool = False
    ) -> tuple[str, MailChunk]:
        """Mail for one edge not handed out yet, waiting up to `wait_s` for some. At-least-once:
        items stay until a later pull (or apply) acknowledges them; `resend` hands out again
        everything after `acked_seq` (a reply the edge lost). Each pull also renews the edge's
        lease. An acknowledgement meant for another incarnation (an earlier one of this shard, or
        a box this shard has since forgotten: `EdgeMail`) acknowledges nothing, and everything is
        handed out again."""
        self.state.refresh_edge(edge_id, self.clock())
        self._carry_out()  # renewing one lease may have expired another edge's
        box = self._box(edge_id)
        # An edge that does not know this box's name yet (this incarnation is new to it, or forgot
        # it) is answered at once, mail or not: the name is the news. It registers its sockets
        # again on learning it, which a shard `presence rollout` replaced wants done while it owns
        # nothing (cluster/rollout.py); a pull that waited for mail first made the edge learn it
        # only once its slots were back, and register all their sockets again under load.
        told = incarnation == box.incarnation
        if told:
            box.known = True
        else:
            acked_seq, resend = 0, True
        box.ack(acked_seq)
        if resend:
            box.resend_after(acked_seq)
        deadline = time.monotonic() + wait_s
        # An apply's reply may take what woke us: wait on until something is left to hand out
        # (or until the box is forgotten: see below).
        while (
            told
            and not box.unhanded()
            and self.mail.get(edge_id) is box
            and (left := deadline - time.monotonic()) > 0
        ):
            box.event.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):  # no task of its own, unlike wait_for
                    await box.event.wait()
        # Not word from the edge: its lease was renewed when the pull came in. A pull still waiting
        # when its edge's node died returns when mail for it arrives (or its wait ends); renewed
        # then, the lease would date the dead edge's departures that late (Ray's verdict departs
        # its sockets as of when this shard last heard from it: `edge_died`).
        # The edge forgotten while we waited (a shard stalled past its lease; a verdict of Ray's):
        # the new box, a new incarnation to the edge, is the one to answer from.
        box = self._box(edge_id)
        chunk = box.hand_out()
        self.metrics.observe("shard_pull_items", len(chunk[2]))
        return box.incarnation, chunk

    async def is_focused(self, user_id: str, channel_id: str) -> bool:
        return self.state.is_focused(user_id, channel_id, self.clock())

    async def operator_view(self, user_id: str) -> dict[str, object] | None:
        """The operator's view: real status and the real stored time, whatever the setting;
        None for an account that does not exist (reading never creates one)."""
        row = (await self.store.read_accounts([user_id])).get(user_id)
        if row is None and user_id not in self.state.accounts:
            return None
        now = self.clock()
        memory = self.state.last_seen_of(user_id, now)
        stored = row.last_seen_at if row is not None else None
        candidates = [t for t in (memory, stored) if t is not None]
        acc = self.state.accounts.get(user_id)
        rel = self.state.relations.get(user_id)
        return {
            "userId": user_id,
            "status": self.state.real_status_of(user_id),
            "lastSeenAt": iso_ms(max(candidates)) if candidates else None,
            "lastSeenVisibility": rel.last_seen_visibility
            if rel
            else (row.last_seen_visibility if row else "everyone"),
            "sockets": len(acc.sockets) if acc is not None else 0,
            "chosenStatus": acc.chosen if acc is not None else (row.chosen_status if row else "online"),
            # The operator page's detail: each live socket, where it is and what it reports.
            "liveSockets": [
                {"socketId": sk.socket_id, "edgeId": sk.edge_id, "idle": sk.idle, "focus": sk.focus}
                for sk in (acc.sockets.values() if acc is not None else ())
            ],
        }

    async def postgres_ok(self, timeout_s: float = 1.0) -> bool:
        """Whether this shard reaches its store now (the operator page's health line)."""
        return await self.store.healthy(timeout_s)

    async def server_members(self, server_id: str) -> list[str]:
        """Every member of a server, from the store (the active count of one server)."""
        return await self.store.server_members(server_id)

    async def stats(self) -> ShardStats:
        self.metrics.sample_process()
        return ShardStats(
            shard=self.config.shard_index,
            incarnation=self.incarnation,
            accounts=len(self.state.accounts),
            sockets=self.state.socket_count(),
            online=len(self.state.present_accounts()),
            edges=len(self.state.edges),
            pending_last_seen=len(self.state.pending_last_seen),
            watched=len(self.state.watchers),
            channels=len(self.state.channels.channels),
            slots=len(self.owned) if self.owned is not None else None,
            node_id=self.node_id,
            node_ip=self.node_ip,
            redis_ok=self.counts.healthy,
            metrics=self.metrics.snapshot(),
        )

    def edges_died(self, edge_ids: Iterable[str]) -> list[str]:
        """These edges died with their node: their sockets depart now, each at the moment this
        shard last heard from its edge (`ShardState.edge_died`). Returns those it held."""
        now = self.clock()
        gone = [e for e in edge_ids if self.state.edge_died(e, now)]
        self._carry_out()
        return gone

    async def export_slots(self, slots: list[int]) -> SlotExport:
        """Give up these slots: from now on their operations are answered MOVED."""
        wanted = set(slots)
        if self.owned is not None:
            self.owned -= wanted
        export = self.state.export_slots(wanted)
        self.metrics.inc("slots_exported_total", n=len(wanted))
        return export

    async def import_slots(self, export: SlotExport) -> None:
        """Take over slots exported by another shard, silently: nothing changes for anybody."""
        now = self.clock()
        users = self.state.users_of_export(export)
        # The relations this shard has already are kept while it loads the others, up to the
        # import that decides with them what each arriving watcher sees (`_in_use`).
        with self._in_use(users):
            missing = self.state.missing_relations(users)
            if missing:
                async with self.store.loading() as loads:
                    for user_id, rel in (await loads.relations(missing)).items():
                        self.state.set_relations(user_id, rel, now)
            for edge_id in export.edges:
                self._box(edge_id)  # mail for them may be due at once
            self.state.import_slots(export, self.clock())
        if self.owned is not None:
            self.owned |= set(export.slots)
        self.metrics.inc("slots_imported_total", n=len(export.slots))
        self._carry_out()
        if self.state.pending_last_seen:
            self._flush_wake.set()

    async def mail_pending(self) -> int:
        """Frames waiting for an edge to collect them (a shard is retired only at 0)."""
        return sum(box.kept for box in self.mail.values())

    async def edges_registered(self) -> list[str]:
        """The edges that have called with their box's name since it was made: they know this
        incarnation and have registered their sockets here again."""
        return sorted(edge_id for edge_id, box in self.mail.items() if box.known)

    def unsaved(self) -> set[str]:
        """Accounts whose chosen status or setting is not in PostgreSQL yet."""
        return {
            *self.persist_status,
            *self.persist_visibility,
            *self._saving_status,
            *self._saving_visibility,
        }

    async def drain(self, timeout_s: float) -> int:
        """Hand every pending last-seen value to the FlushActor and save every chosen status and
        setting (clean shutdown), within `timeout_s` whatever PostgreSQL does. Returns how many
        are left, and logs them: what a deadline leaves is lost with this process."""
        deadline = time.monotonic() + timeout_s

        def left() -> int:
            return len(self.state.pending_last_seen) + len(self.unsaved())

        while left() and time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # a failure is retried until the deadline
                await asyncio.wait_for(self._drain_once(), max(0.1, deadline - time.monotonic()))
            if left():
                await asyncio.sleep(0.2)
        if left():
            log.error(
                "shard %s: drain deadline passed with %d last-seen and %d choices unsaved: %s",
                self.config.shard_index,
                len(self.state.pending_last_seen),
                len(self.unsaved()),
                sorted({*self.state.pending_last_seen, *self.unsaved()})[:20],
            )
        return left()

    async def _drain_once(self) -> None:
        if self.persist_status or self.persist_visibility:
            await self._persist_once()
        await self._flush_once()

    # ------------------------------------------------------------------ applying

    def _missing(self, ops: list[Operation[object]]) -> _Missing | None:
        """What the state lacks for this batch (None: everything is in memory, the common case,
        decided without taking a connection: each acquire costs a reset round trip to PostgreSQL)."""
        if self._all_in_memory(ops):
            return None
        return self._gather_missing(ops)

    def _gather_missing(self, ops: list[Operation[object]]) -> _Missing | None:
        """`_missing` the long way: every id the batch needs, those not in memory listed."""
        rel_ids: list[str] = []
        acc_ids: list[str] = []
        channel_ids: list[str] = []
        queries: list[tuple[str, tuple[str, ...]]] = []
        for op in ops:
            needs = op.needs()
            if needs is not NOTHING:
                relations, accounts, channels = needs
                if isinstance(op, ops_.Query):
                    queries.append((op.reader, op.targets))
                    if not self.state.query_needs_reader(op.reader, op.targets):
                        relations = op.targets  # no answer depends on the reader's (friends only)
                rel_ids.extend(relations)
                acc_ids.extend(accounts)
                channel_ids.extend(channels)
        missing_rel = self.state.missing_relations(rel_ids)
        if not missing_rel:
            for reader, targets in queries:
                acc_ids.extend(self.state.accounts_to_load_for_query(reader, targets))
            queries = []
        missing_acc = [u for u in dict.fromkeys(acc_ids) if not self.state.has_account(u)]
        missing_ch = [c for c in dict.fromkeys(channel_ids) if not self.state.channels.knows(c)]
        if not (missing_rel or missing_acc or missing_ch):
            return None
        return _Missing(missing_rel, missing_acc, missing_ch, queries, {*rel_ids, *acc_ids}, set(channel_ids))

    def _all_in_memory(self, ops: list[Operation[object]]) -> bool:
        """True: `_missing` would find nothing missing (every status change, heartbeat and watch
        of accounts already here), decided without building its lists. A query goes the long way:
        what it needs depends on the reader's relations."""
        state = self.state
        relations, knows = state.relations, state.channels.knows
        for op in ops:
            needs = op.needs()
            if needs is NOTHING:
                continue
            if isinstance(op, ops_.Query):
                return False
            rel_ids, acc_ids, channel_ids = needs
            for user_id in rel_ids:
                if user_id not in relations:
                    return False
            for user_id in acc_ids:
                if not state.has_account(user_id):
                    return False
            for channel_id in channel_ids:
                if not knows(channel_id):
                    return False
        return True

    async def _load(self, missing: _Missing, now: float) -> None:
        """Load from PostgreSQL everything the state lacks for a batch, in one query per kind."""
        missing_acc = missing.accounts
        async with self.store.loading() as loads:
            if missing.relations:
                for user_id, rel in (await loads.relations(missing.relations)).items():
                    self.state.set_relations(user_id, rel, now)
            # A query's audience is known once the relations are: its visible accounts load too.
            for reader, targets in missing.queries:
                if self.state.query_needs_reader(reader, targets):
                    # A reader spared above whose targets' friendships changed meanwhile: its
                    # query answers UNAVAILABLE, and the edge asks again.
                    continue
                missing_acc.extend(self.state.accounts_to_load_for_query(reader, targets))
            if missing_acc:
                rows = await loads.accounts(list(dict.fromkeys(missing_acc)))
                for user_id, row in rows.items():
                    self.state.load_account(user_id, row, now)
            if missing.channels:
                for channel_id, server_id in (await loads.channel_servers(missing.channels)).items():
                    self.state.channels.load_channel(channel_id, server_id)

    def _apply_checked(self, edge_id: str, op: Operation[object], now: float) -> object:
        """Apply one operation to the state; its answer in its wire form (`actors.core.answers`)."""
        self.metrics.counters[_OP_KEYS[type(op)]] += 1
        try:
            return wire(apply(self.state, edge_id, op, now))
        except NotLoaded:
            # The state refuses operations on data that was never loaded (the store was away);
            # any other error is a bug and fails the call.
            self.metrics.inc("shard_ops_unavailable_total")
            return UNAVAILABLE

    def _carry_out(self, collecting: str | None = None) -> None:
        """Turn the state's effects into mail, durable writes and count updates. `collecting`:
        the edge whose batch's reply is about to take its mail (its pull is not woken for it)."""
        effects = self.state.outbox.drain()
        if not effects:
            return
        now = self.clock()
        touched: set[str] = set()
        # A frame published to several edges is one object: serialised once.
        last_frame: frames.Frame | None = None
        last_text = ""
        event_key = _DELIVERIES  # always set with last_frame, before its first use
        counters = self.metrics.counters
        for e in effects:
            if isinstance(e, _MAIL):
                box = self.mail.get(e.edge_id)
                if box is None:
                    continue  # an edge that never called us has no sockets here
                if e.frame is not last_frame:
                    last_frame, last_text = e.frame, frames.text(e.frame)
                    event_key = _EVENT_KEYS[str(e.frame.get("type"))]
                if isinstance(e, Publish):
                    address: Address = (e.user_id, e.own)  # a publication (wire 3)
                    n = e.watchers
                else:
                    address, n = e.socket_ids, len(e.socket_ids)
                if box.add(address, last_text):
                    self.metrics.inc("mail_dropped_total")
                touched.add(e.edge_id)
                counters[event_key] += 1
                counters[_DELIVERIES] += n
            elif isinstance(e, PersistChosen):
                _keep_newest(self.persist_status, e.user_id, (e.status, e.at))
                self._persist_wake.set()
            elif isinstance(e, PersistVisibility):
                _keep_newest(self.persist_visibility, e.user_id, (e.visibility, e.at))
                self._persist_wake.set()
            elif isinstance(e, OnlineCount):
                self.counts.account(e.user_id, e.servers, e.present, now)
            elif isinstance(e, SocketCount):
                self.counts.socket(e.user_id, e.socket_id, e.alive, now)
            elif isinstance(e, Activity):
                score = activity.live_until(e.at, self.config.checkpoint_interval_s) if e.live else e.at
                self.counts.active([(e.user_id, score)])
            elif isinstance(e, HeldPlaces) and self.held is not None:
                self._held_dirty[e.user_id] = e.held
                self._held_wake.set()
            elif isinstance(e, EdgeForgotten):
                self._forget_box(e.edge_id)
        if collecting is not None:
            touched.discard(collecting)
        for edge_id in touched:
            if (box := self.mail.get(edge_id)) is not None:  # not if forgotten since, for good
                box.event.set()
        if self.state.pending_last_seen:
            self._flush_wake.set()
        if self.state.publications.any_pending and not self._held_back.is_set():
            self._held_back.set()
        # Mailboxes of edges without a lease go (`_forget_box` took those the state dropped).
        for edge_id in [e for e in self.mail if e not in self.state.edges]:
            del self.mail[edge_id]
        for edge_id, lock in list(self._edge_order.items()):
            if edge_id not in self.state.edges and not lock.locked():
                del self._edge_order[edge_id]

    def _forget_box(self, edge_id: str) -> None:
        """The state forgot the edge (`EdgeForgotten`): its mail goes, and should the edge be back
        already (the call that renewed its lease found it run out), what follows goes into a new
        box, whose name tells the edge to register again (`EdgeMail`). A pull waiting on the old
        box answers under the new name."""
        box = self.mail.pop(edge_id, None)
        if box is None:
            return
        box.event.set()
        self.metrics.inc("shard_edges_forgotten_total")
        log.info(
            "shard %d: forgot edge %s (its lease ran out or its node died; %d items of its mail "
            "dropped); it registers again if it is alive",
            self.config.shard_index,
            edge_id,
            box.kept,
        )
        if edge_id in self.state.edges:
            self._box(edge_id)

    # ------------------------------------------------------------------ background duties

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            self._sweep_once()

    def _sweep_once(self) -> None:
        self.state.sweep(
            self.clock(),
            keep={*self.unsaved(), *self._users_in_use},
            keep_channels=set(self._channels_in_use),
        )
        self._carry_out()

    async def _publish_loop(self) -> None:
        # Status changes an account's budget held back go out once its window admits them, checked
        # every tick while any is held (`_carry_out` wakes this loop when one is).
        while True:
            if self.state.next_publication_due() is None:
                self._held_back.clear()
                await self._held_back.wait()
            await asyncio.sleep(self.config.publish_tick_s)
            if self.state.next_publication_due() is not None:
                self.state.publish_due(self.clock())
                self._carry_out()

    async def _flush_once(self) -> None:
        # An account's last-seen waits for its unsaved choices: the FlushActor's statement reads
        # the stored chosen status (the invisible freeze), which must not be older than what this
        # shard knew when it set the time. Saving a choice wakes this loop again.
        unsaved = self.unsaved()
        entries = [e for e in self.state.last_seen_to_flush() if e[0] not in unsaved]
        if not entries:
            return
        await self.flush_write(entries)
        self.state.last_seen_flushed(entries)
        self.metrics.inc("last_seen_acked_total", n=len(entries))

    async def _flush_loop(self) -> None:
        # A departure stays in the state until the FlushActor confirms it is committed; a
        # FlushActor that dies (or a database that is away) only delays it.
        def failed(e: BaseException, wait: float) -> None:
            log.warning(
                "shard %s: last-seen flush failed (%s); retrying in %.1f s",
                self.config.shard_index,
                type(e).__name__,
                wait,
            )
            self.metrics.inc("last_seen_flush_failures_total")

        while True:
            await self._flush_wake.wait()
            self._flush_wake.clear()
            await retry(self._flush_once, SAVE_RETRY, on_retry=failed)

    async def _checkpoint_loop(self) -> None:
        # A slice a second: the checkpoint shares the departures' batches (see checkpoint_chunk).
        while True:
            await asyncio.sleep(1.0)
            self._refresh_active(self.state.activity_chunk(self.clock()))
            unsaved = self.unsaved()  # as in _flush_once; the next round writes them
            entries = [e for e in self.state.checkpoint_chunk(self.clock()) if e[0] not in unsaved]
            if entries:
                await self.flush_write(entries)
                self.metrics.inc("checkpoint_rows_total", n=len(entries))

    async def _held_loop(self) -> None:
        """Write each account's held places as they change (the latest only), for the next
        incarnation of this shard. Redis away: kept and tried again every second."""
        while True:
            await self._held_wake.wait()
            self._held_wake.clear()
            if self.held is None:
                continue
            batch, self._held_dirty = self._held_dirty, {}
            try:
                await self.held.write(batch)
            except Exception as e:
                for user_id, places in batch.items():
                    self._held_dirty.setdefault(user_id, places)  # unless it changed since
                self.metrics.inc("shard_held_write_failures_total")
                log.warning("shard %s: held places not saved (%s)", self.config.shard_index, type(e).__name__)
                await asyncio.sleep(1.0)
                self._held_wake.set()

    async def _restore_held(self) -> None:
        """The held places an earlier incarnation kept in this shard's slots (it died during their
        window): back before this one serves anything, so a resume still tells nobody and an
        account not back departs as of its close. Redis or PostgreSQL away: started without."""
        if self.held is None or not self.owned:
            return
        try:
            saved = await self.held.read(self.owned)
            if not saved:
                return
            async with self.store.loading() as loads:
                relations = await loads.relations(list(saved))
                rows = await loads.accounts(list(saved))
        except Exception as e:
            log.warning("shard %s: held places not restored (%s)", self.config.shard_index, type(e).__name__)
            return
        now = self.clock()
        for user_id, rel in relations.items():
            self.state.set_relations(user_id, rel, now)
        for user_id, row in rows.items():
            self.state.load_account(user_id, row, now)
            self.state.restore_holds(user_id, saved[user_id], now)
        self._carry_out()
        log.info("shard %s: held places of %d accounts restored", self.config.shard_index, len(rows))

    async def _persist_loop(self) -> None:
        def failed(e: BaseException, wait: float) -> None:
            log.warning(
                "shard %s: saving statuses failed (%s); retrying", self.config.shard_index, type(e).__name__
            )

        while True:
            await self._persist_wake.wait()
            self._persist_wake.clear()
            await retry(self._persist_once, SAVE_RETRY, on_retry=failed)

    async def _persist_once(self) -> None:
        status, visibility = self.persist_status, self.persist_visibility
        self.persist_status, self.persist_visibility = {}, {}
        self._saving_status, self._saving_visibility = status, visibility
        try:
            await self.store.persist(
                sorted((u, v, at) for u, (v, at) in status.items()),
                sorted((u, v, at) for u, (v, at) in visibility.items()),
            )
            if self.state.pending_last_seen:
                self._flush_wake.set()  # last-seen values that waited for these choices
        except BaseException:
            # Values chosen meanwhile win over the ones being retried (also at an equal time).
            for user_id, choice in status.items():
                _keep_newest(self.persist_status, user_id, choice, ties_win=False)
            for user_id, choice in visibility.items():
                _keep_newest(self.persist_visibility, user_id, choice, ties_win=False)
            raise
        finally:
            self._saving_status, self._saving_visibility = {}, {}

    async def _count_loop(self) -> None:
        while True:
            await self.counts.refresh(self.state.present_accounts(), self.state.live_sockets())
            await self._check_active()
            await asyncio.sleep(self.config.count_refresh_s)

    def _refresh_active(self, user_ids: list[str]) -> None:
        """Put these live accounts' active scores ahead of now again (actors/core/activity.py)."""
        if user_ids:
            until = activity.live_until(self.clock(), self.config.checkpoint_interval_s)
            self.counts.active((u, until) for u in user_ids)

    async def _check_active(self) -> None:
        """Trim the active set; after a wipe (or lost writes) write every live account again, and
        let one shard refill the history from the stored last-seen times."""
        now = self.clock()
        rewrite, seed = await self.counts.check_active(self.config.shard_index, activity.trim_before(now))
        if rewrite:
            self._refresh_active(self.state.live_accounts())
        if seed:
            try:
                async for chunk in self.store.last_seen_since(activity.trim_before(now)):
                    self.counts.active_history(chunk)
            except self.store.errors as e:
                log.warning(
                    "shard %s: refilling active counts failed (%s)", self.config.shard_index, type(e).__name__
                )
                await self.counts.forget_seeded()

    def _reload_user(self, user_id: str) -> None:
        self._reload_users.add(user_id)
        self._reload_wake.set()

    def _reload_channel(self, channel_id: str) -> None:
        self._reload_channels.add(channel_id)
        self._reload_wake.set()

    def _reload_everything(self) -> None:
        self._reload_users.update(self.state.relations)
        self._reload_channels.update(self.state.channels.channels)
        self._reload_wake.set()

    async def _reload_loop(self) -> None:
        """Audience changes announced by PostgreSQL replace cached relations, in batches."""
        while True:
            await self._reload_wake.wait()
            await asyncio.sleep(0.1)  # a burst of announcements gathers into one load
            self._reload_wake.clear()
            users = [u for u in self._reload_users if u in self.state.relations]
            channels = [c for c in self._reload_channels if self.state.channels.knows(c)]
            self._reload_users.clear()
            self._reload_channels.clear()
            if not users and not channels:
                continue
            try:
                async with self.store.loading() as loads:
                    rels = await loads.relations(users) if users else {}
                    chans = await loads.channel_servers(channels) if channels else {}
            except Exception:
                self._reload_users.update(users)
                self._reload_channels.update(channels)
                self._reload_wake.set()  # tried again once the loop restarts
                raise
            now = self.clock()
            for user_id, rel in rels.items():
                pending = self.persist_visibility.get(user_id, self._saving_visibility.get(user_id))
                if pending is not None:
                    # Not yet saved: the database still has the older value.
                    rel = Relations(rel.friends, rel.servers, pending[0])
                self.state.set_relations(user_id, rel, now)
            for channel_id, server_id in chans.items():
                self.state.channels.load_channel(channel_id, server_id)
            self._carry_out()


# Counter keys of the paths taken for every operation and frame, made once.
_OP_KEYS = {kind: Metrics.key("shard_ops_total", op=name) for kind, name in ops_.KIND.items()}
_DELIVERIES = Metrics.key("deliveries_total")
# The effects that become mail: a tuple, which `isinstance` tests faster than a union.
_MAIL = (Publish, Deliver)
# The summaries observed for every batch, their keys made once.
_BATCH_OPS = Metrics.figure_key("shard_batch_ops")
_APPLY_SECONDS = Metrics.figure_key("shard_apply_seconds")
_REPLY_ITEMS = Metrics.figure_key("shard_reply_items")
_EVENT_KEYS = Metrics.keys_by("events_total", "type")
# The frames a shard produces for clients (`events_total`'s types; the edges' own notes, which
# start with "_", are counted too, from their first).
EVENT_TYPES_COUNTED = ("presence.changed", "presence.self", "typing", "voice.roster")


@dataclass
class _Missing:
    """What the state lacks for a batch (`PresenceShard._missing`), loaded by `_load`; and
    everything the batch applies with, in memory already or not (`users`: rows and relations,
    `channels_used`), kept from the sweep until it is applied (`PresenceShard._in_use`)."""

    relations: list[str]
    accounts: list[str]
    channels: list[str]
    queries: list[tuple[str, tuple[str, ...]]]
    users: set[str]
    channels_used: set[str]


def _release(counts: Counter[str], keys: Iterable[str]) -> None:
    """One holder fewer for each key; a key nobody holds any more goes."""
    for key in keys:
        if counts[key] <= 1:
            del counts[key]
        else:
            counts[key] -= 1


def _keep_newest(
    pending: dict[str, tuple[str, float]], user_id: str, choice: tuple[str, float], ties_win: bool = True
) -> None:
    """Queue a choice (value, when) to be saved unless a newer one of the account is queued (at
    an equal time the one queued later is the newer, unless `ties_win` is False)."""
    queued = pending.get(user_id)
    if queued is None or queued[1] < choice[1] or (ties_win and queued[1] == choice[1]):
        pending[user_id] = choice
