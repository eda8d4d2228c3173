"""Whether something probed at intervals is gone, and whether a shard may still serve: pure rules
(the shells probe, on their own clocks, and act on the answers).

`LossWatch`: an edge probes its node's raylet every second; the raylet is *lost* once every probe
has failed for `after_s` without a break (one failed probe, a busy second, is not a loss). An
edge that lost its raylet has lost Ray for good (its core worker cannot reconnect to another
one), so it exits and its supervisor starts it again (docs/operations.md "The head dies").

`Fence`: the rule that keeps a shard cut off from the cluster from serving beside the
incarnation Ray restarts elsewhere (docs/architecture.md "Fencing"). Every second a shard asks
Ray's GCS about itself (is its node still alive in Ray's node table?) and probes
the raylets of the other nodes that carry shards. It serves while a strict majority of those
nodes (itself included) answered within `lease_s`, whether or not the GCS answers: with GCS
fault tolerance the head may be away for minutes, and the workers (a majority) go on serving,
while a node cut off alone (a minority) stops. `lease_s` stays well under Ray's quickest
verdict on a silent node (five failed health checks, 15 s at the least), so a cut-off shard has
stopped (*suspended*: operations refused, lanes closed) before Ray restarts it elsewhere; it
serves again once it hears a majority again, if Ray did not replace it meanwhile. A shard the
GCS says was replaced (its node declared dead) is
*fenced* for good: it never serves again, and its process exits.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class LossWatch:
    """Lost once every probe failed for `after_s` without a break."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s
        self._failing_since: float | None = None

    def observe(self, ok: bool, now: float) -> bool:
        """Record one probe's outcome; True when the thing probed is lost."""
        if ok:
            self._failing_since = None
            return False
        if self._failing_since is None:
            self._failing_since = now
        return now - self._failing_since >= self.after_s

    def failing_for(self, now: float) -> float:
        return 0.0 if self._failing_since is None else now - self._failing_since


class CutOff:
    """When an edge was last cut off from most of the shards (`Router.healthy` false: its
    /healthz 503), remembered after it is healed, for the departures it notices late.

    A partition leaves an edge's sockets open on its side: the balancer closed its own ends at
    once, but its FIN or reset crosses the cut only after the heal, or the edge learns of the loss
    only when it next writes there. Such a socket, not heard since the edge found itself cut off,
    departs when it was last heard (`Conn.lost`), not when the loss was noticed (testbed, a 30 s
    partition: both abandoned accounts stored 31.3 s after the cut, 1.3 s after the heal). An edge
    that has not yet reached most of the shards (starting) is not cut off: it has served nobody."""

    def __init__(self) -> None:
        self.since: float | None = None  # the start of the latest period cut off, healed or not
        self._served = False
        self._out = False

    def observe(self, reachable: bool, now: float) -> None:
        """One look (the edge's liveness loop, every second): most shards reachable or not."""
        if reachable:
            self._served, self._out = True, False
        elif self._served and not self._out:
            self._out, self.since = True, now


class Standing(Enum):
    SERVING = "serving"
    SUSPENDED = "suspended"  # cut off: refuses operations until confirmed again
    FENCED = "fenced"  # replaced: never serves again


class GcsAnswer(Enum):
    CURRENT = "current"  # its node alive in Ray's node table
    REPLACED = "replaced"  # its node declared dead: Ray restarted its actors elsewhere
    NO_ANSWER = "no answer"


def gcs_answer(node_alive: bool | None) -> GcsAnswer:
    """What Ray's node table says of this shard's node (None: not listed, or no table). Ray
    restarts an actor elsewhere only when its process died (then nothing of it runs) or when its
    node was declared dead: a shard whose node is dead in the table has been replaced."""
    return GcsAnswer.REPLACED if node_alive is False else GcsAnswer.CURRENT


def majority(reachable: int, nodes: int) -> bool:
    """`reachable` of `nodes` (both counting this one) is a strict majority."""
    return nodes <= 1 or reachable * 2 > nodes


@dataclass
class Fence:
    lease_s: float
    standing: Standing = Standing.SERVING
    _quorum_at: float | None = None

    def started(self, now: float) -> None:
        """A new incarnation starts serving: Ray just placed it on a node it could reach."""
        self._quorum_at = now
        self.standing = Standing.SERVING

    def observe(self, gcs: GcsAnswer, reachable: int, nodes: int, now: float) -> Standing:
        """One round of checks: the GCS's answer, and how many of the `nodes` that carry shards
        (this one included) answered a probe."""
        if gcs is GcsAnswer.REPLACED:
            self.standing = Standing.FENCED
        elif majority(reachable, nodes):
            self._quorum_at = now
        return self.decide(now)

    def decide(self, now: float) -> Standing:
        """The standing at `now`, from what was observed so far (also between rounds, so a shard
        whose checks stopped coming, stuck on a GCS that does not answer, suspends itself all the
        same)."""
        if self.standing is Standing.FENCED:
            return self.standing
        fresh = self._quorum_at is not None and now - self._quorum_at <= self.lease_s
        self.standing = Standing.SERVING if fresh else Standing.SUSPENDED
        return self.standing
