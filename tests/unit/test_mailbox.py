"""The mail a shard keeps for one edge (actors/core/mailbox.py), pure: sequence numbers, each item
handed out once and kept until acknowledged, handed out again after a lost reply, capped."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from actors.core.contract import PULL_BATCH
from actors.core.mailbox import Mailbox


def filled(n: int, cap: int = 1_000) -> Mailbox:
    box = Mailbox(cap)
    for i in range(n):
        box.add((f"s{i}",), f"frame {i + 1}")
    return box


def payloads(chunk: tuple[int, int, list[tuple[tuple[str, ...], str]]]) -> list[str]:
    return [p for _, p in chunk[2]]


def test_an_empty_box_hands_out_an_empty_chunk() -> None:
    box = Mailbox()
    assert not box.unhanded()
    assert box.hand_out() == (0, 0, [])


def test_items_leave_once_in_order_and_stay_until_acknowledged() -> None:
    box = filled(3)
    assert box.unhanded()
    assert box.hand_out() == (0, 3, [(("s0",), "frame 1"), (("s1",), "frame 2"), (("s2",), "frame 3")])
    assert not box.unhanded()
    assert box.hand_out() == (3, 3, [])  # nothing twice
    assert box.kept == 3
    box.ack(2)
    assert box.kept == 1
    box.add(("s9",), "frame 4")
    assert box.hand_out() == (3, 4, [(("s9",), "frame 4")])


def test_a_lost_reply_is_handed_out_again_after_what_was_acknowledged() -> None:
    box = filled(5)
    box.hand_out()
    box.ack(2)
    box.resend_after(2)
    assert payloads(box.hand_out()) == ["frame 3", "frame 4", "frame 5"]


def test_a_chunk_holds_at_most_pull_batch_items() -> None:
    box = filled(PULL_BATCH + 3, cap=PULL_BATCH * 2)
    first = box.hand_out()
    assert (first[0], first[1], len(first[2])) == (0, PULL_BATCH, PULL_BATCH)
    assert box.hand_out()[1] == PULL_BATCH + 3


def test_past_the_cap_the_oldest_goes_and_the_edge_sees_a_gap() -> None:
    box = Mailbox(cap=3)
    dropped = [box.add(("s",), f"frame {i}") for i in range(1, 6)]
    assert dropped == [False, False, False, True, True]
    prev, last, items = box.hand_out()
    # The chunk follows 0 but starts at 3: the edge's Inbox delivers it and skips the gap.
    assert (prev, last, [p for _, p in items]) == (0, 5, ["frame 3", "frame 4", "frame 5"])


@given(st.lists(st.sampled_from(["add", "hand_out", "ack", "resend"]), max_size=60))
def test_every_item_is_handed_out_before_it_can_be_acknowledged_away(steps: list[str]) -> None:
    """Whatever the order of adds, hand-outs, acknowledgements and resends: the edge, acknowledging
    only what it received, receives every item, in order (possibly more than once)."""
    box = Mailbox()
    received: list[int] = []
    for step in steps:
        if step == "add":
            box.add(("s",), str(box.seq + 1))
        elif step == "hand_out":
            _, _, items = box.hand_out()
            received += [int(p) for _, p in items]
        elif step == "ack":
            box.ack(max(received, default=0))
        else:
            box.resend_after(max(received, default=0))
    _, _, items = box.hand_out()
    received += [int(p) for _, p in items]
    assert sorted(set(received)) == list(range(1, box.seq + 1))
