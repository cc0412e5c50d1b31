"""The pipeline: messages in, output messages and per-message outcomes out.

Input rows need ``message_id``, ``key``, ``type`` and ``body`` (a JSON string,
or binary), and may name an ordering column. The job repartitions by key,
orders within each key, and hands each key's messages to the handlers
runtime in ``mapPartitions``. Whatever Spark repeats (task retries,
speculative copies, a rerun of the job, a replayed micro-batch), every
message changes state once and its outputs come out identical.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields
from typing import Any

from pyspark import Accumulator
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
)

from ._executor import OUTCOME, OUTPUT, process_partition
from ._settings import JobSettings

__all__ = [
    "INPUT_SCHEMA",
    "Counters",
    "JobResult",
    "Summary",
    "process_messages",
    "read_messages",
    "run_batch",
    "session",
    "write_result",
]

INPUT_SCHEMA = StructType(
    [
        StructField("message_id", StringType()),
        StructField("key", StringType()),
        StructField("type", StringType()),
        StructField("body", StringType()),
    ]
)

RESULT_SCHEMA = StructType(
    [
        StructField("kind", StringType(), False),
        StructField("message_id", StringType()),
        StructField("key", StringType()),
        StructField("type", StringType()),
        StructField("status", StringType()),
        StructField("version", IntegerType()),
        StructField("reason", StringType()),
        StructField("body", StringType()),
        StructField("source_message_id", StringType()),
    ]
)

_ORDER = "_order"


def session(master: str = "local[2]", app: str = "streamstone-py", **conf: str) -> SparkSession:
    """A Spark session; in local mode its Python workers run this interpreter (this venv).

    On a cluster the executors' Python is the cluster's to set (PYSPARK_PYTHON
    or spark.pyspark.python): a driver's local path would not exist there.
    """
    if master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app)
    defaults = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "true",
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.session.timeZone": "UTC",
    }
    for name, value in {**defaults, **conf}.items():
        builder = builder.config(name, value)
    return builder.getOrCreate()


class Counters:
    """Spark accumulators for the summary (updated on executors)."""

    def __init__(self, spark: SparkSession) -> None:
        context = spark.sparkContext
        self.messages_in: Accumulator[int] = context.accumulator(0)
        self.dead_lettered: Accumulator[int] = context.accumulator(0)
        self.completed: Accumulator[int] = context.accumulator(0)
        self.duplicates: Accumulator[int] = context.accumulator(0)
        self.abandoned: Accumulator[int] = context.accumulator(0)
        self.faulted: Accumulator[int] = context.accumulator(0)
        self.outputs: Accumulator[int] = context.accumulator(0)
        self.conflicts_retried: Accumulator[int] = context.accumulator(0)

    def add(self, outcome: Any) -> None:
        {
            "completed": self.completed,
            "duplicate": self.duplicates,
            "abandoned": self.abandoned,
            "faulted": self.faulted,
        }[outcome.status].add(1)
        if outcome.status in ("completed", "duplicate"):
            self.outputs.add(len(outcome.outputs))


@dataclass(frozen=True, slots=True)
class Summary:
    messages_in: int
    processed: int
    duplicates: int
    outputs: int
    dead_lettered: int
    abandoned: int
    faulted: int
    conflicts_retried: int

    @classmethod
    def of(cls, counters: Counters) -> Summary:
        return cls(
            messages_in=counters.messages_in.value,
            processed=counters.completed.value,
            duplicates=counters.duplicates.value,
            outputs=counters.outputs.value,
            dead_lettered=counters.dead_lettered.value,
            abandoned=counters.abandoned.value,
            faulted=counters.faulted.value,
            conflicts_retried=counters.conflicts_retried.value,
        )

    def table(self) -> str:
        """The summary as a readable two-column table."""
        labels = {
            "messages_in": "messages in",
            "processed": "processed (state changed)",
            "duplicates": "duplicates (no change)",
            "outputs": "outputs published",
            "dead_lettered": "dead-lettered",
            "abandoned": "abandoned (handler error)",
            "faulted": "faulted (in doubt)",
            "conflicts_retried": "conflicts retried",
        }
        width = max(len(v) for v in labels.values())
        lines = [f"  {labels[f.name]:<{width}}  {getattr(self, f.name):>10,}" for f in fields(self)]
        rule = "  " + "-" * (width + 12)
        return "\n".join([rule, *lines, rule])


@dataclass(frozen=True)
class JobResult:
    outputs: DataFrame
    outcomes: DataFrame
    counters: Counters

    @property
    def dead_letters(self) -> DataFrame:
        return self.outcomes.where(F.col("status") == "dead_lettered")

    def summary(self) -> Summary:
        return Summary.of(self.counters)


def read_messages(spark: SparkSession, path: str, input_format: str) -> DataFrame:
    """JSON lines or Parquet with at least message_id, key, type and body."""
    if input_format == "json":
        return spark.read.schema(INPUT_SCHEMA).json(path)
    if input_format == "parquet":
        frame = spark.read.parquet(path)
        missing = [c for c in ("message_id", "key", "type", "body") if c not in frame.columns]
        if missing:
            raise ValueError(f"input {path!r} lacks the columns {missing}")
        return frame
    raise ValueError(f"input format must be 'json' or 'parquet', got {input_format!r}")


def process_messages(
    frame: DataFrame, settings: JobSettings, partitions: int, order_by: str | None = None
) -> JobResult:
    """Handle the messages of ``frame``; the result DataFrames are persisted."""
    spark = frame.sparkSession
    if order_by is not None and order_by not in frame.columns:
        raise ValueError(f"order column {order_by!r} is not in the input ({frame.columns})")
    body = F.col("body")
    if not isinstance(frame.schema["body"].dataType, StringType | BinaryType):
        body = body.cast(StringType())
    order = F.col(order_by) if order_by else F.monotonically_increasing_id()
    rows = (
        frame.select("message_id", "key", "type", body.alias("body"), order.alias(_ORDER))
        .repartition(partitions, "key")
        .sortWithinPartitions("key", _ORDER)
    )
    counters = Counters(spark)
    job = settings

    def run(partition: Any) -> Any:
        return process_partition(partition, job, counters)

    results = spark.createDataFrame(rows.rdd.mapPartitions(run), RESULT_SCHEMA).persist()
    outputs = (
        results.where(F.col("kind") == OUTPUT)
        .select("message_id", "key", "type", "body", "source_message_id")
        .dropDuplicates(["message_id"])
    )
    outcomes = results.where(F.col("kind") == OUTCOME).select(
        "message_id", "key", "type", "status", "version", "reason"
    )
    return JobResult(outputs, outcomes, counters)


def write_result(result: JobResult, output: str, output_format: str) -> None:
    """Write with Spark's commit protocol: a failed job leaves no partial output."""
    if output_format not in ("parquet", "json"):
        raise ValueError(f"output format must be 'parquet' or 'json', got {output_format!r}")
    result.outputs.orderBy("key", "message_id").write.mode("overwrite").format(output_format).save(
        f"{output}/outputs"
    )
    result.outcomes.orderBy("key", "message_id", "status").write.mode("overwrite").format(
        output_format
    ).save(f"{output}/outcomes")
    result.dead_letters.orderBy("key", "message_id").write.mode("overwrite").format(
        output_format
    ).save(f"{output}/dead_letters")


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
    frame = read_messages(spark, input_path, input_format)
    result = process_messages(frame, settings, partitions, order_by)
    if explain:
        result.outputs.explain(extended=True)
    write_result(result, output, output_format)
    return result.summary()
