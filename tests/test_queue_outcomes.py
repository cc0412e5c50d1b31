"""What a consumer does with each outcome, and says about it: a deleted
output queue is made again, two messages of a batch that publish one output
id with different bodies, the log line and callback of every message not
completed, per-run figures, and the time a message was first produced."""

from __future__ import annotations

import base64
import json
import logging
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    HandlerContext,
    InMemoryPublisher,
    Message,
    Processor,
    QueueConsumer,
    QueuePublisher,
    handler,
    read_queue_text,
)
from tests.helpers import drain
from tests.queueing import Tally, add, poison_of, seen, send, states, tally


def test_an_output_queue_deleted_while_the_consumer_runs_is_made_again(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    out = queues.get_queue_client(f"{queue.queue_name}-out")
    processor = Processor(tally, table, QueuePublisher(queues, lambda m: out.queue_name))
    consumer = QueueConsumer(processor, queue, backoff=timedelta(0))
    send(queue, add(1, key, 2))
    assert consumer.run(until_empty=True).completed == 1
    assert [read_queue_text(t).body for t in drain(out)] == [{"total": 2, "by": "m-1"}]

    queues.delete_queue(out.queue_name)  # an operator cleans up
    send(queue, add(2, key, 5))
    stats = consumer.run(until_empty=True)

    assert (stats.completed, stats.faulted, stats.abandoned, stats.poisoned) == (1, 0, 0, 0)
    assert states(processor, key) == {key: (2, Tally(7, ["m-1", "m-2"]))}
    assert [read_queue_text(t).body for t in drain(out)] == [{"total": 7, "by": "m-2"}]


@handler("Seats", types=["Claim"])
def seats(state: dict[str, str], message: Message, ctx: HandlerContext) -> None:
    seat = message.body["seat"]
    state[seat] = message.id
    ctx.publish("Claimed", {"seat": seat, "by": message.id}, id=f"claim-{seat}")


def test_a_second_message_publishing_an_output_id_with_other_content_is_refused_alone(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    out = queues.get_queue_client(f"{queue.queue_name}-out")
    processor = Processor(seats, table, QueuePublisher(queues, lambda m: out.queue_name))
    claims = [Message(f"c-{n}", key, "Claim", {"seat": seat}) for n, seat in
              enumerate(["a1", "b2", "a1", "c3"])]  # fmt: skip
    for claim in claims:
        send(queue, claim)

    stats = QueueConsumer(processor, queue, backoff=timedelta(0)).run(until_empty=True)

    assert (stats.received, stats.completed, stats.poisoned, stats.abandoned) == (4, 3, 1, 0)
    assert processor.current_state(key).state == {"a1": "c-0", "b2": "c-1", "c3": "c-3"}
    assert sorted(json.dumps(read_queue_text(t).body, sort_keys=True) for t in drain(out)) == [
        json.dumps({"by": b, "seat": s}) for s, b in [("a1", "c-0"), ("b2", "c-1"), ("c3", "c-3")]
    ]
    [entry] = poison_of(queues, queue)
    assert (read_queue_text(entry.content).id, entry.dequeue_count) == ("c-2", 1)
    assert entry.reason == (
        "output id 'claim-a1' of message 'c-2' was published by message 'c-0' of this batch "
        "with other content"
    )


def test_every_message_not_completed_logs_one_warning_and_reaches_the_callback(
    table: TableClient, queue: QueueClient, caplog: pytest.LogCaptureFixture
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    processor = Processor(tally, table, InMemoryPublisher())
    seen: list[Any] = []
    consumer = QueueConsumer(processor, queue, backoff=timedelta(0), max_dequeue_count=2,
                             on_outcome=seen.append)  # fmt: skip
    send(queue, add(1, key, 1, "Broken"))
    send(queue, add(2, key, 4))

    with caplog.at_level(logging.INFO, logger="handlers"):
        first = consumer.run(until_empty=True)

    failed = "handler 'Tally' failed on message 'm-1': RuntimeError: cannot add 1"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [w.split(" (at ")[0] for w in warnings] == [
        f"abandoned message 'm-1' of key '{key}' on receive 1 of 2: {failed}",
        f"poisoned message 'm-1' of key '{key}' on receive 2 of 2: {failed}",
    ]
    assert [(o.action, o.message_id, o.key, o.dequeue_count) for o in seen] == [
        ("abandoned", "m-1", key, 1),
        ("completed", "m-2", key, 1),
        ("poisoned", "m-1", key, 2),
    ]
    assert seen[0].reason.startswith(failed)
    assert (first.received, first.completed, first.abandoned, first.poisoned) == (3, 1, 1, 1)
    send(queue, add(3, key, 2))
    second = consumer.run(until_empty=True)  # the figures of this run only
    assert (second.received, second.completed, second.poisoned) == (1, 1, 0)
    assert (consumer.stats.received, consumer.stats.completed) == (4, 2)  # since it was made


def test_a_copy_sent_again_after_retention_is_refused_by_the_time_it_was_first_produced(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    out = queues.get_queue_client(f"{queue.queue_name}-out")
    first = datetime.now(UTC) - timedelta(hours=1)
    producer = Processor(tally, table, QueuePublisher(queues, lambda m: out.queue_name),
                         clock=lambda: first)  # fmt: skip
    producer.process(add(1, key, 5))
    [text] = drain(out)
    envelope = json.loads(base64.b64decode(text))
    assert envelope["produced"] == first.isoformat()
    consumer_side = Processor(seen, table, InMemoryPublisher())
    reader = QueueConsumer(consumer_side, out, sent_at="produced")
    out.send_message(text)
    assert reader.run(until_empty=True).completed == 1
    for n in (1, 2):
        consumer_side.process(Message(f"x-{n}", key, "Added", {}))
    assert consumer_side.retain(key, keep_last=1) == 1  # the first output's version goes

    producer.process(add(1, key, 5))  # redelivered: its output goes out again
    [again] = drain(out)
    assert again == text  # the same text, the same time first produced
    out.send_message(again)
    stats = reader.run(until_empty=True)

    assert (stats.completed, stats.poisoned) == (0, 1)
    assert consumer_side.current_state(key).state.ids == [read_queue_text(text).id, "x-1", "x-2"]
    [entry] = poison_of(queues, out)
    assert "outside the de-duplication window" in entry.reason
