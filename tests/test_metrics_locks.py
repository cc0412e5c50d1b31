"""Lost locks counted once each, however the consumer finds out: a renewal
refused (its answer lost on a real socket, then the old pop receipt
refused) before the message is abandoned."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import timedelta

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from azurite.proxy import Action, Proxy, Request
from handlers import HandlerContext, InMemoryPublisher, Message, Processor, QueueConsumer, handler
from tests.helpers import azurite_port
from tests.metrics import points
from tests.queueing import Tally, add, send, states
from tests.test_queue_service_faults import through

WHERE = "messaging.destination.name"


@handler("Tally", Tally, types=["Add"])
def slow_then_broken(state: Tally, message: Message, ctx: HandlerContext) -> None:
    time.sleep(1.2)  # past a renewal, and the one tried again
    raise RuntimeError("broken after a while")


def test_a_lock_lost_at_a_renewal_of_a_message_then_abandoned_is_counted(
    connection_string: str, table: TableClient, queue: QueueClient, meters: InMemoryMetricReader
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    send(queue, add(1, key, 2))
    dropped: list[Request] = []

    def plan(request: Request) -> Action:
        if request.method == "PUT" and not dropped:  # the first renewal: applied, answer lost
            dropped.append(request)
            return "drop"
        return "pass"

    with Proxy(azurite_port(connection_string, "Queue")) as proxy:
        proxy.plan(plan)
        consumer = QueueConsumer(
            Processor(slow_then_broken, table, InMemoryPublisher()),
            through(proxy, connection_string, queue),
            visibility_timeout=1,
            backoff=timedelta(0),
            pause=timedelta(seconds=0.1),
            max_pause=timedelta(seconds=0.2),
        )
        consumer.run_once()
        stats = consumer.stats

    assert len(dropped) == 1
    assert (stats.received, stats.abandoned, stats.lost_locks, stats.poisoned) == (1, 1, 1, 0)
    assert points(meters, "streamstone.lock.lost", WHERE) == {(queue.queue_name,): 1}
    assert points(meters, "streamstone.messages", "streamstone.outcome") == {("abandoned",): 1}
    assert states(consumer.processor, key) == {key: (0, Tally())}


def test_a_queue_deleted_while_its_message_is_processed_is_waited_for_not_a_lost_lock(
    table: TableClient, queue: QueueClient, meters: InMemoryMetricReader,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """An operator deletes the queue while its message is processed, and makes
    it again: the delete meets 404 QueueNotFound, which no other receive
    caused (the message went with the queue). A missing queue is an outage:
    the delete waits it out, then finds the message gone (completed)."""
    key = f"k-{uuid.uuid4().hex[:8]}"
    send(queue, add(1, key, 2))

    @handler("Tally", Tally, types=["Add"])
    def deleting_its_queue(state: Tally, message: Message, ctx: HandlerContext) -> None:
        queue.delete_queue()
        threading.Timer(1.5, queue.create_queue).start()
        state.total += message.body["n"]
        state.seen.append(message.id)

    consumer = QueueConsumer(
        Processor(deleting_its_queue, table, InMemoryPublisher()), queue,
        pause=timedelta(seconds=0.2), max_pause=timedelta(seconds=0.5),
    )  # fmt: skip
    with caplog.at_level(logging.INFO, logger="handlers"):
        consumer.run_once()
    stats = consumer.stats

    assert (stats.received, stats.completed, stats.faulted, stats.lost_locks) == (1, 1, 0, 0)
    assert points(meters, "streamstone.lock.lost", WHERE) == {}
    assert points(meters, "streamstone.messages", "streamstone.outcome") == {("completed",): 1}
    assert states(consumer.processor, key) == {key: (1, Tally(2, ["m-1"]))}
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if "lock lost" in line], lines
    assert any("already gone when deleted" in line for line in lines), lines
