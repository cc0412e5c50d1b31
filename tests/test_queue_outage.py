"""A storage outage never poisons: the Table service stopped alone while a
consumer runs, messages sent all along; when it comes back, every message
is stored once and the poison queue is empty.

``STREAMSTONE_OUTAGE_SECONDS`` sets the outage (12 s here: three times the
backoffs, 1 s then 2 s, in which a churning consumer's three receives of a
message would poison it; the issue's two minutes pass the same way, run
with 120)."""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from azure.storage.queue import QueueClient, QueueServiceClient

from azurite.launcher import AzuriteTable
from handlers import InMemoryPublisher, Processor, QueueConsumer
from streamstone_py import RetryPolicy, WireTableClient
from tests.queueing import Tally, add, poison_of, send, tally

OUTAGE = float(os.environ.get("STREAMSTONE_OUTAGE_SECONDS", "12"))


@pytest.mark.timeout(OUTAGE + 240)
def test_a_table_outage_poisons_nothing_and_each_message_is_stored_once_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with AzuriteTable(location=tmp_path / "data", queues=True) as azurite:
        connection = azurite.connection_string
        table = WireTableClient.from_connection_string(connection, "outage")
        table.create_table()
        queues = QueueServiceClient.from_connection_string(connection)
        queue = queues.create_queue("shots")
        # Storage calls give up fast, so that each try of the consumer meets the outage.
        hasty = RetryPolicy(attempts=2, max_delay=0.5, total_time=2)
        processor = Processor(tally, table, InMemoryPublisher(), retry=hasty)
        consumer = QueueConsumer(
            processor, queue, visibility_timeout=6, max_dequeue_count=3,
            backoff=timedelta(seconds=1), max_backoff=timedelta(seconds=4),
        )  # fmt: skip
        keys = [f"k{n}" for n in range(3)]
        sent: dict[str, list[str]] = {key: [] for key in keys}

        def produce(until: float) -> None:
            n = 0
            while time.monotonic() < until:
                message = add(n, keys[n % 3], n)
                send(QueueClient.from_connection_string(connection, "shots"), message)
                sent[message.key].append(message.id)
                n += 1
                time.sleep(0.25)

        started = time.monotonic()
        producer = threading.Thread(target=produce, args=(started + OUTAGE + 6,))
        worker = threading.Thread(target=consumer.run, kwargs={"idle_wait": 0.2})
        with caplog.at_level(logging.WARNING, logger="handlers"):
            producer.start()
            worker.start()
            time.sleep(2)
            azurite.stop("table")  # the Queue service runs on
            time.sleep(OUTAGE)
            azurite.start("table")
            producer.join()
            deadline = time.monotonic() + 120
            while queue.get_queue_properties().approximate_message_count:
                assert time.monotonic() < deadline, f"the queue never emptied: {consumer.stats}"
                time.sleep(0.5)
            consumer.stop()
            worker.join(60)

        assert poison_of(queues, queue) == []
        for key in keys:
            history = [v.message_id for v in processor.history(key)]
            assert sorted(history) == sorted(sent[key])  # each once, none lost
            state = processor.current_state(key).state
            assert state == Tally(sum(int(i[2:]) for i in sent[key]), history)
        stats = consumer.stats
        assert (stats.received, stats.completed + stats.duplicates) == (
            sum(map(len, sent.values())),
            sum(map(len, sent.values())),
        )
        assert (stats.poisoned, stats.abandoned) == (0, 0)
        assert stats.faulted > 0  # the outage was met, not slept through
        lines = [r.getMessage() for r in caplog.records]
        opened = [line for line in lines if line.startswith("storage unavailable: pausing")]
        closed = [line for line in lines if line.startswith("storage answers again")]
        assert (len(opened), len(closed)) == (1, 1), lines
