"""How a last-seen time is shown to people: coarse on purpose.

The display matches the precision we store and the precision that respects privacy: "Online"
while connected (presence answers that, not last-seen), then "Active in the last 10 minutes",
then whole minutes, hours, days, and finally a date.

Two forms (seed 003): a *profile card* (the default) states the status in words (Online, Idle,
Do not disturb, a last-seen line, or Offline); a *conversation header* answers "will this be read
now", so it collapses `idle` and `dnd` to "Online", shows the same last-seen line when one is
known, and otherwise says nothing at all (an empty string) rather than "Offline".

The same rules exist in JavaScript in `clients/js/src/lastseen.js` (the JavaScript client's, also
imported by the demo page); `tests/unit/lastseen_display_cases.json` keeps the two in step.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, tzinfo
from typing import Literal

__all__ = ["FORMS", "describe_last_seen"]

Form = Literal["card", "header"]
FORMS: tuple[Form, ...] = ("card", "header")

_MINUTE = 60.0
_HOUR = 3600.0
_DAY = 86400.0

# Statuses shown as they are; `invisible` is `offline` to everybody but the account itself.
_PRESENT_LABELS = {"online": "Online", "idle": "Idle", "dnd": "Do not disturb"}
_OFFLINE = frozenset({"offline", "invisible"})


def describe_last_seen(
    status: str,
    last_seen_at: float | None,
    now: float,
    tz: tzinfo = UTC,  # the same object as timezone.utc
    form: Form = "card",
) -> str:
    """The label for an account with visible `status` and last-seen epoch time `last_seen_at`.

    Elapsed time is rounded down ("59 minutes" until the hour is complete); "yesterday" means
    24 to 48 hours ago, not the previous calendar day, so the label does not depend on the time
    zone. Only the date shown after a week does, hence `tz`. A time in the future (clock skew)
    reads as just now. `form` is "card" (a profile card) or "header" (a conversation header: idle
    and dnd read "Online", and an offline account without a known time reads ""). Raises
    ValueError for an unknown status or form.
    """
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}")
    label = _PRESENT_LABELS.get(status)
    if label is not None:
        return "Online" if form == "header" else label
    if status not in _OFFLINE:
        raise ValueError(f"unknown status {status!r}")
    if last_seen_at is None or not math.isfinite(last_seen_at):
        return "" if form == "header" else "Offline"
    age = max(now - last_seen_at, 0.0)
    if age < 10 * _MINUTE:
        return "Active in the last 10 minutes"
    if age < _HOUR:
        return f"Last seen {int(age // _MINUTE)} minutes ago"
    if age < _DAY:
        hours = int(age // _HOUR)
        return "Last seen 1 hour ago" if hours == 1 else f"Last seen {hours} hours ago"
    if age < 7 * _DAY:
        days = int(age // _DAY)
        return "Last seen yesterday" if days == 1 else f"Last seen {days} days ago"
    return "Last seen on " + datetime.fromtimestamp(last_seen_at, tz).date().isoformat()
