"""Status resolution (protocol.md, Statuses): chosen and live sockets' idle flags → real status;
what everybody else sees; what counts as visibly present."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.status import (
    CHOSEN_STATUSES,
    VISIBILITIES,
    as_chosen,
    is_visibly_present,
    real_status,
    visible_status,
)

ALL = ("online", "idle", "dnd", "invisible", "offline")


@pytest.mark.parametrize(
    ("chosen", "flags", "real"),
    [
        ("online", [], "offline"),
        ("dnd", [], "offline"),
        ("invisible", [], "offline"),
        ("online", [False], "online"),
        ("online", [True], "idle"),
        ("online", [True, False], "online"),  # one awake socket is enough
        ("online", [True, True, True], "idle"),  # idle only when every live socket is idle
        ("dnd", [False], "dnd"),
        ("dnd", [True, True], "dnd"),  # decision: dnd is shown even when every socket is idle
        ("invisible", [False], "invisible"),
        ("invisible", [True], "invisible"),
    ],
)
def test_real_status(chosen: str, flags: list[bool], real: str) -> None:
    assert real_status(chosen, flags) == real  # type: ignore[arg-type]


def test_real_status_accepts_any_iterable_once() -> None:
    assert real_status("online", (f for f in [True, True])) == "idle"


@pytest.mark.parametrize(
    ("real", "visible"),
    [
        ("online", "online"),
        ("idle", "idle"),
        ("dnd", "dnd"),
        ("invisible", "offline"),
        ("offline", "offline"),
    ],
)
def test_visible_status(real: str, visible: str) -> None:
    assert visible_status(real) == visible  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("real", "present"),
    [("online", True), ("idle", True), ("dnd", True), ("invisible", False), ("offline", False)],
)
def test_visibly_present(real: str, present: bool) -> None:
    assert is_visibly_present(real) is present  # type: ignore[arg-type]


@given(chosen=st.sampled_from(sorted(CHOSEN_STATUSES)), flags=st.lists(st.booleans(), max_size=6))
def test_invisible_never_leaves(chosen: str, flags: list[bool]) -> None:
    real = real_status(chosen, flags)  # type: ignore[arg-type]
    assert real in ALL
    assert visible_status(real) != "invisible"
    assert (real == "offline") == (not flags)
    assert (real == "idle") == (chosen == "online" and bool(flags) and all(flags))
    assert is_visibly_present(real) == (bool(flags) and chosen != "invisible")


def test_sets() -> None:
    assert frozenset({"online", "dnd", "invisible"}) == CHOSEN_STATUSES
    assert frozenset({"everyone", "friends", "nobody"}) == VISIBILITIES


@pytest.mark.parametrize(
    ("stored", "chosen"),
    [
        ("online", "online"),
        ("dnd", "dnd"),
        ("invisible", "invisible"),
        ("idle", "online"),
        ("offline", "online"),
        ("", "online"),
        ("DND", "online"),
    ],
)
def test_as_chosen(stored: str, chosen: str) -> None:
    assert as_chosen(stored) == chosen
