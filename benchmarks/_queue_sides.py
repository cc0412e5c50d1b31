"""The two sides of the queue benchmark over the same messages: the consumer
(on each processor: the wire runner's client with the consumer's header
cache or without it, or the SDK's table client) and the bare
receive-and-delete loop, each run checked for what it must leave behind."""

from __future__ import annotations

import base64
import contextlib
import cProfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from _common import check, log
from _queue_meter import (
    Meter,
    Run,
    Servers,
    TimedProcessor,
    TimedQueue,
    TimedTransport,
    TimedWire,
    Timers,
    profiled,
    queue_kind,
)
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient, TableServiceClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    HandlerContext,
    InMemoryPublisher,
    Message,
    QueueConsumer,
    encode_envelope,
    handler,
)

PAGE = 32
VISIBILITY = 30


@dataclass
class Count:
    n: int = 0


@handler("Count", Count, types=["Add"])
def count(state: Count, message: Message, ctx: HandlerContext) -> None:
    state.n += 1
    ctx.publish("Counted", {"n": state.n, "by": message.id})


def texts_for(messages: int) -> list[str]:
    """The queue messages' texts: base64 envelopes, each message on a key of its own."""
    return [
        base64.b64encode(
            encode_envelope(Message(f"m-{n}", f"k-{n}", "Add", {"n": n})).encode()
        ).decode()
        for n in range(messages)
    ]


#: The processor: on the wire runner's client (the default of ``TableConfig``)
#: with the consumer's own ``HeaderCache``, the same without it, or on
#: the SDK's ``TableClient`` as ``TableClient.from_connection_string`` builds it.
TableKind = Literal["wire", "nocache", "sdk"]


