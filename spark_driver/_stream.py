"""Streaming mode: a file source over an input directory, one job per micro-batch.

The micro-batch sink and the query's run are shared with the queue source
(``_queue_stream``): outputs may go to queues too, and a query may run until
its input is drained (``availableNow``) or on a processing-time trigger until
it is told to stop, letting the micro-batch in progress finish.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from ._arrow import ORDER, number_rows, process_batches
from ._executor import OUTCOME, RESULT_SCHEMA, RETENTION, TASK
from ._input import input_order, message_columns
from ._intake import FileIntake
from ._query import RECEIPT, BatchSink, Settle, StopRequested, run_query, stop_on_signals
from ._queues import Delivery, OutputRoute
from ._settings import JobSettings
from ._summary import Summary

# The sink and the query's run live in ``_query``; named here too, for the
# queue stream and for callers that import them from this module.
__all__ = [
    "METRICS",
    "RECEIPT",
    "BatchSink",
    "Settle",
    "StopRequested",
    "process_stream",
    "run_query",
    "run_stream",
    "stop_on_signals",
]

#: The name of the observed metrics each micro-batch reports in its
#: ``StreamingQueryProgress.observedMetrics``.
METRICS: Final = "streamstone"


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
    intake = FileIntake(
        spark, input_dir, checkpoint, input_format, order_by, settings.sent_at,
        max_files_per_trigger,
    )  # fmt: skip
    sink = BatchSink(
        output, output_format, settings, partitions,
        route=output_queues, on_batch=on_batch, on_delivery=on_delivery, intake=intake,
    )  # fmt: skip
    if not _schema_known(intake, trigger, stop):
        return sink.summaries
    while True:
        results = process_stream(intake.frame(), settings, partitions, order_by)
        try:
            run_query(results, sink, checkpoint, trigger=trigger, stop=stop, query_name=query_name)
        except Exception as exc:
            if not intake.examine(exc):
                raise
            if stop is not None and stop.is_set():
                return sink.summaries  # the batch runs at the next start
            continue  # the batch again, without the files it could not read
        return sink.summaries


def _schema_known(
    intake: FileIntake, trigger: timedelta | None, stop: threading.Event | None
) -> bool:
    """Whether the stream's schema is known; a Parquet stream on a folder
    without a Parquet file waits for one (with ``trigger``, until ``stop``)."""
    while intake.schema() is None:
        if trigger is None or stop is None:
            return False
        if stop.wait(trigger.total_seconds()):
            return False
    return True
