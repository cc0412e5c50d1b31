"""The Spark queue path against the Queue service's own faults, through a
proxy on a real socket in front of Azurite's Queue service: the sink's
throttled deletes and sends are waited out (the task never fails for them);
the source reads a message received too often whose processing is stored,
poisons one that is not, and never poisons a message twice when its delete
failed."""

from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from azure.storage.queue import LinearRetry, QueueClient, QueueMessage, QueueServiceClient

from azurite.proxy import Action, Proxy, Request
from handlers import Breaker, InMemoryPublisher, Processor, read_queue_text
from tests.helpers import drain
from tests.queueing import add, tally
from tests.spark.test_pipeline import client
from tests.spark.test_queue_holes import poisoned
from tests.spark.test_queue_source import b64, needs_pyspark_4, queues, send
from tests.test_queue_service_faults import queue_proxy

__all__ = ["queue_proxy", "queues"]  # the fixtures


def paused(caplog: pytest.LogCaptureFixture, what: str) -> list[str]:
    """The driver's lines, after the two of the breaker opening on ``what``
    (the beginning of its reason) and closing again."""
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("spark_driver")]
    assert len(lines) >= 2, lines
    assert lines[0].startswith(
        "Queue service unavailable: queue calls pause, trying again in 0.1 s, then less often: "
        + what
    ), lines
    assert lines[1].startswith("Queue service answers again after "), lines
    return lines[2:]


def processed(inbox: QueueClient) -> tuple[list[QueueMessage], list[dict[str, Any]]]:
    """Two messages sent and received, and the sink's rows to delete them."""
    send(inbox, [b64(add(1, "k", 1)), b64(add(2, "k", 2))])
    got = list(inbox.receive_messages(max_messages=32, visibility_timeout=30))
    rows = [
        {"receipt": json.dumps({"id": m.id, "popReceipt": m.pop_receipt,
                                "dequeueCount": m.dequeue_count, "text": m.content}),
         "reason": None, "cause": None}
        for m in got
    ]  # fmt: skip
    return got, rows


