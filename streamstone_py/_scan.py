"""Scanning a table for the streams of one name, across partitions.

Every stream's header row has the same row key (``SS-HEAD``, or
``{name}|SS-HEAD`` for the virtual stream ``name``), so one query with that
row key, and optionally a range of partition keys, finds them all: the
service scans the range, and pages come back in partition-key order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from azure.data.tables import TableClient

from ._partition import Partition
from ._protocol import Row
from ._retry import RetryPolicy
from ._rows import is_deleted, stream_from_row
from ._values import DELETED

if TYPE_CHECKING:
    from ._stream import Stream  # handed down as ``header_type``; see _rows

__all__ = ["ScannedStream", "scan", "scan_keys"]


@dataclass(frozen=True, slots=True)
class ScannedStream:
    """A stream header found by :meth:`Stream.scan`, and when its row last changed."""

    stream: Stream
    #: The header row's ``Timestamp``, set by the service at every write.
    updated: datetime


def _query(
    table: TableClient,
    stream_name: str | None,
    start_key: str | None,
    end_key: str | None,
    page_size: int,
    select: list[str] | None,
) -> Iterator[Any]:
    if not isinstance(table, TableClient):
        raise TypeError(f"table must be an azure.data.tables.TableClient, got {table!r}")
    if not isinstance(page_size, int) or isinstance(page_size, bool) or not 1 <= page_size <= 1000:
        raise ValueError(f"page_size must be an int from 1 to 1000, got {page_size!r}")
    for name, key in (("start_key", start_key), ("end_key", end_key)):
        if key is not None and not isinstance(key, str):
            raise TypeError(f"{name} must be a str or None, got {key!r}")
    # Any partition key shows the header's row key (and checks the name).
    probe = Partition(table, "scan", stream_name)
    clauses, parameters = ["RowKey eq @head"], {"head": probe.header_row_key}
    if start_key is not None:
        clauses.append("PartitionKey ge @start")
        parameters["start"] = start_key
    if end_key is not None:
        clauses.append("PartitionKey lt @end")
        parameters["end"] = end_key
    return iter(
        table.query_entities(
            " and ".join(clauses),
            parameters=parameters,
            results_per_page=page_size,
            select=select,
        )
    )


def scan(
    table: TableClient,
    stream_name: str | None,
    start_key: str | None,
    end_key: str | None,
    page_size: int,
    retry: RetryPolicy,
    header_type: type[Stream],
) -> Iterator[ScannedStream]:
    for entity in _query(table, stream_name, start_key, end_key, page_size, None):
        row = Row(dict(entity), str(entity.metadata["etag"]))
        if is_deleted(row):
            continue  # a delete in progress: the stream is gone for readers
        partition = Partition(table, str(entity["PartitionKey"]), stream_name, retry=retry)
        stream = stream_from_row(partition, row, header_type)
        stamp = entity.metadata["timestamp"]  # the SDK's datetime subclass: a plain one
        updated = datetime.fromtimestamp(stamp.timestamp(), stamp.tzinfo)
        yield ScannedStream(stream, updated)


def scan_keys(
    table: TableClient,
    stream_name: str | None,
    start_key: str | None,
    end_key: str | None,
    page_size: int,
) -> Iterator[str]:
    selected = ["PartitionKey", DELETED]
    for entity in _query(table, stream_name, start_key, end_key, page_size, selected):
        if not entity.get(DELETED):
            yield str(entity["PartitionKey"])
