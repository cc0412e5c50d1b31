"""Reading a slice of a stream: its events, bounded by the header read beside them."""

from __future__ import annotations

from typing import Final

from ._errors import StreamNotFoundError, StreamstoneError
from ._header_type import H
from ._model import StreamSlice
from ._partition import Partition
from ._rows import is_deleted, recorded_from_row, stream_from_row
from ._transport._protocol import GetEntity, QueryEntities, Row, Steps, parallel, query_entities

__all__ = ["MAX_SLICE_SIZE", "POINT_READ_SLICE", "read"]

#: Slices up to this size are read with point reads instead of a range query.
POINT_READ_SLICE: Final = 4

#: Reads of a slice whose rows a truncation kept removing under it.
_READ_ATTEMPTS: Final = 5

#: Largest slice one read returns; the table service pages at 1,000 anyway.
MAX_SLICE_SIZE: Final = 100_000


def _check_positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def read(
    partition: Partition, start_version: int, slice_size: int, header_type: type[H]
) -> Steps[StreamSlice]:
    _check_positive("start_version", start_version)
    _check_positive("slice_size", slice_size)
    if slice_size > MAX_SLICE_SIZE:
        raise ValueError(f"slice_size must be <= {MAX_SLICE_SIZE}, got {slice_size}")
    pk = partition.partition_key
    header_key = partition.header_row_key
    end = start_version + slice_size - 1

    def events_between(first: int, last: int) -> QueryEntities:
        return QueryEntities(
            "PartitionKey eq @pk and RowKey ge @first and RowKey le @last",
            {
                "pk": pk,
                "first": partition.event_row_key(first),
                "last": partition.event_row_key(last),
            },
            page_size=min(last - first + 1, 1000),
        )

    def header_and_rows() -> Steps[tuple[Row | None, list[Row]]]:
        if slice_size <= POINT_READ_SLICE:
            # A few versions: point reads of exactly those rows, beside the
            # header, cost the same however long the stream is.
            keys = [partition.event_row_key(v) for v in range(start_version, end + 1)]
            found = yield from parallel(
                GetEntity(pk, header_key), *(GetEntity(pk, k) for k in keys)
            )
            return found[0], [row for row in found[1:] if row is not None]
        if start_version == 1 and slice_size < 1000:
            # The header sorts just before the event rows, so one range query
            # (one page) reads both, and the scan meets the header before its events.
            rows = yield from query_entities(
                "PartitionKey eq @pk and RowKey ge @first and RowKey le @last",
                {"pk": pk, "first": header_key, "last": partition.event_row_key(end)},
                page_size=slice_size + 1,
            )
            header = rows[0] if rows and rows[0].properties["RowKey"] == header_key else None
            return header, rows
        header, rows = yield from parallel(
            GetEntity(pk, header_key), events_between(start_version, end)
        )
        return header, rows

    for _ in range(_READ_ATTEMPTS):
        header, rows = yield from header_and_rows()
        if header is None or is_deleted(header):
            raise StreamNotFoundError(partition, deleting=header is not None)
        stream = stream_from_row(partition, header, header_type)
        # Events up to the header's version are committed and immutable: the
        # slice stops there. Rows below a truncation point may linger while
        # truncate sweeps them.
        last = min(end, stream.version)
        first = max(start_version, stream.first_version)
        wanted = list(range(first, last + 1))
        first_key, last_key = partition.event_row_key(first), partition.event_row_key(last)
        events = [
            recorded_from_row(row.properties)
            for row in rows
            if first_key <= row.properties["RowKey"] <= last_key
        ]
        got = [e.version for e in events]
        if got != wanted:
            # The event reads ran beside the header read, so events committed
            # meanwhile may be missing, and not only at the tail (point reads
            # run in any order). All of them are committed now: read again
            # from the first one missing.
            gap = next(i for i, v in enumerate(wanted) if i >= len(got) or got[i] != v)
            request = events_between(wanted[gap], last)
            more = yield from query_entities(request.filter, request.parameters, request.page_size)
            events = events[:gap] + [recorded_from_row(row.properties) for row in more]
        if [e.version for e in events] == wanted:
            return StreamSlice(
                stream,
                tuple(events),
                end >= stream.version,
                truncated=start_version < stream.first_version,
            )
        # Committed rows the header promised are gone: a truncation or a
        # delete has begun since the header was read. Read it again.
    raise StreamstoneError(
        f"{partition} was truncated or deleted during each of {_READ_ATTEMPTS} attempts to read it"
    )
