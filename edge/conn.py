"""One websocket connection as the edge keeps it, pure: where it is in its life as the shards see
it (`Phase`), its session, and the frames held back while a reply that must come first is made.

No I/O and no clock: the server (edge/server.py) owns the socket and says when things happen;
tests/unit/test_conn.py walks every transition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from actors.core.shard import Claim
from edge.reregistration import Registered
from edge.session import Session

if TYPE_CHECKING:
    from edge.transport import Socket


class Phase(Enum):
    """Where a connection is in its life, as the shards see it.

    IDENTIFYING → LIVE once its `connect` was answered (it is registered on its account's shard);
    LIVE → LEAVING when the connection goes (its handler may notice later: it waits on a shard
    meanwhile). A connection that goes while IDENTIFYING is GONE: nothing upstream to undo, unless
    its `connect` lands after all (GONE → LEAVING)."""

    IDENTIFYING = "identifying"
    LIVE = "live"
    LEAVING = "leaving"
    GONE = "gone"


@dataclass(eq=False)
class Conn:
    ws: Socket
    session: Session
    phase: Phase = Phase.IDENTIFYING
    # When the connection went (LEAVING, GONE): its departure is stamped with this time.
    went_at: float | None = None
    # Closed by the server for its own reasons (1012 drain, 1011 shard out of reach): its
    # account keeps its presence for a resume (protocol.md "Drain and resume").
    resumable: bool = False
    # Not part of the phase: a counter with a job of its own. Frames for this socket wait in
    # `held` while a reply that must come first (ready, a sync, a resync) is being prepared, so
    # that no change overtakes the state it changes; replies nest, hence a count (1 until ready).
    hold: int = 1
    held: list[str] = field(default_factory=list)
    # More frames came while it was held than `held` keeps: the types of those dropped, whose
    # views are looked at afresh when the hold ends (edge/server.py `_release`, `_look_again`).
    # None until the first drop: an empty set per connection was 0.23 KiB of every idle socket.
    held_lost: set[str] | None = None

    @property
    def registered(self) -> bool:
        """Registered on its account's shard: the shards must hear of its departure."""
        return self.phase in (Phase.LIVE, Phase.LEAVING)

    def connected(self) -> None:
        """Its `connect` was answered."""
        self.phase = Phase.LEAVING if self.phase is Phase.GONE else Phase.LIVE

    def went(self, at: float) -> None:
        """The connection went at `at`; the first cause noticed keeps its time."""
        if self.went_at is None:
            self.went_at = at
            self.phase = Phase.LEAVING if self.phase is Phase.LIVE else Phase.GONE

    def closed_by_server(self, at: float, cut_off_since: float | None = None) -> None:
        """The server is closing it for its own reasons, at `at`: its client will be back.

        `cut_off_since`: the edge closes it because it has been cut off from most of the shards
        since then (its node partitioned away). A socket not heard since then departs when it was
        last heard, as a silent socket does: its client is most likely beyond the cut (the
        balancer closed its side at once) and was never seen again, so stamping the close, up to
        half a minute later, would move its departure. One heard since is on this side, still
        there: it departs now."""
        self.resumable = True
        self.went(self._since_heard(at, cut_off_since))

    def lost(self, at: float, cut_off_since: float | None) -> None:
        """The connection ended without a close frame from its client (reset, ended, or a close
        it never answered), noticed at `at`.

        `cut_off_since`: when this edge was last cut off from most of the shards (its node
        partitioned away; `actors.core.liveness.CutOff`), healed since or not. A socket not heard
        since then departs when it was last heard, as one its drain closes does: its client was
        most likely beyond the cut, closed by the balancer at once, and the loss crosses the cut
        only after the heal (the balancer's FIN, or the reset answering the edge's next write),
        up to the whole partition later. Any other departs when the loss was noticed."""
        self.went(self._since_heard(at, cut_off_since))

    def _since_heard(self, at: float, cut_off_since: float | None) -> float:
        """`at`, or when the socket was last heard if that was before the edge was cut off."""
        heard = self.session.last_frame_at
        return heard if cut_off_since is not None and heard < cut_off_since else at

    def departed_at(self, now: float) -> float:
        """When its departure happened: when it went, or `now` if it has not gone yet."""
        return self.went_at if self.went_at is not None else now

    def registration(self) -> Registered:
        """What a restarted shard must be told about it (edge/reregistration.py)."""
        s = self.session
        assert s.user_id is not None
        return Registered(
            s.user_id,
            s.socket_id,
            idle=s.idle,
            claim=Claim(*s.claim()),
            focus=s.focus,
            subscriptions=tuple(s.subscriptions),
            channels=tuple(s.channels),
            voice_channel=s.voice_channel,
            gone_at=self.went_at if self.phase is Phase.LEAVING else None,
        )
