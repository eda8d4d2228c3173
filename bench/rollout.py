"""`presence bench rollout`: a deploy under load. `--sockets` accounts (19,000) on `--edges` edges
(3), each account watching the next `--subscriptions` (50) on a ring, so each is watched by as
many; statuses change steadily (`--rate`, 2,000 per second, alternating idle and online). Then,
one after another, with the load running all along:

1. **old restart**: every edge restarted today's way, one at a time: its sockets closed at once,
   their accounts departing at once (the edges of this phase run with no drain grace, no drain
   window and no resume: `PRESENCE_DRAIN_GRACE_S=0`, `PRESENCE_DRAIN_WINDOW_S=0`,
   `PRESENCE_RESUME_S=0`);
2. **rolling restart**: every edge restarted the new way, `cluster.rolling`'s own roll (the
   command operators run): drained (503, grace, 1012 spread over the window), its accounts held
   for `resume_s`;
3. **pool rollout**: `presence rollout` of the pool (`--shards`, 8): every shard, the FlushActor
   and the directory replaced live.

A steady window (`--steady-s`) before them is the baseline; each phase lasts from its start until
the next one starts (its action, then until every client is back, then `--settle-s`), so that no
phase is charged with the reconnects of the one before.

The clients act as the client libraries do: a socket closed with 1012 or 1011 comes back after
`restart_delay` (jittered over a second), anything else after `reconnect_delay`, to the next
edge of its own list (a client's edges are its own first, then the two others in an order that
alternates between clients, so a drained edge's clients spread over the others); it identifies,
restores its own choice (idle or awake) if `ready` says otherwise, subscribes to its accounts
again and shows what the `presence.sync` says and every change after it. There is no balancer:
a restarted edge comes back on the same ports (the benchmark's probe plays the supervisor loop
that restarts it on a cluster).

Measured per phase (its wall time besides):

- **frames for accounts that did not change**: every `presence.changed` a watcher got that was
  not a real change of the account (idle ↔ online, the only changes the load makes): `offline`,
  the `online` back after one, or a repeat of the status the watcher already showed; plus
  `offline` entries in the `presence.sync` of a watcher that subscribed again (every account of
  the run is connected all along); and, on the sampled sockets, a receipt of a change older than
  one the watcher already had (a flicker back). Counted on every socket. Target 0 (rolling
  restart, rollout);
- **reconnect time**: from a socket's loss to its `ready` on another edge (p50, p99), and to its
  `presence.sync`;
- **fan-out latency** (send of the change → first receipt at a watcher subscribed from the send
  to the receipt, one clock: a change re-told by a watcher's resync after its own reconnect is
  not a fan-out) on the sockets of every `--sample`th account (all at `--quick`), by the phase the
  change was sent in. Target p99 < 100 ms in the steady window, the rolling restart and the
  rollout (the old restart is the baseline they are compared with);
- **status changes lost**: changes whose receipt never came to a sampled watcher subscribed from
  before the change until `ALLOWANCE_S` after it (a change sent less than a second before its own
  socket was closed may never have reached the edge: left out). Target 0. At the end the load
  stops and every watcher's view of each of its accounts is compared with the account's last
  status: `views not converged`.

Beside the new way, the old restart in the same run: their ratios (frames, reconnect p99,
fan-out p99, wall time).

Not in `presence bench all`: it replaces every actor of the pool (the benchmarks after it in a
shared environment would run on a rolled pool) and wants an 8-shard pool where the others run
one shard per core. The full size takes about ten minutes.

    presence bench rollout [--sockets 19000] [--edges 3] [--subscriptions 50] [--rate 2000]
                           [--shards 8] [--steady-s 10] [--settle-s 5] [--sample 10]
                           [--quick] [--no-record] [--raw FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import math
import os
import pickle
import random
import secrets
import socket
import time
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from bench import fanout, results
from bench import loadgen as lg
from bench.reconnect import edge_env
from bench.results import machine_info, machine_summary

if TYPE_CHECKING:
    from cluster.config import Settings
    from cluster.drain import Health

NAME = "rollout"
TARGET_FANOUT_P99_MS = 100.0
# A change counts as lost for a sampled watcher subscribed from before it until this long after.
ALLOWANCE_S = 2.0
# A change sent this shortly before its socket was lost may never have reached the edge.
UNCERTAIN_S = 1.0
HEARTBEAT_S = 30.0
STEADY, OLD, ROLL, ROLLOUT = "steady", "old restart", "rolling restart", "pool rollout"
# What today's edges did on SIGTERM: every socket closed at once, every account departing at once.
OLD_WAY_ENV = {"PRESENCE_DRAIN_GRACE_S": "0", "PRESENCE_DRAIN_WINDOW_S": "0", "PRESENCE_RESUME_S": "0"}

# Statuses as the generators keep them (one byte per watched account).
ONLINE, IDLE, OFFLINE = 0, 1, 2
CODES = {"online": ONLINE, "idle": IDLE}  # anything else (offline, dnd) reads as OFFLINE
# Why a frame was not a real change (the index is what the generators record).
SPURIOUS = ("offline frame", "back after offline", "repeat", "offline in a resync")
# ... and one the analysis finds (`stale`), among the sampled watchers only.
OLDER = "older than one already had (sampled)"


# ------------------------------------------------------------------------------- pure parts


def code_of(status: str) -> int:
    return CODES.get(status, OFFLINE)


def view_index(watcher: int, target: int, accounts: int, subscriptions: int) -> int | None:
    """Where `watcher` keeps `target` in its view: the k-th of the accounts it watches (the next
    `subscriptions` on the ring, lg.fanout_targets), None if it does not watch it."""
    k = (target - watcher - 1) % accounts
    return k if k < subscriptions else None


def classify(seen: int, status: int) -> int | None:
    """A `presence.changed` to a watcher that showed `seen`: None for a real change (idle ↔
    online), else why not (an index of SPURIOUS)."""
    if status == OFFLINE:
        return 0
    if seen == OFFLINE:
        return 1
    if status == seen:
        return 2
    return None


def edge_order(index: int, edges: int) -> list[int]:
    """The edges client `index` tries, in turn: its own (index mod edges) first, then the others
    in an order that alternates between clients, so a drained edge's clients spread evenly."""
    own = index % edges
    others = [(own + k) % edges for k in range(1, edges)]
    return [own, *(others if (index // edges) % 2 == 0 else others[::-1])]


@dataclass(frozen=True)
class Phase:
    name: str
    start: float
    end: float
    action_s: float  # the restart or rollout itself, without the settle after it


def phase_of(phases: Sequence[Phase], t: float) -> int | None:
    """The index of the phase `t` falls in (start ≤ t < end), None outside them all."""
    for i, ph in enumerate(phases):
        if ph.start <= t < ph.end:
            return i
    return None


@dataclass
class Raw:
    """Everything the generators recorded, merged (one monotonic clock)."""

    sends_u: array[int] = field(default_factory=lambda: array("i"))
    sends_s: bytearray = field(default_factory=bytearray)
    sends_t: array[float] = field(default_factory=lambda: array("d"))
    rec_w: array[int] = field(default_factory=lambda: array("i"))
    rec_u: array[int] = field(default_factory=lambda: array("i"))
    rec_s: bytearray = field(default_factory=bytearray)
    rec_t: array[float] = field(default_factory=lambda: array("d"))
    spur_t: array[float] = field(default_factory=lambda: array("d"))
    spur_k: bytearray = field(default_factory=bytearray)
    spur_w: array[int] = field(default_factory=lambda: array("i"))  # who got it
    spur_u: array[int] = field(default_factory=lambda: array("i"))  # about whom
    rc_u: array[int] = field(default_factory=lambda: array("i"))
    rc_lost: array[float] = field(default_factory=lambda: array("d"))
    rc_ready: array[float] = field(default_factory=lambda: array("d"))
    rc_synced: array[float] = field(default_factory=lambda: array("d"))
    refused_t: array[float] = field(default_factory=lambda: array("d"))  # error frames received


def merge(parts: Iterable[dict[str, bytes]]) -> Raw:
    """The generators' `collect` results as one Raw (same field names, as bytes)."""
    raw = Raw()
    for part in parts:
        for name, value in vars(raw).items():
            if isinstance(value, array):
                value.frombytes(part[name])
            else:
                value.extend(part[name])
    return raw


def intervals(raw: Raw, start: float, end: float) -> dict[int, list[tuple[float, float]]]:
    """Per account that reconnected: when its socket was subscribed ((from, to) pairs, from
    `start` to `end`); accounts absent stayed subscribed from `start` to `end`."""
    out: dict[int, list[tuple[float, float]]] = {}
    events = sorted(zip(raw.rc_u, raw.rc_lost, raw.rc_synced, strict=True), key=lambda e: e[1])
    for u, lost, synced in events:
        spans = out.setdefault(u, [(start, end)])
        spans[-1] = (spans[-1][0], lost)
        if not math.isnan(synced):
            spans.append((synced, end))
    return out


def _covered(spans: list[tuple[float, float]] | None, a: float, b: float, start: float, end: float) -> bool:
    if spans is None:
        return start <= a and b <= end
    return any(lo <= a and b <= hi for lo, hi in spans)


def match(raw: Raw) -> array[int]:
    """Each receipt's change: the index of the latest send of that account with that status
    before it (-1: none)."""
    times: dict[int, array[float]] = {}
    index: dict[int, array[int]] = {}
    for n, (u, t) in enumerate(zip(raw.sends_u, raw.sends_t, strict=True)):
        times.setdefault(u, array("d")).append(t)
        index.setdefault(u, array("i")).append(n)
    found = array("i")
    for u, s, t in zip(raw.rec_u, raw.rec_s, raw.rec_t, strict=True):
        ts, ns = times.get(u, array("d")), index.get(u, array("i"))
        i = bisect.bisect_right(ts, t) - 1
        while i >= 0 and raw.sends_s[ns[i]] != s:
            i -= 1
        found.append(ns[i] if i >= 0 else -1)
    return found


def stale(raw: Raw, found: array[int]) -> array[float]:
    """The times of receipts (sampled watchers) of a change older than one the same watcher had
    already received about the same account: a flicker back to a past status, which `classify`
    takes for a real change (each step is idle ↔ online)."""
    newest: dict[tuple[int, int], int] = {}
    out = array("d")
    order = sorted(range(len(found)), key=lambda k: raw.rec_t[k])
    for k in order:
        n = found[k]
        if n < 0:
            continue
        key = (raw.rec_w[k], raw.rec_u[k])
        if n < newest.get(key, -1):
            out.append(raw.rec_t[k])
        else:
            newest[key] = n
    return out


def uncertain(raw: Raw) -> set[int]:
    """Sends made less than UNCERTAIN_S before their own socket was lost (maybe never arrived)."""
    lost: dict[int, list[float]] = {}
    for u, t in zip(raw.rc_u, raw.rc_lost, strict=True):
        lost.setdefault(u, []).append(t)
    out: set[int] = set()
    for n, (u, t) in enumerate(zip(raw.sends_u, raw.sends_t, strict=True)):
        if any(t <= x < t + UNCERTAIN_S for x in lost.get(u, ())):
            out.add(n)
    return out


@dataclass(frozen=True)
class Shape:
    """The run's sizes the analysis needs: who watches whom, who is sampled, when it ran."""

    accounts: int
    subscriptions: int
    sample: int
    start: float
    end: float

    def sampled_watchers(self, target: int) -> list[int]:
        ws = ((target - k) % self.accounts for k in range(1, self.subscriptions + 1))
        return [w for w in ws if w % self.sample == 0]


def lost_changes(raw: Raw, found: array[int], shape: Shape) -> tuple[array[float], int]:
    """The send times of changes a sampled watcher, subscribed from before each until
    ALLOWANCE_S after it, never received (one entry per watcher missing it); and how many
    (change, watcher) deliveries were expected."""
    got = {(w, n) for w, n in zip(raw.rec_w, found, strict=True) if n >= 0}
    spans = intervals(raw, shape.start, shape.end)
    skip = uncertain(raw)
    missing, expected = array("d"), 0
    for n, (u, t) in enumerate(zip(raw.sends_u, raw.sends_t, strict=True)):
        if n in skip or t + ALLOWANCE_S > shape.end:
            continue
        for w in shape.sampled_watchers(u):
            if _covered(spans.get(w), t, t + ALLOWANCE_S, shape.start, shape.end):
                expected += 1
                if (w, n) not in got:
                    missing.append(t)
    return missing, expected


def fanout_latencies(raw: Raw, found: array[int], shape: Shape) -> tuple[array[float], array[float]]:
    """(send time, seconds to the watcher) of each change's first receipt by a watcher subscribed
    from the send to the receipt. A receipt after the watcher's own reconnect re-tells a change it
    was away for (its resync), however old: not a fan-out."""
    spans = intervals(raw, shape.start, shape.end)
    seen: set[tuple[int, int]] = set()
    sent_at, latency = array("d"), array("d")
    for k, n in enumerate(found):
        w = raw.rec_w[k]
        if n < 0 or (w, n) in seen:
            continue
        seen.add((w, n))
        t, r = raw.sends_t[n], raw.rec_t[k]
        if _covered(spans.get(w), t, r, shape.start, shape.end):
            sent_at.append(t)
            latency.append(r - t)
    return sent_at, latency


def by_phase(phases: Sequence[Phase], times: Iterable[float], values: Iterable[float]) -> list[array[float]]:
    """`values` grouped by the phase their `times` fall in (those outside every phase dropped)."""
    out = [array("d") for _ in phases]
    for t, v in zip(times, values, strict=True):
        i = phase_of(phases, t)
        if i is not None:
            out[i].append(v)
    return out


def analyse(raw: Raw, phases: Sequence[Phase], shape: Shape) -> list[dict[str, Any]]:
    """Every figure of every phase (the report's table)."""
    found = match(raw)
    sent_at, latency = fanout_latencies(raw, found, shape)
    fan = by_phase(phases, sent_at, latency)
    missing, _ = lost_changes(raw, found, shape)
    lost = by_phase(phases, missing, missing)
    back = by_phase(phases, raw.rc_lost, (r - x for r, x in zip(raw.rc_ready, raw.rc_lost, strict=True)))
    synced = by_phase(phases, raw.rc_lost, (s - x for s, x in zip(raw.rc_synced, raw.rc_lost, strict=True)))
    kinds = by_phase(phases, raw.spur_t, (float(k) for k in raw.spur_k))
    stale_t = stale(raw, found)
    older = by_phase(phases, stale_t, stale_t)
    changes = by_phase(phases, raw.sends_t, raw.sends_t)
    refused = by_phase(phases, raw.refused_t, raw.refused_t)
    out = []
    for i, ph in enumerate(phases):
        spurious = {name: sum(1 for k in kinds[i] if k == n) for n, name in enumerate(SPURIOUS)}
        spurious[OLDER] = len(older[i])
        out.append(
            {
                "phase": ph.name,
                "wall_s": ph.end - ph.start,
                "action_s": ph.action_s,
                "changes": len(changes[i]),
                "reconnects": len(back[i]),
                "reconnect_ms": lg.summary_ms([x for x in back[i] if not math.isnan(x)]),
                "resubscribed_ms": lg.summary_ms([x for x in synced[i] if not math.isnan(x)]),
                "not_back": sum(1 for x in back[i] if math.isnan(x)),
                "spurious": spurious,
                "spurious_total": sum(spurious.values()),
                "fanout_ms": lg.summary_ms(fan[i]),
                "lost": len(lost[i]),
                "error_frames": len(refused[i]),
            }
        )
    return out


def ratio(new: float, old: float) -> float:
    """new / old; inf when only old is 0, nan when both are (or either is unknown)."""
    if math.isnan(new) or math.isnan(old) or (new == 0 and old == 0):
        return math.nan
    return math.inf if old == 0 else new / old


def comparison(old: dict[str, Any], new: dict[str, Any]) -> dict[str, float]:
    """The new way beside the old, as ratios (new / old): under 1 is better."""
    return {
        "spurious_frames": ratio(new["spurious_total"], old["spurious_total"]),
        "reconnect_p99": ratio(new["reconnect_ms"]["p99"], old["reconnect_ms"]["p99"]),
        "fanout_p99": ratio(new["fanout_ms"]["p99"], old["fanout_ms"]["p99"]),
        "wall": ratio(new["action_s"], old["action_s"]),
    }


def judge(rows: list[dict[str, Any]], converged_misses: int, quick: bool) -> dict[str, bool | None]:
    """The targets: no frame for an unchanged account and no change lost in the new way's phases
    (every view converged at the end), fan-out p99 under 100 ms in the steady window and the new
    way's phases (not at --quick). The old restart is what they are compared with, not judged."""
    new = [r for r in rows if r["phase"] in (ROLL, ROLLOUT)]
    p99s = [r["fanout_ms"]["p99"] for r in rows if r["phase"] != OLD]
    return {
        "spurious": sum(r["spurious_total"] for r in new) == 0,
        "lost": sum(r["lost"] for r in new) == 0 and converged_misses == 0,
        "fanout": None if quick else all(p < TARGET_FANOUT_P99_MS for p in p99s),
    }


# ------------------------------------------------------------------------------- inside a generator
#
# Phases run by `Generator.phase("bench.rollout:NAME", kwargs)`; their state lives here, one per
# generator process. Every client is an account, a watcher of its ring and a socket of the load.

GIVE_UP_S = 120.0
# The frame that makes an account of the load idle or online again (the load's changes, and a
# client restoring its choice after a reconnect).
RESTORE = {
    ONLINE: lg.client_frame(b'{"type":"presence.update","status":"online"}'),
    IDLE: lg.client_frame(b'{"type":"presence.update","status":"idle"}'),
}


@dataclass(slots=True)
class _Client:
    index: int
    user: str
    identify: bytes
    order: list[int]  # edge_order
    view: bytearray  # what it shows of each account it watches (codes)
    sampled: bool
    at: int = 0  # the position in `order` of the edge it is on, or was last on
    conn: lg.WsConn | None = None
    status: int = ONLINE  # its own account's: what `ready` said, or the last change it made
    slot: int = 0  # its place in the generator's socket group (heartbeats)


@dataclass
class _Gen:
    prefix: str = ""
    accounts: int = 0
    subscriptions: int = 0
    targets: list[tuple[str, int]] = field(default_factory=list)
    connect_timeout_s: float = 10.0
    clients: list[_Client] = field(default_factory=list)
    raw: Raw = field(default_factory=Raw)
    recording: bool = False
    stopping: bool = False
    load_stop: bool = False
    skipped: int = 0
    restored: int = 0  # reconnects whose `ready` differed from the client's own choice
    away: int = 0  # clients coming back (their socket lost, not subscribed again yet)
    errors: dict[str, int] = field(default_factory=dict)
    changer: asyncio.Task[None] | None = None
    cpu0: float = 0.0


_state = _Gen()


def _count_error(st: _Gen, e: BaseException, step: str) -> None:
    key = f"{type(e).__name__} in {step}: {e}"[:100]
    st.errors[key] = st.errors.get(key, 0) + 1


async def setup_connect(
    gen: lg.Generator,
    targets: list[tuple[str, int]],
    prefix: str,
    accounts: int,
    subscriptions: int,
    sample: int,
    concurrency: int,
    connect_timeout_s: float,
) -> dict[str, Any]:
    """This generator's accounts (i ≡ its index mod their count), each identified on its own edge."""
    from edge.tokens import mint_token

    global _state
    _state = st = _Gen(prefix, accounts, subscriptions, [(h, p) for h, p in targets], connect_timeout_s)
    for i in range(gen.index, accounts, gen.count):
        token = mint_token(f"{prefix}{i}", gen.secret, 7200)
        st.clients.append(
            _Client(i, f"{prefix}{i}", orjson.dumps({"type": "identify", "token": token}),
                    edge_order(i, len(targets)), bytearray(subscriptions), i % sample == 0)
        )  # fmt: skip
    sem, done = asyncio.Semaphore(concurrency), 0

    async def one(c: _Client) -> None:
        nonlocal done
        async with sem:
            try:
                await _open(st, c)
            except Exception as e:
                _count_error(st, e, "set-up")
            done += 1
            if done % 200 == 0:
                gen.progress({"done": done, "ok": done, "of": len(st.clients)})

    await asyncio.gather(*(one(c) for c in st.clients))
    return {"connected": sum(1 for c in st.clients if c.conn is not None), "errors": st.errors}


async def setup_subscribe(gen: lg.Generator, concurrency: int) -> dict[str, Any]:
    """Every client subscribes to its ring; then heartbeats, and each client comes back whenever
    its socket is lost."""
    st = _state
    sem = asyncio.Semaphore(concurrency)
    ok = 0

    async def one(c: _Client) -> None:
        nonlocal ok
        async with sem:
            try:
                await _subscribe(st, c)
                ok += 1
            except Exception as e:
                _count_error(st, e, "subscribe")

    await asyncio.gather(*(one(c) for c in st.clients if c.conn is not None))
    group = gen.groups.setdefault("rollout", [])
    for c in st.clients:
        if c.conn is not None:
            c.slot = len(group)
            group.append(c.conn)
            gen._tasks.append(asyncio.create_task(_keep(st, c, group)))
    await gen.heartbeats("rollout", HEARTBEAT_S)
    return {"subscribed": ok, "errors": st.errors}


async def _open(st: _Gen, c: _Client) -> None:
    """A socket to the client's current edge, identified; its `ready` says the account's status
    (a resumed account's is what it was). Coming back, the client restores its own choice as the
    client libraries do (what belongs to the socket: idle or awake) when `ready` says otherwise: a
    change it sent just before the server closed its socket may never have been read (an edge
    behind on its loop drops what is unread when it closes), and a resumed place keeps the idle
    flag of the socket it replaces."""
    host, port = st.targets[c.order[c.at]]
    conn = await lg.open_ws(host, port, lg.WS_PATH, lg.source_address(c.index), st.connect_timeout_s)
    try:
        conn.send(c.identify)
        ready = await conn.expect(b"ready", st.connect_timeout_s)
    except BaseException:
        if conn.transport is not None:
            conn.transport.abort()
        raise
    conn.user, conn.index = c.user, c.index
    resumed = code_of(ready["status"])
    if c.conn is None:
        c.status = resumed
    elif resumed != c.status:
        conn.send_raw(RESTORE[c.status])
        st.restored += 1
    c.conn = conn


async def _subscribe(st: _Gen, c: _Client) -> None:
    """Subscribe to the ring and show what the sync says (an `offline` there is a flicker: every
    account of the run is connected all along), then every `presence.changed` after it.

    The frames are taken by one handler from before the subscription leaves: the edge sends the
    changes it held back during the watch right behind the sync, often in the same read, and a
    frame that comes before this coroutine resumes would otherwise go nowhere (the watcher would
    miss a real change, and count the next one as a repeat)."""
    assert c.conn is not None
    conn = c.conn
    ids = [f"{st.prefix}{t}" for t in lg.fanout_targets(c.index, st.accounts, st.subscriptions)]
    synced: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_text(_conn: lg.WsConn, payload: bytes) -> None:
        if synced.done():
            _on_frame(st, c, payload)
        elif payload.startswith(b'{"type":"presence.sync"'):
            _show_sync(st, c, orjson.loads(payload))
            synced.set_result(None)
        elif payload.startswith(b'{"type":"error"'):
            synced.set_exception(ConnectionError(f"error frame: {payload[:200]!r}"))

    conn.on_text = on_text
    conn.send(orjson.dumps({"type": "presence.subscribe", "userIds": ids}))
    await asyncio.wait([synced, conn.lost], timeout=st.connect_timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if not synced.done():
        conn.on_text = None
        synced.cancel()
        raise ConnectionError(f"closed ({conn.close_code})") if conn.lost.done() else TimeoutError("no sync")
    synced.result()


def _show_sync(st: _Gen, c: _Client, frame: dict[str, Any]) -> None:
    now = time.monotonic()
    for entry in frame["users"]:
        target = int(entry["userId"][len(st.prefix) :])
        k = view_index(c.index, target, st.accounts, st.subscriptions)
        if k is None:
            continue
        code = code_of(entry["status"])
        if code == OFFLINE and st.recording:
            _spurious(st.raw, now, 3, c.index, target)
        c.view[k] = code


def _on_frame(st: _Gen, c: _Client, payload: bytes) -> None:
    if not payload.startswith(b'{"type":"presence.changed"'):
        if payload.startswith(b'{"type":"error"') and st.recording:
            st.raw.refused_t.append(time.monotonic())
            _count_error(st, RuntimeError(orjson.loads(payload).get("code")), "an error frame")
        return
    t = time.monotonic()
    frame = orjson.loads(payload)
    target = int(frame["userId"][len(st.prefix) :])
    k = view_index(c.index, target, st.accounts, st.subscriptions)
    if k is None:
        return
    status = code_of(frame["status"])
    why = classify(c.view[k], status)
    c.view[k] = status
    if not st.recording:
        return
    raw = st.raw
    if why is not None:
        _spurious(raw, t, why, c.index, target)
    elif c.sampled:
        raw.rec_w.append(c.index)
        raw.rec_u.append(target)
        raw.rec_s.append(status)
        raw.rec_t.append(t)


def _spurious(raw: Raw, t: float, why: int, watcher: int, target: int) -> None:
    raw.spur_t.append(t)
    raw.spur_k.append(why)
    raw.spur_w.append(watcher)
    raw.spur_u.append(target)


async def _keep(st: _Gen, c: _Client, group: list[lg.WsConn]) -> None:
    """Whenever the client's socket is lost, back as the client libraries come back: after
    `restart_delay` for 1012/1011, else `reconnect_delay`, to the next edge of its list."""
    from presence_client import DEFAULT_BACKOFF, RESTART_CLOSE_CODES, reconnect_delay
    from presence_client.backoff import restart_delay

    rng = random.Random(c.index)
    while True:
        assert c.conn is not None
        await c.conn.lost
        if st.stopping:
            return
        lost_at = time.monotonic()
        st.away += 1
        code = c.conn.close_code or 1006
        restart = code in RESTART_CLOSE_CODES
        delay = (
            restart_delay(DEFAULT_BACKOFF, rng.random)
            if restart
            else reconnect_delay(0, False, DEFAULT_BACKOFF, rng.random)
        )
        try:
            ready_at, synced_at = await _come_back(st, c, delay, rng)
        finally:
            st.away -= 1
        raw = st.raw
        raw.rc_u.append(c.index)
        raw.rc_lost.append(lost_at)
        raw.rc_ready.append(ready_at)
        raw.rc_synced.append(synced_at)
        if math.isnan(synced_at):
            return  # given up
        group[c.slot] = c.conn  # heartbeats go to the new socket


async def _come_back(st: _Gen, c: _Client, delay: float, rng: random.Random) -> tuple[float, float]:
    """Tries the next edges until one takes the client: (ready, synced) times, NaN if it gave up."""
    from presence_client import DEFAULT_BACKOFF, reconnect_delay

    attempt, give_up = 0, time.monotonic() + GIVE_UP_S
    while time.monotonic() < give_up and not st.stopping:
        await asyncio.sleep(delay)
        c.at = (c.at + 1) % len(c.order)
        step = "reconnect"
        try:
            await _open(st, c)
            ready_at, step = time.monotonic(), "resubscribe"
            await _subscribe(st, c)
            return ready_at, time.monotonic()
        except Exception as e:
            _count_error(st, e, step)
            if c.conn is not None and c.conn.transport is not None and step == "resubscribe":
                c.conn.transport.abort()
            attempt += 1
            delay = reconnect_delay(attempt, False, DEFAULT_BACKOFF, rng.random)
    return math.nan, math.nan


async def load_start(gen: lg.Generator, start_at: float, rate: float) -> int:
    """From `start_at`, status changes of this generator's accounts at `rate` per second, round
    robin, each the other of idle and online from the account's current one; a client whose
    socket is being replaced is skipped. Everything is recorded from then on."""
    st = _state
    frames = RESTORE

    async def changer() -> None:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        for c in st.clients:  # every account is online: the load has changed nobody yet
            c.view[:] = bytes(len(c.view))
        st.recording, st.cpu0 = True, time.process_time()
        t0, k, raw = time.monotonic(), 0, st.raw
        while not st.load_stop:
            due = int((time.monotonic() - t0) * rate) + 1
            while k < due:
                c = st.clients[k % len(st.clients)]
                k += 1
                if c.conn is None or not c.conn.open:
                    st.skipped += 1
                    continue
                c.status = IDLE if c.status == ONLINE else ONLINE
                raw.sends_t.append(time.monotonic())
                c.conn.send_raw(frames[c.status])
                raw.sends_u.append(c.index)
                raw.sends_s.append(c.status)
            await asyncio.sleep(max(0.0, t0 + k / rate - time.monotonic()))

    st.changer = asyncio.create_task(changer())
    return len(st.clients)


async def finish(gen: lg.Generator, drain_s: float) -> dict[str, Any]:
    """Stop the load, wait `drain_s` for late frames, stop recording; everything recorded."""
    st = _state
    st.load_stop = True
    if st.changer is not None:
        await st.changer
    cpu = time.process_time() - st.cpu0
    await asyncio.sleep(drain_s)
    st.recording = False
    out: dict[str, Any] = {
        name: bytes(value) if isinstance(value, bytearray) else value.tobytes()
        for name, value in vars(st.raw).items()
    }
    return {**out, "skipped": st.skipped, "restored": st.restored, "errors": st.errors, "cpu_s": cpu}


async def away(gen: lg.Generator) -> int:
    """How many of this generator's clients are coming back."""
    return _state.away


async def own_statuses(gen: lg.Generator) -> dict[int, int]:
    return {c.index: c.status for c in _state.clients}


async def converged(gen: lg.Generator, truth: bytes) -> dict[str, int]:
    """How many (watcher, account) views differ from the account's status, and sockets not open;
    then the clients stop coming back (the group closes with the generator)."""
    st = _state
    misses = 0
    for c in st.clients:
        for k, t in enumerate(lg.fanout_targets(c.index, st.accounts, st.subscriptions)):
            misses += c.view[k] != truth[t]
    st.stopping = True
    return {"mismatches": misses, "closed": sum(1 for c in st.clients if c.conn is None or not c.conn.open)}


# ------------------------------------------------------------------------------- the benchmark


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="presence bench rollout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--sockets", type=int, default=19_000, help="accounts, one socket each (19,000)")
    p.add_argument("--edges", type=int, default=3, help="`presence edge` processes (3)")
    p.add_argument("--subscriptions", type=int, default=50, help="accounts each one watches (50)")
    p.add_argument("--rate", type=float, default=2_000.0, help="status changes per second (2,000)")
    p.add_argument("--generators", type=int, default=2, help="processes holding the sockets (2)")
    p.add_argument("--concurrency", type=int, default=200, help="connects in flight while setting up")
    p.add_argument("--steady-s", type=float, default=10.0, help="the baseline before the restarts (10 s)")
    p.add_argument("--settle-s", type=float, default=5.0, help="kept in a phase after its action (5 s)")
    p.add_argument("--sample", type=int, default=10, help="fan-out timed on every Nth account's socket (10)")
    p.add_argument("--drain-grace-s", type=float, default=None, help="the edges' (default theirs, 4 s)")
    p.add_argument("--drain-window-s", type=float, default=None, help="the edges' (default theirs, 10 s)")
    p.add_argument("--connect-timeout-s", type=float, default=None, help="default PresenceClient's")
    p.add_argument("--raw", type=Path, default=None, help="also write every record of the run here (pickle)")
    lg.add_common_args(p)
    args = p.parse_args(argv)
    if args.quick:
        args.sockets, args.subscriptions, args.rate, args.generators = 1_500, 20, 150.0, 1
        args.steady_s, args.settle_s, args.sample = 3.0, 3.0, 1
        args.drain_grace_s, args.drain_window_s = 0.5, 2.0
    if args.shards is None:
        args.shards = 2 if args.quick else 8
    if args.connect_timeout_s is None:
        from bench.reconnect import _client_connect_timeout_s

        args.connect_timeout_s = _client_connect_timeout_s()
    if args.shards < 2 or args.edges < 2:
        p.error("a rollout needs 2 shards or more, a rolling restart 2 edges or more")
    if args.subscriptions * 2 >= args.sockets:
        p.error("--subscriptions must be under half of --sockets (the ring would wrap onto itself)")
    if args.sockets / args.generators > 18_000 or 2 * args.sockets / args.edges > 18_000:
        p.error("too many sockets per generator or per edge (20,000 open files per process)")
    return args


def main(argv: list[str], settings: Settings) -> int:
    return lg.main_in_env(NAME, parse(argv), settings, run, report)


def _phase(target: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"target": f"bench.rollout:{target}", "kwargs": kwargs}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Edges:
    """The benchmark's edges, each on fixed ports. `probe` is what `cluster.rolling` asks an
    edge's health with, and plays the supervisor loop of a cluster: an edge whose process has
    exited is started again on its ports (with `mode`, the environment of edges started now)."""

    def __init__(self, env: lg.BenchEnv, count: int, mode: dict[str, str]) -> None:
        self.env, self.mode = env, mode
        self.ports = [(_free_port(), _free_port()) for _ in range(count)]
        self.procs = [env.start_edge(mode, ports) for ports in self.ports]
        self.urls = [f"http://127.0.0.1:{internal}" for _, internal in self.ports]

    def targets(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", ws) for ws, _ in self.ports]

    def probe(self, url: str) -> Health:
        from cluster.drain import health

        i = self.urls.index(url)
        if self.procs[i].proc.poll() is not None:
            self.env.stop(self.procs[i])
            self.procs[i] = self.env.start_edge(self.mode, self.ports[i])
        return health(url)

    def roll(self, stage: lg.Stage) -> float:
        """`cluster.rolling`'s roll over every edge, one at a time: its seconds."""
        from cluster.rolling import Roll, Target

        started = time.monotonic()
        roll = Roll(token=self.procs[0].internal_token, probe=self.probe, say=stage.log, poll_s=0.2)
        if roll.run([Target(f"edge {i}", url) for i, url in enumerate(self.urls)]) != 0:
            raise RuntimeError("the rolling restart stopped (see above)")
        return time.monotonic() - started

    def stop(self) -> None:
        for proc in self.procs:
            self.env.stop(proc)


def _pool_rollout(stage: lg.Stage) -> float:
    from cluster.rollout import rollout

    return float(asyncio.run(rollout(progress=stage.log))["seconds"])


def _setup(
    workers: lg.Workers, stage: lg.Stage, edges: _Edges, prefix: str, args: argparse.Namespace
) -> dict[str, Any]:
    per = max(1, args.concurrency // args.generators)
    kw = {
        "targets": edges.targets(),
        "prefix": prefix,
        "accounts": args.sockets,
        "concurrency": per,
        "subscriptions": args.subscriptions,
        "sample": args.sample,
        "connect_timeout_s": args.connect_timeout_s,
    }
    started = time.monotonic()
    res = workers.call(
        "phase", _phase("setup_connect", kw), on_progress=stage.progress("identify", args.sockets)
    )
    connected = sum(r["connected"] for r in res)
    connect_s = time.monotonic() - started
    stage.log(f"{connected:,} of {args.sockets:,} sockets identified in {connect_s:.1f} s")
    if connected < args.sockets:
        raise RuntimeError(f"set-up: only {connected:,} of {args.sockets:,} connected: {res[0]['errors']}")
    res = workers.call("phase", _phase("setup_subscribe", {"concurrency": per}))
    subscribed = sum(r["subscribed"] for r in res)
    stage.log(f"{subscribed:,} subscribed to {args.subscriptions} accounts each")
    if subscribed < args.sockets:
        raise RuntimeError(f"set-up: only {subscribed:,} of {args.sockets:,} subscribed: {res[0]['errors']}")
    time.sleep(args.settle_s)  # the set-up's own frames drain before anything is recorded
    return {
        "connected": connected,
        "connect_s": connect_s,
        "subscribe_s": time.monotonic() - started - connect_s,
    }


def _phases(workers: lg.Workers, stage: lg.Stage, edges: _Edges, args: argparse.Namespace) -> list[Phase]:
    """The steady window, then each restart and the rollout, the load running all along."""
    start_at = time.monotonic() + 1.0
    workers.call("phase", _phase("load_start", {"start_at": start_at, "rate": args.rate / args.generators}))
    time.sleep(max(0.0, start_at + args.steady_s - time.monotonic()))
    phases = [Phase(STEADY, start_at, time.monotonic(), 0.0)]
    for name, action in ((OLD, edges.roll), (ROLL, edges.roll), (ROLLOUT, _pool_rollout)):
        stage.log(f"{name}: starting")
        started = time.monotonic()
        action_s = action(stage)
        back_s = _everybody_back(workers)
        stage.log(
            f"{name}: done in {action_s:.1f} s; every client back {back_s:.1f} s later; "
            f"{args.settle_s:g} s more"
        )
        time.sleep(args.settle_s)
        phases.append(Phase(name, started, time.monotonic(), action_s))
    return phases


def _everybody_back(workers: lg.Workers) -> float:
    """Wait until no client is coming back (at most GIVE_UP_S), so that a phase's reconnects do not
    spill into the next one (a slow old restart's accounts coming back online during the rolling
    restart would be counted as its flicker); the seconds waited."""
    started = time.monotonic()
    while time.monotonic() - started < GIVE_UP_S:
        if sum(workers.call("phase", _phase("away", {}))) == 0:
            break
        time.sleep(0.5)
    return time.monotonic() - started


def _converge(workers: lg.Workers, accounts: int) -> dict[str, int]:
    """Every watcher's view beside every account's last status (the load stopped)."""
    truth = bytearray(accounts)
    for part in workers.call("phase", _phase("own_statuses", {})):
        for i, status in part.items():
            truth[i] = status
    res = workers.call("phase", _phase("converged", {"truth": bytes(truth)}))
    return {"mismatches": sum(r["mismatches"] for r in res), "closed": sum(r["closed"] for r in res)}


def _edge_env(args: argparse.Namespace) -> dict[str, str]:
    """The new way's edges drain as configured: the arguments, else the environment's or the
    settings' defaults (a benchmark's edges otherwise stop without draining, `lg.NO_DRAIN`)."""
    from cluster import config

    env = edge_env()
    for key, given, setting in (
        ("PRESENCE_DRAIN_GRACE_S", args.drain_grace_s, "drain_grace_s"),
        ("PRESENCE_DRAIN_WINDOW_S", args.drain_window_s, "drain_window_s"),
    ):
        default = os.environ.get(key, str(config.Settings.model_fields[setting].default))
        env[key] = str(given) if given is not None else default
    return env


def run(args: argparse.Namespace, env: lg.BenchEnv, stage: lg.Stage) -> dict[str, Any]:
    prefix = f"ro-{secrets.token_hex(3)}-"
    stage.log(f"loading {args.sockets:,} accounts x {args.subscriptions} friendships on a ring")
    friendships = asyncio.run(
        fanout.load_graph(env.database_url, prefix, args.sockets, args.subscriptions, None, "")
    )
    new_way = _edge_env(args)
    edges = _Edges(env, args.edges, {**new_way, **OLD_WAY_ENV})  # the first ones stop the old way
    try:
        with lg.Workers(args.generators, {"secret": env.secret}) as workers:
            setup = _setup(workers, stage, edges, prefix, args)
            edges.mode = new_way  # every edge started from now on drains and holds
            phases = _phases(workers, stage, edges, args)
            drain_s = 2.0
            parts = workers.call("phase", _phase("finish", {"drain_s": drain_s}))
            views = _converge(workers, args.sockets)
    finally:
        edges.stop()
    stage.log("matching every receipt to its change")
    shape = Shape(args.sockets, args.subscriptions, args.sample, phases[0].start, phases[-1].end + drain_s)
    raw = merge(parts)
    if args.raw is not None:
        args.raw.write_bytes(pickle.dumps({"raw": raw, "phases": phases, "shape": shape}))
        stage.log(f"records written to {args.raw}")
    rows = analyse(raw, phases, shape)
    errors: dict[str, int] = {}
    for part in parts:
        for k, v in part["errors"].items():
            errors[k] = errors.get(k, 0) + v
    return {
        "friendships": friendships,
        "setup": setup,
        "phases": rows,
        "views": views,
        "errors": errors,
        "skipped_changes": sum(p["skipped"] for p in parts),
        "restored_on_reconnect": sum(p["restored"] for p in parts),
        "generator_cpu_s": sum(p["cpu_s"] for p in parts),
    }


# ------------------------------------------------------------------------------- report


def _cells(r: dict[str, Any]) -> list[str]:
    rc, fo = r["reconnect_ms"], r["fanout_ms"]
    return [
        r["phase"],
        f"{r['wall_s']:.1f}" + (f" ({r['action_s']:.1f})" if r["action_s"] else ""),
        f"{r['changes']:,}",
        f"{r['reconnects']:,}" + (f" ({r['not_back']} not back)" if r["not_back"] else ""),
        f"{lg.fmt_ms(rc['p50'])}/{lg.fmt_ms(rc['p99'])}",
        f"{r['spurious_total']:,}",
        f"{lg.fmt_ms(fo['p50'])}/{lg.fmt_ms(fo['p99'])} (n {fo['n']:,})",
        f"{r['lost']:,}",
    ]


def _ratio_text(x: float) -> str:
    return "-" if math.isnan(x) else "∞" if math.isinf(x) else f"{x:.2f}x"


def _print(args: argparse.Namespace, m: dict[str, Any], info: dict[str, Any], cmp: dict[str, float]) -> None:
    print(
        f"\npresence bench rollout on {machine_summary(info)} (commit {info['commit']}): {args.sockets:,} "
        f"sockets on {args.edges} edges, each watching {args.subscriptions} on a ring, "
        f"{args.rate:g} changes/s; {args.shards} shards; fan-out timed on every {args.sample}th "
        "account's socket\n"
    )
    results.print_table(
        ["phase", "wall s (action)", "changes", "reconnects", "reconnect p50/p99 ms",
         "frames for unchanged accounts", "fan-out p50/p99 ms", "changes lost"],
        [_cells(r) for r in m["phases"]],
    )  # fmt: skip
    print("\nframes for unchanged accounts, by kind:")
    for r in m["phases"]:
        kinds = ", ".join(f"{k} {n:,}" for k, n in r["spurious"].items() if n)
        print(f"  {r['phase']}: {kinds or 'none'}")
    views = m["views"]
    print(
        f"at the end: {views['mismatches']:,} (watcher, account) views not converged, "
        f"{views['closed']} sockets not open; {m['skipped_changes']:,} changes skipped (their socket was "
        f"being replaced); {m.get('restored_on_reconnect', 0):,} clients back with a status other than "
        "their own choice restored it"
    )
    print(
        "rolling restart / old restart: frames for unchanged accounts "
        f"{_ratio_text(cmp['spurious_frames'])}, reconnect p99 {_ratio_text(cmp['reconnect_p99'])}, "
        f"fan-out p99 {_ratio_text(cmp['fanout_p99'])}, wall {_ratio_text(cmp['wall'])}"
    )
    if m["errors"]:
        print(f"client errors: {m['errors']}")


def _targets(
    rows: list[dict[str, Any]], views: dict[str, int], met: dict[str, bool | None]
) -> list[dict[str, Any]]:
    new = [r for r in rows if r["phase"] in (ROLL, ROLLOUT)]
    worst = max((r["fanout_ms"]["p99"] for r in rows if r["phase"] != OLD), default=math.nan)
    lost = sum(r["lost"] for r in new) + views["mismatches"]
    return [
        results.target(
            "frames for unchanged accounts (rolling restart + rollout)",
            sum(r["spurious_total"] for r in new),
            "frames",
            "= 0",
            met["spurious"],
        ),
        results.target(
            "status changes lost (rolling restart + rollout, views at the end)",
            lost,
            "changes",
            "= 0",
            met["lost"],
        ),
        results.target(
            "fan-out p99, worst phase but the old restart",
            worst,
            "ms",
            f"< {TARGET_FANOUT_P99_MS:g}",
            met["fanout"],
        ),
    ]


RESULTS_TITLE = (
    "A deploy under load: every edge restarted the old way (sockets closed at once, accounts departing), "
    "then rolled the new way (drain, 1012, resume), then `presence rollout` of the pool; status changes "
    "steady all along. Frames for accounts that did not change (old/rolling/rollout), reconnect p50/p99 "
    "(old | rolling), fan-out p99 per phase (steady/old/rolling/rollout), changes lost (views not "
    "converged), each action's seconds, rolling/old ratios of frames and reconnect p99."
)


def _columns(
    args: argparse.Namespace, m: dict[str, Any], info: dict[str, Any], cmp: dict[str, float], runtime: float
) -> list[tuple[str, str]]:
    by = {r["phase"]: r for r in m["phases"]}
    old, new, out = by[OLD], by[ROLL], by[ROLLOUT]
    met = judge(m["phases"], m["views"]["mismatches"], args.quick)
    load = (
        f"{args.sockets:,} x {args.subscriptions}, {args.rate:g}/s, {args.edges} edges, {args.shards} shards"
    )
    reconnect = " | ".join(
        f"{lg.fmt_ms(r['reconnect_ms']['p50'])}/{lg.fmt_ms(r['reconnect_ms']['p99'])}" for r in (old, new)
    )
    ratios = f"{_ratio_text(cmp['spurious_frames'])}, {_ratio_text(cmp['reconnect_p99'])}"
    return [
        *results.lead_columns(info),
        ("load", load),
        ("frames unchanged", "/".join(f"{r['spurious_total']:,}" for r in (old, new, out))),
        ("reconnect ms", reconnect),
        ("fan-out p99 ms", "/".join(lg.fmt_ms(r["fanout_ms"]["p99"]) for r in m["phases"])),
        ("lost", f"{sum(r['lost'] for r in m['phases']):,} ({m['views']['mismatches']:,})"),
        ("action s old/rolling/rollout", "/".join(f"{r['action_s']:.1f}" for r in (old, new, out))),
        ("ratio frames, reconnect p99", ratios),
        ("targets", ", ".join(f"{k} {results.met_text(v)}" for k, v in met.items())),
        ("runtime", f"{runtime:.0f} s"),
    ]


def report(args: argparse.Namespace, m: dict[str, Any], runtime: float, started_at: str) -> int:
    info = machine_info()
    by = {r["phase"]: r for r in m["phases"]}
    cmp = comparison(by[OLD], by[ROLL])
    met = judge(m["phases"], m["views"]["mismatches"], args.quick)
    _print(args, m, info, cmp)
    print(", ".join(f"target {k}: {results.met_text(v)}" for k, v in met.items()))
    payload = {
        **results.run_record(NAME, started_at, runtime, info, args),
        **m,
        "comparison": cmp,
        "targets": _targets(m["phases"], m["views"], met),
    }
    results.record(NAME, payload, args, RESULTS_TITLE, _columns(args, m, info, cmp, runtime))
    print(f"runtime {runtime:.1f} s")
    return 0
