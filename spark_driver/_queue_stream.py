"""The pipeline on an Azure Storage Queue: messages in from a queue source,
each micro-batch written, its outputs sent to queues, then its queue messages
completed. A message is deleted only once its batch's results are written and
its outputs sent; one whose outcome is abandoned or faulted is made visible
again (after a backoff) instead, and poisoned on its last allowed receive.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Final

import pyspark
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ._queues._sink import Delivery, OutputRoute
from ._settings import JobSettings, resolve_handler
from ._stream import RECEIPT, BatchSink, Settle, process_stream, run_query
from ._summary import Summary
from ._tasks._executor import RESULT_SCHEMA

__all__ = [
    "QueueSourceUnavailable", "queue_source_missing", "read_queue", "register_queue_source",
    "run_queue",
]  # fmt: skip

#: Seconds an abandoned or faulted message stays hidden before it comes
#: again, doubled on each receive (as the queue consumer's backoff).
RETRY_BACKOFF: Final = 1
#: The receive on which a message still not completed is poisoned.
MAX_DEQUEUE_COUNT: Final = 5


class QueueSourceUnavailable(RuntimeError):
    """This PySpark has no Python data source API (PySpark 3.5)."""


def queue_source_missing() -> str | None:
    """Why the queue source cannot run on this PySpark, or None when it can."""
    if importlib.util.find_spec("pyspark.sql.datasource") is not None:
        return None
    return (
        f"the queue source needs PySpark 4 (its Python data source API, "
        f"pyspark.sql.datasource); this is PySpark {pyspark.__version__}"
    )


def register_queue_source(spark: SparkSession) -> None:
    """Make ``spark.readStream.format("azure-queue")`` available in ``spark``;
    :class:`QueueSourceUnavailable` on PySpark 3.5."""
    missing = queue_source_missing()
    if missing is not None:
        raise QueueSourceUnavailable(missing)
    from ._queues._source import QueueDataSource

    spark.dataSource.register(QueueDataSource)


def read_queue(
    spark: SparkSession,
    queue: str,
    *,
    max_messages: int = 1000,
    visibility_timeout: int = 300,
    max_dequeue_count: int = MAX_DEQUEUE_COUNT,
    partitions: int = 4,
    settings: JobSettings | None = None,
) -> DataFrame:
    """The messages of ``queue`` as a streaming DataFrame (columns:
    ``QUEUE_SCHEMA``), each received with a lock of ``visibility_timeout``
    seconds that must outlast its micro-batch. The source deletes nothing:
    :func:`run_queue` completes each message once its batch is written.
    With the job's ``settings``, a message received more than
    ``max_dequeue_count`` times is looked up in its table: stored, it is
    read (a duplicate) rather than poisoned."""
    register_queue_source(spark)
    from ._queues._source import NAME, QueueOptions

    options = QueueOptions(
        queue, max_messages, visibility_timeout, max_dequeue_count, partitions,
        table=None if settings is None else settings.table,
        handler=None if settings is None else resolve_handler(settings.handler).name,
        transport="wire" if settings is None else settings.transport,
    )  # fmt: skip
    return spark.readStream.format(NAME).options(**options.options()).load()


def _receipts(frame: DataFrame) -> DataFrame:
    """One :data:`RECEIPT` row per queue message, in the results' columns."""
    receipt = F.to_json(
        F.struct(
            F.col("queue_message_id").alias("id"),
            F.col("pop_receipt").alias("popReceipt"),
            F.col("dequeue_count").alias("dequeueCount"),
            F.col("queue_text").alias("text"),
        )
    )
    given = {"kind": F.lit(RECEIPT), "message_id": F.col("message_id"), "key": F.col("key"),
             "body": receipt}  # fmt: skip
    return frame.select(
        *(given.get(f.name, F.lit(None).cast(f.dataType)).alias(f.name) for f in RESULT_SCHEMA)
    )


def run_queue(
    spark: SparkSession,
    queue: str,
    output: str,
    checkpoint: str,
    settings: JobSettings,
    *,
    output_format: str = "parquet",
    partitions: int = 8,
    order_by: str | None = None,
    output_queues: OutputRoute | None = None,
    trigger: timedelta | None = None,
    stop: threading.Event | None = None,
    max_messages: int = 1000,
    visibility_timeout: int = 300,
    max_dequeue_count: int = MAX_DEQUEUE_COUNT,
    retry_backoff: int = RETRY_BACKOFF,
    on_batch: Callable[[int, Summary], None] | None = None,
    on_delivery: Callable[[int, Delivery], None] | None = None,
    query_name: str | None = None,
) -> list[tuple[int, Summary]]:
    """Process ``queue`` until a micro-batch finds it empty; with ``trigger``,
    a micro-batch every such interval until ``stop`` is set (the batch in
    progress finishes first).

    Each batch is written to ``{output}/batch={id}``; then its outputs are
    sent to ``output_queues``; then each of its queue messages is deleted,
    or, abandoned or faulted, made visible again after ``retry_backoff``
    seconds doubled per receive (poisoned to ``<queue>-poison`` on its
    ``max_dequeue_count``-th receive). A batch that
    fails before that deletes nothing: its messages come again once their
    lock runs out, as duplicates of what was stored, with the same outputs,
    sent again (consumers de-duplicate by id). The Queue service's faults
    (a throttled delete, a receive without an answer...) pause the call and
    try it again: they never fail a batch nor cost a receive; and a message
    received more than ``max_dequeue_count`` times whose processing is
    stored in ``settings.table`` is read as a duplicate, not poisoned.
    ``on_delivery(batch_id, delivery)`` tells what each batch did on queues.
    """
    frame = read_queue(
        spark, queue, max_messages=max_messages, visibility_timeout=visibility_timeout,
        max_dequeue_count=max_dequeue_count, settings=settings,
    )  # fmt: skip
    settings = dataclasses.replace(settings, source="queue")
    from ._queues._source import AVAILABLE_NOW

    results = process_stream(frame, settings, partitions, order_by)
    plan = results.unionByName(_receipts(frame))
    sink = BatchSink(
        output, output_format, settings, partitions, route=output_queues,
        settle=Settle(queue, max_dequeue_count, retry_backoff),
        on_batch=on_batch, on_delivery=on_delivery,
    )  # fmt: skip
    while True:
        done = len(sink.summaries)
        run_query(plan, sink, checkpoint, trigger=trigger, stop=stop, query_name=query_name)
        # Before PySpark 4.2 an availableNow query over this source runs one
        # batch: run again until one finds the queue empty.
        if AVAILABLE_NOW or trigger is not None or len(sink.summaries) == done:
            return sink.summaries
        if stop is not None and stop.is_set():
            return sink.summaries
