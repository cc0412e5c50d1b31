"""The poison gauges against a Queue service that answers badly: a collection
is never held past its bound, a queue that does not answer is left out
alone (the others read), and its read still running is not sent again."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from azurite.proxy import Proxy
from handlers import InMemoryPublisher, Processor, QueueConsumer
from handlers._queues import _metrics
from tests.helpers import azurite_port
from tests.metrics import points
from tests.queueing import tally

DEPTH, AGE = "streamstone.poison.depth", "streamstone.poison.oldest_age"
WHERE = "messaging.destination.name"


def _collected_within(meters: InMemoryMetricReader, seconds: float) -> tuple[Any, Any]:
    """The two gauges' points, from a collection that must end within ``seconds``."""
    got: list[tuple[Any, Any]] = []
    reading = threading.Thread(
        target=lambda: got.append((points(meters, DEPTH, WHERE), points(meters, AGE, WHERE))),
        daemon=True,
    )
    reading.start()
    reading.join(seconds)
    assert got, f"a collection still running after {seconds} s"
    return got[0]


def test_a_poison_queue_trickling_its_answers_never_holds_a_collection(
    connection_string: str,
    table: TableClient,
    queue: QueueClient,
    queues: QueueServiceClient,
    meters: InMemoryMetricReader,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_metrics, "WAIT", 1.0)
    healthy = queues.create_queue(f"{queue.queue_name}-poison")
    healthy.send_message("an entry")
    slow_name, missing = (f"gauge-{uuid.uuid4().hex[:10]}" for _ in range(2))
    queues.create_queue(slow_name).send_message("an entry")
    processor = Processor(tally, table, InMemoryPublisher())
    # One byte a second: no socket read ever times out, the answer takes minutes.
    with Proxy(azurite_port(connection_string, "Queue"), trickle=1.0) as proxy:
        slow = QueueClient.from_connection_string(proxy.endpoint_of(connection_string), slow_name)
        consumers = [
            QueueConsumer(processor, queue),
            QueueConsumer(processor, queue, poison_queue=slow),
            QueueConsumer(processor, queue, poison_queue=queues.get_queue_client(missing)),
        ]
        proxy.plan(lambda request: "trickle")
        try:
            for collection in range(2):
                depths, ages = _collected_within(meters, 2 * 1.0 + 1.5)
                assert depths == {(healthy.queue_name,): 1, (missing,): 0}, collection
                assert sorted(ages) == [(healthy.queue_name,)], collection
                assert 0 <= ages[(healthy.queue_name,)] < 60
            # The first collection's reads still trickle: the second sent none.
            assert [r.method for r, _ in proxy.seen] == ["GET", "GET"]
        finally:
            proxy.stop()  # ends the trickling answers
        del consumers
    queues.delete_queue(slow_name)
