"""Which of this edge's sockets watch each account, and what each sees of it: the edge's half of
fan-out per edge.

A shard publishes a status change once per edge and kind of watcher (an address `(user_id, own)`,
`actors.core.contract.publication`: the account's own sockets, which see its real status, or its
audience, which sees the visible one); the edge expands it here to its sockets. What a socket
sees is the shard's decision (the audience rule, made when the watch is made and when relations
change), told to the edge in `_audience` notes through the same ordered mail as the publications,
so the index lists exactly the sockets the shard counts when a publication is expanded. A socket
outside an account's audience is never listed for it.

Pure: no I/O, no clock. The edge keeps one (`edge/server.py`) and feeds it the notes of sockets
still subscribed to the account, the unsubscriptions, the sockets that close, and what a restarted
shard forgot.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable

_NONE: Collection[str] = ()


class WatchIndex:
    __slots__ = ("_audience", "_listed", "_own")

    def __init__(self) -> None:
        # account → the sockets that see its visible status (insertion-ordered: dict as a set)
        self._audience: dict[str, dict[str, None]] = {}
        # account → its own sockets watching it (they see its real status)
        self._own: dict[str, dict[str, None]] = {}
        # socket → the accounts it is listed for, so a closing socket leaves without a search
        self._listed: dict[str, set[str]] = {}

    def see(self, socket_id: str, user_id: str, inside: Iterable[str], outside: Iterable[str]) -> None:
        """A note from a shard: the socket of account `user_id` now sees the accounts `inside`
        (its own account's real status, the others' visible one) and nothing of those `outside`."""
        for target in inside:
            kind = self._own if target == user_id else self._audience
            kind.setdefault(target, {})[socket_id] = None
            self._listed.setdefault(socket_id, set()).add(target)
        self.unwatch(socket_id, outside)

    def unwatch(self, socket_id: str, targets: Iterable[str]) -> None:
        listed = self._listed.get(socket_id)
        if listed is None:
            return
        for target in targets:
            if target in listed:
                listed.discard(target)
                self._unlist(socket_id, target)
        if not listed:
            del self._listed[socket_id]

    def drop(self, socket_id: str) -> None:
        """The socket closed."""
        for target in self._listed.pop(socket_id, ()):
            self._unlist(socket_id, target)

    def forget(self, forgotten: Callable[[str], bool]) -> None:
        """The shard of the accounts for which `forgotten` is true restarted empty: nothing it
        decided holds any more, until the watches registered again bring their notes."""
        for kind in (self._audience, self._own):
            for target in [t for t in kind if forgotten(t)]:
                for socket_id in kind.pop(target):
                    listed = self._listed.get(socket_id)
                    if listed is not None:
                        listed.discard(target)
                        if not listed:
                            del self._listed[socket_id]

    def watchers(self, user_id: str, own: bool) -> Collection[str]:
        """The sockets a publication about `user_id` goes to: its own sockets watching it (`own`)
        or the others that see it."""
        sockets = (self._own if own else self._audience).get(user_id)
        return sockets.keys() if sockets is not None else _NONE

    def listed(self, socket_id: str) -> frozenset[str]:
        """The accounts the socket is listed for (tests, figures)."""
        return frozenset(self._listed.get(socket_id, ()))

    def __len__(self) -> int:
        """Sockets listed for at least one account."""
        return len(self._listed)

    def _unlist(self, socket_id: str, target: str) -> None:
        for kind in (self._audience, self._own):
            sockets = kind.get(target)
            if sockets is not None and socket_id in sockets:
                del sockets[socket_id]
                if not sockets:
                    del kind[target]
