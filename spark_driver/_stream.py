"""Streaming mode: a file source over an input directory, one job per micro-batch."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from ._job import CORRUPT_RECORD, _json_schema, process_messages, write_result
from ._settings import JobSettings
from ._summary import Summary

__all__ = ["run_stream"]


def run_stream(
    spark: SparkSession,
    input_dir: str,
    output: str,
    checkpoint: str,
    settings: JobSettings,
    *,
    output_format: str = "parquet",
    partitions: int = 8,
    order_by: str | None = None,
    max_files_per_trigger: int | None = None,
    on_batch: Callable[[int, Summary], None] | None = None,
) -> list[tuple[int, Summary]]:
    """Process what is in ``input_dir`` now (``availableNow``), micro-batch by micro-batch.

    Each batch's outputs go to ``{output}/batch={id}``, overwritten when Spark
    replays the batch after a restart (its commit never got logged), so a
    replay yields the same files, never extra ones. State changes are
    exactly-once by the handlers runtime itself. Each batch's cached rows
    are released once it is written, so a long stream does not accumulate
    them. ``on_batch(batch_id, summary)`` is called after each batch.
    """
    summaries: list[tuple[int, Summary]] = []

    def each(batch: DataFrame, batch_id: int) -> None:
        result = process_messages(batch, settings, partitions, order_by)
        try:
            directory = f"{output}/batch={batch_id}"
            summary = write_result(result, directory, output_format)
        finally:
            result.unpersist()  # a long-running stream would otherwise keep every batch
        summaries.append((batch_id, summary))
        if on_batch is not None:
            on_batch(batch_id, summary)

    schema = _json_schema(spark, input_dir, order_by)
    if order_by is not None and order_by not in schema.fieldNames():
        raise ValueError(f"order column {order_by!r} is not in the input {input_dir!r}")
    reader = (
        spark.readStream.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", CORRUPT_RECORD)
    )
    if max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", str(max_files_per_trigger))
    query: Any = (
        reader.json(input_dir)
        .writeStream.foreachBatch(each)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return summaries
