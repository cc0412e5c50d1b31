"""Streaming mode: a file source over an input directory, one job per micro-batch.

The micro-batch sink and the query's run are shared with the queue source
(``_queue_stream``): outputs may go to queues too, and a query may run until
its input is drained (``availableNow``) or on a processing-time trigger until
it is told to stop, letting the micro-batch in progress finish.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from ._arrow import ORDER, number_rows, process_batches
from ._executor import OUTCOME, RESULT_SCHEMA, RETENTION, TASK
from ._input import input_order, message_columns, read_stream
from ._job import write_result
from ._queues import Delivery, OutputRoute, send_outputs, settle_messages
from ._settings import JobSettings
from ._summary import JobResult, Summary

__all__ = [
    "METRICS",
    "RECEIPT",
    "BatchSink",
    "Settle",
    "run_query",
    "run_stream",
    "stop_on_signals",
]

#: The name of the observed metrics each micro-batch reports in its
#: ``StreamingQueryProgress.observedMetrics``.
METRICS: Final = "streamstone"
#: The kind of the rows a queue source adds to a micro-batch beside its
#: results: one per queue message, its receipt in ``body``, to complete it
#: once the batch is written.
RECEIPT: Final = "queue_message"


def _metrics() -> list[Column]:
    """Each micro-batch's figures, named as :class:`Summary` names them."""
    kind, status = F.col("kind"), F.col("status")

    def outcomes(name: str) -> Column:
        return F.count(F.when((kind == OUTCOME) & (status == name), 1))

    def total(of: str, column: str) -> Column:
        return F.coalesce(F.sum(F.when(kind == of, F.col(column))), F.lit(0)).cast("long")

    return [
        F.count(F.when(kind == OUTCOME, 1)).alias("messages_in"),
        outcomes("completed").alias("processed"),
        outcomes("duplicate").alias("duplicates"),
        outcomes("dead_lettered").alias("dead_lettered"),
        outcomes("abandoned").alias("abandoned"),
        outcomes("faulted").alias("faulted"),
        total(OUTCOME, "conflicts").alias("conflicts_retried"),
        total(RETENTION, "version").alias("versions_removed"),
        total(TASK, "requests").alias("requests"),
    ]


def process_stream(
    stream: DataFrame, settings: JobSettings, partitions: int, order_by: str | None = None
) -> DataFrame:
    """The result rows of a streaming DataFrame of messages, observed as :data:`METRICS`.

    The processing is part of the streaming plan (not of ``foreachBatch``),
    so the plan's observed metrics are what each micro-batch did.
    """
    job = settings

    def run(batches: Any) -> Any:
        return process_batches(batches, job, [*names, ORDER])

    order = input_order(stream, order_by)
    names = [f"_order{n}" for n in range(len(order))]
    with warnings.catch_warnings():
        # PySpark 3.5's mapInArrow checks the pandas version with distutils.
        warnings.filterwarnings("ignore", "distutils Version classes", DeprecationWarning)
        messages = stream.select(
            *message_columns(stream, settings.sent_at),
            *(column.alias(name) for column, name in zip(order, names, strict=True)),
        )
        # A streaming plan may not use monotonically_increasing_id: number here.
        numbered = StructType([*messages.schema.fields, StructField(ORDER, LongType(), False)])
        messages = messages.mapInArrow(number_rows, numbered)
        results = messages.repartition(partitions, "key").mapInArrow(run, RESULT_SCHEMA)
    return results.observe(METRICS, *_metrics())


@dataclass(frozen=True)
class Settle:
    """How a micro-batch's queue messages are completed once it is written
    (see :func:`settle_messages`): their queue, the receive that poisons an
    unsettled one, and the seconds it is hidden, doubled per receive."""

    queue: str
    max_dequeue_count: int
    backoff: int


class BatchSink:
    """``foreachBatch``: each micro-batch's results written to
    ``{output}/batch={id}``, then its outputs sent to queues (``route``), then
    its queue messages completed (``settle``), all before Spark records the
    batch as done. ``summaries`` and ``deliveries`` grow by one per batch."""

    def __init__(
        self,
        output: str,
        output_format: str,
        settings: JobSettings,
        partitions: int,
        *,
        route: OutputRoute | None = None,
        settle: Settle | None = None,
        on_batch: Callable[[int, Summary], None] | None = None,
        on_delivery: Callable[[int, Delivery], None] | None = None,
    ) -> None:
        self.output, self.output_format = output, output_format
        self.settings, self.partitions = settings, partitions
        self.route, self.settle = route, settle
        self.on_batch, self.on_delivery = on_batch, on_delivery
        self.summaries: list[tuple[int, Summary]] = []
        self.deliveries: list[tuple[int, Delivery]] = []

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        whole = batch.persist()
        try:
            done = self._write(whole, batch_id)
        finally:
            whole.unpersist()  # a long-running stream would otherwise keep every batch
        if done is None:
            return
        summary, delivery = done
        self.summaries.append((batch_id, summary))
        self.deliveries.append((batch_id, delivery))
        if self.on_batch is not None:
            self.on_batch(batch_id, summary)
        if self.on_delivery is not None:
            self.on_delivery(batch_id, delivery)

    def _write(self, whole: DataFrame, batch_id: int) -> tuple[Summary, Delivery] | None:
        kind = F.col("kind")
        results = whole if self.settle is None else whole.where(kind != RECEIPT)
        result = JobResult.of(results, self.settings, self.partitions)
        # The first action runs the handlers once, in a result stage, whose
        # observed metrics count each task once, whatever attempts failed.
        whole.write.format("noop").mode("overwrite").save()
        receipts = None if self.settle is None else whole.where(kind == RECEIPT)
        if receipts is not None and receipts.isEmpty():
            # Replayed after a restart: the source holds its messages no more
            # (they come again), and what its first run wrote stays as it is.
            return None
        summary = write_result(result, f"{self.output}/batch={batch_id}", self.output_format)
        delivery = Delivery()
        if self.route is not None:
            delivery.add_sent(send_outputs(result.outputs, self.route))
        if self.settle is not None and receipts is not None:
            settle = self.settle
            delivery.add_settled(
                settle_messages(receipts, results, settle.queue, settle.max_dequeue_count,
                                settle.backoff)
            )  # fmt: skip
        return summary, delivery


