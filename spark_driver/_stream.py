"""Streaming mode: a file source over an input directory, one job per micro-batch."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any, Final

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from ._arrow import ORDER, number_rows, process_batches
from ._executor import OUTCOME, RESULT_SCHEMA, RETENTION, TASK
from ._input import input_order, message_columns, read_stream
from ._job import write_result
from ._settings import JobSettings
from ._summary import JobResult, Summary

__all__ = ["METRICS", "run_stream"]

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
) -> list[tuple[int, Summary]]:
    """Process what is in ``input_dir`` now (``availableNow``), micro-batch by micro-batch.

    The files are JSON lines or Parquet (``input_format``), taken oldest
    first; a key's messages apply in the order of their files, then of their
    lines, however the files fall into micro-batches (or by ``order_by``).

    Each batch's outputs go to ``{output}/batch={id}``, overwritten when Spark
    replays the batch after a restart (its commit never got logged), so a
    replay yields the same files, never extra ones. State changes are
    exactly-once by the handlers runtime itself. Each batch's cached rows
    are released once it is written, so a long stream does not accumulate
    them. ``on_batch(batch_id, summary)`` is called after each batch.

    Each micro-batch's figures also appear in its ``StreamingQueryProgress``,
    under ``observedMetrics["streamstone"]`` (:data:`METRICS`), for a
    ``StreamingQueryListener`` or a monitoring tool. ``query_name`` names the
    query in its progress.
    """
    summaries: list[tuple[int, Summary]] = []

    def each(batch: DataFrame, batch_id: int) -> None:
        result = JobResult.of(batch.persist(), settings, partitions)
        try:
            # The first action runs the handlers once, in a result stage, whose
            # observed metrics count each task once, whatever attempts failed.
            result.results.write.format("noop").mode("overwrite").save()
            directory = f"{output}/batch={batch_id}"
            summary = write_result(result, directory, output_format)
        finally:
            result.unpersist()  # a long-running stream would otherwise keep every batch
        summaries.append((batch_id, summary))
        if on_batch is not None:
            on_batch(batch_id, summary)

    frame = read_stream(
        spark, input_dir, input_format, order_by, settings.sent_at, max_files_per_trigger
    )
    writer = process_stream(frame, settings, partitions, order_by).writeStream
    if query_name is not None:
        writer = writer.queryName(query_name)
    query: Any = (
        writer.foreachBatch(each)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return summaries
