"""Properties of the queue path, through real queues: hostile texts beside
valid messages of the same keys never stop a consumer, each valid message is
stored once and read back exactly, each hostile text is poisoned alone with
its reason; and any body a handler may publish arrives as it was published."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

from azure.data.tables import TableClient
from azure.storage.queue import QueueServiceClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers import (
    InMemoryPublisher,
    Message,
    Processor,
    QueueConsumer,
    QueuePublisher,
    Refused,
    admit_text,
    read_queue_text,
)
from tests.helpers import drain
from tests.hostile_texts import HOSTILE, bodies, draw_mix, stored_exactly, valid_text
from tests.queueing import poison_of, seen

SETTINGS = settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SETTINGS
@given(data=st.data())
def test_hostile_texts_never_stop_the_consumer_nor_take_a_valid_message_along(
    table: TableClient, queues: QueueServiceClient, data: st.DataObject
) -> None:
    tag = uuid.uuid4().hex[:8]
    mix = draw_mix(data, tag)
    texts = mix.texts
    queue = queues.create_queue(f"prop-{tag}")
    try:
        for text in texts:
            queue.send_message(text)
        processor = Processor(seen, table, InMemoryPublisher())

        stats = QueueConsumer(processor, queue, backoff=timedelta(0)).run(until_empty=True)

        assert (stats.received, stats.abandoned, stats.faulted) == (len(texts), 0, 0)
        assert stats.completed + stats.duplicates + stats.poisoned == len(texts)
        entries = poison_of(queues, queue)
        assert all(e.reason and e.dequeue_count == 1 for e in entries)
        poisoned = Counter(e.content for e in entries)
        assert all(poisoned[text] == 1 for text in mix.hostile), (mix.forms, entries)
        assert not any(valid_text(m) in poisoned or valid_text(m, True) in poisoned
                       for m in mix.valid)  # fmt: skip
        stored_exactly(processor, mix)
        assert drain(queue) == []
    finally:
        for name in (queue.queue_name, f"{queue.queue_name}-poison"):
            queues.delete_queue(name)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies)
def test_any_body_a_handler_may_publish_arrives_through_a_queue_as_published(
    queues: QueueServiceClient, body: Any
) -> None:
    name = f"body-{uuid.uuid4().hex[:10]}"
    output = Message("o-1", "k", "Keep", body)
    QueuePublisher(queues, lambda m: name).publish([output])
    try:
        [text] = drain(queues.get_queue_client(name))
        arrived = read_queue_text(text)
        assert arrived == output
        assert arrived.encode() == output.encode()  # bytes stay bytes, 1 stays 1, not 1.0
    finally:
        queues.delete_queue(name)


def test_every_hostile_form_is_refused_with_a_reason() -> None:
    rng = random.Random(7)
    for form, make in HOSTILE.items():
        refused = admit_text(make(rng, "k-1"))
        assert isinstance(refused, Refused), form
        assert refused.reason, form
