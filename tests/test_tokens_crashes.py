"""A sender that dies at each token step, crossed with a receiver that sees 0,
1 or 2 copies of what went out before retention, then every copy twice
after retention removed all it may. Oracle: each credit applied once, the
same output on every dispatch, and no token, registration or checkpoint left.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import InMemoryPublisher, Message, Outcome, Processor, StateStore
from handlers.examples import accounts
from streamstone_py import RetryPolicy
from tests.tokening import Crash, credits, expected_stream, stream_rows, token_rows, with_rows

POINTS = [
    "after state",
    "after register",
    "after creating some tokens",
    "after checkpoint",
    "after dispatching some outputs",
    "before finishing",
]
#: Where a redelivery still makes tokens of its own: before any checkpoint.
BEFORE_CHECKPOINT = POINTS[:3]


class DiesAfterState(StateStore):
    def write(self, stream: Any, events: Any) -> Any:
        super().write(stream, events)
        raise Crash("after state")


class DiesHalfwayPublishing(InMemoryPublisher):
    def __init__(self, sink: InMemoryPublisher) -> None:
        super().__init__()
        self.sink = sink

    def publish(self, messages: Sequence[Message]) -> None:
        self.sink.publish(messages[: len(messages) // 2])
        raise Crash("after dispatching some outputs")


@pytest.mark.parametrize("copies", [0, 1, 2])
@pytest.mark.parametrize("point", POINTS)
def test_a_sender_crash_then_redelivery_applies_each_credit_once(
    table: TableClient, game: str, point: str, copies: int
) -> None:
    a, b, c = f"{game}-a", f"{game}-b", f"{game}-c"
    sink = InMemoryPublisher()
    Processor(accounts, table, sink, tokens=True).process(
        Message("dep-a", a, "Deposit", {"amount": 100})
    )
    transfers = [
        Message("t-1", a, "Transfer", {"to": b, "amount": 10}),
        Message("t-2", a, "Transfer", {"to": c, "amount": 20}),
    ]
    halfway = point == "after dispatching some outputs"
    dying = Processor(
        accounts, table, DiesHalfwayPublishing(sink) if halfway else sink, tokens=True,
        store=DiesAfterState(table, accounts.name, RetryPolicy()) if point == "after state"
        else None,
    )  # fmt: skip
    with_rows(dying, point)
    with pytest.raises(Crash, match=point):
        dying.process_batch(a, transfers)
    assert len(credits(sink.deliveries)) == (1 if halfway else 2 if point == POINTS[-1] else 0)

    receiver = Processor(accounts, table, InMemoryPublisher(), tokens=True)
    seen: list[Outcome] = []
    for credit in credits(sink.deliveries) * copies:  # what went out before the crash
        seen.append(receiver.process(credit))

    again = Processor(accounts, table, sink, tokens=True)
    counting = with_rows(again, "never")
    assert [o.status for o in again.process_batch(a, transfers)] == ["duplicate"] * 2
    # Before the checkpoint a retry makes tokens of its own; after it, never again.
    assert counting.creates == (2 if point in BEFORE_CHECKPOINT else 0)
    sent = list({m.id: m for m in credits(sink.deliveries)}.values())
    assert len(sent) == 2
    for credit in sent * copies:  # before retention: duplicates found by their ids
        seen.append(receiver.process(credit))

    for key in (a, b, c):
        receiver.retain(key, keep_last=0)
    late = [receiver.process(credit) for credit in sent * 2]  # after retention: by tokens

    applied = Counter(o.message_id for o in [*seen, *late] if o.status == "completed")
    assert applied == {sent[0].id: 1, sent[1].id: 1}
    if copies:
        assert [o.kind for o in late] == ["consumed"] * 4
    else:  # first seen after the sender's retention: its token was there
        assert [o.kind for o in late] == ["completed", "completed", "duplicate", "duplicate"]
    assert [receiver.current_state(k).state.balance for k in (a, b, c)] == [70, 10, 20]
    assert sink.divergent == []  # each credit went out with one token, on every dispatch
    for key, credit in ((b, sent[0]), (c, sent[1])):
        kept = [] if copies else [(1, credit.id)]
        assert stream_rows(table, key) == expected_stream(table, key, kept)
        assert token_rows(table, key) == {}
    assert stream_rows(table, a) == expected_stream(table, a, [])
    assert token_rows(table, a) == {}
