"""The last-seen visibility rule, as a full table against protocol.md.

Every combination of: the reader's relation to the target (accepted friend, server in common only,
nothing, the account itself), the reader's own setting, the target's setting, the target's real
status, and whether a last-seen time exists. The expected answer is written out from the contract
below (`expected`), independently of `actors/core/visibility.py`:

- only an account shown offline (offline or invisible) carries a time, and only if one exists;
- nobody outside the audience (no server in common, no accepted friendship) learns anything;
- `everyone` admits the whole audience, `friends` accepted friendships only (a server in common
  is not a friendship), `nobody` no one; `nobody` is reciprocal: a reader whose own setting is
  `nobody` receives no time for anybody;
- the time is truncated to the minute (the precision is configuration).

The account itself is not "anybody else": it reads its own time whatever its setting (the
operator view and the account's own sockets see the real state; the settings govern who *else*
reads it). That case is the project's decision, marked as such below.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.audience import Relations
from actors.core.visibility import last_seen_for_reader, truncate

from .conftest import T0

SEEN = T0 - 3 * 3600 + 47.123  # 47.123 s past a minute: truncation shows
STATUSES = ("online", "idle", "dnd", "offline", "invisible")
SETTINGS = ("everyone", "friends", "nobody")
RELATIONS = ("friend", "server", "none", "self")


def build(relation: str, reader_setting: str, target_setting: str) -> tuple[str, Relations, str, Relations]:
    """Target and reader ids and relations for one relation kind (friendships on both sides)."""
    target, reader = "t", "r"
    if relation == "self":
        return (
            target,
            Relations(frozenset(), frozenset({"g1"}), target_setting),
            target,
            Relations(frozenset(), frozenset({"g1"}), target_setting),
        )
    t_friends = frozenset({reader}) if relation == "friend" else frozenset()
    r_friends = frozenset({target}) if relation == "friend" else frozenset()
    t_servers = frozenset({"g1", "g2"})
    r_servers = frozenset({"g2"}) if relation == "server" else frozenset({"g9"})
    return (
        target,
        Relations(t_friends, t_servers, target_setting),
        reader,
        Relations(r_friends, r_servers, reader_setting),
    )


def expected(
    relation: str, reader_setting: str, target_setting: str, status: str, seen: float | None
) -> float | None:
    if status not in ("offline", "invisible") or seen is None:
        return None
    if relation == "none":
        return None
    minute = math.floor(seen / 60) * 60.0
    if relation == "self":
        return minute  # decision: an account reads its own time whatever its setting
    if reader_setting == "nobody":
        return None  # reciprocal
    if target_setting == "nobody":
        return None
    if target_setting == "friends" and relation != "friend":
        return None
    return minute


CASES = [
    (rel_, rs, ts, status, seen)
    for rel_, rs, ts, status, seen in itertools.product(RELATIONS, SETTINGS, SETTINGS, STATUSES, (None, SEEN))
    # An account has one setting: for "self" the reader's setting is the target's.
    if rel_ != "self" or rs == ts
]


@pytest.mark.parametrize(("relation", "reader_setting", "target_setting", "status", "seen"), CASES)
def test_matrix(
    relation: str, reader_setting: str, target_setting: str, status: str, seen: float | None
) -> None:
    target, target_rel, reader, reader_rel = build(relation, reader_setting, target_setting)
    got = last_seen_for_reader(
        target=target,
        target_rel=target_rel,
        target_status=status,  # type: ignore[arg-type]
        last_seen_at=seen,
        reader=reader,
        reader_rel=reader_rel,
        precision_s=60,
    )
    assert got == expected(relation, reader_setting, target_setting, status, seen)


def test_matrix_is_complete() -> None:
    # 3 relations x 3 x 3 settings + self x 3 settings, each x 5 statuses x 2 last-seen values.
    assert len(CASES) == (3 * 3 * 3 + 3) * 5 * 2
    admitted = [c for c in CASES if expected(*c) is not None]
    assert admitted, "the table must contain cases that do show a time"
    # Those are exactly: offline/invisible with a time, in the audience, admitted by both settings.
    assert {c[3] for c in admitted} == {"offline", "invisible"}


def test_friendship_must_be_on_the_targets_side() -> None:
    """Friendships are accepted ones, stored both ways; a one-sided claim by the reader admits nothing."""
    got = last_seen_for_reader(
        target="t",
        target_rel=Relations(frozenset(), frozenset(), "everyone"),
        target_status="offline",
        last_seen_at=SEEN,
        reader="r",
        reader_rel=Relations(frozenset({"t"}), frozenset(), "everyone"),
    )
    assert got is None


def test_server_in_common_is_not_a_friendship() -> None:
    got = last_seen_for_reader(
        target="t",
        target_rel=Relations(frozenset({"x"}), frozenset({"g"}), "friends"),
        target_status="offline",
        last_seen_at=SEEN,
        reader="r",
        reader_rel=Relations(frozenset(), frozenset({"g"}), "everyone"),
    )
    assert got is None


def test_withheld_is_indistinguishable_from_never_seen() -> None:
    """Absent means absent: a hidden time and a missing time are the same value (None)."""
    kwargs = dict(
        target="t",
        target_status="offline",
        reader="r",
        reader_rel=Relations(frozenset(), frozenset({"g"}), "everyone"),
    )
    hidden = last_seen_for_reader(
        target_rel=Relations(frozenset(), frozenset({"g"}), "nobody"), last_seen_at=SEEN, **kwargs
    )  # type: ignore[arg-type]
    never = last_seen_for_reader(
        target_rel=Relations(frozenset(), frozenset({"g"}), "everyone"), last_seen_at=None, **kwargs
    )  # type: ignore[arg-type]
    assert hidden is None and never is None


@pytest.mark.parametrize(
    ("precision", "ts", "want"),
    [
        (60, T0 + 59.999, T0),
        (60, T0 + 60.0, T0 + 60),
        (60, T0 + 119.5, T0 + 60),
        (300, T0 + 299.0, T0),  # T0 is a multiple of 300 s
        (1, T0 + 1.23456, T0 + 1.234),  # a second's precision still drops below the millisecond
        (0, T0 + 1.23456, T0 + 1.234),
    ],
)
def test_truncate(precision: int, ts: float, want: float) -> None:
    assert truncate(ts, precision) == pytest.approx(want, abs=1e-6)
    assert truncate(ts, precision) <= ts


@given(ts=st.floats(0, 4_102_444_800), precision=st.sampled_from([60, 300, 3600]))
def test_truncate_properties(ts: float, precision: int) -> None:
    t = truncate(ts, precision)
    assert t <= ts < t + precision
    assert t % precision == 0
    assert truncate(t, precision) == t


def test_configured_precision_is_applied() -> None:
    got = last_seen_for_reader(
        target="t",
        target_rel=Relations(frozenset(), frozenset({"g"}), "everyone"),
        target_status="invisible",
        last_seen_at=T0 + 3599,
        reader="r",
        reader_rel=Relations(frozenset(), frozenset({"g"}), "everyone"),
        precision_s=3600,
    )
    assert got == T0 + 3600 * 0  # T0 is a multiple of 3600 s
