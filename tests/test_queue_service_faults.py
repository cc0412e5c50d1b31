"""The Queue service's own faults never poison: a throttled Delete Message is
waited out with the message in hand, a message whose processing is stored
is completed however often it was received, a poisoned message whose
delete failed is not poisoned a second time, and a throttled output send
keeps its messages in hand. Faults come from a proxy on a real socket in
front of Azurite's Queue service."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from azurite.proxy import Action, Proxy, Request
from handlers import Processor, QueueConsumer, QueueOutcome, QueuePublisher, read_queue_text
from tests.helpers import azurite_port, drain
from tests.queueing import Tally, add, poison_of, send, states, tally

#: Breaker pauses short enough for a test: 0.1 s, doubled up to 0.4 s.
PAUSE, MAX_PAUSE = timedelta(seconds=0.1), timedelta(seconds=0.4)


@pytest.fixture
def queue_proxy(connection_string: str) -> Iterator[Proxy]:
    """A fault-injecting proxy in front of Azurite's Queue service."""
    with Proxy(azurite_port(connection_string, "Queue")) as running:
        yield running


def through(proxy: Proxy, connection_string: str, queue: QueueClient) -> QueueClient:
    """``queue`` reached through ``proxy``, the SDK's own retries off (they
    would wait 15 s on a 503): each fault reaches the consumer."""
    return QueueClient.from_connection_string(
        proxy.endpoint_of(connection_string), queue.queue_name, retry_total=0
    )


def throttling(method: str, first: int) -> tuple[Callable[[Request], Action], list[Request]]:
    """A plan that throttles the first ``first`` requests of ``method``, and them."""
    throttled: list[Request] = []

    def plan(request: Request) -> Action:
        if request.method == method and len(throttled) < first:
            throttled.append(request)
            return "throttle"
        return "pass"

    return plan, throttled


def until(done: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)


def told(outcomes: list[QueueOutcome]) -> list[tuple[Any, ...]]:
    return [
        (o.action, o.message_id, o.dequeue_count, None if o.outcome is None else o.outcome.kind)
        for o in outcomes
    ]


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("handlers")
    ]  # fmt: skip


