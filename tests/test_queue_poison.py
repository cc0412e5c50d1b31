"""Poison entries of any size: whatever a queue message holds, up to the 64
KiB a queue takes, its poison entry fits the poison queue, so a message is
never kept from its shelf by its size."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from azurite.proxy import Proxy
from handlers import (
    MAX_QUEUE_MESSAGE_BYTES,
    InMemoryPublisher,
    PoisonEntry,
    Processor,
    QueueConsumer,
)
from tests.helpers import drain
from tests.queueing import Tally, add, send, states, tally


def _envelope_of_size(size: int, **fields: object) -> str:
    """A base64 envelope (as QueuePublisher sends it) of exactly ``size`` characters."""

    def text(pad: int) -> str:
        body = json.dumps({**fields, "body": {"n": 1, "pad": "x" * pad}})
        return base64.b64encode(body.encode()).decode()

    pad = size * 3 // 4 - len(json.dumps({**fields, "body": {"n": 1, "pad": ""}}))
    assert len(text(pad)) == size, "size must be a multiple of 4"
    return text(pad)


def _entries(queue: QueueClient) -> list[tuple[str, PoisonEntry]]:
    """Each poison entry's text as it sits in the queue, and what it reads as."""
    return [(t, PoisonEntry.decode(t)) for t in drain(queue)]


def test_messages_up_to_the_queue_limit_are_poisoned_with_their_reason_and_text(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    processor = Processor(tally, table, InMemoryPublisher())
    unknown = _envelope_of_size(60_000, id="big-unknown", key=key, type="Refund")
    broken = _envelope_of_size(60_000, id="big-broken", key=key, type="Broken")
    # The largest text a queue takes, and not a message: the entry holds its beginning.
    largest = "{" + "x" * (MAX_QUEUE_MESSAGE_BYTES - 1)
    for text in (unknown, broken, largest):
        queue.send_message(text)
    send(queue, add(1, key, 3))

    consumer = QueueConsumer(processor, queue, max_dequeue_count=2, backoff=timedelta(0))
    stats = consumer.run(until_empty=True)

    assert (stats.received, stats.completed, stats.abandoned, stats.poisoned) == (5, 1, 1, 3)
    assert states(processor, key) == {key: (1, Tally(3, ["m-1"]))}
    assert queue.get_queue_properties().approximate_message_count == 0
    entries = {e.content[:20]: (t, e) for t, e in _entries(queues.get_queue_client(
        f"{queue.queue_name}-poison"))}  # fmt: skip
    assert len(entries) == 3
    assert all(len(t.encode()) <= MAX_QUEUE_MESSAGE_BYTES for t, _ in entries.values())
    _, first = entries[unknown[:20]]
    assert (first.reason, first.content, first.content_length) == (
        "unknown type 'Refund'", unknown, None,
    )  # fmt: skip
    assert (first.queue, first.dequeue_count) == (queue.queue_name, 1)
    _, second = entries[broken[:20]]
    assert (second.content, second.content_length, second.dequeue_count) == (broken, None, 2)
    assert second.reason.startswith(
        "failed on receive 2 of 2: handler 'Tally' failed on message 'big-broken': "
        "RuntimeError: cannot add 1 (at "
    )
    text, cut = entries[largest[:20]]
    assert cut.reason == (
        "not a message envelope: Expecting property name enclosed in double quotes: line 1 "
        "column 2 (char 1)"
    )
    assert cut.content_length == MAX_QUEUE_MESSAGE_BYTES
    assert largest.startswith(cut.content)
    assert len(text) == MAX_QUEUE_MESSAGE_BYTES  # as much of the text as fits
    assert PoisonEntry(
        cut.reason, cut.content, cut.queue, cut.queue_message_id, cut.dequeue_count,
        content_length=cut.content_length,
    ).encode() == text  # fmt: skip


@pytest.fixture
def strict_poison(connection_string: str, queue: QueueClient) -> Iterator[QueueClient]:
    """The queue's poison queue behind a proxy that answers 413 to any request
    body over 64 KiB, as a service that counts the XML around the text would."""
    port = int(connection_string.split("QueueEndpoint=http://127.0.0.1:")[1].split("/")[0])
    with Proxy(port, max_body=MAX_QUEUE_MESSAGE_BYTES) as proxy:
        url = queue.url.replace(f":{port}/", f":{proxy.port}/")
        yield QueueClient.from_queue_url(f"{url}-poison", credential=queue.credential)


def test_a_poison_queue_that_refuses_the_entry_as_too_large_gets_it_shorter(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient, strict_poison: QueueClient
) -> None:
    largest = "{" + "y" * (MAX_QUEUE_MESSAGE_BYTES - 1)
    queue.send_message(largest)
    processor = Processor(tally, table, InMemoryPublisher())

    stats = QueueConsumer(processor, queue, poison_queue=strict_poison).run(until_empty=True)

    assert (stats.received, stats.poisoned) == (1, 1)
    assert queue.get_queue_properties().approximate_message_count == 0
    [(text, entry)] = _entries(queues.get_queue_client(f"{queue.queue_name}-poison"))
    assert entry.content_length == MAX_QUEUE_MESSAGE_BYTES
    assert entry.reason.startswith("not a message envelope: Expecting property name")
    assert largest.startswith(entry.content)
    assert len(text) == 8 * 1024  # as much of the text as 8 KiB holds
