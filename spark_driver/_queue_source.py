"""A Structured Streaming source of Azure Storage Queue messages (PySpark 4's
Python data source API; PySpark 3.5 has none, see ``_queue_stream``).

Peek-lock over micro-batches. ``latestOffset`` receives up to
``maxMessagesPerBatch`` messages with a visibility timeout, the lock, which
must outlast a micro-batch; the reader keeps them, in the Python process
Spark runs the source's driver side in, under the next batch number, and
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
sent. A scheduled message received before its due time is hidden again
until then. Deleting is not done in ``commit``: Spark commits a batch's
offset only once the next batch is planned, so a run's last batch would
never be committed.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
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

from handlers import PoisonEntry, Refused, admit_text

from ._queue_config import MAX_HIDDEN, check_input_queue, lost_lock, poison, queue_service
from ._rows import body_json

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # PySpark 4.0 and 4.1: an availableNow query runs one batch

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stands in for the mixin of PySpark 4.2 and later."""

    AVAILABLE_NOW = False
else:
    AVAILABLE_NOW = True

__all__ = ["AVAILABLE_NOW", "NAME", "QUEUE_SCHEMA", "QueueDataSource", "QueueOptions"]

#: The format name: ``spark.readStream.format("azure-queue").option("queue", ...)``.
NAME: Final = "azure-queue"
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

#: Each ``readStream`` option, and the :class:`QueueOptions` field it sets.
_OPTIONS: Final = {
    "queue": "queue",
    "maxMessagesPerBatch": "max_messages",
    "visibilityTimeout": "visibility_timeout",
    "maxDequeueCount": "max_dequeue_count",
    "numPartitions": "partitions",
}


@dataclass(frozen=True)
class QueueOptions:
    """The source's options; each also a ``readStream`` option (camel case)."""

    queue: str
    #: At most this many messages per micro-batch, received 32 at a time.
    max_messages: int = 1000
    #: Seconds each message stays hidden once received: the lock, which
    #: must outlast a micro-batch (or the message comes again meanwhile).
    visibility_timeout: int = 300
    #: A message received more often than this without being completed is poisoned.
    max_dequeue_count: int = 5
    #: How many partitions each batch's messages are cut into (in their order).
    partitions: int = 4

    def __post_init__(self) -> None:
        check_input_queue(self.queue)
        for name, low, high in (
            ("max_messages", 1, None),
            ("visibility_timeout", 1, MAX_HIDDEN),
            ("max_dequeue_count", 1, None),
            ("partitions", 1, None),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
            if high is not None and value > high:
                raise ValueError(f"{name} must be at most {high}, got {value}")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> QueueOptions:
        """From a reader's string options, their names in any case."""
        known = {option.lower(): name for option, name in _OPTIONS.items()}
        given = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(set(given) - set(known) - {"path"})
        if unknown:
            raise ValueError(f"unknown {NAME} options {unknown}; it takes {list(_OPTIONS)}")
        if "queue" not in given:
            raise ValueError(f'the {NAME} source needs .option("queue", NAME)')
        values: dict[str, Any] = {"queue": given["queue"]}
        for option, name in known.items():
            if option in given and name != "queue":
                try:
                    values[name] = int(given[option])
                except ValueError:
                    raise ValueError(
                        f"option {option} must be an integer, got {given[option]!r}"
                    ) from None
        return cls(**values)

    def options(self) -> dict[str, str]:
        """The ``readStream`` options that give these."""
        return {option: str(getattr(self, name)) for option, name in _OPTIONS.items()}


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
        received = queue.receive_messages(
            messages_per_page=32,
            max_messages=self.options.max_messages,
            visibility_timeout=self.options.visibility_timeout,
        )
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
        if count > self.options.max_dequeue_count:
            admitted: Any = Refused(
                f"received {count} times, more than maxDequeueCount="
                f"{self.options.max_dequeue_count}, without being completed"
            )
        else:
            admitted = admit_text(content, default_id=received.id)
        try:
            if isinstance(admitted, Refused):
                entry = PoisonEntry(admitted.reason, text or "", queue.queue_name, received.id,
                                    count)  # fmt: skip
                poison(queue, entry, received.pop_receipt or "")
                return None
            message = admitted
            wait = 0.0 if message.due is None else (message.due - datetime.now(UTC)).total_seconds()
            if wait > 0:  # sent without its delay, or this clock is behind the sender's
                hidden = min(MAX_HIDDEN, math.ceil(wait))
                queue.update_message(received.id, received.pop_receipt, visibility_timeout=hidden)
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


def _utf8(content: Any) -> str | None:
    try:
        return bytes(content).decode("utf-8")
    except (UnicodeDecodeError, TypeError):
        return None
