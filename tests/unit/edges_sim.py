"""What the edges make of a shard's effects, for the tests of the pure shard state.

A shard publishes a status change once per edge and kind of watcher (`Publish`); each edge
expands it through its `WatchIndex` (edge/watch_index.py, kept by the shard's `_audience`
notes) and drops it for a socket whose view already shows that status (`Session.tell`, fed by
syncs too). `EdgesSim` does the same to the effects a test drains, so the tests written against
per-socket deliveries (the privacy properties: nobody outside an audience hears anything,
`invisible` never leaves the account, no repeats) check the shard and the edges' index together,
as clients would see them. Notes are consumed here, never shown to a test.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from actors.core.effects import Deliver, Effect, Outbox, Publish
from actors.core.frames import INTERNAL_AUDIENCE
from actors.core.shard import OUTSIDE, ShardState, SlotExport, Watcher
from edge.watch_index import WatchIndex


class EdgesSim:
    def __init__(self) -> None:
        self.index: defaultdict[str, WatchIndex] = defaultdict(WatchIndex)
        self.owner: dict[str, str] = {}  # socket → its account
        self.view: dict[tuple[str, str], str] = {}  # (socket, account) → status it shows

    def synced(self, socket_id: str, answer: list[tuple[str, Any]]) -> None:
        for target, status in answer:
            self.view[(socket_id, target)] = status

    def _tell(self, socket_ids: Any, user_id: str, status: str) -> tuple[str, ...]:
        out = []
        for s in socket_ids:
            if self.view.get((s, user_id)) != status:
                self.view[(s, user_id)] = status
                out.append(s)
        return tuple(out)

    def expand(self, effects: list[Effect]) -> list[Effect]:
        out: list[Effect] = []
        for e in effects:
            if isinstance(e, Publish):
                user, status = e.frame["userId"], e.frame["status"]
                sockets = self._tell(self.index[e.edge_id].watchers(e.user_id, e.own), user, status)
                if sockets:
                    out.append(Deliver(e.edge_id, sockets, e.frame))
            elif isinstance(e, Deliver) and e.frame["type"] == INTERNAL_AUDIENCE:
                for s in e.socket_ids:
                    self.index[e.edge_id].see(s, self.owner[s], e.frame["in"], e.frame["out"])
                    for target in e.frame["out"]:
                        self.view.pop((s, target), None)  # as the edge forgets it (edge/server.py)
            elif isinstance(e, Deliver) and e.frame["type"] == "presence.changed":
                sockets = self._tell(e.socket_ids, e.frame["userId"], e.frame["status"])
                if sockets:
                    out.append(Deliver(e.edge_id, sockets, e.frame))
            else:
                out.append(e)
        return out


class Sims:
    """One `EdgesSim` per shard state (keyed by its outbox): each hypothesis example starts
    afresh with its own state. A resize hands the edges' knowledge of the moved accounts on with
    the slots (what an edge holds does not move when a slot does): their watchers as the notes
    listed them, and the sockets' views of them."""

    @staticmethod
    def of(outbox: Outbox) -> EdgesSim:
        # Kept on the object itself: an id would be reused by the next example's state.
        sim: EdgesSim | None = getattr(outbox, "_edges_sim", None)
        if sim is None:
            sim = EdgesSim()
            outbox._edges_sim = sim  # type: ignore[attr-defined]
        return sim


@pytest.fixture
def edges(monkeypatch: pytest.MonkeyPatch) -> Sims:
    """Every `Outbox.drain` of the test returns what the edges deliver (see the module)."""
    sims = Sims()
    drain, watch, set_watcher = Outbox.drain, ShardState.watch, ShardState._set_watcher
    export, import_ = ShardState.export_slots, ShardState.import_slots
    unwatch, drop_edge = ShardState.unwatch, ShardState.drop_edge

    def unwatching(self: ShardState, socket_id: str, edge_id: str, targets: Any) -> None:
        targets = list(targets)
        sims.of(self.outbox).index[edge_id].unwatch(socket_id, targets)  # the edge first, then the shard
        unwatch(self, socket_id, edge_id, targets)

    def dropping(self: ShardState, edge_id: str, now: float) -> None:
        # The edge lost its lease here: nothing of it is watched on this shard any more.
        sims.of(self.outbox).index.pop(edge_id, None)
        drop_edge(self, edge_id, now)

    def drained(self: Outbox) -> list[Effect]:
        return sims.of(self).expand(drain(self))

    def watched(self: ShardState, watcher: str, socket_id: str, *args: Any, **kwargs: Any) -> Any:
        answer = watch(self, watcher, socket_id, *args, **kwargs)
        sims.of(self.outbox).synced(socket_id, answer)
        return answer

    def setting(self: ShardState, target: str, socket_id: str, w: Watcher) -> None:
        sims.of(self.outbox).owner[socket_id] = w.user_id
        set_watcher(self, target, socket_id, w)

    def exporting(self: ShardState, slots: set[int]) -> SlotExport:
        out = export(self, slots)
        out._edges_sim = sims.of(self.outbox)  # type: ignore[attr-defined]
        return out

    def importing(self: ShardState, export: SlotExport, now: float) -> None:
        sim, source = sims.of(self.outbox), getattr(export, "_edges_sim", None)
        if source is not None:
            sim.owner.update(source.owner)
            sim.view.update((k, v) for k, v in source.view.items() if k[1] in export.watchers)
        for target, watchers in export.watchers.items():
            for socket_id, w in watchers.items():
                sim.owner[socket_id] = w.user_id
                if w.sees != OUTSIDE:
                    sim.index[w.edge_id].see(socket_id, w.user_id, [target], [])
        import_(self, export, now)

    monkeypatch.setattr(ShardState, "unwatch", unwatching)
    monkeypatch.setattr(ShardState, "drop_edge", dropping)
    monkeypatch.setattr(Outbox, "drain", drained)
    monkeypatch.setattr(ShardState, "watch", watched)
    monkeypatch.setattr(ShardState, "_set_watcher", setting)
    monkeypatch.setattr(ShardState, "export_slots", exporting)
    monkeypatch.setattr(ShardState, "import_slots", importing)
    return sims
