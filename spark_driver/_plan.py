"""A micro-batch's processing inside the streaming plan: the handlers run in a
``mapInArrow`` after a repartition by key, observed as :data:`METRICS`, so
that each batch's ``StreamingQueryProgress`` carries what it did."""

from __future__ import annotations

import warnings
from typing import Any, Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StructField, StructType

from ._input import input_order, message_columns
from ._settings import JobSettings
from ._tasks._arrow import ORDER, number_rows, process_batches
from ._tasks._executor import OUTCOME, RESULT_SCHEMA, RETENTION, TASK

__all__ = ["METRICS", "process_stream"]

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
