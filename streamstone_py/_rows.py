"""The row layout of a stream, and its parsing.

A stream in a partition is a header row (version, first version, a
tombstone mark, the stream's properties), one row per event (its version,
its id, its properties) and one id row per event id (the version it
holds). Every verb builds and reads rows through these functions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._codec._values import (
    DELETED,
    EVENT_ID,
    FIRST_VERSION,
    RESERVED_NAMES,
    VERSION,
    check_entity,
    convert_properties,
    from_table,
    plain_properties,
    to_table,
)
from ._errors import StreamstoneError
from ._header_type import H, Header
from ._model import EventData, Include, RecordedEvent
from ._partition import Partition
from ._transport._protocol import Entity, Row, Steps, TableOperation, get_entity

__all__ = [
    "event_operations",
    "header_entity",
    "header_of",
    "header_row",
    "is_deleted",
    "recorded_from_row",
    "stream_from_row",
]


def header_entity(
    partition: Partition,
    version: int,
    properties: Mapping[str, Any],
    first_version: int = 1,
    deleted: bool = False,
) -> Entity:
    entity: Entity = {
        "PartitionKey": partition.partition_key,
        "RowKey": partition.header_row_key,
        **convert_properties(properties, RESERVED_NAMES, "stream"),
        VERSION: to_table(VERSION, version),
    }
    if first_version > 1:
        entity[FIRST_VERSION] = to_table(FIRST_VERSION, first_version)
    if deleted:
        entity[DELETED] = True
    return entity


def header_of(stream: Header, version: int | None = None, deleted: bool = False) -> Entity:
    """The header row that keeps what ``stream`` knows, at ``version`` if given."""
    return header_entity(
        stream.partition,
        stream.version if version is None else version,
        stream.properties,
        stream.first_version,
        deleted,
    )


def is_deleted(row: Row) -> bool:
    return bool(row.properties.get(DELETED))


def stream_from_row(partition: Partition, row: Row, header_type: type[H]) -> H:
    """The header a row holds, as an instance of ``header_type`` (``Stream``)."""
    version = from_table(row.properties.get(VERSION, 0))
    first = from_table(row.properties.get(FIRST_VERSION, 1))
    if not isinstance(version, int) or not isinstance(first, int):
        raise StreamstoneError(f"header of {partition} has a non-integer version column")
    properties = plain_properties(row.properties)
    return header_type._stored(partition, row.etag, version, properties, first)


def header_row(partition: Partition) -> Steps[Row | None]:
    """The header row, tombstone included (``None`` if there is none)."""
    return (yield from get_entity(partition.partition_key, partition.header_row_key))


def recorded_from_row(row: Entity) -> RecordedEvent:
    version = row[VERSION]
    if type(version) is not int:
        version = from_table(version)
        assert isinstance(version, int)
    event_id = row.get(EVENT_ID)
    event_id = None if event_id is None else str(event_id)
    return RecordedEvent(version, event_id, plain_properties(row))


def event_operations(
    partition: Partition, version: int, event: EventData
) -> tuple[list[TableOperation], list[EventData | Include | int]]:
    pk = partition.partition_key
    row: Entity = {"PartitionKey": pk, "RowKey": partition.event_row_key(version)}
    row.update(event._table_properties)
    row[VERSION] = to_table(VERSION, version)
    ops = [TableOperation("create", row)]
    roles: list[EventData | Include | int] = [version]
    if event.id is not None:
        row[EVENT_ID] = event.id
        id_row = {
            "PartitionKey": pk,
            "RowKey": partition.id_row_key(event.id),
            VERSION: row[VERSION],
        }
        ops.append(TableOperation("create", id_row))
        roles.append(event)
    check_entity(row, f"event {event.id or version!r}", emulator=partition.is_emulator)
    return ops, roles
