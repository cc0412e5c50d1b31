"""The executor side of a streaming micro-batch: the same processing as a
batch job's, inside the streaming plan on Arrow batches, so that the plan's
observed metrics count what it did (a streaming plan may neither sort nor use
``monotonically_increasing_id``, so both are done here)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .._settings import JobSettings
from ._executor import RESULT_SCHEMA, process_partition

__all__ = ["ORDER", "number_rows", "process_batches"]


#: The column a streaming micro-batch orders each key's messages by.
ORDER = "_order"
_CHUNK = 1024


def number_rows(batches: Iterable[Any]) -> Iterator[Any]:
    """Arrow batches of an input partition with ``ORDER`` appended: the same
    numbers ``monotonically_increasing_id`` gives (partition index in the upper
    bits, row index below), which a streaming plan may not use."""
    import pyarrow as pa
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    first = context.partitionId() << 33
    for batch in batches:
        numbers = pa.array(range(first, first + batch.num_rows), pa.int64())
        first += batch.num_rows
        yield batch.append_column(ORDER, numbers)


def process_batches(
    batches: Iterable[Any], settings: JobSettings, order: Sequence[str] = (ORDER,)
) -> Iterator[Any]:
    """:func:`process_partition` over Arrow batches, for a streaming plan.

    A streaming plan may not sort, so the partition is ordered here, by key
    and then by the ``order`` columns, with nulls first as Spark sorts: it is
    held in memory, which ``maxFilesPerTrigger`` bounds.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.pandas.types import to_arrow_schema

    try:  # PySpark 4 needs the time zone of timestamps (an output's due)
        schema = to_arrow_schema(RESULT_SCHEMA, timezone="UTC")
    except TypeError:  # PySpark 3.5 takes none: its timestamps are UTC
        schema = to_arrow_schema(RESULT_SCHEMA)
    received = list(batches)
    rows: list[dict[str, Any]] = []
    if received:
        table = pa.Table.from_batches(received)
        # Nulls first, as Spark sorts, by sorting on "is valid" before each column.
        keyed: dict[str, Any] = {}
        for n, name in enumerate(["key", *order]):
            keyed[f"valid{n}"] = pc.is_valid(table[name])
            keyed[f"value{n}"] = table[name]
        keys = [(name, "ascending") for name in keyed]
        rows = table.take(pc.sort_indices(pa.table(keyed), sort_keys=keys)).to_pylist()
    results = process_partition(rows, settings)
    while chunk := list(itertools.islice(results, _CHUNK)):
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(column, field.type)
                for column, field in zip(zip(*chunk, strict=True), schema, strict=True)
            ],
            schema=schema,
        )
