"""Streaming mode: a file source over an input directory, one job per micro-batch."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame, SparkSession

from ._job import INPUT_SCHEMA, Summary, process_messages, write_result
from ._settings import JobSettings

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
) -> list[tuple[int, Summary]]:
    """Process what is in ``input_dir`` now (``availableNow``), micro-batch by micro-batch.

    Each batch's outputs go to ``{output}/batch={id}``, overwritten when Spark
    replays the batch after a restart (its commit never got logged), so a
    replay yields the same files, never extra ones. State changes are
    exactly-once by the handlers runtime itself.
    """
    summaries: list[tuple[int, Summary]] = []

    def each(batch: DataFrame, batch_id: int) -> None:
        result = process_messages(batch, settings, partitions, order_by)
        write_result(result, f"{output}/batch={batch_id}", output_format)
        summaries.append((batch_id, result.summary()))

    reader = spark.readStream.schema(INPUT_SCHEMA)
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
