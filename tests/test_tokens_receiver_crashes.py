"""Tokens to another handler's table (``token_receivers``) under a sender
that dies at each step, crossed with the receiver seeing 0, 1 or 2 copies of
what went out before: redelivery, every copy twice, retention on both sides,
every copy again. Oracle: the invoice applied once, no token, registration
or checkpoint left in either table once the sender's retention ran."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import InMemoryPublisher, Message, Processor
from handlers._batch._token_rows import TokenRows
from tests.test_tokens_receivers import _beside_stream, _sender, billing, billing_table
from tests.tokening import Crash

__all__ = ["billing_table"]  # the fixture, used by name

STEPS = ["register", "create", "record", "publish", "finish"]


class DiesAfterPublishing(InMemoryPublisher):
    def __init__(self, sink: InMemoryPublisher) -> None:
        super().__init__()
        self.sink = sink

    def publish(self, messages: Sequence[Message]) -> None:
        self.sink.publish(messages)
        raise Crash("after publishing")


@pytest.mark.parametrize("copies", [0, 1, 2])
@pytest.mark.parametrize("step", STEPS)
def test_a_sender_dying_at_each_step_invoices_once_in_the_other_table(
    table: TableClient,
    billing_table: TableClient,
    game: str,
    step: str,
    copies: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shop, customer = f"{game}-shop", f"{game}-c"
    order = Message("o-1", shop, "Order", {"amount": 40, "customer": customer})
    sink = InMemoryPublisher()
    dying = _sender(table, billing_table)
    if step == "publish":
        dying.publisher = DiesAfterPublishing(sink)
    else:
        real = getattr(TokenRows, step)

        def then_die(self: TokenRows, *args: Any) -> Any:
            real(self, *args)
            raise Crash(step)

        monkeypatch.setattr(TokenRows, step, then_die)
    with pytest.raises(Crash):
        dying.process(order)
    monkeypatch.undo()
    receiver = Processor(billing, billing_table, InMemoryPublisher())

    def invoices() -> list[Message]:
        return [m for m in sink.deliveries if m.type == "Invoice"]

    for invoice in invoices() * copies:
        receiver.process(invoice)
    sender = _sender(table, billing_table)
    sender.publisher = sink
    assert [sender.process(order).status for _ in range(2)] == ["duplicate"] * 2
    assert len({i.headers["ss-token"] for i in invoices()}) == 1  # one id, every delivery
    for invoice in invoices() * 2:
        receiver.process(invoice)
    sender.process(Message("o-2", shop, "Order", {"amount": 2, "customer": customer}))
    receiver.process(invoices()[-1])
    receiver.retain(customer, keep_last=0)
    sender.retain(shop, keep_last=0)
    for invoice in invoices():
        assert receiver.process(invoice).status == "duplicate"
    assert receiver.current_state(customer).state.owed == 42
    assert sender.current_state(shop).state.total == 42
    assert _beside_stream(table, shop) == []
    assert _beside_stream(billing_table, customer) == []
