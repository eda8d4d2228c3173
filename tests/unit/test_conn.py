"""A connection's life as the shards see it (edge/conn.py `Conn`, `Phase`), pure: every transition,
the time its departure carries, and what a restarted shard is told about it."""

from __future__ import annotations

from typing import Any, cast

import pytest

from edge.conn import Conn, Phase
from edge.session import Limits, Session


def conn(user: str | None = "alice") -> Conn:
    session = Session(secret="x" * 32, now=0.0, limits=Limits(), socket_id="s1")
    session.user_id = user
    return Conn(cast(Any, object()), session)


def test_a_new_connection_is_identifying_and_not_registered() -> None:
    c = conn()
    assert c.phase is Phase.IDENTIFYING
    assert not c.registered


def test_answered_connect_makes_it_live_and_registered() -> None:
    c = conn()
    c.connected()
    assert c.phase is Phase.LIVE
    assert c.registered


def test_a_live_connection_that_goes_is_leaving_with_its_time() -> None:
    c = conn()
    c.connected()
    c.went(100.0)
    assert (c.phase, c.went_at, c.registered) == (Phase.LEAVING, 100.0, True)
    assert c.departed_at(now=500.0) == 100.0


def test_the_first_cause_noticed_keeps_its_time() -> None:
    c = conn()
    c.connected()
    c.went(100.0)
    c.went(150.0)
    assert (c.phase, c.went_at) == (Phase.LEAVING, 100.0)


def test_gone_before_its_connect_landed_then_the_connect_lands() -> None:
    c = conn()
    c.went(100.0)
    assert (c.phase, c.registered) == (Phase.GONE, False)  # nothing upstream to undo...
    c.connected()
    assert (c.phase, c.registered) == (Phase.LEAVING, True)  # ...unless its connect lands after all
    assert c.departed_at(now=500.0) == 100.0


def test_closed_by_the_server_is_resumable() -> None:
    c = conn()
    c.connected()
    c.closed_by_server(42.0)
    assert (c.phase, c.resumable, c.went_at) == (Phase.LEAVING, True, 42.0)


@pytest.mark.parametrize(("heard", "went_at"), [(10.0, 10.0), (25.0, 50.0)])
def test_closed_because_its_edge_was_cut_off_it_departs_when_last_heard_unless_heard_since(
    heard: float, went_at: float
) -> None:
    """A partition: the edge, cut off from the shards since 20, drains at 50. A socket last heard
    at 10 had its client beyond the cut (the balancer closed it): it departs at 10, not 40 s late.
    One heard at 25 is on this side of the cut, still there: it departs when closed."""
    c = conn()
    c.connected()
    c.session.last_frame_at = heard
    c.closed_by_server(50.0, cut_off_since=20.0)
    assert (c.phase, c.resumable, c.went_at) == (Phase.LEAVING, True, went_at)


@pytest.mark.parametrize(
    ("heard", "cut_off_since", "went_at"),
    [(10.0, 20.0, 10.0), (25.0, 20.0, 51.3), (10.0, None, 51.3)],
)
def test_lost_after_its_edge_was_cut_off_it_departs_when_last_heard_unless_heard_since(
    heard: float, cut_off_since: float | None, went_at: float
) -> None:
    """A 30 s partition (testbed): cut at 5, the edge found itself cut off at 20, healed at 35; the
    balancer closed its side of a socket at 8, and the edge learns of it at 51.3, when the close
    or the reset answering its next write crosses the healed link. Last heard at 10, its client
    was beyond the cut: it departs at 10, not 46 s late (the old stamp: both abandoned accounts
    stored 1.3 s after the heal). One heard at 25 was on this side after the cut; and an edge
    never cut off stamps the loss when it noticed it. Not resumable: nobody closed it for a
    restart."""
    c = conn()
    c.connected()
    c.session.last_frame_at = heard
    c.lost(51.3, cut_off_since)
    assert (c.phase, c.resumable, c.went_at) == (Phase.LEAVING, False, went_at)
    assert c.departed_at(now=60.0) == went_at


def test_not_gone_departs_now() -> None:
    assert conn().departed_at(now=7.0) == 7.0


@pytest.mark.parametrize(("went", "gone_at"), [(False, None), (True, 100.0)])
def test_the_registration_names_its_departure_only_once_it_went(went: bool, gone_at: float | None) -> None:
    c = conn()
    c.connected()
    if went:
        c.went(100.0)
    registered = c.registration()
    assert (registered.user_id, registered.socket_id, registered.gone_at) == ("alice", "s1", gone_at)
