"""The mail a shard keeps for one edge (actors/core/contract.py `MailChunk`), as a pure object.

Frames for the edge's sockets get consecutive sequence numbers. Each leaves once, by whichever
road comes first (the reply of the edge's own batch, or its long-poll `pull`), and stays until the
edge acknowledges it, so a reply that was lost can be handed out again (`resend_after`).
At-least-once: the edge skips what it already delivered (`edge.router.Inbox`). The shell
(actors/presence.py) wakes the edge's waiting pull when `add` put something there.
"""

from __future__ import annotations

import itertools
from collections import deque

from .contract import PULL_BATCH, Address, MailChunk

# Mail waiting for an edge that does not collect it is capped; past this the oldest is dropped
# (and counted), since an edge that far behind is about to lose its lease anyway.
MAILBOX_CAP = 200_000


class Mailbox:
    __slots__ = ("cap", "handed", "items", "seq")

    def __init__(self, cap: int = MAILBOX_CAP) -> None:
        self.cap = cap
        self.seq = 0
        # (sequence number, socket ids, serialised frame), oldest first.
        self.items: deque[tuple[int, Address, str]] = deque()
        # The last sequence number handed to the edge (by a pull or in an apply's reply).
        self.handed = 0

    def add(self, address: Address, payload: str) -> bool:
        """Queue a frame for these sockets; True if the oldest item was dropped to make room."""
        self.seq += 1
        self.items.append((self.seq, address, payload))
        if len(self.items) > self.cap:
            self.items.popleft()
            return True
        return False

    def ack(self, acked_seq: int) -> None:
        """The edge has everything up to `acked_seq`: it need not be kept any longer."""
        items = self.items
        while items and items[0][0] <= acked_seq:
            items.popleft()

    def resend_after(self, acked_seq: int) -> None:
        """Hand out again everything after `acked_seq` (a reply the edge lost)."""
        self.handed = acked_seq

    def unhanded(self) -> bool:
        return bool(self.items) and self.items[-1][0] > self.handed

    @property
    def kept(self) -> int:
        """Items kept (handed out or not) until acknowledged."""
        return len(self.items)

    def hand_out(self) -> MailChunk:
        """The items after `handed` (at most PULL_BATCH), as a chunk; they count as handed."""
        prev = self.handed
        if not self.items:
            return prev, prev, []
        start = max(0, prev + 1 - self.items[0][0])
        taken = list(itertools.islice(self.items, start, start + PULL_BATCH))
        if not taken:
            return prev, prev, []
        self.handed = taken[-1][0]
        return prev, self.handed, [(address, payload) for _, address, payload in taken]
