"""A handler's states as DataFrames: the newest state of every key, and the
history of given keys, read from the table by the executors."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import IntegerType, StringType, StructField, StructType, TimestampType

from handlers import InMemoryPublisher, Processor, scan_keys, scan_states
from streamstone_py import TableConfig, key_order

from ._settings import resolve_handler
from ._tasks._rows import body_json
from ._tasks._worker import table_client

__all__ = ["HISTORY_SCHEMA", "STATES_SCHEMA", "read_history", "read_states"]

STATES_SCHEMA = StructType(
    [
        StructField("key", StringType(), False),
        StructField("version", IntegerType(), False),
        StructField("updated", TimestampType()),
        StructField("state", StringType(), False),
    ]
)

HISTORY_SCHEMA = StructType(
    [
        StructField("key", StringType(), False),
        StructField("version", IntegerType(), False),
        StructField("message_id", StringType(), False),
        StructField("type", StringType(), False),
        StructField("time", TimestampType(), False),
        StructField("state", StringType(), False),
    ]
)


def state_json(state: Any) -> str:
    """A state as JSON text with sorted keys (bytes as ``{"$base64": ...}``)."""
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        state = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}
    return body_json(state)


def _ranges(keys: Sequence[str], parts: int) -> list[tuple[str | None, str | None]]:
    """``parts`` half-open key ranges that together cover every key, with about
    the same number of the listed keys in each (keys added since fall in one too)."""
    count = max(1, min(parts, len(keys)))
    # In the table's order, not Python's: a bound out of order makes two ranges overlap.
    bounds = sorted({keys[len(keys) * i // count] for i in range(1, count)}, key=key_order)
    starts: list[str | None] = [None, *bounds]
    ends: list[str | None] = [*bounds, None]
    return list(zip(starts, ends, strict=True))


def read_states(spark: SparkSession, table: str, handler: str, *, partitions: int = 8) -> DataFrame:
    """One row per key of ``handler`` in ``table``: ``key``, ``version``,
    ``updated`` (when its newest version was stored) and ``state`` (JSON).

    The driver lists the keys (one scan that returns only them) and cuts
    the key space into ``partitions`` ranges of about as many keys; each
    Spark task then scans its range for the states. Executors and the
    driver read the account from their environment, as the job does.
    Parse the state column with ``from_json`` and a schema, or with
    ``spark.read.json(frame.rdd.map(lambda r: r.state))``.
    """
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
    found = resolve_handler(handler)
    with TableConfig.from_env(table_name=table).table_client() as client:
        keys = list(scan_keys(found, client))
    ranges = _ranges(keys, partitions)

    def scan(rows: Iterable[tuple[str | None, str | None]]) -> Iterator[tuple[Any, ...]]:
        scanned = resolve_handler(handler)
        for start, end in rows:
            for key_state in scan_states(
                scanned, table_client(table), start_key=start, end_key=end
            ):
                yield (
                    key_state.key,
                    key_state.version,
                    key_state.updated,
                    state_json(key_state.state),
                )

    rdd = spark.sparkContext.parallelize(ranges, len(ranges)).mapPartitions(scan)
    return spark.createDataFrame(rdd, STATES_SCHEMA)


def read_history(
    spark: SparkSession, table: str, handler: str, keys: Sequence[str], *, partitions: int = 8
) -> DataFrame:
    """Every kept version of the given keys: ``key``, ``version``,
    ``message_id``, ``type``, ``time`` (when the message was first processed)
    and ``state`` after it (JSON), oldest first within each key."""
    if isinstance(keys, str) or not all(isinstance(k, str) for k in keys):
        raise TypeError(f"keys must be a sequence of str, got {keys!r}")
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise ValueError(f"partitions must be an int >= 1, got {partitions!r}")
    resolve_handler(handler)  # refuse a bad name on the driver, before any task
    wanted = sorted(set(keys))

    def history(rows: Iterable[str]) -> Iterator[tuple[Any, ...]]:
        processor = Processor(resolve_handler(handler), table_client(table), InMemoryPublisher())
        for key in rows:
            for v in processor.history(key):
                yield (key, v.version, v.message_id, v.message_type, v.now, state_json(v.state))

    slices = max(1, min(partitions, len(wanted)))
    rdd = spark.sparkContext.parallelize(wanted, slices).mapPartitions(history)
    return spark.createDataFrame(rdd, HISTORY_SCHEMA)
