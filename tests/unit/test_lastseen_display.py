"""The last-seen display rules, from the cases shared with the JavaScript implementation."""

from __future__ import annotations

import json
import shutil
import subprocess
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.core.lastseen_display import describe_last_seen

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
DATA: dict[str, Any] = json.loads((HERE / "lastseen_display_cases.json").read_text())
NOW = float(DATA["now_epoch_s"])
CASE_IDS = [f"{c.get('form', 'card')}-{c['status']}-{c['offset_s']}" for c in DATA["cases"]]


def test_file_now_agrees_with_its_epoch_seconds() -> None:
    assert datetime.fromisoformat(DATA["now"].replace("Z", "+00:00")).timestamp() == NOW


@pytest.mark.parametrize("case", DATA["cases"], ids=CASE_IDS)
def test_shared_case(case: dict[str, Any]) -> None:
    seen = None if case["offset_s"] is None else NOW - case["offset_s"]
    assert describe_last_seen(case["status"], seen, NOW, form=case.get("form", "card")) == case["expected"]


@pytest.mark.parametrize("case", DATA["cases"], ids=CASE_IDS)
def test_shared_case_at_wire_precision(case: dict[str, Any]) -> None:
    # lastSeenAt travels with millisecond precision; the label must not change with it.
    seen = None if case["offset_s"] is None else NOW - round(case["offset_s"] * 1000) / 1000
    assert describe_last_seen(case["status"], seen, NOW, form=case.get("form", "card")) == case["expected"]


def test_cases_cover_every_rule() -> None:
    labels = " | ".join(c["expected"] for c in DATA["cases"])
    for fragment in (
        "Online",
        "Idle",
        "Do not disturb",
        "Offline",
        "Active in the last 10 minutes",
        " minutes ago",
        "1 hour ago",
        " hours ago",
        "yesterday",
        " days ago",
        "Last seen on",
    ):
        assert fragment in labels


def test_unknown_status_is_refused() -> None:
    with pytest.raises(ValueError):
        describe_last_seen("away", NOW, NOW)
    with pytest.raises(ValueError):
        describe_last_seen("away", NOW, NOW, form="header")


def test_unknown_form_is_refused() -> None:
    with pytest.raises(ValueError):
        describe_last_seen("online", NOW, NOW, form="banner")  # type: ignore[arg-type]


def test_cases_cover_the_header_form() -> None:
    header = {c["status"]: c["expected"] for c in DATA["cases"] if c.get("form") == "header"}
    # The header answers "will this be read now": every present status is "Online".
    assert header["idle"] == header["dnd"] == header["online"] == "Online"
    assert {c.get("form", "card") for c in DATA["cases"]} == {"card", "header"}


@given(
    status=st.sampled_from(["online", "idle", "dnd", "offline", "invisible"]),
    offset=st.one_of(st.none(), st.floats(-1e9, 1e9, allow_nan=False)),
)
def test_header_differs_from_card_only_where_the_rule_says(status: str, offset: float | None) -> None:
    seen = None if offset is None else NOW - offset
    card = describe_last_seen(status, seen, NOW)
    header = describe_last_seen(status, seen, NOW, form="header")
    if status in ("online", "idle", "dnd"):
        assert header == "Online"
    elif card == "Offline":
        assert header == ""
    else:
        assert header == card


def test_non_finite_time_reads_as_unknown() -> None:
    assert describe_last_seen("offline", float("nan"), NOW) == "Offline"


def test_date_follows_time_zone() -> None:
    seen = datetime(2026, 11, 2, 23, 30, tzinfo=UTC).timestamp()
    assert describe_last_seen("offline", seen, NOW) == "Last seen on 2026-11-02"
    tokyo = timezone(timedelta(hours=9))
    assert describe_last_seen("offline", seen, NOW, tz=tokyo) == "Last seen on 2026-11-03"
    new_york = timezone(timedelta(hours=-5))
    assert describe_last_seen("offline", seen, NOW, tz=new_york) == "Last seen on 2026-11-02"


def test_relative_labels_do_not_depend_on_time_zone() -> None:
    tz = timezone(timedelta(hours=13))
    for c in DATA["cases"]:
        if c["offset_s"] is not None and "Last seen on" not in c["expected"]:
            form = c.get("form", "card")
            label = describe_last_seen(c["status"], NOW - c["offset_s"], NOW, tz=tz, form=form)
            assert label == c["expected"]


def test_node_implementation_passes_the_same_cases() -> None:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed: the JavaScript side (clients/js/src/lastseen.js) is untested")
    result = subprocess.run(
        [node, "--test", str(HERE / "lastseen_display.test.mjs")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
