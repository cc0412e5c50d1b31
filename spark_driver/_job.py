"""The pipeline: messages in, output messages and per-message outcomes out.

Input rows need ``message_id``, ``key``, ``type`` and ``body`` (a JSON string,
or binary), and may name an ordering column. The job repartitions by key,
orders within each key, and hands each key's messages to the handlers
runtime in ``mapPartitions``. Whatever Spark repeats (task retries,
speculative copies, a rerun of the job, a replayed micro-batch), every
message changes state once and its outputs come out identical.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from ._executor import RESULT_SCHEMA, mark_partition, process_partition
from ._settings import JobSettings
from ._summary import JobResult, Summary

__all__ = ["INPUT_SCHEMA", "process_messages", "read_messages", "run_batch", "write_result"]

INPUT_SCHEMA = StructType(
    [
        StructField("message_id", StringType()),
        StructField("key", StringType()),
        StructField("type", StringType()),
        StructField("body", StringType()),
    ]
)

_ORDER = "_order"


#: Where Spark's JSON reader keeps a line it could not parse (PERMISSIVE mode).
CORRUPT_RECORD = "_corrupt_record"
_RAW = "_raw"
#: The column the executors read a message's sent time from (see ``JobSettings.sent_at``).
SENT_AT = "_sent_at"


def _json_schema(spark: SparkSession, path: str, *extra: str | None) -> StructType:
    """The input's columns: the four message columns as text, the others as inferred.

    The message columns are read as text even where they hold JSON objects
    (a body), so Spark keeps their raw JSON. Without an ``extra`` column to
    read (an ordering or a sent-time column) the fixed schema is enough, and
    no inference pass is made.
    """
    corrupt = StructField(CORRUPT_RECORD, StringType())
    if not any(extra):
        return StructType([*INPUT_SCHEMA.fields, corrupt])
    inferred = spark.read.json(path).schema
    known = {*INPUT_SCHEMA.fieldNames(), CORRUPT_RECORD}
    others = [f for f in inferred.fields if f.name not in known]
    return StructType([*INPUT_SCHEMA.fields, *others, corrupt])


def read_messages(
    spark: SparkSession,
    path: str,
    input_format: str,
    order_by: str | None = None,
    sent_at: str | None = None,
) -> DataFrame:
    """JSON lines or Parquet with at least message_id, key, type and body.

    Other columns are kept (with JSON, when ``order_by`` or ``sent_at`` names
    one of them), so an ordering or sent-time column reaches
    :func:`process_messages`.
    """
    if input_format == "json":
        # A line that is not a JSON object keeps its text in CORRUPT_RECORD, so it
        # is dead-lettered with its reason and its raw line, not as empty columns.
        frame = (
            spark.read.schema(_json_schema(spark, path, order_by, sent_at))
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT_RECORD)
            .json(path)
        )
    elif input_format == "parquet":
        frame = spark.read.parquet(path)
        missing = [c for c in INPUT_SCHEMA.fieldNames() if c not in frame.columns]
        if missing:
            raise ValueError(f"input {path!r} lacks the columns {missing}")
    else:
        raise ValueError(f"input format must be 'json' or 'parquet', got {input_format!r}")
    for what, name in (("order", order_by), ("sent-at", sent_at)):
        if name is not None and name not in frame.columns:
            raise ValueError(
                f"{what} column {name!r} is not in the input {path!r} (columns: {frame.columns})"
            )
    return frame


def _sent_at_column(frame: DataFrame, name: str) -> Column:
    """A sent-time column as the executors read it: text as it is (ISO-8601,
    checked there), a timestamp as microseconds since the epoch (exact, and
    independent of the session's time zone)."""
    if name not in frame.columns:
        raise ValueError(f"sent-at column {name!r} is not in the input ({frame.columns})")
    found = frame.schema[name].dataType
    if isinstance(found, StringType):
        return F.col(name)
    if isinstance(found, TimestampType):
        return F.unix_micros(F.col(name))
    raise ValueError(
        f"sent-at column {name!r} is of type {found.simpleString()}: give a timestamp "
        "(with its time zone, Spark's TIMESTAMP) or ISO-8601 text with a zone"
    )


def _message_columns(frame: DataFrame, sent_at: str | None = None) -> list[Column]:
    """The four message columns as the executors read them, from any producer's types.

    Ids, keys and types of any integer or string type become strings; a body
    that is a struct, a map or an array becomes its JSON text, and any other
    non-binary body its text (a number or a boolean is valid JSON as text).
    With ``sent_at``, the sent time follows (see :data:`SENT_AT`).
    """
    columns = []
    for name in ("message_id", "key", "type"):
        column = F.col(name)
        if not isinstance(frame.schema[name].dataType, StringType):
            column = column.cast(StringType())
        columns.append(column.alias(name))
    body = F.col("body")
    body_type = frame.schema["body"].dataType
    if isinstance(body_type, StructType | MapType | ArrayType):
        body = F.to_json(body)
    elif not isinstance(body_type, StringType | BinaryType):
        body = body.cast(StringType())
    raw = F.col(CORRUPT_RECORD) if CORRUPT_RECORD in frame.columns else F.lit(None)
    sent = [_sent_at_column(frame, sent_at).alias(SENT_AT)] if sent_at is not None else []
    return [*columns, body.alias("body"), raw.cast(StringType()).alias(_RAW), *sent]


def process_messages(
    frame: DataFrame, settings: JobSettings, partitions: int, order_by: str | None = None
) -> JobResult:
    """Handle the messages of ``frame``; the result DataFrames are persisted."""
    spark = frame.sparkSession
    if order_by is not None and order_by not in frame.columns:
        raise ValueError(f"order column {order_by!r} is not in the input ({frame.columns})")
    order = F.col(order_by) if order_by else F.monotonically_increasing_id()
    rows = (
        frame.select(*_message_columns(frame, settings.sent_at), order.alias(_ORDER))
        .repartition(partitions, "key")
        .sortWithinPartitions("key", _ORDER)
    )
    job = settings

    def run(partition: Any) -> Any:
        return process_partition(partition, job)

    results = spark.createDataFrame(rows.rdd.mapPartitions(run), RESULT_SCHEMA).persist()
    return JobResult.of(results, settings, partitions)


def _delete(spark: SparkSession, path: str) -> None:
    """Delete a path on whatever file system Spark writes to (local, ABFS, ...)."""
    jvm: Any = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop_path.getFileSystem(conf).delete(hadoop_path, True)


def write_result(result: JobResult, output: str, output_format: str) -> Summary:
    """Write the run, each part with Spark's commit protocol; return its summary.

    The order, which a reader can rely on: ``summary/`` of an earlier run is
    deleted first; then ``outputs/``, ``outcomes/`` and ``dead_letters/`` are
    written; then, for the outbox strategy, the outputs are marked
    dispatched; ``summary/`` (one JSON row, from the outcome rows as written)
    comes last. A directory without ``summary/_SUCCESS`` is incomplete: run
    the job again (it is safe to).
    """
    if output_format not in ("parquet", "json"):
        raise ValueError(f"output format must be 'parquet' or 'json', got {output_format!r}")
    spark = result.outcomes.sparkSession
    _delete(spark, f"{output}/summary")
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
    if result.settings.strategy == "outbox":
        _mark_dispatched(written["outcomes"], result.settings, result.partitions)
    summary = Summary.of(written["outcomes"], written["outputs"], result.results)
    marker = spark.createDataFrame([asdict(summary)])
    marker.coalesce(1).write.mode("overwrite").json(f"{output}/summary")
    return summary


def _mark_dispatched(outcomes: DataFrame, settings: JobSettings, partitions: int) -> None:
    """After the commit: the outbox outputs of settled messages are delivered."""
    settled = outcomes.where(F.col("status").isin("completed", "duplicate"))
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
    """Read, process and write one batch of messages; return the summary."""
    frame = read_messages(spark, input_path, input_format, order_by, settings.sent_at)
    result = process_messages(frame, settings, partitions, order_by)
    if explain:
        result.outputs.explain(extended=True)
    try:
        return write_result(result, output, output_format)
    finally:
        result.unpersist()
