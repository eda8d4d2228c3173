"""Active counts: which accounts had a live socket at some moment of the last H hours.

The store (chosen by measured cost, bench/RESULTS.md "active counts") is one Redis sorted set,
`presence:active`, one member per account, whatever its chosen status (an operator figure, so
`invisible` counts too). Its score is:

- while the account has a live socket, a time *ahead of now*: `live_until(now)`, written when its
  first socket arrives and again by a rolling refresh that reaches every live account well within
  that lead, so a live account is counted in every window, however short;
- when its last socket goes, the moment it went.

So "active in the last H hours" is the number of members scored at or after `now - H h` (one
`ZCOUNT`), an account with many sockets or edges is one member, a count can never go negative,
and members older than the longest window (720 h) are trimmed. Everything here is pure: the shard
decides what to write and when; `actors.counts` writes it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

MAX_HOURS = 720.0
RETENTION_S = MAX_HOURS * 3600.0
# A refresh round is handed out over this share of its interval (like the last-seen checkpoint).
SPREAD = 0.8
# Slack on top of the longest gap between two refreshes of one live account (loop jitter).
MARGIN_S = 60.0
# The windows the operator page and `presence report` show.
REPORT_WINDOWS_H = (1.0, 24.0, 168.0)

_HOURS = re.compile(r"[0-9]{1,6}(\.[0-9]{1,6})?")


class BadWindow(ValueError):
    """The `hours` of an active count is missing, not a number, or outside (0, 720]."""


def parse_hours(raw: str | None) -> float:
    """`hours=H` as the internal API receives it: a decimal number with 0 < H <= 720."""
    if raw is None or raw == "":
        raise BadWindow("hours is required (0 < hours <= 720)")
    if not _HOURS.fullmatch(raw):
        raise BadWindow("hours must be a number (0 < hours <= 720)")
    hours = float(raw)
    if not 0.0 < hours <= MAX_HOURS:
        raise BadWindow("hours must be above 0 and at most 720")
    return hours


def window_start(now: float, hours: float) -> float:
    """Members scored at or after this time were active in the last `hours` hours."""
    return now - hours * 3600.0


def trim_before(now: float) -> float:
    """Members scored before this time are past the longest window and may go."""
    return now - RETENTION_S


def lead_s(refresh_s: float) -> float:
    """How far ahead of now a live account's score is put: longer than the longest gap between two
    refreshes of one account (a full interval plus one spread-out round) plus some slack."""
    return refresh_s * (1.0 + SPREAD) + MARGIN_S


def live_until(now: float, refresh_s: float) -> float:
    return now + lead_s(refresh_s)


@dataclass
class RollingRefresh:
    """Every `interval_s`, the accounts live at that moment are handed out in even slices over
    `SPREAD` of the interval (call `chunk` about once a second), so a shard with 100,000 live
    accounts writes a few hundred a second instead of all of them at once. The first round
    begins one interval after the first call: whoever is live then arrived moments ago and was
    written on arrival."""

    interval_s: float
    rounds: int = 0
    _round: list[str] = field(default_factory=list)
    _started: float | None = None
    _sent: int = 0

    def chunk(self, live: Iterable[str], now: float) -> list[str]:
        """The slice due by `now`; `live` is read only when a round begins."""
        if self._started is None:
            self._started = now
            return []
        if now - self._started >= self.interval_s:
            self._round = sorted(live)
            self._started, self._sent = now, 0
            self.rounds += 1
        spread = max(self.interval_s * SPREAD, 1e-9)
        due = min(len(self._round), math.ceil(len(self._round) * (now - self._started) / spread))
        out = self._round[self._sent : due]
        self._sent = max(self._sent, due)
        return out
