"""Tokens through a queue: the credit's token travels in the envelope, and a
copy sent again after the receiver's retention is completed on the queue and
changes nothing."""

from __future__ import annotations

from datetime import timedelta

from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    InMemoryPublisher,
    Message,
    Processor,
    QueueConsumer,
    QueuePublisher,
    read_queue_text,
)
from handlers.examples import accounts
from tests.helpers import drain
from tests.tokening import token_of, token_rows


def test_a_credit_sent_again_through_the_queue_after_retention_changes_nothing(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient, game: str
) -> None:
    a, b = f"{game}-a", f"{game}-b"
    notices = f"{queue.queue_name}-out"
    route = {"Credit": queue.queue_name}
    sender = Processor(accounts, table, QueuePublisher(queues, route, default=notices), tokens=True)
    sender.process(Message("dep-a", a, "Deposit", {"amount": 100}))
    sender.process(Message("t-1", a, "Transfer", {"to": b, "amount": 30}))
    [text] = [m.content for m in queue.peek_messages(max_messages=32)]
    receiver = Processor(accounts, table, InMemoryPublisher(), tokens=True)
    consumer = QueueConsumer(receiver, queue, backoff=timedelta(0))

    first = consumer.run(until_empty=True)
    assert (first.received, first.completed, first.duplicates) == (1, 1, 0)
    credit = read_queue_text(text)
    assert token_rows(table, a) == {
        f"{accounts.name}|TC-t-1": {"Tokens": [token_of(credit)], "Dispatched": True}
    }
    assert token_rows(table, b) == {}  # consumed with the credit's version
    assert receiver.retain(b, keep_last=0) == 1

    queue.send_message(text)  # the queue delivers the credit again, long after
    again = consumer.run(until_empty=True)

    assert (again.received, again.completed, again.duplicates) == (1, 0, 1)
    assert (again.abandoned, again.poisoned, again.faulted) == (0, 0, 0)
    assert drain(queue) == []
    assert receiver.current_state(b).state.balance == 30
    assert receiver.current_state(b).version == 1
    assert list(receiver.history(b)) == []  # its only version went: the token answered