class Bench:
    """Runs over ``texts`` in rounds of ``depth`` messages: Azurite's Queue
    service spends time per request in proportion to the messages a queue
    holds (a service's queue does not), so the queue is never deeper than that."""

    def __init__(self, connection_string: str, texts: list[str], workers: int, depth: int) -> None:
        self.connection_string = connection_string
        self.service = QueueServiceClient.from_connection_string(connection_string)
        self.tables = TableServiceClient.from_connection_string(connection_string)
        self.texts = texts
        self.workers = workers
        self.depth = depth
        self.rounds = [texts[i : i + depth] for i in range(0, len(texts), depth)]
        self.servers = Servers(connection_string)
        #: Deletes refused (404) per run at most: the SDK retries a delete whose
        #: answer was lost, and the retry finds the message gone.
        self.refused = max(2, len(texts) // 200)

    # --- not timed ------------------------------------------------------------------

    def queue(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:12]}"
        self.service.create_queue(name)
        return name

    def fill(self, name: str, texts: list[str]) -> None:
        """Send ``texts`` to the empty queue. A send the SDK retried after it had
        gone through leaves a copy: then the queue is cleared and filled again."""
        queue = self.service.get_queue_client(name)
        for attempt in (1, 2, 3):
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(queue.send_message, texts))
            held = queue.get_queue_properties().approximate_message_count
            if held == len(texts) or attempt == 3:
                check(held == len(texts), f"queue {name} holds {held} of {len(texts)} sent")
                return
            log(f"queue {name} holds {held} messages of {len(texts)} sent; filling it again")
            queue.clear_messages()

    def emptied(self, name: str) -> None:
        """Check that the run left nothing on the queue (nor poisoned anything), then drop it."""
        queue = self.service.get_queue_client(name)
        left = queue.get_queue_properties().approximate_message_count
        check(left == 0, f"{left} messages left on {name}")
        queue.delete_queue()
        with contextlib.suppress(ResourceNotFoundError):
            poisoned = self.service.get_queue_client(f"{name}-poison")
            count = poisoned.get_queue_properties().approximate_message_count
            check(count == 0, f"{count} messages poisoned from {name}")
            poisoned.delete_queue()

    def client(self, name: str, timers: Timers) -> QueueClient:
        queue = TimedQueue.from_connection_string(
            self.connection_string, name, transport=TimedTransport(timers, queue_kind)
        )
        queue.timers = timers
        return queue

    def table(self, name: str, kind: TableKind, timers: Timers) -> TableClient:
        if kind in ("wire", "nocache"):
            wire = TimedWire.from_connection_string(self.connection_string, name)
            wire.timers = timers
            return wire
        transport = TimedTransport(timers, lambda _: "process.table")
        return TableClient.from_connection_string(self.connection_string, name, transport=transport)

    # --- the sides ------------------------------------------------------------------

    def consumer(self, kind: TableKind, profile: list[cProfile.Profile] | None = None) -> Run:
        name = self.queue()
        table_name = "benchqueue" + uuid.uuid4().hex[:8]
        self.tables.create_table(table_name)
        timers = Timers()
        table = self.table(table_name, kind, timers)
        publisher = InMemoryPublisher()
        processor = TimedProcessor(count, table, publisher)
        processor.timers = timers
        consumer = QueueConsumer(
            processor, self.client(name, timers), workers=self.workers, page_size=PAGE,
            visibility_timeout=VISIBILITY,
        )  # fmt: skip
        if kind == "nocache":  # the reference: the consumer's own HeaderCache taken away
            processor.cache = None
        meter = Meter(self.servers)
        for texts in self.rounds:
            self.fill(name, texts)
            with meter.timed(len(texts)), profiled(profile):
                consumer.run(until_empty=True)
        stats = consumer.stats  # every run's: a run returns its own figures only
        n = len(self.texts)
        check(stats.received == n, f"consumer: received {stats.received} of {n}")
        # A delete refused as a lost lock is faulted; its message was deleted all the same.
        done = stats.completed + stats.lost_locks
        check(
            done == n, f"consumer: {stats.completed} completed and {stats.lost_locks} lost of {n}"
        )
        check(stats.faulted == stats.lost_locks <= self.refused, f"consumer: {stats}")
        trouble = ("abandoned", "poisoned", "deferred", "receive_errors")
        check(not any(getattr(stats, t) for t in trouble), f"consumer: {stats}")
        if stats.lost_locks:
            log(f"  consumer: {stats.lost_locks} deletes refused after a retry")
        check(len(publisher.messages) == n, f"consumer: {len(publisher.messages)} outputs of {n}")
        check(not publisher.divergent, "consumer: an output was published with two contents")
        for k in range(0, n, max(1, n // 20)):
            state = processor.current_state(f"k-{k}")
            check(state.version == 1 and state.state == Count(1), f"k-{k}: {state}")
        self.emptied(name)
        table.close()
        self.tables.delete_table(table_name)
        return Run(n / meter.wall, meter.wall, {**timers.seconds, **meter.seconds}, meter.disturbed)

    def bare(self) -> Run:
        name = self.queue()
        timers = Timers()
        queue = self.client(name, timers)
        seen: list[str] = []
        refused: list[str] = []

        def delete(message: Any) -> None:
            try:
                queue.delete_message(message.id, message.pop_receipt)
            except ResourceNotFoundError:  # as the consumer counts a lost lock
                refused.append(message.id)

        meter = Meter(self.servers)
        for texts in self.rounds:
            self.fill(name, texts)
            with meter.timed(len(texts)), ThreadPoolExecutor(self.workers, "bare-delete") as pool:
                while page := list(
                    queue.receive_messages(
                        messages_per_page=PAGE, max_messages=PAGE, visibility_timeout=VISIBILITY
                    )
                ):
                    seen += (m.content for m in page)
                    for future in [pool.submit(delete, m) for m in page]:
                        future.result()
        check(sorted(seen) == sorted(self.texts), f"bare: received {len(seen)} messages")
        check(len(refused) <= self.refused, f"bare: {len(refused)} deletes refused")
        if refused:
            log(f"  bare: {len(refused)} deletes refused after a retry")
        self.emptied(name)
        rate = len(seen) / meter.wall
        return Run(rate, meter.wall, {**timers.seconds, **meter.seconds}, meter.disturbed)
