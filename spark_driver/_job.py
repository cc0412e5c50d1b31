"""The pipeline: messages in, output messages and per-message outcomes out.

Input rows need ``message_id``, ``key``, ``type`` and ``body`` (a JSON string,
or binary), and may name an ordering column (reading them is ``_input``). The
job repartitions by key, orders within each key, and hands each key's
messages to the handlers runtime in ``mapPartitions``. Whatever Spark repeats (task retries,
speculative copies, a rerun of the job, a replayed micro-batch), every
message changes state once and its outputs come out identical.
"""

from __future__ import annotations

import logging
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from handlers import TOKEN_HEADER

from ._files._fs import delete, shown
from ._files._landing import dead_letters, left_out
from ._input import input_order, message_columns, read_messages
from ._settings import JobSettings
from ._summary import JobResult, Summary
from ._tasks._executor import OUTCOME, RESULT_SCHEMA, mark_partition, process_partition

__all__ = ["process_messages", "run_batch", "write_result"]

_log = logging.getLogger(__name__)


def process_messages(
    frame: DataFrame, settings: JobSettings, partitions: int, order_by: str | None = None
) -> JobResult:
    """Handle the messages of ``frame``; the result DataFrames are persisted.

    Within a key, messages apply in ``order_by``'s order, else in input order
    (see :mod:`spark_driver._input`: their files' order, then their rows').
    """
    spark = frame.sparkSession
    order = [*input_order(frame, order_by), F.monotonically_increasing_id()]
    names = [f"_order{n}" for n in range(len(order))]
    rows = (
        frame.select(
            *message_columns(frame, settings.sent_at),
            *(column.alias(name) for column, name in zip(order, names, strict=True)),
        )
        .repartition(partitions, "key")
        .sortWithinPartitions("key", *names)
    )
    job = settings

    def run(partition: Any) -> Any:
        return process_partition(partition, job)

    results = spark.createDataFrame(rows.rdd.mapPartitions(run), RESULT_SCHEMA).persist()
    return JobResult.of(results, settings, partitions)


def write_result(result: JobResult, output: str, output_format: str) -> Summary:
    """Write the run, each part with Spark's commit protocol; return its summary.

    The order, which a reader can rely on: ``summary/`` of an earlier run is
    deleted first; then ``outputs/``, ``outcomes/`` and ``dead_letters/`` are
    written; then the outbox outputs (with tokens, the checkpoints) are
    marked dispatched; ``summary/`` (one JSON row, from the outcome rows as
    written) comes last. A directory without ``summary/_SUCCESS`` is incomplete: run
    the job again (it is safe to).
    """
    if output_format not in ("parquet", "json"):
        raise ValueError(f"output format must be 'parquet' or 'json', got {output_format!r}")
    spark = result.outcomes.sparkSession
    delete(spark, f"{output}/summary")
    parts = {
        "outputs": result.outputs.orderBy("key", "message_id"),
        "outcomes": result.outcomes.orderBy("key", "message_id", "status"),
        "dead_letters": result.dead_letters.orderBy("key", "message_id"),
    }
    for name, frame in parts.items():
        frame.write.mode("overwrite").format(output_format).save(f"{output}/{name}")
    # Read back with the schemas written: an inferred one (JSON) knows no column
    # of a part that holds no rows, and the summary must not depend on the format.
    written = {
        name: spark.read.schema(frame.schema).format(output_format).load(f"{output}/{name}")
        for name, frame in parts.items()
    }
    _mark_dispatched(written, result.results, result.settings, result.partitions)
    summary = Summary.of(written["outcomes"], written["outputs"], result.results)
    marker = spark.createDataFrame([summary.figures()])
    marker.coalesce(1).write.mode("overwrite").json(f"{output}/summary")
    return summary


def _mark_dispatched(
    written: dict[str, DataFrame], results: DataFrame, settings: JobSettings, partitions: int
) -> None:
    """After the commit: the outbox outputs of settled messages are delivered;
    with tokens, the checkpoints of the messages whose outputs carry one are
    marked (until then retention keeps those versions: a rerun re-sends them).
    Whatever ``--tokens`` says: a job with tokens off re-sends, with its
    token, a duplicate stored by one with them on."""
    if settings.strategy == "outbox":
        outcomes = written["outcomes"]
        settled = outcomes.where(F.col("status").isin("completed", "duplicate"))
    else:
        outputs = written["outputs"]
        sources = outputs.select(
            F.col("source_key").alias("key"),
            F.col("source_message_id").alias("message_id"),
            F.col("headers").getItem(TOKEN_HEADER).isNotNull().alias("carry"),
        )
        # And the messages that consumed a token and have outputs: their
        # versions await them (see handlers' AWAITS_DISPATCH).
        consumed = (
            results.where(F.col("kind") == OUTCOME)
            .where(F.col("status").isin("completed", "duplicate"))
            .where(F.col("headers").getItem(TOKEN_HEADER).isNotNull())
            .select("key", "message_id")
        )
        settled = (
            sources.where("carry")
            .select("key", "message_id")
            .unionByName(
                sources.select("key", "message_id").join(
                    consumed, ["key", "message_id"], "left_semi"
                )
            )
            .distinct()
        )
    job = settings

    def mark(rows: Any) -> None:
        mark_partition(rows, job)

    (
        settled.select("key", "message_id")
        .repartition(partitions, "key")
        .sortWithinPartitions("key")
        .foreachPartition(mark)
    )


def run_batch(
    spark: SparkSession,
    input_path: str,
    output: str,
    settings: JobSettings,
    *,
    input_format: str = "json",
    output_format: str = "parquet",
    partitions: int = 8,
    order_by: str | None = None,
    explain: bool = False,
) -> Summary:
    """Read, process and write one batch of messages; return the summary.

    Of local JSON lines, a file Spark would fail on, or leave out without a
    word, and a line too long to read are each dead-lettered by name (see
    :mod:`spark_driver._files._landing`), and the other messages processed."""
    found = left_out(spark, input_path) if input_format == "json" else []
    whole = [uri for uri, _, entire in found if entire]
    frame = read_messages(
        spark, input_path, input_format, order_by, settings.sent_at, leave_out=whole
    )
    result = process_messages(frame, settings, partitions, order_by)
    told = result
    if found:
        for uri, reason, _ in found:
            _log.warning("%s is dead-lettered: %s", shown(spark, uri), reason)
        files = dead_letters(spark, [(uri, reason) for uri, reason, _ in found])
        told = JobResult.of(result.results.unionByName(files), settings, partitions)
    if explain:
        told.outputs.explain(extended=True)
    try:
        return write_result(told, output, output_format)
    finally:
        result.unpersist()
