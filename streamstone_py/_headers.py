"""The verbs on a stream's header: provision, open, find, set_properties."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from azure.core.exceptions import HttpResponseError, ResourceExistsError

from ._attempts import CONFLICT, NOT_APPLIED, Unresolved, attempt, conflict
from ._codec._text import exact_str
from ._codec._values import VERSION, check_entity, comparable, from_table
from ._errors import StreamBeingDeletedError, StreamNotFoundError, StreamstoneError
from ._header_type import H
from ._partition import Partition
from ._rows import header_entity, header_row, is_deleted, stream_from_row
from ._transport._protocol import Steps, create_entity, get_entity, update_entity

__all__ = [
    "exists",
    "find",
    "open_for_change",
    "open_stream",
    "provision",
    "set_properties",
    "try_open",
]


def provision(
    partition: Partition, properties: Mapping[str, Any] | None, header_type: type[H]
) -> Steps[H]:
    entity = header_entity(partition, 0, properties or {})
    check_entity(entity, "stream header", emulator=partition.is_emulator)

    def send() -> Steps[str]:
        return (yield from create_entity(entity))

    def resolve() -> Steps[str | Unresolved]:
        row = yield from header_row(partition)
        if row is None:
            return NOT_APPLIED
        found = stream_from_row(partition, row, header_type)
        mine = found.version == 0 and comparable(found.properties) == comparable(properties or {})
        return row.etag if mine and not is_deleted(row) else CONFLICT

    try:
        etag = yield from attempt(partition, send, resolve, header_type)
    except ResourceExistsError as exc:
        # Azurite leaves error_code empty here, so the exception type decides.
        raise (
            yield from conflict(partition, "the stream already exists", exc, header_type)
        ) from exc
    return header_type._stored(partition, etag, 0, properties or {})


def try_open(partition: Partition, header_type: type[H]) -> Steps[H | None]:
    row = yield from header_row(partition)
    # A stream that is being deleted no longer exists for readers and writers.
    return None if row is None or is_deleted(row) else stream_from_row(partition, row, header_type)


def open_for_change(partition: Partition, header_type: type[H]) -> Steps[H]:
    """The stored header, for a verb that changes the stream: a tombstone means a
    delete is pending, which the writer is told how to finish."""
    row = yield from header_row(partition)
    if row is None:
        raise StreamNotFoundError(partition)
    if is_deleted(row):
        raise StreamBeingDeletedError(partition)
    return stream_from_row(partition, row, header_type)


def open_stream(partition: Partition, header_type: type[H]) -> Steps[H]:
    row = yield from header_row(partition)
    if row is None or is_deleted(row):
        raise StreamNotFoundError(partition, deleting=row is not None)
    return stream_from_row(partition, row, header_type)


def find(partition: Partition, event_id: str) -> Steps[int | None]:
    """The version of the event with this id, from its id row."""
    row = yield from get_entity(
        partition.partition_key, partition.id_row_key(exact_str("event_id", event_id))
    )
    if row is None:
        return None
    version = from_table(row.properties.get(VERSION))
    if not isinstance(version, int):
        raise StreamstoneError(f"id row of {event_id!r} in {partition} has no integer Version")
    return version


def exists(partition: Partition) -> Steps[bool]:
    row = yield from header_row(partition)
    return row is not None and not is_deleted(row)


def set_properties(stream: H, properties: Mapping[str, Any]) -> Steps[H]:
    if stream.etag is None:
        raise ValueError("cannot set properties on a transient stream; provision or write it first")
    partition = stream.partition
    header_type = type(stream)
    entity = header_entity(partition, stream.version, properties, stream.first_version)
    check_entity(entity, "stream header", emulator=partition.is_emulator)
    etag_before = stream.etag

    def send() -> Steps[str]:
        return (yield from update_entity(entity, etag_before))

    def resolve() -> Steps[str | Unresolved]:
        row = yield from header_row(partition)
        if row is not None and row.etag == etag_before:
            return NOT_APPLIED
        if row is None or is_deleted(row):
            return CONFLICT
        found = stream_from_row(partition, row, header_type)
        mine = (found.version, found.first_version, comparable(found.properties)) == (
            stream.version, stream.first_version, comparable(properties),
        )  # fmt: skip
        return row.etag if mine else CONFLICT

    try:
        etag = yield from attempt(partition, send, resolve, header_type)
    except HttpResponseError as exc:
        if exc.status_code in (404, 412):
            raise (
                yield from conflict(partition, "the stream header has changed", exc, header_type)
            ) from exc
        raise
    return header_type._stored(partition, etag, stream.version, properties, stream.first_version)
