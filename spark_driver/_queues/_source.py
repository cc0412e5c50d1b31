"""A Structured Streaming source of Azure Storage Queue messages (PySpark 4's
Python data source API; PySpark 3.5 has none, see ``_queue_stream``).

Peek-lock over micro-batches. ``latestOffset`` receives up to
``maxMessagesPerBatch`` messages with a visibility timeout, the lock, which
must outlast a micro-batch (pages of 32, several in flight: ``_fanout``);
the reader keeps them, in the Python process Spark runs the source's driver
side in, under the next batch number, and
returns ``{"run": R, "batch": N}`` (none received: the offset it was given,
so no batch runs). ``partitions`` hands the held rows of the batches in
``(start, end]`` to the tasks inside the partitions; ``read`` yields them.

Each reader numbers its batches under its own run id, so a batch that Spark
replays from its offset log after a restart names a run that no reader holds
any more: it gets no rows. Its messages were never deleted (that happens only
once a batch's results are written, in the pipeline's sink), so they become
visible when their lock runs out and come in a later batch, where the
handlers runtime recognises those it stored as duplicates.

A text that cannot become a message (the admission every entry shares,
``handlers.admit_text``: whatever it holds and whatever fails), or a message
received more than ``maxDequeueCount`` times without being completed, goes
to the poison queue ``<queue>-poison`` with its reason and text, here, alone,
and never reaches a batch: every row of a batch can be encoded, stored and
sent. Received too often but stored in the job's table (options ``table``
and ``handler``, which ``run_queue`` sets), a message goes into the batch,
as a duplicate: the queue lost its receives, not the handler. A message this
reader poisoned whose delete found its lock lost comes again: it is then
deleted, not poisoned again (the last ``REMEMBERED`` ids). The Queue
service's faults are waited out (``queue_call``), never poison. A scheduled
message received before its due time is hidden again until then. Deleting
is not done in ``commit``: Spark commits a batch's offset only once the next
batch is planned, so a run's last batch would never be committed.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any, Final

from azure.core.exceptions import HttpResponseError
from azure.storage.queue import QueueClient, QueueMessage
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import (
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from handlers import Message, PoisonEntry, Refused, StateStore, admit_text
from streamstone_py import RetryPolicy

from .._tasks._rows import body_json
from .._tasks._worker import storage, table_client
from ._config import MAX_HIDDEN, delete, lost_lock, queue_call, queue_service, send_poison
from ._fanout import receive
from ._options import NAME, QueueOptions

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # PySpark 4.0 and 4.1: an availableNow query runs one batch

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stands in for the mixin of PySpark 4.2 and later."""

    AVAILABLE_NOW = False
else:
    AVAILABLE_NOW = True

__all__ = ["AVAILABLE_NOW", "NAME", "QUEUE_SCHEMA", "QueueDataSource", "QueueOptions"]

#: The rows of the source: the message's columns as the pipeline reads them,
#: the queue message's own, and its text (parsed again by the executors).
QUEUE_SCHEMA: Final = StructType(
    [
        StructField("message_id", StringType(), False),
        StructField("key", StringType(), False),
        StructField("type", StringType(), False),
        StructField("body", StringType()),  # JSON text; bytes as {"$base64": ...}
        StructField("headers", MapType(StringType(), StringType())),
        StructField("inserted_on", TimestampType()),  # when the queue took it: --sent-at
        StructField("due", TimestampType()),  # a scheduled message's
        StructField("produced", TimestampType()),  # when first produced: --sent-at
        StructField("dequeue_count", IntegerType()),
        StructField("queue_message_id", StringType()),
        StructField("pop_receipt", StringType()),
        StructField("queue_text", StringType()),
    ]
)

_log = logging.getLogger(__name__)

#: How many ids of messages it poisoned, whose delete failed, a reader remembers.
REMEMBERED: Final = 10_000


