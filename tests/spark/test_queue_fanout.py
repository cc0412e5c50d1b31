"""The Spark queue path's requests in flight at once, against Azurite's Queue
service through a proxy on a real socket: the source's receives take each
message of the queue once, in batches of at most ``maxMessagesPerBatch``;
a partition's deletes, releases and poison entries settle each message
exactly (each count, what stays on the queue, the poison queue's entries)
while deletes are throttled and one's answer is lost."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from azure.storage.queue import QueueClient

from azurite.proxy import Action, Proxy, Request
from tests.helpers import drain
from tests.queueing import add
from tests.spark.test_queue_holes import poisoned
from tests.spark.test_queue_service_faults import lost_answers
from tests.spark.test_queue_source import b64, needs_pyspark_4, queues
from tests.test_queue_service_faults import queue_proxy

__all__ = ["queue_proxy", "queues"]  # the fixtures


def is_receive(request: Request) -> bool:
    return request.method == "GET" and b"/messages" in request.head.split(b"\r\n")[0]


def filled(queue: QueueClient, texts: list[str]) -> None:
    queue.create_queue()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(queue.send_message, texts))


def first_batch(inbox: QueueClient, visibility_timeout: int) -> list[Any]:
    """The rows of a reader's first batch of at most 100 messages."""
    from spark_driver._queues._source import QueueOptions, QueueStreamReader

    options = QueueOptions(inbox.queue_name, max_messages=100,
                           visibility_timeout=visibility_timeout)  # fmt: skip
    reader = QueueStreamReader(options)
    start = reader.initialOffset()
    return [row for part in reader.partitions(start, reader.latestOffset()) for row in part.value]


