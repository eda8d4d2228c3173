"""A history of a run in the Jepsen manner, and the checker of its invariants. Pure: no I/O.

A run records what every client sent and received, with wall-clock times (`Event`), when each
socket could have gone away (`SocketLife`: a window, since a departure is stamped by the server
somewhere between the client's last word and the close or the lease running out), what
PostgreSQL held before, during and after, the online counts read along the way, and the
operator's view of every account once the aging has passed.

Each check is a function from a `History` to a list of violations (strings); `check` runs them
all. The rules come from the contract (shared/protocol.md), not from the code under test:

- nobody but the account itself ever sees `invisible`, and an account invisible throughout is
  never shown present to anybody else;
- no frame about an account reaches a socket outside its audience;
- `lastSeenAt` appears only in query answers, only for accounts shown offline, only when the
  visibility rule admits the reader (`nobody` reciprocal), truncated to the precision, and never
  later than the moment an invisible account went invisible;
- no ghosts: once the aging has passed, an account with no live socket is offline everywhere;
- every departure's last-seen is stored, inside its window, and stored times never go back;
- online counts are never negative nor above the members, and are right when the run is quiet;
- nothing but contract frames reaches a client;
- every subscriber's view converges: for the sockets a test names as watchers (open at the end,
  subscribing, never querying), the status each last heard about every account it watches equals
  the truth once the run is quiet, and no frame repeats a status the socket already shows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

Frame = dict[str, Any]
SERVER_FRAME_TYPES = frozenset(
    {
        "ready",
        "heartbeat.ack",
        "presence.sync",
        "presence.changed",
        "presence.self",
        "typing",
        "voice.roster",
        "error",
    }
)
STATUSES = frozenset({"online", "idle", "dnd", "invisible", "offline"})


@dataclass(frozen=True)
class Graph:
    """The social graph of a run, fixed for its length."""

    users: frozenset[str]
    friends: frozenset[frozenset[str]] = frozenset()
    servers: dict[str, frozenset[str]] = field(default_factory=dict)
    # Last-seen visibility at the start of the run (default `everyone`); `settings.update` frames
    # in the history change it from the moment they are sent.
    visibility: dict[str, str] = field(default_factory=dict)
    # Accounts whose chosen status is `invisible` for the whole run.
    invisible: frozenset[str] = frozenset()

    def are_friends(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self.friends

    def in_audience(self, target: str, reader: str) -> bool:
        if target == reader or self.are_friends(target, reader):
            return True
        return any(target in members and reader in members for members in self.servers.values())


@dataclass(frozen=True)
class Event:
    t: float  # time.time() when it happened at the client
    socket: str  # the client-side name of the socket
    user: str
    kind: Literal["open", "send", "recv", "closed"]
    frame: Frame | None = None  # send: the frame when it was a valid JSON object; recv: always
    code: int | None = None  # closed: the close code


@dataclass
class SocketLife:
    user: str
    opened_at: float  # `ready` received
    # The server stamps the socket's departure somewhere in [gone_after, gone_before]; None while
    # the socket is (believed) open.
    gone_after: float | None = None
    gone_before: float | None = None


@dataclass
class CountSample:
    t: float
    server: str
    value: int | None  # None: the service answered "unknown"


@dataclass
class History:
    graph: Graph
    events: list[Event] = field(default_factory=list)
    sockets: dict[str, SocketLife] = field(default_factory=dict)
    # last_seen_at per account, as PostgreSQL held it (epoch seconds; absent = NULL).
    stored_before: dict[str, float] = field(default_factory=dict)
    stored_samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    stored_after: dict[str, float] = field(default_factory=dict)
    counts: list[CountSample] = field(default_factory=list)
    # server → (expected, observed) once the run was quiet.
    quiet_counts: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    # The operator's view after the aging: real status and live sockets per account.
    final_status: dict[str, str] = field(default_factory=dict)
    final_sockets: dict[str, int] = field(default_factory=dict)
    faults: list[tuple[float, str]] = field(default_factory=list)
    # Sockets whose final view is compared with the truth (`stale_views`): open at the end, and
    # they send no query (a query's answers are presence.changed frames too).
    watchers: set[str] = field(default_factory=set)
    precision_s: int = 60
    # Slack on departure windows: clocks are one machine's, but flushes and timers are not instant.
    tolerance_s: float = 1.0

    def user_of(self, socket: str) -> str:
        return self.sockets[socket].user if socket in self.sockets else self._user_from_events(socket)

    def _user_from_events(self, socket: str) -> str:
        for e in self.events:
            if e.socket == socket:
                return e.user
        raise KeyError(socket)


# --------------------------------------------------------------------------- frames


def mentions(frame: Frame, own: str) -> list[tuple[str, str | None, Any]]:
    """(account, status shown, lastSeenAt or None) for every account a server frame is about."""
    kind = frame.get("type")
    if kind in ("ready", "presence.self"):
        return [(own, frame.get("status"), frame.get("lastSeenAt"))]
    if kind == "presence.changed":
        return [(frame.get("userId"), frame.get("status"), frame.get("lastSeenAt"))]
    if kind == "presence.sync":
        return [(u.get("userId"), u.get("status"), u.get("lastSeenAt")) for u in frame.get("users", [])]
    if kind == "typing":
        return [(frame.get("userId"), None, None)]
    if kind == "voice.roster":
        return [(u, None, None) for u in frame.get("userIds", [])]
    return []


def _received(h: History) -> Iterable[Event]:
    return (e for e in h.events if e.kind == "recv" and e.frame is not None)


def parse_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value.endswith("Z"):
        return None
    try:
        return dt.datetime.fromisoformat(value[:-1] + "+00:00").timestamp()
    except ValueError:
        return None


# --------------------------------------------------------------------------- checks


def foreign_frames(h: History) -> list[str]:
    """Only contract frames reach clients (internal frames such as `_settings` never do)."""
    return [
        f"{e.socket}: got a frame that is not in the contract: {e.frame}"
        for e in _received(h)
        if e.frame is not None and e.frame.get("type") not in SERVER_FRAME_TYPES
    ]


def invisible_leaks(h: History) -> list[str]:
    out = []
    for e in _received(h):
        assert e.frame is not None
        for user, status, _ in mentions(e.frame, e.user):
            if user == e.user:
                continue
            if status == "invisible":
                out.append(f"{e.socket} ({e.user}) was told {user} is invisible: {e.frame}")
            elif user in h.graph.invisible and status not in (None, "offline"):
                out.append(f"{e.socket} ({e.user}) was shown invisible {user} as {status}: {e.frame}")
    return out


def audience_leaks(h: History) -> list[str]:
    out = []
    for e in _received(h):
        assert e.frame is not None
        for user, _, _ in mentions(e.frame, e.user):
            if not h.graph.in_audience(user, e.user):
                out.append(f"{e.socket} ({e.user}) heard about {user}, outside its audience: {e.frame}")
    return out


def _settings_timeline(h: History) -> dict[str, list[tuple[float, str]]]:
    timeline: dict[str, list[tuple[float, str]]] = {
        u: [(float("-inf"), h.graph.visibility.get(u, "everyone"))] for u in h.graph.users
    }
    for e in h.events:
        if e.kind == "send" and e.frame is not None and e.frame.get("type") == "settings.update":
            value = e.frame.get("lastSeenVisibility")
            if value in ("everyone", "friends", "nobody") and set(e.frame) == {"type", "lastSeenVisibility"}:
                timeline.setdefault(e.user, [(float("-inf"), "everyone")]).append((e.t, value))
    return timeline


def _possible(timeline: list[tuple[float, str]], start: float, end: float, slack: float) -> set[str]:
    """Every value that may have been in force at some moment in [start, end]: a change sent at t
    takes effect somewhere after t (within `slack`, frames of one socket being handled in order)."""
    values = set()
    for i, (t, value) in enumerate(timeline):
        nxt = timeline[i + 1][0] if i + 1 < len(timeline) else float("inf")
        if t <= end and nxt + slack >= start:
            values.add(value)
    return values


def last_seen_leaks(h: History, slack_s: float = 2.0) -> list[str]:
    out = []
    timeline = _settings_timeline(h)
    # socket → account → times of queries naming it, not yet answered with a lastSeenAt
    asked: dict[str, dict[str, list[float]]] = {}
    for e in h.events:
        if e.kind == "send" and e.frame is not None and e.frame.get("type") == "presence.query":
            ids = e.frame.get("userIds")
            if isinstance(ids, list) and len(ids) <= 100 and set(e.frame) == {"type", "userIds"}:
                for u in dict.fromkeys(i for i in ids if isinstance(i, str)):
                    asked.setdefault(e.socket, {}).setdefault(u, []).append(e.t)
            continue
        if e.kind != "recv" or e.frame is None:
            continue
        f = e.frame
        kind = f.get("type")
        if kind == "presence.sync":
            out += [
                f"{e.socket}: presence.sync carries lastSeenAt: {f}" for u in f["users"] if "lastSeenAt" in u
            ]
            continue
        if "lastSeenAt" not in f:
            continue
        if kind != "presence.changed":
            out.append(f"{e.socket}: {kind} carries lastSeenAt: {f}")
            continue
        target, reader, seen = f.get("userId"), e.user, parse_time(f.get("lastSeenAt"))
        pending = asked.get(e.socket, {}).get(target, [])
        if not pending:
            out.append(f"{e.socket} ({reader}): lastSeenAt of {target} outside any query answer: {f}")
            continue
        query_t = pending.pop(0)
        if f.get("status") != "offline":
            out.append(f"{e.socket} ({reader}): lastSeenAt of {target} shown {f.get('status')}: {f}")
        if seen is None or (seen * 1000) % (h.precision_s * 1000) != 0:
            out.append(f"{e.socket} ({reader}): lastSeenAt of {target} not truncated to the precision: {f}")
        if target != reader:
            theirs = _possible(timeline.get(target, [(float("-inf"), "everyone")]), query_t, e.t, slack_s)
            mine = _possible(timeline.get(reader, [(float("-inf"), "everyone")]), query_t, e.t, slack_s)
            admitted = "everyone" in theirs or ("friends" in theirs and h.graph.are_friends(target, reader))
            if not admitted:
                out.append(f"{e.socket} ({reader}): lastSeenAt of {target} whose setting is {theirs}: {f}")
            if mine == {"nobody"}:
                out.append(f"{e.socket} ({reader}): reader with setting nobody got lastSeenAt of {target}")
        if target in h.graph.invisible and seen is not None:
            frozen = h.stored_before.get(target)
            if frozen is None or seen > frozen:
                out.append(f"{e.socket}: lastSeenAt of invisible {target} moved past {frozen}: {f}")
    return out


def ghosts(h: History) -> list[str]:
    out = []
    for user in sorted({life.user for life in h.sockets.values()}):
        status = h.final_status.get(user)
        if status is None:
            out.append(f"{user}: no final status recorded")
        elif status != "offline" or h.final_sockets.get(user, 0) != 0:
            out.append(f"{user}: a ghost, {status} with {h.final_sockets.get(user)} sockets after the aging")
    return out


def _departure_windows(h: History) -> dict[str, tuple[float, float] | None]:
    """Per account: the window of its last departure, or None if a socket is still open."""
    windows: dict[str, tuple[float, float] | None] = {}
    for life in h.sockets.values():
        if life.gone_after is None or life.gone_before is None:
            windows[life.user] = None
            continue
        if life.user in windows and windows[life.user] is None:
            continue
        lo, hi = windows.get(life.user) or (float("-inf"), float("-inf"))
        windows[life.user] = (max(lo, life.gone_after), max(hi, life.gone_before))
    return windows


def departures_stored(h: History) -> list[str]:
    out = []
    tol = h.tolerance_s
    for user, window in sorted(_departure_windows(h).items()):
        stored = h.stored_after.get(user)
        before = h.stored_before.get(user)
        if user in h.graph.invisible:
            if stored != before:
                out.append(f"{user}: invisible throughout, yet last-seen went from {before} to {stored}")
            continue
        if window is None:
            continue  # a socket still open: nothing departed for good
        lo, hi = window
        if stored is None:
            out.append(f"{user}: departed in [{lo:.3f}, {hi:.3f}] but no last-seen is stored")
        elif not lo - tol <= stored <= hi + tol:
            out.append(f"{user}: departed in [{lo:.3f}, {hi:.3f}] but last-seen stored is {stored:.3f}")
    return out


def last_seen_backwards(h: History) -> list[str]:
    out = []
    series: list[tuple[float, dict[str, float]]] = [
        (float("-inf"), h.stored_before),
        *h.stored_samples,
        (float("inf"), h.stored_after),
    ]
    latest: dict[str, tuple[float, float]] = {}
    for t, values in series:
        for user, value in values.items():
            if user in latest and value < latest[user][1]:
                seen_at, old = latest[user]
                out.append(
                    f"{user}: last-seen went back from {old:.3f} (read at {seen_at}) to {value:.3f} ({t})"
                )
            if user not in latest or value >= latest[user][1]:
                latest[user] = (t, value)
    return out


def bad_counts(h: History) -> list[str]:
    out = []
    for s in h.counts:
        members = len(h.graph.servers.get(s.server, frozenset()))
        if s.value is not None and not 0 <= s.value <= members:
            out.append(f"online count of {s.server} was {s.value} at {s.t} ({members} members)")
    for server, (expected, observed) in sorted(h.quiet_counts.items()):
        if observed != expected:
            out.append(f"online count of {server} was {observed} once quiet, expected {expected}")
    return out


def subscribed(h: History, socket: str) -> set[str]:
    """The accounts a socket watches at the end (its subscribes less its unsubscribes)."""
    out: set[str] = set()
    for e in h.events:
        if e.socket != socket or e.kind != "send" or e.frame is None:
            continue
        ids = [i for i in e.frame.get("userIds") or [] if isinstance(i, str)]
        if e.frame.get("type") == "presence.subscribe":
            out.update(ids)
        elif e.frame.get("type") == "presence.unsubscribe":
            out.difference_update(ids)
    return out


def view_of(h: History, socket: str) -> dict[str, str]:
    """What a watcher socket shows for each account: the last status it heard (sync or change)."""
    view: dict[str, str] = {}
    for e in _received(h):
        if e.socket != socket:
            continue
        assert e.frame is not None
        if e.frame.get("type") in ("presence.sync", "presence.changed"):
            for user, status, _ in mentions(e.frame, e.user):
                if isinstance(user, str) and isinstance(status, str):
                    view[user] = status
    return view


def truth_for(h: History, reader: str, target: str) -> str | None:
    """The status `reader` must show for `target` once quiet: the real one for its own account,
    the visible one for others, nothing outside the audience; None if the truth is unknown."""
    real = h.final_status.get(target)
    if real is None or not h.graph.in_audience(target, reader):
        return None
    return real if target == reader else ("offline" if real == "invisible" else real)


def stale_views(h: History) -> list[str]:
    out = []
    for socket in sorted(h.watchers):
        reader = h.user_of(socket)
        view = view_of(h, socket)
        for target in sorted(subscribed(h, socket)):
            want = truth_for(h, reader, target)
            if want is not None and view.get(target) != want:
                out.append(f"{socket} ({reader}) shows {target} {view.get(target)}, the truth is {want}")
    return out


def repeated_frames(h: History) -> list[str]:
    """A watcher told a status it already shows: noise (e.g. re-announcements after a restart)."""
    out = []
    for socket in sorted(h.watchers):
        view: dict[str, str] = {}
        for e in _received(h):
            if e.socket != socket or e.frame is None or e.frame.get("type") != "presence.changed":
                if e.socket == socket and e.frame is not None and e.frame.get("type") == "presence.sync":
                    view.update({u["userId"]: u["status"] for u in e.frame.get("users", [])})
                continue
            user, status = e.frame.get("userId"), e.frame.get("status")
            if isinstance(user, str) and view.get(user) == status:
                out.append(f"{socket}: told {user} is {status} again at {e.t:.3f}")
            if isinstance(user, str) and isinstance(status, str):
                view[user] = status
    return out


CHECKS: tuple[Callable[[History], list[str]], ...] = (
    foreign_frames,
    invisible_leaks,
    audience_leaks,
    last_seen_leaks,
    ghosts,
    departures_stored,
    last_seen_backwards,
    bad_counts,
    stale_views,
    repeated_frames,
)
# What can be checked while a run is still going (no final state yet).
FRAME_CHECKS: tuple[Callable[[History], list[str]], ...] = (
    foreign_frames,
    invisible_leaks,
    audience_leaks,
    last_seen_leaks,
)
# Sockets still open at the end: what each watcher shows, and nothing said twice.
VIEW_CHECKS: tuple[Callable[[History], list[str]], ...] = (*FRAME_CHECKS, stale_views, repeated_frames)


def check(h: History, checks: Iterable[Callable[[History], list[str]]] = CHECKS) -> list[str]:
    return [v for c in checks for v in c(h)]