class QueueDataSource(DataSource):
    """``spark.dataSource.register(QueueDataSource)``, then
    ``spark.readStream.format("azure-queue").option("queue", NAME).load()``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return QUEUE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return QueueStreamReader(QueueOptions.from_options(self.options))


class QueueStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Receives with a lock in ``latestOffset``; holds each batch until ``commit``.

    Spark also makes one in each task only to call :meth:`read`, so making
    one connects to nothing.
    """

    def __init__(self, options: QueueOptions) -> None:
        self.options = options
        self._run = uuid.uuid4().hex[:12]
        self._batch = 0
        self._held: dict[int, list[tuple[Any, ...]]] = {}
        self._offset: dict[str, Any] = {"run": self._run, "batch": 0}
        self._queue: QueueClient | None = None
        self._store: StateStore | None = None
        #: Queue message id -> the receive that poisoned it (its delete failed).
        self._poisoned: OrderedDict[str, int] = OrderedDict()

    def initialOffset(self) -> dict[str, Any]:
        return {"run": self._run, "batch": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        """An availableNow query ends at the first batch that finds the queue empty."""

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        """The next batch's offset, or the one it was given when no message came.

        (PySpark 4.0 and 4.1 call it without arguments.)"""
        if start is not None:
            self._offset = start
        rows = self._receive()
        if not rows:
            return self._offset
        self._batch += 1
        self._held[self._batch] = rows
        self._offset = {"run": self._run, "batch": self._batch}
        return self._offset

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if end.get("run") != self._run:
            return []  # an earlier run's batch, replayed: its messages come again
        after = start.get("batch", 0) if start.get("run") == self._run else 0
        batches = [n for n in sorted(self._held) if after < n <= end["batch"]]
        rows = [row for n in batches for row in self._held[n]]
        size = math.ceil(len(rows) / self.options.partitions) or 1
        # Contiguous slices: a partition's place then its rows' keep the received order.
        return [InputPartition(rows[i : i + size]) for i in range(0, len(rows), size)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        yield from partition.value

    def commit(self, end: dict[str, Any]) -> None:
        """Forget the batches up to ``end``: the sink completed their messages."""
        if end.get("run") == self._run:
            for n in [n for n in self._held if n <= end["batch"]]:
                del self._held[n]

    def stop(self) -> None:
        self._held.clear()

    def _client(self) -> QueueClient:
        if self._queue is None:
            self._queue = queue_service().get_queue_client(self.options.queue)
        return self._queue

    def _receive(self) -> list[tuple[Any, ...]]:
        queue = self._client()
        received = receive(queue, self.options.max_messages, self.options.visibility_timeout)
        rows: list[tuple[Any, ...]] = []
        for message in received:
            try:
                row = self._admit(queue, message)
            except Exception:  # one message's trouble never stops the query
                _log.exception("queue message %r: left for its lock to run out", message.id)
                continue
            if row is not None:
                rows.append(row)
        return rows

    def _admit(self, queue: QueueClient, received: QueueMessage) -> tuple[Any, ...] | None:
        """The message's row, or None when it was poisoned or hidden until due."""
        content, count = received.content, received.dequeue_count or 1
        text = content if isinstance(content, str) else _utf8(content)
        receipt = received.pop_receipt or ""
        if received.id in self._poisoned:
            _log.warning("poisoned queue message %r on receive %d: already in the poison "
                         "queue (sent on receive %d, its delete failed): deleted now, not sent "
                         "again", received.id, count, self._poisoned[received.id])  # fmt: skip
            if delete(queue, received.id, receipt):
                del self._poisoned[received.id]
            return None
        admitted: Message | Refused = admit_text(content, default_id=received.id)
        if count > self.options.max_dequeue_count and not (
            isinstance(admitted, Message) and self._stored(admitted)
        ):
            admitted = Refused(
                f"received {count} times, more than maxDequeueCount="
                f"{self.options.max_dequeue_count}, without being completed"
            )
        try:
            if isinstance(admitted, Refused):
                entry = PoisonEntry(admitted.reason, text or "", queue.queue_name, received.id,
                                    count)  # fmt: skip
                self._poison(queue, entry, receipt)
                return None
            message = admitted
            wait = 0.0 if message.due is None else (message.due - datetime.now(UTC)).total_seconds()
            if wait > 0:  # sent without its delay, or this clock is behind the sender's
                hidden = min(MAX_HIDDEN, math.ceil(wait))
                queue_call(partial(queue.update_message, received.id, receipt,
                                   visibility_timeout=hidden),
                           f"deferring queue message {received.id!r}")  # fmt: skip
                return None
        except HttpResponseError as exc:
            if not lost_lock(exc):
                raise
            _log.info("queue message %r: lock lost (%s)", received.id, exc.message)
            return None
        return (
            message.id, message.key, message.type, body_json(message.body), dict(message.headers),
            received.inserted_on, message.due, message.produced, count, received.id,
            received.pop_receipt, text,
        )  # fmt: skip

    def _poison(self, queue: QueueClient, entry: PoisonEntry, pop_receipt: str) -> None:
        """Poison, then delete; remembered until deleted, so never poisoned twice."""
        if not send_poison(queue, entry):
            return  # kept: it comes again when its lock runs out
        self._poisoned[entry.queue_message_id] = entry.dequeue_count
        while len(self._poisoned) > REMEMBERED:
            self._poisoned.popitem(last=False)
        if delete(queue, entry.queue_message_id, pop_receipt):
            del self._poisoned[entry.queue_message_id]
        else:
            _log.info("queue message %r: poisoned, its lock lost before the delete: when it "
                      "comes again, it is deleted, not poisoned again",
                      entry.queue_message_id)  # fmt: skip

    def _stored(self, message: Message) -> bool:
        """Whether the job's table holds the message (False without the
        ``table`` option); the look-up waits out a storage outage."""
        if self.options.table is None or self.options.handler is None:
            return False
        if self._store is None:
            client = table_client(self.options.table, self.options.transport, 1)
            self._store = StateStore(client, self.options.handler, RetryPolicy())
        store = self._store
        return storage.call(
            lambda: store.find(store.partition(message.key), message.id) is not None,
            f"looking up message {message.id!r}",
        )


def _utf8(content: Any) -> str | None:
    try:
        return bytes(content).decode("utf-8")
    except (UnicodeDecodeError, TypeError):
        return None