@needs_pyspark_4
def test_receives_in_flight_take_each_message_once_in_batches_of_at_most_max_messages(
    connection_string: str, queues: Callable[[str], QueueClient], queue_proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from spark_driver._queues._fanout import RECEIVERS
    from spark_driver._queues._source import QueueOptions, QueueStreamReader

    inbox = queues("inbox")
    sent = {f"m-{n}" for n in range(150)}
    filled(inbox, [b64(add(n, f"k-{n % 7}", n)) for n in range(150)])
    throttled = {"left": 3}

    def plan(request: Request) -> Action:
        if is_receive(request) and throttled["left"]:
            throttled["left"] -= 1
            return "throttle"  # a fault in the middle: waited out, costing no message
        return "pass"

    lost_answers(connection_string, queue_proxy, monkeypatch, plan)
    reader = QueueStreamReader(QueueOptions(inbox.queue_name, max_messages=100,
                                            visibility_timeout=60))  # fmt: skip
    start = reader.initialOffset()
    first = reader.latestOffset()
    second = reader.latestOffset()
    assert reader.latestOffset() == second  # the queue is empty: no third batch

    batches = [
        [row[0] for part in reader.partitions(a, b) for row in part.value]
        for a, b in ((start, first), (first, second))
    ]
    assert [len(batch) for batch in batches] == [100, 50]
    assert Counter(batches[0] + batches[1]) == Counter(sent)  # each once, none in two batches
    assert throttled["left"] == 0
    # The SDK's pool opens a connection only when the ones it has are busy.
    assert 2 <= queue_proxy.connections <= RECEIVERS
    assert inbox.get_queue_properties().approximate_message_count == 150  # held, not deleted


def test_a_partitions_messages_settle_in_flight_exactly_through_throttles_and_a_lost_answer(
    connection_string: str, queues: Callable[[str], QueueClient], queue_proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from spark_driver._queues._fanout import DELETERS
    from spark_driver._queues._sink import settle_partition

    inbox = queues("inbox")
    texts = [b64(add(n, f"k-{n}", n)) for n in range(40)]
    filled(inbox, texts)
    got = sorted(inbox.receive_messages(messages_per_page=32, visibility_timeout=60),
                 key=lambda m: texts.index(m.content))  # fmt: skip
    assert len(got) == 40
    # 27 to delete; 3 whose lock another receive took (their receipts refused);
    # 5 failed on their first receive (released at once: backoff 0); 5 on their last.
    for lost in got[27:30]:
        inbox.update_message(lost.id, lost.pop_receipt, visibility_timeout=0)
    rows = [
        {"receipt": json.dumps({"id": m.id, "popReceipt": m.pop_receipt,
                                "dequeueCount": 5 if n >= 35 else 1, "text": m.content}),
         "reason": "boom" if n >= 30 else None, "cause": None}
        for n, m in enumerate(got)
    ]  # fmt: skip
    seen = {"n": 0}

    def plan(request: Request) -> Action:
        if request.method != "DELETE":
            return "pass"
        seen["n"] += 1
        return "throttle" if seen["n"] <= 6 else "drop" if seen["n"] == 10 else "pass"

    lost_answers(connection_string, queue_proxy, monkeypatch, plan)
    # (deleted, released, poisoned, lost)
    assert list(settle_partition(rows, inbox.queue_name, 5, 0)) == [(27, 5, 5, 3)]

    # A connection per request in flight (the pool opens one only when its
    # others are busy), besides the one made after the dropped answer closed its own.
    assert 2 <= queue_proxy.connections - 1 <= DELETERS
    assert [a for r, a in queue_proxy.seen if r.method == "DELETE"].count("throttle") == 6
    assert sorted(drain(inbox)) == sorted(texts[27:35])  # the lost and the released: again
    entries = poisoned(inbox)
    assert {text: (e.reason, e.dequeue_count) for text, e in entries.items()} == dict.fromkeys(
        texts[35:], ("failed on receive 5 of 5: boom", 5)
    )


@needs_pyspark_4
def test_a_message_received_again_within_one_fan_out_is_held_once_on_its_live_receipt(
    connection_string: str, queues: Callable[[str], QueueClient], queue_proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from spark_driver._queues._sink import settle_partition

    inbox = queues("inbox")
    texts = [b64(add(n, f"k-{n % 7}", n)) for n in range(40)]
    filled(inbox, texts)
    slow = {"receives": 0, "on": True}

    def plan(request: Request) -> Action:
        if is_receive(request) and slow["on"]:
            slow["receives"] += 1
            if slow["receives"] > 1:  # the first page's 1 s locks run out meanwhile
                time.sleep(1.5)
        return "pass"

    lost_answers(connection_string, queue_proxy, monkeypatch, plan)
    rows = first_batch(inbox, visibility_timeout=1)
    slow["on"] = False

    assert slow["receives"] > 1
    assert sorted(row[0] for row in rows) == sorted(f"m-{n}" for n in range(40))  # each once
    # Each held on the receipt the service honours: all 40 deleted, none lost.
    receipts = [
        {"receipt": json.dumps({"id": row[9], "popReceipt": row[10], "dequeueCount": row[8],
                                "text": row[11]}), "reason": None, "cause": None}
        for row in rows
    ]  # fmt: skip
    assert list(settle_partition(receipts, inbox.queue_name, 5, 0)) == [(40, 0, 0, 0)]
    assert drain(inbox) == []


@needs_pyspark_4
def test_a_receive_answer_cut_amid_its_headers_in_the_fan_out_is_waited_out(
    connection_string: str, queues: Callable[[str], QueueClient], queue_proxy: Proxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    inbox = queues("inbox")
    filled(inbox, [b64(add(n, f"k-{n % 7}", n)) for n in range(150)])
    receives = {"n": 0}

    def plan(request: Request) -> Action:
        if is_receive(request):
            receives["n"] += 1
            if receives["n"] == 3:  # applied, its answer's body never comes: no XML to read
                return "behead"
        return "pass"

    lost_answers(connection_string, queue_proxy, monkeypatch, plan)
    rows = first_batch(inbox, visibility_timeout=60)

    # The cut page's messages are hidden until their lock runs out; the batch
    # is filled from the others, each once, and nothing is deleted.
    assert len({row[0] for row in rows}) == len(rows) == 100
    assert {row[0] for row in rows} < {f"m-{n}" for n in range(150)}
    assert [a for r, a in queue_proxy.seen if r.method == "GET"].count("behead") == 1
    assert inbox.get_queue_properties().approximate_message_count == 150


@needs_pyspark_4
def test_every_message_a_settle_fails_on_says_so_though_the_task_raises_only_the_first(
    connection_string: str, queues: Callable[[str], QueueClient],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    from spark_driver._queues import _sink
    from spark_driver._queues._config import delete as real_delete

    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    inbox = queues("inbox")
    texts = [b64(add(n, f"k-{n}", n)) for n in range(6)]
    filled(inbox, texts)
    got = sorted(inbox.receive_messages(messages_per_page=32, visibility_timeout=60),
                 key=lambda m: texts.index(m.content))  # fmt: skip
    failing = {got[1].id, got[4].id}

    def delete(queue: QueueClient, message_id: str, receipt: str) -> bool:
        if message_id in failing:  # neither a fault nor a refused receipt
            raise RuntimeError(f"bug settling {message_id}")
        return real_delete(queue, message_id, receipt)

    monkeypatch.setattr("spark_driver._queues._sink.delete", delete)
    rows = [
        {"receipt": json.dumps({"id": m.id, "popReceipt": m.pop_receipt, "dequeueCount": 1,
                                "text": m.content}), "reason": None, "cause": None}
        for m in got
    ]  # fmt: skip
    with pytest.raises(RuntimeError, match="bug settling"):
        list(_sink.settle_partition(rows, inbox.queue_name, 5, 0))

    said = sorted(r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    assert said == sorted(
        f"queue message {i!r}: not settled (RuntimeError: bug settling {i}); the task fails "
        "and the message comes again once its lock runs out"
        for i in failing
    )
    # The others were settled all the same: only the two failing stay, locked.
    assert inbox.get_queue_properties().approximate_message_count == 2