@needs_pyspark_4
def test_queue_faults_pause_the_sink_and_source_and_nothing_is_poisoned_for_them(
    connection_string: str, table_name: str, queues: Callable[[str], QueueClient],
    queue_proxy: Proxy, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from spark_driver._queues import _config as _queue_config
    from spark_driver._queues._sink import OutputRoute, send_partition, settle_partition
    from spark_driver._queues._source import QueueOptions, QueueStreamReader

    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    inbox = queues("inbox")
    deletes = {"throttled": 0, "left": 4}
    outbox, sends = queues("outbox"), {"left": 0}

    def plan(request: Request) -> Action:
        if request.method == "DELETE" and deletes["left"]:
            deletes["throttled"] += 1
            deletes["left"] -= 1
            return "throttle"
        if f"/{outbox.queue_name}/messages".encode() in request.head and sends["left"]:
            sends["left"] -= 1
            return "throttle"
        return "pass"

    queue_proxy.plan(plan)
    # This process's Queue service, through the proxy, the SDK's retries off
    # (they wait 15 s on a 503); the breaker's pauses short.
    proxied = QueueServiceClient.from_connection_string(
        queue_proxy.endpoint_of(connection_string), retry_total=0
    )
    config = _queue_config.QueueConfig.from_env()
    monkeypatch.setitem(_queue_config._services, config, proxied)
    fast = Breaker("Queue service", "queue calls pause", timedelta(seconds=0.1),
                   timedelta(seconds=0.2), _queue_config._log)  # fmt: skip
    monkeypatch.setattr(_queue_config, "queueing", fast)

    # The sink: two processed messages, their first 4 deletes throttled.
    got, rows = processed(inbox)
    with caplog.at_level(logging.WARNING, logger="spark_driver"):
        assert list(settle_partition(rows, inbox.queue_name, 5, 1)) == [(2, 0, 0, 0)]
    assert deletes["throttled"] == 4
    assert inbox.get_queue_properties().approximate_message_count == 0
    # Its deletes are in flight together: either may be the one that opened the breaker.
    line = next(r.getMessage() for r in caplog.records if r.name.startswith("spark_driver"))
    opener = got[0] if repr(got[0].id) in line else got[1]
    assert paused(caplog, f"delete of queue message {opener.id!r}: Operation returned an "
                  "invalid status") == []  # fmt: skip

    # The sink's outputs: the first two sends throttled, then each sent once,
    # its headers (the trace it was published in) in its envelope.
    sends["left"] = 2
    traced = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    output = {"message_id": "o-1", "key": "k", "type": "Added", "body": '{"total": 1}',
              "headers": traced, "due": None, "produced": None}  # fmt: skip
    assert list(send_partition([output], OutputRoute.parse([outbox.queue_name]))) == [
        (1, 0, 0, None)
    ]
    assert sends["left"] == 0
    sent = [read_queue_text(t) for t in drain(outbox)]
    assert [(m.body, dict(m.headers)) for m in sent] == [({"total": 1}, traced)]

    # The source, max 1 receive: m-1 stored (its delete was lost), m-2 not,
    # and a text that is no message; every delete refused until told.
    processor = Processor(tally, client(table_name), InMemoryPublisher())
    processor.process(add(1, "k", 1))
    for n in (1, 2):
        inbox.send_message(b64(add(n, "k", n)))
    for lost in list(inbox.receive_messages(max_messages=32, visibility_timeout=30)):
        inbox.update_message(lost.id, lost.pop_receipt, visibility_timeout=0)
    inbox.send_message("not a message")
    deletes.update(throttled=0, left=10**6)
    reader = QueueStreamReader(QueueOptions(inbox.queue_name, visibility_timeout=1,
                                            max_dequeue_count=1, table=table_name,
                                            handler="Tally"))  # fmt: skip
    offsets: list[dict[str, object]] = []
    first = threading.Thread(target=lambda: offsets.append(reader.latestOffset()))
    first.start()
    # Its delete of the poisoned m-2 waits; meanwhile the locks run out and
    # another receiver takes all three: the reader's deletes find their locks lost.
    taken: dict[str, str] = {}
    deadline = time.monotonic() + 20
    while not deletes["throttled"]:  # the reader received them all, and waits on m-2's delete
        assert time.monotonic() < deadline, "the reader never poisoned m-2"
        time.sleep(0.05)
    while len(taken) < 3:
        assert time.monotonic() < deadline, f"took only {taken}"
        for m in inbox.receive_messages(max_messages=32, visibility_timeout=30):
            taken[m.id] = m.pop_receipt or ""
        time.sleep(0.1)
    for message_id, receipt in taken.items():
        inbox.update_message(message_id, receipt, visibility_timeout=0)
    deletes["left"] = 0
    first.join(30)
    second = reader.latestOffset()

    assert [offset["batch"] for offset in offsets] == [1]  # m-1's first read

    held = reader.partitions({"run": "", "batch": 0}, second)
    rows_read = [row for part in held for row in part.value]
    assert [(row[0], row[8]) for row in rows_read] == [("m-1", 2), ("m-1", 4)]  # and receives
    entries = poisoned(inbox)
    assert {text: (e.reason, e.dequeue_count) for text, e in entries.items()} == {
        b64(add(2, "k", 2)): (
            "received 2 times, more than maxDequeueCount=1, without being completed",
            2,
        ),
        "not a message": (
            "queue message text is neither base64 of a JSON envelope nor a JSON envelope: "
            "'not a message'",
            1,
        ),
    }  # each once, though each came again
    assert inbox.get_queue_properties().approximate_message_count == 1  # m-1, in a batch


def lost_answers(
    connection_string: str, proxy: Proxy, monkeypatch: pytest.MonkeyPatch,
    plan: Callable[[Request], Action],
) -> None:  # fmt: skip
    """This process's Queue service through ``proxy`` (run by ``plan``), the
    SDK's retries on as users have them (without their 15 s waits), and a
    breaker with short pauses."""
    from spark_driver._queues import _config as _queue_config

    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    proxy.plan(plan)
    proxied = QueueServiceClient.from_connection_string(
        proxy.endpoint_of(connection_string),
        retry_policy=LinearRetry(backoff=0, random_jitter_range=0),
    )
    monkeypatch.setitem(_queue_config._services, _queue_config.QueueConfig.from_env(), proxied)
    fast = Breaker("Queue service", "queue calls pause", timedelta(seconds=0.1),
                   timedelta(seconds=0.2), _queue_config._log)  # fmt: skip
    monkeypatch.setattr(_queue_config, "queueing", fast)


def test_the_sink_counts_a_delete_whose_answer_was_lost_as_deleted(
    connection_string: str, queues: Callable[[str], QueueClient], queue_proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from spark_driver._queues._sink import settle_partition

    inbox = queues("inbox")
    first = itertools.count()

    def plan(request: Request) -> Action:
        return "drop" if request.method == "DELETE" and next(first) == 0 else "pass"

    lost_answers(connection_string, queue_proxy, monkeypatch, plan)
    got, rows = processed(inbox)
    with caplog.at_level(logging.INFO, logger="spark_driver"):
        # (deleted, released, poisoned, lost): the first delete was applied, its answer lost.
        assert list(settle_partition(rows, inbox.queue_name, 5, 1)) == [(2, 0, 0, 0)]
    assert [a for r, a in queue_proxy.seen if r.method == "DELETE"] == ["drop", "pass", "pass"]
    assert inbox.get_queue_properties().approximate_message_count == 0
    # The two deletes are in flight together: the dropped one is whichever came first.
    [dropped] = [m for m in got for r, a in queue_proxy.seen
                 if a == "drop" and f"/messages/{m.id}?".encode() in r.head]  # fmt: skip
    assert [(r.levelname, r.getMessage()) for r in caplog.records
            if r.name.startswith("spark_driver")] == [
        ("INFO", f"queue message {dropped.id!r}: already gone when deleted (MessageNotFound): "
                 "its delete applied and its answer lost, or another receive took it; it does "
                 "not come again"),
    ]  # fmt: skip


def test_the_source_poisons_once_per_lost_answer_through_its_breaker(
    connection_string: str, queues: Callable[[str], QueueClient], queue_proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from handlers import PoisonEntry
    from spark_driver._queues._config import poison, queue_service

    inbox = queues("inbox")
    path = f"/{inbox.queue_name}-poison/messages".encode()

    def to_poison(request: Request) -> bool:
        return request.method == "POST" and path in request.head.split(b"\r\n")[0]

    posts, deletes = itertools.count(), itertools.count()

    def plan(request: Request) -> Action:
        if to_poison(request):
            return "drop" if next(posts) == 0 else "pass"
        return "drop" if request.method == "DELETE" and next(deletes) == 0 else "pass"

    lost_answers(connection_string, queue_proxy, monkeypatch, plan)
    send(inbox, ["not a message"])
    [got] = inbox.receive_messages(max_messages=32, visibility_timeout=30)
    entry = PoisonEntry("not a message", "not a message", inbox.queue_name, got.id, 1)
    with caplog.at_level(logging.WARNING, logger="spark_driver"):
        source = queue_service().get_queue_client(inbox.queue_name)  # as the source has it
        assert poison(source, entry, got.pop_receipt or "") == "poisoned"

    # One try by the SDK (its retries off for entries), one by the breaker.
    assert [a for r, a in queue_proxy.seen if to_poison(r)] == ["drop", "pass"]
    assert [a for r, a in queue_proxy.seen if r.method == "DELETE"] == ["drop", "pass"]
    shelf = QueueClient.from_queue_url(f"{inbox.url}-poison", credential=inbox.credential)
    # At least once: a reader tells the copy by its queueMessageId and dequeueCount.
    assert [PoisonEntry.decode(t) for t in drain(shelf)] == [entry, entry]
    assert inbox.get_queue_properties().approximate_message_count == 0
    assert paused(caplog, f"poisoning queue message {got.id!r}: ") == [
        f"poisoned queue message {got.id!r} on receive 1 to {inbox.queue_name}-poison: "
        "not a message"
    ]
