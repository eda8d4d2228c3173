"""The last-seen visibility rule: the only road a last-seen timestamp travels to another account.

`last_seen_for_reader` is called by the shard for every query answer and nowhere else returns a
timestamp to a reader. An excluded timestamp is absent (None), exactly like one that never
existed, so the wire cannot tell "hidden from you" from "never seen".
"""

from __future__ import annotations

from .audience import Relations, in_audience
from .status import Status


def truncate(ts: float, precision_s: int) -> float:
    """Others never get an exact time: round down to the configured precision (a minute)."""
    if precision_s <= 1:
        return float(int(ts * 1000)) / 1000
    return float(int(ts // precision_s) * precision_s)


def last_seen_for_reader(
    *,
    target: str,
    target_rel: Relations,
    target_status: Status,
    last_seen_at: float | None,
    reader: str,
    reader_rel: Relations,
    precision_s: int = 60,
) -> float | None:
    """The last-seen time `reader` may see for `target`, or None.

    `target_status` is the real status; an account shown offline (offline or invisible) is the
    only kind that carries a timestamp, since "online, last seen a moment ago" says one thing
    twice and the second half goes stale.
    """
    if target_status not in ("offline", "invisible"):
        return None
    if last_seen_at is None:
        return None
    if not in_audience(target, target_rel, reader, reader_rel):
        return None
    if reader != target:
        # `nobody` is reciprocal: hiding your own last-seen costs you everybody else's.
        if reader_rel.last_seen_visibility == "nobody":
            return None
        setting = target_rel.last_seen_visibility
        if setting == "nobody":
            return None
        if setting == "friends" and reader not in target_rel.friends:
            return None
    return truncate(last_seen_at, precision_s)
