"""Adversary round 3: a QueueConsumer as the receiver of tokens made in its
own states table by another handler (``token_receivers``), whose notice
fails to go out after its write."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    HandlerContext,
    Message,
    Processor,
    QueueConsumer,
    QueuePublisher,
    TokenReceiver,
    handler,
)
from tests.helpers import drain
from tests.test_tokens_receivers import Billing, billing_table, orders
from tests.tokening import FailsOnce, token_rows

__all__ = ["billing_table"]  # the fixture, used by name


@handler("Billing", Billing, types=["Invoice"])
def billing(state: Billing, message: Message, ctx: HandlerContext) -> None:
    state.owed += message.body["amount"]
    ctx.publish("Billed", {"amount": message.body["amount"], "owed": state.owed})


def test_a_queue_consumer_sends_its_awaited_notice_once_then_drops_late_copies(
    table: TableClient,
    billing_table: TableClient,
    queues: QueueServiceClient,
    queue: QueueClient,
    game: str,
) -> None:
    shop, customer = f"{game}-shop", f"{game}-c"
    receivers = {"Invoice": TokenReceiver("Billing", billing_table)}
    route = QueuePublisher(queues, {"Invoice": queue.queue_name}, default=f"{queue.queue_name}-o")
    sender = Processor(orders, table, route, tokens=True, token_receivers=receivers)
    sender.process(Message(f"{game}-o1", shop, "Order", {"amount": 5, "customer": customer}))
    [text] = [m.content for m in queue.peek_messages(max_messages=32)]
    out = FailsOnce()
    receiver = Processor(billing, billing_table, out)
    consumer: Any = QueueConsumer(receiver, queue, backoff=timedelta(0), visibility_timeout=1)
    first = consumer.run(until_empty=True)
    assert (first.faulted, first.completed, first.duplicates) == (1, 0, 1), first
    assert [(m.type, m.body) for m in out.deliveries] == [("Billed", {"amount": 5, "owed": 5})]
    assert token_rows(billing_table, customer) == {}
    for n in (2, 3):
        sender.process(Message(f"{game}-o{n}", shop, "Order", {"amount": 1, "customer": customer}))
    consumer.run(until_empty=True)
    assert receiver.retain(customer, keep_last=0) == 3
    queue.send_message(text)  # a month later
    late = consumer.run(until_empty=True)
    assert (late.received, late.duplicates, late.faulted, late.poisoned) == (1, 1, 0, 0)
    assert drain(queue) == []
    assert receiver.current_state(customer).state.owed == 7
    assert [m.body["owed"] for m in out.deliveries] == [5, 6, 7]
    assert token_rows(billing_table, customer) == {}