def run_query(
    results: DataFrame,
    sink: BatchSink,
    checkpoint: str,
    *,
    trigger: timedelta | None = None,
    stop: threading.Event | None = None,
    query_name: str | None = None,
) -> None:
    """Run the streaming query of ``results`` into ``sink``: what is there now
    (``availableNow``), or with ``trigger`` a micro-batch every such interval
    until ``stop`` is set. Stopping lets the micro-batch in progress finish."""
    writer = results.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    if query_name is not None:
        writer = writer.queryName(query_name)
    if trigger is None:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger.total_seconds():g} seconds")
    query: Any = writer.start()
    if stop is None:
        query.awaitTermination()
        return
    while not query.awaitTermination(0.5):
        if stop.is_set():
            # Stopping interrupts a trigger in progress: wait for it to end.
            while query.isActive and query.status["isTriggerActive"]:
                time.sleep(0.1)
            query.stop()
            query.awaitTermination()  # raises if the query had failed
            return


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """While inside, SIGTERM and the first Ctrl-C set ``stop``; a second
    Ctrl-C goes to the handler before this one (which interrupts the run).
    Outside the main thread no handler can be installed: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        previous = before[signal.SIGINT]
        if signum == signal.SIGINT and stop.is_set():
            if callable(previous):
                previous(signum, frame)
                return
            raise KeyboardInterrupt
        if not stop.is_set():
            print("stopping: the micro-batch in progress finishes first (Ctrl-C again "
                  "interrupts it)", file=sys.stderr)  # fmt: skip
        stop.set()

    for signum in before:
        signal.signal(signum, on_signal)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def run_stream(
    spark: SparkSession,
    input_dir: str,
    output: str,
    checkpoint: str,
    settings: JobSettings,
    *,
    input_format: str = "json",
    output_format: str = "parquet",
    partitions: int = 8,
    order_by: str | None = None,
    max_files_per_trigger: int | None = None,
    on_batch: Callable[[int, Summary], None] | None = None,
    query_name: str | None = None,
    output_queues: OutputRoute | None = None,
    trigger: timedelta | None = None,
    stop: threading.Event | None = None,
    on_delivery: Callable[[int, Delivery], None] | None = None,
) -> list[tuple[int, Summary]]:
    """Process what is in ``input_dir`` now (``availableNow``), micro-batch by
    micro-batch; with ``trigger``, a micro-batch of the new files every such
    interval until ``stop`` is set (the batch in progress finishes first).

    The files are JSON lines or Parquet (``input_format``), taken oldest
    first; a key's messages apply in the order of their files, then of their
    lines, however the files fall into micro-batches (or by ``order_by``).

    Each batch's outputs go to ``{output}/batch={id}``, overwritten when Spark
    replays the batch after a restart (its commit never got logged), so a
    replay yields the same files, never extra ones. State changes are
    exactly-once by the handlers runtime itself. Each batch's cached rows
    are released once it is written, so a long stream does not accumulate
    them. ``on_batch(batch_id, summary)`` is called after each batch. With
    ``output_queues``, each batch's outputs are then sent to queues (a
    replayed batch sends them again: consumers de-duplicate by id), and
    ``on_delivery(batch_id, delivery)`` tells what was sent.

    Each micro-batch's figures also appear in its ``StreamingQueryProgress``,
    under ``observedMetrics["streamstone"]`` (:data:`METRICS`), for a
    ``StreamingQueryListener`` or a monitoring tool. ``query_name`` names the
    query in its progress.
    """
    sink = BatchSink(
        output, output_format, settings, partitions,
        route=output_queues, on_batch=on_batch, on_delivery=on_delivery,
    )  # fmt: skip
    frame = read_stream(
        spark, input_dir, input_format, order_by, settings.sent_at, max_files_per_trigger
    )
    results = process_stream(frame, settings, partitions, order_by)
    run_query(results, sink, checkpoint, trigger=trigger, stop=stop, query_name=query_name)
    return sink.summaries
