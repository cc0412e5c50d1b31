"""How a write is split into entity-group transactions: at most 100
operations and 4 MiB each, in the bytes the request carries (see
:mod:`._codec._payload`), the header in every one, and every event measured
before anything is sent."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ._codec._payload import TRANSACTION_BYTES, operation_bytes
from ._codec._values import check_entity
from ._header_type import Header
from ._model import EventData, Include, fold_includes
from ._rows import event_operations, header_entity, header_of
from ._transport._protocol import OperationKind, TableOperation

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_OPERATIONS",
    "Chunk",
    "check_events",
    "check_write",
    "plan",
]


#: Operations in one entity-group transaction (Azure's limit).
MAX_BATCH_OPERATIONS: Final = 100

#: Request body of one entity-group transaction (Azure's limit).
MAX_BATCH_BYTES: Final = 4 * 1024 * 1024

_INCLUDE_KINDS: Final[dict[str, OperationKind]] = {
    "insert": "create",
    "replace": "update_replace",
    "delete": "delete",
    "insert_or_merge": "upsert_merge",
    "insert_or_replace": "upsert_replace",
}


@dataclass(slots=True)
class Chunk:
    """Events that go into one transaction, with the operations they need."""

    events: list[EventData] = field(default_factory=list)
    operations: list[TableOperation] = field(default_factory=list)
    # What each operation is, to map a failing index back to an error.
    roles: list[EventData | Include | int] = field(default_factory=list)
    includes: list[Include] = field(default_factory=list)
    count: int = 0
    payload: int = 0
    #: The header's properties once this transaction commits.
    header_properties: Mapping[str, Any] = field(default_factory=dict)

    def add_includes(self, partition_key: str, track_changes: bool, emulator: bool) -> None:
        """Append the include operations after the event rows, as Streamstone
        orders them. Each include was measured alone; one folded from several
        (properties merged) is measured again, as it will be stored."""
        folded = fold_includes(self.includes) if track_changes else self.includes
        several = Counter(include.row_key for include in self.includes)
        for include in folded:
            etag = include.etag if include.operation in ("replace", "delete") else None
            entity = include.table_entity(partition_key)
            if several[include.row_key] > 1:
                owner = (
                    f"included entity {include.row_key!r} (its includes in one transaction, folded)"
                )
                check_entity(entity, owner, emulator=emulator)
            self.operations.append(TableOperation(_INCLUDE_KINDS[include.operation], entity, etag))
            self.roles.append(include)


def plan(stream: Header, events: Sequence[EventData], track_changes: bool) -> list[Chunk]:
    """Split the write into transactions of at most 100 operations and 4 MiB.

    Each event is measured alone first, so an event that cannot fit any
    transaction is refused before anything of the write is sent. The header
    of each transaction carries the properties in force at its last event.
    """
    op_budget = MAX_BATCH_OPERATIONS - 1  # the header is in every transaction
    partition = stream.partition
    pk = partition.partition_key
    emulator = partition.is_emulator
    table_url = len(partition.endpoint) + 1 + len(partition.table_name)
    last_version = stream.version + len(events)
    properties: Mapping[str, Any] = stream.properties

    def header_bytes(entity: Mapping[str, Any]) -> int:
        # An update addressed by its keys, conditional on an ETag not known yet.
        return TRANSACTION_BYTES + operation_bytes(table_url, "update_replace", entity)

    header = header_of(stream, last_version)
    header_payload = header_bytes(header)
    chunks = [Chunk(header_properties=properties)]
    headers = [header]  # each chunk's, as its last event leaves it (the largest version)
    for offset, event in enumerate(events):
        version = stream.version + offset + 1
        if event.stream_properties is not None:
            properties = event.stream_properties
            header = header_entity(partition, last_version, properties, stream.first_version)
            header_payload = header_bytes(header)
        ops, roles = event_operations(partition, version, event)
        includes = fold_includes(event.includes) if track_changes else list(event.includes)
        count = len(ops) + len(includes)
        payload = sum(operation_bytes(table_url, op.kind, op.entity) for op in ops)
        for include in includes:
            entity = include.table_entity(pk)
            check_entity(entity, f"included entity {include.row_key!r}", emulator=emulator)
            kind = _INCLUDE_KINDS[include.operation]
            payload += operation_bytes(table_url, kind, entity, include.etag)
        if count > op_budget or payload + header_payload > MAX_BATCH_BYTES:
            raise ValueError(
                f"event {event.id or version!r} needs {count} operations and up to "
                f"{payload + header_payload} bytes with the header; one transaction holds "
                f"{op_budget} besides the header and {MAX_BATCH_BYTES} bytes"
            )
        chunk = chunks[-1]
        if (
            chunk.count + count > op_budget
            or chunk.payload + payload + header_payload > MAX_BATCH_BYTES
        ):
            chunk = Chunk()
            chunks.append(chunk)
            headers.append(header)
        chunk.events.append(event)
        chunk.operations += ops
        chunk.roles += roles
        chunk.includes += event.includes
        chunk.count += count
        chunk.payload += payload
        chunk.header_properties = properties
        headers[-1] = header
    for chunk, header in zip(chunks, headers, strict=True):
        check_entity(header, "stream header", emulator=emulator)
        chunk.add_includes(pk, track_changes, emulator)
    return chunks


def check_events(events: Sequence[EventData]) -> None:
    if not events:
        raise ValueError("a write needs at least one event")
    seen: set[str] = set()
    for event in events:
        if not isinstance(event, EventData):
            raise TypeError(f"events must be EventData values, got {event!r}")
        if event.id is not None:
            if event.id in seen:
                raise ValueError(f"event id {event.id!r} appears twice in one write")
            seen.add(event.id)


def check_write(stream: Header, events: Sequence[EventData], track_changes: bool = True) -> None:
    """Raise what ``write`` would raise for these events before sending anything."""
    check_events(events)
    plan(stream, events, track_changes)