def test_a_throttled_delete_is_waited_out_in_hand_and_poisons_nothing(
    connection_string: str, table: TableClient, queues: QueueServiceClient, queue: QueueClient,
    queue_proxy: Proxy, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    key = f"k-{uuid.uuid4().hex[:8]}"
    out = queues.get_queue_client(f"{queue.queue_name}-out")
    plan, throttled = throttling("DELETE", 9)
    queue_proxy.plan(plan)
    processor = Processor(tally, table, QueuePublisher(queues, lambda m: out.queue_name))
    seen: list[QueueOutcome] = []
    # One receive allowed and a 1 s lock: before, each failed delete cost a
    # receive, and the stored messages were poisoned, again on every receive.
    consumer = QueueConsumer(
        processor, through(queue_proxy, connection_string, queue), visibility_timeout=1,
        max_dequeue_count=1, backoff=timedelta(0), on_outcome=seen.append, pause=PAUSE,
        max_pause=MAX_PAUSE,
    )  # fmt: skip
    for n in (1, 2, 3):
        send(queue, add(n, key, n))
    worker = threading.Thread(target=consumer.run, kwargs={"idle_wait": 0.1})
    with caplog.at_level(logging.WARNING, logger="handlers"):
        worker.start()
        until(lambda: consumer.stats.completed == 3 or (
            len(throttled) == 9 and queue.get_queue_properties().approximate_message_count == 0
        ))  # fmt: skip
        consumer.stop()
        worker.join(30)

    assert len(throttled) == 9  # the fault was met
    assert poison_of(queues, queue) == []
    assert states(processor, key) == {key: (3, Tally(6, ["m-1", "m-2", "m-3"]))}
    assert sorted((read_queue_text(t).body for t in drain(out)), key=str) == [
        {"total": 1, "by": "m-1"},
        {"total": 3, "by": "m-2"},
        {"total": 6, "by": "m-3"},
    ]  # each once: no message came again
    assert drain(queue) == []
    stats = consumer.stats
    assert (stats.received, stats.completed, stats.duplicates, stats.faulted) == (3, 3, 0, 0)
    assert (stats.poisoned, stats.abandoned, stats.lost_locks, stats.outages) == (0, 0, 0, 1)
    assert told(seen) == [("completed", f"m-{n}", 1, "completed") for n in (1, 2, 3)]
    lines, name = warnings_of(caplog), queue.queue_name
    assert [line.startswith(prefix) for line, prefix in zip(lines, [
        f"queue {name!r} unavailable: receiving paused, trying again in 0.1 s",
        f"queue {name!r} answers again after ",
    ], strict=True)] == [True, True], lines  # fmt: skip
    assert "delete of queue message" in lines[0]
    assert lines[0].endswith("Operation returned an invalid status 'Server Busy'")


def test_a_message_received_too_often_is_completed_if_its_processing_is_stored(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    key = f"k-{uuid.uuid4().hex[:8]}"
    out = queues.get_queue_client(f"{queue.queue_name}-out")
    processor = Processor(tally, table, QueuePublisher(queues, lambda m: out.queue_name))
    processor.process(add(1, key, 5))  # stored and published by a receive never deleted
    send(queue, add(1, key, 5))
    send(queue, add(2, key, 7))  # never stored
    for _ in range(2):  # two receives that never completed (their deletes failed, say)
        received = list(queue.receive_messages(max_messages=32, visibility_timeout=1))
        assert len(received) == 2
        for lost in received:
            queue.update_message(lost.id, lost.pop_receipt, visibility_timeout=0)
    send(queue, add(3, key, 1))
    seen: list[QueueOutcome] = []
    consumer = QueueConsumer(processor, queue, max_dequeue_count=2, on_outcome=seen.append)

    with caplog.at_level(logging.WARNING, logger="handlers"):
        stats = consumer.run(until_empty=True)

    assert (stats.received, stats.completed, stats.duplicates, stats.poisoned) == (3, 1, 1, 1)
    assert (stats.abandoned, stats.faulted) == (0, 0)
    assert states(processor, key) == {key: (2, Tally(6, ["m-1", "m-3"]))}
    texts = drain(out)
    assert sorted((read_queue_text(t).body for t in texts), key=str) == [
        {"total": 5, "by": "m-1"},
        {"total": 5, "by": "m-1"},
        {"total": 6, "by": "m-3"},
    ]  # m-1's output published again, the same text
    assert len(set(texts)) == 2
    [entry] = poison_of(queues, queue)
    assert (read_queue_text(entry.content).id, entry.dequeue_count) == ("m-2", 3)
    assert entry.reason == (
        "received 3 times, more than max_dequeue_count=2, without being completed"
    )
    assert drain(queue) == []
    assert sorted(told(seen), key=str) == [
        ("completed", "m-3", 1, "completed"),
        ("duplicate", "m-1", 3, "duplicate"),
        ("poisoned", "m-2", 3, None),
    ]
    assert warnings_of(caplog) == [
        f"poisoned message 'm-2' of key '{key}' on receive 3 of 2: received 3 times, more "
        "than max_dequeue_count=2, without being completed"
    ]


def test_a_poisoned_message_whose_delete_failed_is_not_poisoned_again(
    connection_string: str, table: TableClient, queues: QueueServiceClient, queue: QueueClient,
    queue_proxy: Proxy, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    deleting = {"throttled": 0, "on": True}

    def plan(request: Request) -> Action:
        if request.method == "DELETE" and deleting["on"]:
            deleting["throttled"] += 1
            return "throttle"
        return "pass"

    queue_proxy.plan(plan)
    seen: list[QueueOutcome] = []
    consumer = QueueConsumer(
        Processor(tally, table, QueuePublisher(queues, lambda m: "unused")),
        through(queue_proxy, connection_string, queue), visibility_timeout=1,
        on_outcome=seen.append, pause=PAUSE, max_pause=MAX_PAUSE,
    )  # fmt: skip
    queue.send_message("not a message")
    worker = threading.Thread(target=consumer.run, kwargs={"idle_wait": 0.1})
    with caplog.at_level(logging.WARNING, logger="handlers"):
        worker.start()
        until(lambda: consumer.stats.poisoned == 1 and deleting["throttled"] >= 2)
        consumer.stop()  # with its delete still refused: it comes again
        worker.join(30)
        deleting["on"] = False
        deadline = time.monotonic() + 10
        while consumer.run_once() == 0:  # until its lock runs out
            assert time.monotonic() < deadline, "the message never came again"
            time.sleep(0.1)

    [entry] = poison_of(queues, queue)
    assert (entry.content, entry.dequeue_count) == ("not a message", 1)
    assert entry.reason.startswith("queue message text is neither base64")
    assert drain(queue) == []
    stats = consumer.stats  # the second receive poisons no more: deleted, not counted again
    assert (stats.received, stats.poisoned, stats.completed, stats.faulted) == (2, 1, 0, 0)
    assert [(o.action, o.dequeue_count, o.message_id) for o in seen] == [
        ("poisoned", 1, None),
        ("poisoned", 2, None),
    ]
    assert seen[1].reason == (
        "already in the poison queue (sent on receive 1, its delete failed): deleted now, "
        "not sent again"
    )
    qid, name = seen[0].queue_message_id, queue.queue_name
    lines = warnings_of(caplog)
    assert [line.startswith(prefix) for line, prefix in zip(lines, [
        f"poisoned queue message {qid!r} on receive 1 of 5: queue message text is neither",
        f"queue {name!r} unavailable: receiving paused, trying again in 0.1 s",
        f"queue {name!r} answers again after ",
        f"poisoned queue message {qid!r} on receive 2 of 5: already in the poison queue",
    ], strict=True)] == [True] * 4, lines  # fmt: skip


def test_a_throttled_output_send_keeps_its_messages_in_hand_and_publishes_each_once(
    connection_string: str, table: TableClient, queues: QueueServiceClient, queue: QueueClient,
    queue_proxy: Proxy, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    key = f"k-{uuid.uuid4().hex[:8]}"
    out = queues.get_queue_client(f"{queue.queue_name}-out")
    sends: list[Request] = []

    def plan(request: Request) -> Action:
        if f"/{out.queue_name}/messages".encode() in request.head and len(sends) < 2:
            sends.append(request)
            return "throttle"
        return "pass"

    queue_proxy.plan(plan)
    proxied = QueueServiceClient.from_connection_string(
        queue_proxy.endpoint_of(connection_string), retry_total=0
    )
    processor = Processor(tally, table, QueuePublisher(proxied, lambda m: out.queue_name))
    seen: list[QueueOutcome] = []
    consumer = QueueConsumer(processor, queue, max_dequeue_count=1, on_outcome=seen.append,
                             pause=PAUSE, max_pause=MAX_PAUSE)  # fmt: skip
    send(queue, add(1, key, 1))
    send(queue, add(2, key, 2))

    with caplog.at_level(logging.WARNING, logger="handlers"):
        stats = consumer.run(until_empty=True)

    assert len(sends) == 2
    assert states(processor, key) == {key: (2, Tally(3, ["m-1", "m-2"]))}
    assert [read_queue_text(t).body for t in drain(out)] == [
        {"total": 1, "by": "m-1"},
        {"total": 3, "by": "m-2"},
    ]  # each once: the throttled sends applied nothing
    assert (poison_of(queues, queue), drain(queue)) == ([], [])
    assert (stats.received, stats.completed, stats.duplicates, stats.faulted) == (2, 0, 2, 2)
    assert (stats.poisoned, stats.abandoned, stats.outages) == (0, 0, 1)
    assert told(seen) == [
        ("faulted", "m-1", 1, "faulted"),
        ("faulted", "m-2", 1, "faulted"),
        ("duplicate", "m-1", 1, "duplicate"),
        ("duplicate", "m-2", 1, "duplicate"),
    ]  # stored, then in hand until the send went out, as duplicates
    assert [line.split(": ")[0] for line in warnings_of(caplog)] == [
        f"faulted message 'm-1' of key '{key}' on receive 1 of 1",
        f"faulted message 'm-2' of key '{key}' on receive 1 of 1",
        "storage unavailable",
        warnings_of(caplog)[-1].split(": ")[0],
    ]
    assert warnings_of(caplog)[-1].startswith("storage answers again after ")
