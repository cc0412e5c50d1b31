"""Scanning a table for the streams of one name, across partitions.

Every stream's header row has the same row key (``SS-HEAD``, or
``{name}|SS-HEAD`` for the virtual stream ``name``), so one query with that
row key, and optionally a range of partition keys, finds them all: the
service scans the range, and pages come back in partition-key order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Final, Generic

from azure.data.tables import TableClient

from ._codec._text import exact_str
from ._codec._values import DELETED
from ._header_type import H, H_co
from ._partition import Partition
from ._rows import is_deleted, stream_from_row
from ._transport._protocol import QueryPage, Row
from ._transport._retry import RetryPolicy

__all__ = ["KEYS", "ScannedStream", "query", "scan", "scan_keys"]


@dataclass(frozen=True, slots=True)
class ScannedStream(Generic[H_co]):
    """A stream header found by :meth:`Stream.scan`, and when its row last changed."""

    stream: H_co
    #: The header row's ``Timestamp``, set by the service at every write.
    updated: datetime


def query(
    table: TableClient,
    stream_name: str | None,
    start_key: str | None,
    end_key: str | None,
    page_size: int,
    select: tuple[str, ...] | None,
) -> QueryPage:
    """The first page's request of a scan, its arguments checked."""
    if not isinstance(page_size, int) or isinstance(page_size, bool) or not 1 <= page_size <= 1000:
        raise ValueError(f"page_size must be an int from 1 to 1000, got {page_size!r}")
    for name, key in (("start_key", start_key), ("end_key", end_key)):
        if key is not None:
            exact_str(f"{name} (a str or None)", key)
    # Any partition key shows the header's row key (and checks the name).
    probe = Partition(table, "scan", stream_name)
    clauses, parameters = ["RowKey eq @head"], {"head": probe.header_row_key}
    if start_key is not None:
        clauses.append("PartitionKey ge @start")
        parameters["start"] = start_key
    if end_key is not None:
        clauses.append("PartitionKey lt @end")
        parameters["end"] = end_key
    return QueryPage(" and ".join(clauses), parameters, page_size, select)


#: What the keys-only scan reads of each header.
KEYS: Final = ("PartitionKey", DELETED)


def scan(
    pages: Iterable[list[Row]],
    table: TableClient,
    stream_name: str | None,
    retry: RetryPolicy,
    header_type: type[H],
) -> Iterator[ScannedStream[H]]:
    """The headers the pages of a scan's query hold, but those being deleted."""
    for page in pages:
        for row in page:
            if is_deleted(row):
                continue  # a delete in progress: the stream is gone for readers
            key = str(row.properties["PartitionKey"])
            partition = Partition(table, key, stream_name, retry=retry)
            stream = stream_from_row(partition, row, header_type)
            assert row.timestamp is not None, "the service sets every row's Timestamp"
            yield ScannedStream(stream, row.timestamp)


def scan_keys(pages: Iterable[list[Row]]) -> Iterator[str]:
    """The partition keys of the headers the pages of a keys-only scan hold."""
    for page in pages:
        for row in page:
            if not row.properties.get(DELETED):
                yield str(row.properties["PartitionKey"])
