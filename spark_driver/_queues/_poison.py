"""A poison queue's entries as a DataFrame, for analysis in a notebook: read
whole on the driver (``handlers.read_poison``), and left in the queue."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from handlers import ShelvedEntry, reason_group
from handlers import read_poison as read_shelf

from .._tasks._rows import body_json
from ._config import check_queue_name, queue_service

__all__ = ["POISON_SCHEMA", "read_poison"]

POISON_SCHEMA: Final = StructType(
    [
        # The poison queue's own message id, and when it took the entry.
        StructField("id", StringType(), False),
        StructField("poisoned_at", TimestampType(), False),
        StructField("reason", StringType()),
        StructField("reason_group", StringType()),
        # How many times the original queue message was received.
        StructField("dequeue_count", IntegerType()),
        # The queue it was poisoned from, and its message id there.
        StructField("queue", StringType()),
        StructField("queue_message_id", StringType()),
        # The original message, when its text reads as one.
        StructField("message_id", StringType()),
        StructField("key", StringType()),
        StructField("type", StringType()),
        StructField("due", TimestampType()),
        StructField("produced", TimestampType()),
        StructField("headers", MapType(StringType(), StringType())),
        StructField("body", StringType()),  # JSON text; bytes as {"$base64": ...}
        # The original text, as received (its beginning, when it was cut).
        StructField("text", StringType()),
        # Why the entry, or the message it holds, does not read; null: both read.
        StructField("error", StringType()),
        # The poison queue message's own text: what an entry that does not read is.
        StructField("entry_text", StringType(), False),
    ]
)


def _row(shelved: ShelvedEntry) -> tuple[Any, ...]:
    entry, message = shelved.entry, shelved.message
    found: tuple[Any, ...] = (None,) * 5
    if entry is not None:
        found = (
            entry.reason, reason_group(entry.reason), entry.dequeue_count, entry.queue,
            entry.queue_message_id,
        )  # fmt: skip
    held: tuple[Any, ...] = (None,) * 7
    if message is not None:
        held = (
            message.id, message.key, message.type, message.due, message.produced,
            dict(message.headers), body_json(message.body),
        )  # fmt: skip
    text = None if entry is None else entry.content
    return (shelved.id, shelved.poisoned_at, *found, *held, text, shelved.error, shelved.text)


def read_poison(
    spark: SparkSession, poison_queue: str, *, hold: timedelta = timedelta(minutes=1)
) -> DataFrame:
    """Every entry of the poison queue ``poison_queue`` (its own name, such as
    ``orders-poison``), oldest first, as a DataFrame of :data:`POISON_SCHEMA`;
    the entries stay in the queue. An entry that does not read, or whose
    text is no message, is a row too, with its ``error``.

    It runs on the driver (a poison queue holds few messages), through
    ``handlers.read_poison``: each entry is received hidden for ``hold``,
    and made visible again once all are read. A poison queue not made yet
    (it is made when a first message is poisoned) gives no rows. The account
    is the environment's, as the job's (``STREAMSTONE_CONNECTION_STRING``...)."""
    check_queue_name(poison_queue, "poison queue")
    entries = read_shelf(queue_service().get_queue_client(poison_queue), hold=hold)
    return spark.createDataFrame([_row(s) for s in entries], POISON_SCHEMA)
