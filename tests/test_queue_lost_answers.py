"""Answers the Queue service gave and the consumer never heard (a proxy on a
real socket in front of Azurite's Queue service reads the answer, then cuts
the connection): a delete that was applied is a completed message, not a
lost lock; a poison entry that was stored costs at most one more entry, sent
again by the consumer's breaker (said and counted), not by the SDK unseen."""

from __future__ import annotations

import itertools
import logging
import uuid

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import LinearRetry, QueueClient, QueueServiceClient

from azurite.proxy import Action, Proxy, Request
from handlers import InMemoryPublisher, Processor, QueueConsumer, QueueOutcome
from tests.helpers import drain
from tests.queueing import Tally, add, poison_of, send, states, tally
from tests.test_queue_service_faults import MAX_PAUSE, PAUSE, queue_proxy, told, warnings_of

__all__ = ["queue_proxy"]  # the fixture


def proxied(proxy: Proxy, connection_string: str, queue: QueueClient) -> QueueClient:
    """``queue`` through ``proxy``, the SDK's retries on as users have them,
    without their 15 s waits."""
    return QueueClient.from_connection_string(
        proxy.endpoint_of(connection_string),
        queue.queue_name,
        retry_policy=LinearRetry(backoff=0, random_jitter_range=0),
    )


def test_a_delete_whose_answer_is_lost_completes_the_message(
    connection_string: str, table: TableClient, queue: QueueClient, queue_proxy: Proxy,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    key = f"k-{uuid.uuid4().hex[:8]}"
    deletes = itertools.count()
    queue_proxy.plan(lambda r: "drop" if r.method == "DELETE" and next(deletes) == 0 else "pass")
    processor = Processor(tally, table, InMemoryPublisher())
    seen: list[QueueOutcome] = []
    consumer = QueueConsumer(processor, proxied(queue_proxy, connection_string, queue),
                             visibility_timeout=5, on_outcome=seen.append)  # fmt: skip
    send(queue, add(1, key, 1))

    with caplog.at_level(logging.INFO, logger="handlers"):
        stats = consumer.run(until_empty=True)

    # Applied, its answer lost: the retried DELETE finds the message gone.
    assert [(r.method, a) for r, a in queue_proxy.seen if r.method == "DELETE"] == [
        ("DELETE", "drop"), ("DELETE", "pass")
    ]  # fmt: skip
    assert (stats.received, stats.completed, stats.duplicates, stats.faulted) == (1, 1, 0, 0)
    assert (stats.lost_locks, stats.poisoned, stats.abandoned) == (0, 0, 0)
    assert told(seen) == [("completed", "m-1", 1, "completed")]
    assert [o.reason for o in seen] == [None]
    assert warnings_of(caplog) == []
    [line] = [r.getMessage() for r in caplog.records
              if r.name.startswith("handlers") and "already gone" in r.getMessage()]  # fmt: skip
    assert line == (
        f"queue message {seen[0].queue_message_id!r}: already gone when deleted "
        "(MessageNotFound): its delete applied and its answer lost, or another receive took "
        "it; it does not come again"
    )
    assert states(processor, key) == {key: (1, Tally(1, ["m-1"]))}
    assert drain(queue) == []


def test_a_poison_entry_whose_answer_is_lost_is_sent_again_by_the_breaker_once(
    connection_string: str, table: TableClient, queues: QueueServiceClient, queue: QueueClient,
    queue_proxy: Proxy, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    poison_path = f"/{queue.queue_name}-poison/messages".encode()

    def to_poison(request: Request) -> bool:
        return request.method == "POST" and poison_path in request.head.split(b"\r\n")[0]

    posts = itertools.count()

    def plan(request: Request) -> Action:
        return "drop" if to_poison(request) and next(posts) == 0 else "pass"

    queue_proxy.plan(plan)
    seen: list[QueueOutcome] = []
    consumer = QueueConsumer(
        Processor(tally, table, InMemoryPublisher()),
        proxied(queue_proxy, connection_string, queue), visibility_timeout=5,
        on_outcome=seen.append, pause=PAUSE, max_pause=MAX_PAUSE,
    )  # fmt: skip
    queue.send_message("not a message")

    with caplog.at_level(logging.WARNING, logger="handlers"):
        stats = consumer.run(until_empty=True)

    # One try by the SDK (its retries off for this call), one by the breaker.
    assert [a for r, a in queue_proxy.seen if to_poison(r)] == ["drop", "pass"]
    entries = poison_of(queues, queue)
    [queue_message_id] = {o.queue_message_id for o in seen}
    reason = ("queue message text is neither base64 of a JSON envelope nor a JSON envelope: "
              "'not a message'")  # fmt: skip
    assert [(e.content, e.queue_message_id, e.dequeue_count, e.reason) for e in entries] == [
        ("not a message", queue_message_id, 1, reason)
    ] * 2  # at least once: a reader tells the copy by its queueMessageId and dequeueCount
    assert (stats.received, stats.poisoned, stats.outages, stats.faulted) == (1, 1, 1, 0)
    assert [(o.action, o.dequeue_count) for o in seen] == [("poisoned", 1)]
    lines, name = warnings_of(caplog), queue.queue_name
    assert len(lines) == 3, lines
    assert lines[0].startswith(
        f"queue {name!r} unavailable: receiving paused, trying again in 0.1 s, then less "
        f"often: poisoning queue message {queue_message_id!r}: "
    )
    assert lines[1].startswith(f"queue {name!r} answers again after ")
    assert lines[2] == f"poisoned queue message {queue_message_id!r} on receive 1 of 5: {reason}"
    assert drain(queue) == []
