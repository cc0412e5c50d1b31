"""QueueConsumer against Azurite's Queue service: the receive lifecycle on a
real queue (complete, abandon, poison, lost locks, renewal, graceful stop) and
scheduled messages, with exact states and outputs."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    InMemoryPublisher,
    Message,
    Processor,
    QueueConsumer,
    QueuePublisher,
    read_queue_text,
)
from handlers.examples import Order, orders
from tests.helpers import drain
from tests.queueing import Tally, add, poison_of, send, states, tally


def test_a_page_is_processed_completed_and_its_bad_messages_poisoned(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    tag = uuid.uuid4().hex[:8]
    a, b = f"a-{tag}", f"b-{tag}"
    publisher = InMemoryPublisher()
    processor = Processor(tally, table, publisher)
    send(queue, add(1, a, 2))
    send(queue, add(2, b, 5), plain=True)  # plain-text JSON, as some producers send
    send(queue, add(1, a, 2))  # the producer sent it twice
    send(queue, add(3, a, 3))
    queue.send_message("not a message")
    queue.send_message(base64.b64encode(b'{"id": "x", "key": "bad/key", "type": "Add"}').decode())
    consumer = QueueConsumer(processor, queue, backoff=timedelta(0))

    stats = consumer.run(until_empty=True)

    assert (stats.received, stats.completed, stats.duplicates, stats.poisoned) == (6, 3, 1, 2)
    assert (stats.abandoned, stats.faulted, stats.lost_locks) == (0, 0, 0)
    assert states(processor, a, b) == {
        a: (2, Tally(5, ["m-1", "m-3"])),
        b: (1, Tally(5, ["m-2"])),
    }
    added = {m.id: (m.key, m.body) for m in publisher.deliveries}
    assert sorted(added.values(), key=str) == sorted(
        [
            (a, {"total": 2, "by": "m-1"}),
            (a, {"total": 5, "by": "m-3"}),
            (b, {"total": 5, "by": "m-2"}),
        ],
        key=str,
    )
    assert publisher.divergent == []
    assert drain(queue) == []
    poisoned = sorted(poison_of(queues, queue), key=lambda e: e.content)
    assert [(e.content, e.queue, e.dequeue_count) for e in poisoned] == [
        (
            base64.b64encode(b'{"id": "x", "key": "bad/key", "type": "Add"}').decode(),
            queue.queue_name,
            1,
        ),
        ("not a message", queue.queue_name, 1),
    ]
    assert "bad/key" in poisoned[0].reason
    assert "'/'" in poisoned[0].reason
    assert poisoned[1].reason.startswith("queue message text is neither base64")


def test_a_failing_message_is_poisoned_after_five_receives_and_other_messages_complete(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    tag = uuid.uuid4().hex[:8]
    a, b = f"a-{tag}", f"b-{tag}"
    publisher = InMemoryPublisher()
    processor = Processor(tally, table, publisher)
    send(queue, add(1, a, 1, "Broken"))
    send(queue, add(2, a, 4))  # same key, after the broken one on the page
    send(queue, add(3, b, 7))
    consumer = QueueConsumer(processor, queue, backoff=timedelta(0))

    stats = consumer.run(until_empty=True)

    assert (stats.completed, stats.abandoned, stats.poisoned) == (2, 4, 1)
    assert states(processor, a, b) == {a: (1, Tally(4, ["m-2"])), b: (1, Tally(7, ["m-3"]))}
    [entry] = poison_of(queues, queue)
    assert entry.dequeue_count == 5
    assert read_queue_text(entry.content) == add(1, a, 1, "Broken")
    assert entry.reason.startswith("failed on receive 5 of 5: ")
    assert "RuntimeError: cannot add 1" in entry.reason
    assert drain(queue) == []


def test_a_message_over_the_receive_limit_is_poisoned_unprocessed(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    processor = Processor(tally, table, InMemoryPublisher())
    send(queue, add(1, key, 1))
    for _ in range(2):  # two receives that never complete (crashed workers)
        [lost] = queue.receive_messages(visibility_timeout=1)
        queue.update_message(lost.id, lost.pop_receipt, visibility_timeout=0)

    stats = QueueConsumer(processor, queue, max_dequeue_count=2).run(until_empty=True)

    assert (stats.received, stats.poisoned, stats.completed) == (1, 1, 0)
    [entry] = poison_of(queues, queue)
    assert (
        entry.reason == "received 3 times, more than max_dequeue_count=2, without being completed"
    )
    assert processor.current_state(key).version == 0


def test_a_lock_shorter_than_the_handler_lets_a_second_worker_in_and_one_version_is_stored(
    table: TableClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    publisher = InMemoryPublisher()
    send(queue, add(1, key, 3, "Slow", seconds=2.5))
    # The first worker's lock (1 s) runs out while its handler runs, and it does not renew.
    first = QueueConsumer(Processor(tally, table, publisher), queue, visibility_timeout=1,
                          renew_locks=False)  # fmt: skip
    second = QueueConsumer(Processor(tally, table, publisher), queue, visibility_timeout=2)
    worker = threading.Thread(target=first.run_once)
    worker.start()
    time.sleep(1.3)  # the lock has run out: the second worker receives the message
    assert second.run_once() == 1
    worker.join()

    assert (first.stats.completed, first.stats.faulted, first.stats.lost_locks) == (0, 1, 1)
    # The second stored nothing: the first had; it replayed the message as a duplicate.
    assert (second.stats.duplicates, second.stats.completed, second.stats.lost_locks) == (1, 0, 0)
    processor = Processor(tally, table, InMemoryPublisher())
    assert [(v.version, v.message_id) for v in processor.history(key)] == [(1, "m-1")]
    assert processor.current_state(key).state == Tally(3, ["m-1"])
    assert [m.body for m in publisher.deliveries] == [{"total": 3, "by": "m-1"}] * 2
    assert len({m.encode() for m in publisher.deliveries}) == 1
    assert publisher.divergent == []
    assert drain(queue) == []


def test_locks_are_renewed_for_work_that_outlasts_them(
    table: TableClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    processor = Processor(tally, table, InMemoryPublisher())
    send(queue, add(1, key, 3, "Slow", seconds=3))
    consumer = QueueConsumer(processor, queue, visibility_timeout=2)
    rival = QueueConsumer(Processor(tally, table, InMemoryPublisher()), queue, visibility_timeout=2)
    stopper = threading.Timer(3.5, consumer.stop)
    stopper.start()
    seen_by_rival: list[int] = []

    def watch() -> None:  # a rival receiving all along
        for _ in range(6):
            time.sleep(0.5)
            seen_by_rival.append(rival.run_once())

    watcher = threading.Thread(target=watch)
    watcher.start()
    stats = consumer.run(idle_wait=0.2)
    watcher.join()
    stopper.cancel()

    assert stats.completed == 1
    assert stats.lost_locks == 0
    assert stats.renewed >= 2
    assert sum(seen_by_rival) == 0  # never visible while in hand
    assert processor.current_state(key).version == 1


def test_a_scheduled_message_comes_no_earlier_than_due_and_acts_once(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    order = f"o-{uuid.uuid4().hex[:8]}"
    out = f"{queue.queue_name}-out"
    # The timeout goes back to the input queue; the other outputs to their own.
    publisher = QueuePublisher(queues, {"PaymentTimeout": queue.queue_name}, default=out)
    processor = Processor(orders, table, publisher)
    place = Message("place-1", order, "PlaceOrder", {"amount": 30, "pay_within_seconds": 3})
    send(queue, place)
    send(queue, place)  # delivered twice: the timeout is scheduled twice, with one id
    # One message a page: the copies are processed apart, and each sends the timeout.
    consumer = QueueConsumer(processor, queue, backoff=timedelta(0), page_size=1)

    first = consumer.run_once() + consumer.run_once()
    placed_at = processor.current_state(order)
    assert first == 2
    assert placed_at.state == Order("placed", 30)
    assert consumer.run_once() == 0  # both timeouts are hidden until due
    deadline = time.monotonic() + 20
    while consumer.stats.received < 4:  # both copies of the timeout, each when due
        assert time.monotonic() < deadline, f"the timeouts never came: {consumer.stats}"
        consumer.run_once()
        time.sleep(0.2)

    history = list(processor.history(order))
    assert [(v.version, v.message_type, v.state.status) for v in history] == [
        (1, "PlaceOrder", "placed"),
        (2, "PaymentTimeout", "cancelled"),
    ]
    assert history[1].now >= history[0].now + timedelta(seconds=3)  # not before it was due
    assert (consumer.stats.completed, consumer.stats.duplicates) == (2, 2)
    # The timeout's duplicate publishes its output again, identical: one id, one effect.
    cancelled = [read_queue_text(t) for t in drain(queues.get_queue_client(out))]
    expected = Message(cancelled[0].id, order, "OrderCancelled", {"order": order, "amount": 30})
    assert cancelled == [expected, expected]


def test_a_payment_before_the_timeout_makes_the_timeout_do_nothing(table: TableClient) -> None:
    order = f"o-{uuid.uuid4().hex[:8]}"
    publisher = InMemoryPublisher()
    processor = Processor(orders, table, publisher)
    processor.process(Message("place-1", order, "PlaceOrder", {"amount": 9}))
    [timeout] = publisher.deliveries
    assert timeout.type == "PaymentTimeout"
    assert timeout.due is not None
    processor.process(Message("pay-1", order, "PayOrder"))
    processor.process(timeout)

    assert processor.current_state(order).state == Order("paid", 9)
    assert [m.type for m in publisher.deliveries] == ["PaymentTimeout", "OrderPaid"]


def test_a_scheduled_message_sent_without_its_delay_is_deferred_until_due(
    table: TableClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    processor = Processor(tally, table, InMemoryPublisher())
    due = datetime.now(UTC) + timedelta(seconds=2)
    send(queue, Message("m-1", key, "Add", {"n": 1}, due=due))
    consumer = QueueConsumer(processor, queue)

    assert consumer.run_once() == 1
    assert consumer.stats.deferred == 1
    assert processor.current_state(key).version == 0
    time.sleep(2.5)
    assert consumer.run_once() == 1
    [version] = processor.history(key)
    assert version.now >= due
    assert consumer.stats.completed == 1


WORKER = Path(__file__).with_name("queue_worker.py")


def test_a_worker_killed_between_its_store_and_its_delete(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient, tmp_path: Path,
    connection_string: str,
) -> None:  # fmt: skip
    key = f"k-{uuid.uuid4().hex[:8]}"
    out = f"{queue.queue_name}-out"
    send(queue, add(1, key, 6))
    marker = tmp_path / "published"
    worker = subprocess.Popen(
        [sys.executable, str(WORKER), table.table_name, queue.queue_name, out, str(marker)],
        env={**os.environ, "STREAMSTONE_CONNECTION_STRING": connection_string},
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists():
            assert worker.poll() is None, "the worker ended before it published"
            assert time.monotonic() < deadline, "the worker never published"
            time.sleep(0.05)
        os.kill(worker.pid, signal.SIGKILL)  # stored and published, not deleted
    finally:
        worker.wait()
    processor = Processor(tally, table, QueuePublisher(queues, lambda m: out))
    consumer = QueueConsumer(processor, queue)
    assert consumer.run_once() == 0  # still locked by the dead worker
    deadline = time.monotonic() + 10
    while consumer.run_once() == 0:  # until its lock (2 s, maybe just renewed) runs out
        assert time.monotonic() < deadline, "the message never came back"
        time.sleep(0.2)

    assert (consumer.stats.duplicates, consumer.stats.completed) == (1, 0)
    assert [(v.version, v.message_id) for v in processor.history(key)] == [(1, "m-1")]
    texts = drain(queues.get_queue_client(out))
    assert len(texts) == 2
    assert texts[0] == texts[1]
    assert read_queue_text(texts[0]).body == {"total": 6, "by": "m-1"}
    assert drain(queue) == []


def test_sigterm_stops_after_the_messages_in_hand(table: TableClient, queue: QueueClient) -> None:
    tag = uuid.uuid4().hex[:8]
    processor = Processor(tally, table, InMemoryPublisher())
    send(queue, add(1, f"a-{tag}", 1, "Slow", seconds=1.5))
    consumer = QueueConsumer(processor, queue)
    killer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    previous = signal.getsignal(signal.SIGTERM)
    killer.start()
    with consumer.stop_on_signals():
        started = time.monotonic()
        stats = consumer.run(idle_wait=0.1)
    assert time.monotonic() - started < 5
    assert signal.getsignal(signal.SIGTERM) is previous
    assert (stats.received, stats.completed) == (1, 1)
    assert processor.current_state(f"a-{tag}").state == Tally(1, ["m-1"])


def test_keys_not_started_when_stopping_are_released_at_once(
    table: TableClient, queue: QueueClient
) -> None:
    tag = uuid.uuid4().hex[:8]
    processor = Processor(tally, table, InMemoryPublisher())
    keys = [f"k{n}-{tag}" for n in range(3)]
    for n, key in enumerate(keys):
        send(queue, add(n, key, n, "Slow", seconds=1))
    consumer = QueueConsumer(processor, queue, workers=1)  # one key at a time
    threading.Timer(0.3, consumer.stop).start()

    stats = consumer.run()

    assert (stats.received, stats.completed) == (3, 1)
    rest = QueueConsumer(Processor(tally, table, InMemoryPublisher()), queue)
    assert rest.run(until_empty=True).completed == 2  # visible again at once, not after 30 s
    assert sorted(processor.current_state(k).version for k in keys) == [1, 1, 1]


def test_a_consumer_gives_a_processor_without_a_cache_its_own_and_keeps_one_given(
    connection_string: str, table: TableClient, queue: QueueClient
) -> None:
    from handlers import HeaderCache
    from tests.test_handlers_cache import counted

    client, plan = counted(connection_string, table)
    publisher = InMemoryPublisher()
    processor = Processor(tally, client, publisher)
    consumer = QueueConsumer(processor, queue)
    assert isinstance(processor.cache, HeaderCache)  # the processor's own from now on
    tag = uuid.uuid4().hex[:8]
    keys = [f"k{n}-{tag}" for n in range(5)]
    for n, key in enumerate(keys, start=1):
        send(queue, add(n, key, n))

    stats = consumer.run(until_empty=True)

    assert (stats.received, stats.completed, stats.duplicates, stats.poisoned) == (5, 5, 0, 0)
    assert plan.requests == 5  # a new key: one request (without the cache: a read and a write)
    assert states(processor, *keys) == {
        key: (1, Tally(n, [f"m-{n}"])) for n, key in enumerate(keys, start=1)
    }
    assert sorted((m.key, m.body) for m in publisher.deliveries) == [
        (key, {"total": n, "by": f"m-{n}"}) for n, key in enumerate(keys, start=1)
    ]
    mine = HeaderCache(max_entries=10)
    given = Processor(tally, client, publisher, cache=mine)
    assert QueueConsumer(given, queue).processor.cache is mine
