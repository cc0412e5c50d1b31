"""What enters through a queue: a text that cannot become a message, for any
reason, is poisoned alone with its reason, and never stops the consumer nor
holds its key's other messages; bodies travel through a real queue exactly."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import timedelta
from typing import Any

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    InMemoryPublisher,
    Message,
    Processor,
    QueueConsumer,
    QueuePublisher,
)
from tests.queueing import Tally, add, poison_of, seen, send, states, tally


def _plain(**envelope: Any) -> str:
    """An envelope as a producer may write it by hand: plain JSON text."""
    return json.dumps(envelope)


def test_a_due_the_calendar_cannot_hold_in_utc_is_poisoned_alone(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    processor = Processor(tally, table, InMemoryPublisher())
    hostile = _plain(id="late-1", key=key, type="Add", body={"n": 5},
                     due="9999-12-31T23:00:00-05:00")  # fmt: skip
    send(queue, add(1, key, 2))
    queue.send_message(hostile)
    send(queue, add(2, key, 3))

    stats = QueueConsumer(processor, queue, backoff=timedelta(0)).run(until_empty=True)

    assert (stats.received, stats.completed, stats.poisoned) == (3, 2, 1)
    assert (stats.abandoned, stats.faulted) == (0, 0)
    assert states(processor, key) == {key: (2, Tally(5, ["m-1", "m-2"]))}
    [entry] = poison_of(queues, queue)
    assert (entry.content, entry.dequeue_count) == (hostile, 1)
    assert entry.reason == (
        "not a message envelope: due '9999-12-31T23:00:00-05:00' is out of the range of "
        "times in UTC"
    )


def test_a_lone_surrogate_in_any_text_is_poisoned_alone_and_its_key_goes_on(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    tag = uuid.uuid4().hex[:8]
    a, b = f"a-{tag}", f"b-{tag}"
    processor = Processor(tally, table, InMemoryPublisher())
    # Valid JSON all (json.dumps writes "\\udfff"): each a lone surrogate once decoded.
    hostile = [
        _plain(id="\udfff", key=a, type="Add", body={"n": 100}),
        _plain(id="s-2", key=f"{b}\ud800", type="Add"),
        _plain(id="s-3", key=a, type="Add", headers={"h": "\udc00"}),
        _plain(id="s-4", key=b, type="Add", body={"n": 1, "x": "\ud83d"}),
    ]
    send(queue, add(1, a, 1))
    for text in hostile:
        queue.send_message(text)
    send(queue, add(2, a, 2))
    send(queue, add(3, b, 4))

    stats = QueueConsumer(processor, queue, backoff=timedelta(0)).run(until_empty=True)

    assert (stats.received, stats.completed, stats.poisoned) == (7, 3, 4)
    assert (stats.abandoned, stats.faulted) == (0, 0)
    assert states(processor, a, b) == {a: (2, Tally(3, ["m-1", "m-2"])), b: (1, Tally(4, ["m-3"]))}
    entries = {e.content: e for e in poison_of(queues, queue)}
    assert sorted(entries) == sorted(hostile)
    assert {e.dequeue_count for e in entries.values()} == {1}
    assert [entries[t].reason for t in hostile] == [
        "not a message envelope: message id '\\udfff' is not UTF-8 text (surrogates not allowed)",
        f"not a message envelope: message key '{b}\\ud800' is not UTF-8 text (surrogates not "
        "allowed)",
        "not a message envelope: message header 'h' is not UTF-8 text (surrogates not allowed)",
        "not a message envelope: body of message 's-4'['x'] is not UTF-8 text (surrogates not "
        "allowed)",
    ]


def test_an_unknown_type_is_poisoned_at_once_as_spark_dead_letters_it(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    processor = Processor(tally, table, InMemoryPublisher())
    queue.send_message(_plain(id="u-1", key=key, type="Refund"))
    send(queue, add(1, key, 3))

    stats = QueueConsumer(processor, queue, backoff=timedelta(0)).run(until_empty=True)

    assert (stats.received, stats.completed, stats.abandoned, stats.poisoned) == (2, 1, 0, 1)
    [entry] = poison_of(queues, queue)
    assert (entry.reason, entry.dequeue_count) == ("unknown type 'Refund'", 1)
    assert states(processor, key) == {key: (1, Tally(3, ["m-1"]))}


def test_a_queue_whose_poison_queue_name_would_be_too_long_is_refused(
    table: TableClient, queues: QueueServiceClient
) -> None:
    processor = Processor(tally, table, InMemoryPublisher())
    QueueConsumer(processor, queues.get_queue_client("q" * 56))  # 63 with "-poison"
    with pytest.raises(ValueError, match="over the 63 a queue name may have") as refused:
        QueueConsumer(processor, queues.get_queue_client("q" * 57))
    assert str(refused.value) == (
        f"queue {'q' * 57!r} has 57 characters: its poison queue '{'q' * 57}-poison' would "
        "have 64, over the 63 a queue name may have; name the queue in at most 56 "
        "characters, or give poison_queue="
    )
    given = queues.get_queue_client("long-poison")
    assert QueueConsumer(processor, queues.get_queue_client("q" * 57), poison_queue=given)


#: Bodies a handler may publish that look like the bytes marker, or hold it.
MARKED: list[Any] = [
    {"$base64": "aGk="},
    {"$base64": "not base64!"},
    b"hi",
    {"$object": {"a": 1}},
    [{"$base64": b"\x00"}, {"$base64": 3}],
    {"x": {"$base64": "aGk="}, "y": b"\xff"},
    {"$base64": {"$base64": "aGk="}},
]


def test_bodies_that_look_like_the_bytes_marker_arrive_exactly_as_published(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    publisher = QueuePublisher(queues, lambda m: queue.queue_name)
    outputs = [Message(f"o-{n}", key, "Keep", body) for n, body in enumerate(MARKED)]
    for output in outputs:
        publisher.check(output)
    publisher.publish(outputs)
    processor = Processor(seen, table, InMemoryPublisher())

    stats = QueueConsumer(processor, queue, page_size=1).run(until_empty=True)

    assert (stats.completed, stats.poisoned) == (len(MARKED), 0)
    state = processor.current_state(key).state
    assert [Message("m", "k", "T", b).encode() for b in state.bodies] == [
        Message("m", "k", "T", b).encode() for b in MARKED
    ]
    # The envelope a consumer of this version wrote before still reads the same.
    old = _plain(body={"raw": {"$base64": "aGk="}}, headers={}, id="o", key=key, type="Keep")
    queue.send_message(base64.b64encode(old.encode()).decode())
    QueueConsumer(processor, queue).run(until_empty=True)
    assert processor.current_state(key).state.bodies[-1] == {"raw": b"hi"}
