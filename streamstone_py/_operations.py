"""The verbs. Each one prepares its rows, executes through a runner, and maps
the storage outcome to the engine's errors (see ``_protocol``)."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from azure.core.exceptions import AzureError, HttpResponseError, ResourceExistsError
from azure.data.tables import TableTransactionError

from . import _stream
from ._errors import (
    ConcurrencyConflictError,
    DuplicateEventError,
    IncludedOperationConflictError,
    StreamBeingDeletedError,
    StreamNotFoundError,
    StreamstoneError,
    _WriteError,
)
from ._model import EventData, Include, RecordedEvent, StreamSlice, WriteResult, fold_includes
from ._partition import Partition
from ._protocol import (
    Entity,
    GetEntity,
    OperationKind,
    QueryEntities,
    Row,
    Steps,
    TableOperation,
    create_entity,
    error_code,
    get_entity,
    parallel,
    pause,
    query_entities,
    submit_transaction,
    update_entity,
)
from ._retry import is_ambiguous
from ._values import (
    DELETED,
    EVENT_ID,
    FIRST_VERSION,
    RESERVED_NAMES,
    VERSION,
    check_entity,
    comparable,
    convert_properties,
    from_table,
    payload_size,
    plain_properties,
    to_table,
)

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_OPERATIONS",
    "check_write",
    "exists",
    "find",
    "open_for_change",
    "open_stream",
    "provision",
    "read",
    "set_properties",
    "try_open",
    "write",
    "write_expected",
    "write_to",
]

T = TypeVar("T")

#: Operations in one entity-group transaction (Azure's limit).
MAX_BATCH_OPERATIONS: Final = 100
#: Request body of one entity-group transaction (Azure's limit).
MAX_BATCH_BYTES: Final = 4 * 1024 * 1024
#: Slices up to this size are read with point reads instead of a range query.
POINT_READ_SLICE: Final = 4
#: Reads of a slice whose rows a truncation kept removing under it.
_READ_ATTEMPTS: Final = 5
#: Largest slice one read returns; the table service pages at 1,000 anyway.
MAX_SLICE_SIZE: Final = 100_000

_INCLUDE_KINDS: Final[dict[str, OperationKind]] = {
    "insert": "create",
    "replace": "update_replace",
    "delete": "delete",
    "insert_or_merge": "upsert_merge",
    "insert_or_replace": "upsert_replace",
}


# --- rows -----------------------------------------------------------------


def _header_entity(
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


def _header_of(stream: _stream.Stream, version: int | None = None, deleted: bool = False) -> Entity:
    """The header row that keeps what ``stream`` knows, at ``version`` if given."""
    return _header_entity(
        stream.partition,
        stream.version if version is None else version,
        stream.properties,
        stream.first_version,
        deleted,
    )


def _is_deleted(row: Row) -> bool:
    return bool(row.properties.get(DELETED))


def _stream_from_row(partition: Partition, row: Row) -> _stream.Stream:
    version = from_table(row.properties.get(VERSION, 0))
    first = from_table(row.properties.get(FIRST_VERSION, 1))
    if not isinstance(version, int) or not isinstance(first, int):
        raise StreamstoneError(f"header of {partition} has a non-integer version column")
    properties = plain_properties(row.properties)
    return _stream.Stream._stored(partition, row.etag, version, properties, first)


def header_row(partition: Partition) -> Steps[Row | None]:
    """The header row, tombstone included (``None`` if there is none)."""
    return (yield from get_entity(partition.partition_key, partition.header_row_key))


def _recorded_from_row(row: Entity) -> RecordedEvent:
    version = row[VERSION]
    if type(version) is not int:
        version = from_table(version)
        assert isinstance(version, int)
    event_id = row.get(EVENT_ID)
    event_id = None if event_id is None else str(event_id)
    return RecordedEvent(version, event_id, plain_properties(row))


# --- ambiguous writes ---------------------------------------------------------


class _Unresolved(enum.Enum):
    NOT_APPLIED = "not applied"  # the stream is as before: sending again is safe
    CONFLICT = "conflict"  # the stream changed, and not by us


NOT_APPLIED: Final = _Unresolved.NOT_APPLIED
CONFLICT: Final = _Unresolved.CONFLICT

#: A well-formed ETag that no row ever has (its time precedes every write): a
#: header that carries it makes the next conditional write conflict.
STALE_ETAG: Final = "W/\"datetime'1970-01-01T00%3A00%3A00.0000000Z'\""

#: Reports how each write whose outcome was unknown got resolved (INFO records
#: with an ``outcome`` attribute: "committed", "not applied" or "conflict").
log: Final = logging.getLogger("streamstone_py")


def _attempt(
    partition: Partition,
    send: Callable[[], Steps[T]],
    resolve: Callable[[], Steps[T | _Unresolved]],
) -> Steps[T]:
    """Send a write; when its outcome is unknown, find out instead of guessing.

    After an ambiguous failure (no answer, or 408/5xx), ``resolve`` reads the
    stream: unchanged means nothing was applied and the write is sent again
    (bounded by the partition's retry policy); our own rows mean it committed
    and that outcome is returned; a tombstone is :class:`StreamBeingDeletedError`;
    anything else is a concurrency conflict. A
    definite failure that follows an ambiguous attempt is checked the same
    way, because the earlier attempt may be what changed the stream. Every
    write is conditional (header ETag, or insert of the header), so at most
    one attempt can ever commit.
    """
    doubtful = False
    attempt = 0
    while True:
        attempt += 1
        try:
            return (yield from send())
        except AzureError as exc:
            ambiguous = is_ambiguous(exc)
            if not ambiguous and not doubtful:
                raise  # a definite answer about our only attempt: the verb maps it
            doubtful = True
            outcome = yield from resolve()
            if ambiguous:
                found = "committed" if not isinstance(outcome, _Unresolved) else outcome.value
                log.info(
                    "write to %s had no answer (%s); resolved by reading: %s",
                    partition,
                    type(exc).__name__,
                    found,
                    extra={"outcome": found},
                )
            if outcome is CONFLICT and ambiguous:
                reason = "the stream changed while the outcome of a write was unknown"
                raise (yield from _conflict(partition, reason, exc)) from exc
            if outcome is CONFLICT or (outcome is NOT_APPLIED and not ambiguous):
                raise exc  # none of ours applied: the definite failure stands
            if outcome is NOT_APPLIED:
                if attempt >= partition.retry.attempts:
                    raise exc
                yield from pause(attempt)
                continue
            return outcome


# --- provision, open, set_properties ------------------------------------------


def provision(partition: Partition, properties: Mapping[str, Any] | None) -> Steps[_stream.Stream]:
    entity = _header_entity(partition, 0, properties or {})
    check_entity(entity, "stream header")

    def send() -> Steps[str]:
        return (yield from create_entity(entity))

    def resolve() -> Steps[str | _Unresolved]:
        row = yield from header_row(partition)
        if row is None:
            return NOT_APPLIED
        found = _stream_from_row(partition, row)
        mine = found.version == 0 and comparable(found.properties) == comparable(properties or {})
        return row.etag if mine and not _is_deleted(row) else CONFLICT

    try:
        etag = yield from _attempt(partition, send, resolve)
    except ResourceExistsError as exc:
        # Azurite leaves error_code empty here, so the exception type decides.
        raise (yield from _conflict(partition, "the stream already exists", exc)) from exc
    return _stream.Stream._stored(partition, etag, 0, properties or {})


def _refuse_tombstone(partition: Partition, cause: Exception) -> Steps[_stream.Stream | None]:
    """After a write conflicted: if a delete has left a tombstone, say so, and how
    to finish it; otherwise the stream as stored now (None: there is none)."""
    row = yield from header_row(partition)
    if row is None:
        return None
    if _is_deleted(row):
        raise StreamBeingDeletedError(partition) from cause
    return _stream_from_row(partition, row)


def _conflict(
    partition: Partition, reason: str, cause: Exception
) -> Steps[ConcurrencyConflictError]:
    """The conflict to raise, with the stream read after it (or the pending delete)."""
    current = yield from _refuse_tombstone(partition, cause)
    error = ConcurrencyConflictError(partition, reason)
    error.current = current
    return error


def try_open(partition: Partition) -> Steps[_stream.Stream | None]:
    row = yield from header_row(partition)
    # A stream that is being deleted no longer exists for readers and writers.
    return None if row is None or _is_deleted(row) else _stream_from_row(partition, row)


def open_for_change(partition: Partition) -> Steps[_stream.Stream]:
    """The stored header, for a verb that changes the stream: a tombstone means a
    delete is pending, which the writer is told how to finish."""
    row = yield from header_row(partition)
    if row is None:
        raise StreamNotFoundError(partition)
    if _is_deleted(row):
        raise StreamBeingDeletedError(partition)
    return _stream_from_row(partition, row)


def open_stream(partition: Partition) -> Steps[_stream.Stream]:
    row = yield from header_row(partition)
    if row is None or _is_deleted(row):
        raise StreamNotFoundError(partition, deleting=row is not None)
    return _stream_from_row(partition, row)


def find(partition: Partition, event_id: str) -> Steps[int | None]:
    """The version of the event with this id, from its id row."""
    if not isinstance(event_id, str):
        raise TypeError(f"event_id must be a str, got {event_id!r}")
    row = yield from get_entity(partition.partition_key, partition.id_row_key(event_id))
    if row is None:
        return None
    version = from_table(row.properties.get(VERSION))
    if not isinstance(version, int):
        raise StreamstoneError(f"id row of {event_id!r} in {partition} has no integer Version")
    return version


def exists(partition: Partition) -> Steps[bool]:
    return (yield from try_open(partition)) is not None


def set_properties(stream: _stream.Stream, properties: Mapping[str, Any]) -> Steps[_stream.Stream]:
    if stream.etag is None:
        raise ValueError("cannot set properties on a transient stream; provision or write it first")
    partition = stream.partition
    entity = _header_entity(partition, stream.version, properties, stream.first_version)
    check_entity(entity, "stream header")
    etag_before = stream.etag

    def send() -> Steps[str]:
        return (yield from update_entity(entity, etag_before))

    def resolve() -> Steps[str | _Unresolved]:
        row = yield from header_row(partition)
        if row is not None and row.etag == etag_before:
            return NOT_APPLIED
        if row is None or _is_deleted(row):
            return CONFLICT
        found = _stream_from_row(partition, row)
        mine = (found.version, found.first_version, comparable(found.properties)) == (
            stream.version, stream.first_version, comparable(properties),
        )  # fmt: skip
        return row.etag if mine else CONFLICT

    try:
        etag = yield from _attempt(partition, send, resolve)
    except HttpResponseError as exc:
        if exc.status_code in (404, 412):
            raise (yield from _conflict(partition, "the stream header has changed", exc)) from exc
        raise
    return _stream.Stream._stored(partition, etag, stream.version, properties, stream.first_version)


# --- read -----------------------------------------------------------------


def _check_positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def read(partition: Partition, start_version: int, slice_size: int) -> Steps[StreamSlice]:
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
        if header is None or _is_deleted(header):
            raise StreamNotFoundError(partition, deleting=header is not None)
        stream = _stream_from_row(partition, header)
        # Events up to the header's version are committed and immutable: the
        # slice stops there. Rows below a truncation point may linger while
        # truncate sweeps them.
        last = min(end, stream.version)
        first = max(start_version, stream.first_version)
        wanted = list(range(first, last + 1))
        first_key, last_key = partition.event_row_key(first), partition.event_row_key(last)
        events = [
            _recorded_from_row(row.properties)
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
            events = events[:gap] + [_recorded_from_row(row.properties) for row in more]
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


# --- write ----------------------------------------------------------------


@dataclass(slots=True)
class _Chunk:
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

    def add_includes(self, partition_key: str, track_changes: bool) -> None:
        """Append the include operations after the event rows, as Streamstone orders them."""
        for include in fold_includes(self.includes) if track_changes else self.includes:
            etag = include.etag if include.operation in ("replace", "delete") else None
            entity = include.table_entity(partition_key)
            self.operations.append(TableOperation(_INCLUDE_KINDS[include.operation], entity, etag))
            self.roles.append(include)


def _event_operations(
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
    check_entity(row, f"event {event.id or version!r}")
    return ops, roles


def _plan(stream: _stream.Stream, events: Sequence[EventData], track_changes: bool) -> list[_Chunk]:
    """Split the write into transactions of at most 100 operations and 4 MiB.

    Each event is measured alone first, so an event that cannot fit any
    transaction is refused before anything of the write is sent. The header
    of each transaction carries the properties in force at its last event.
    """
    op_budget = MAX_BATCH_OPERATIONS - 1  # the header is in every transaction
    partition = stream.partition
    pk = partition.partition_key
    last_version = stream.version + len(events)
    properties: Mapping[str, Any] = stream.properties
    header_payload = payload_size(_header_of(stream, last_version))
    chunks = [_Chunk(header_properties=properties)]
    for offset, event in enumerate(events):
        version = stream.version + offset + 1
        if event.stream_properties is not None:
            properties = event.stream_properties
            header_payload = payload_size(
                _header_entity(partition, last_version, properties, stream.first_version)
            )
        ops, roles = _event_operations(partition, version, event)
        includes = fold_includes(event.includes) if track_changes else list(event.includes)
        count = len(ops) + len(includes)
        payload = sum(payload_size(op.entity) for op in ops)
        for include in includes:
            entity = include.table_entity(pk)
            check_entity(entity, f"included entity {include.row_key!r}")
            payload += payload_size(entity)
        if count > op_budget or payload + header_payload > MAX_BATCH_BYTES:
            raise ValueError(
                f"event {event.id or version!r} needs {count} operations and about "
                f"{payload + header_payload} bytes with the header; one transaction holds "
                f"{op_budget} besides the header and {MAX_BATCH_BYTES} bytes"
            )
        chunk = chunks[-1]
        if (
            chunk.count + count > op_budget
            or chunk.payload + payload + header_payload > MAX_BATCH_BYTES
        ):
            chunk = _Chunk()
            chunks.append(chunk)
        chunk.events.append(event)
        chunk.operations += ops
        chunk.roles += roles
        chunk.includes += event.includes
        chunk.count += count
        chunk.payload += payload
        chunk.header_properties = properties
    for chunk in chunks:
        chunk.add_includes(pk, track_changes)
    return chunks


def _check_events(events: Sequence[EventData]) -> None:
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


def check_write(
    stream: _stream.Stream, events: Sequence[EventData], track_changes: bool = True
) -> None:
    """Raise what ``write`` would raise for these events before sending anything."""
    _check_events(events)
    _plan(stream, events, track_changes)


def _map_transaction_error(
    partition: Partition, exc: TableTransactionError, roles: list[EventData | Include | int]
) -> _WriteError | None:
    """Turn a failed transaction into the engine's error; ``None`` if it is not ours to map."""
    index = exc.index
    code = error_code(exc)
    role = roles[index - 1] if index is not None and 0 < index <= len(roles) else None
    if isinstance(role, Include):
        return IncludedOperationConflictError(partition, role.operation, role.entity, code)
    if code == "UpdateConditionNotSatisfied" or (index == 0 and code == "ResourceNotFound"):
        return ConcurrencyConflictError(partition, "the stream header has changed")
    if code == "EntityAlreadyExists":
        if index == 0:
            return ConcurrencyConflictError(partition, "the stream already exists")
        if isinstance(role, EventData) and role.id is not None:
            return DuplicateEventError(partition, role.id)
        if isinstance(role, int):
            return ConcurrencyConflictError(
                partition, f"an event with version {role} already exists"
            )
    return None


def write(
    stream: _stream.Stream, events: Sequence[EventData], track_changes: bool = True
) -> Steps[WriteResult]:
    _check_events(events)
    partition = stream.partition
    chunks = _plan(stream, events, track_changes)
    current = stream
    recorded: list[RecordedEvent] = []
    includes: list[Include] = []
    for chunk in chunks:
        version = current.version + len(chunk.events)
        header = _header_entity(partition, version, chunk.header_properties, current.first_version)
        header_op = (
            TableOperation("create", header)
            if current.etag is None
            else TableOperation("update_replace", header, current.etag)
        )
        operations = [header_op, *chunk.operations]

        def send(operations: list[TableOperation] = operations) -> Steps[_Commit]:
            etags = yield from submit_transaction(operations)
            return _Commit(str(etags[0]), etags[1:])

        def resolve(
            before: _stream.Stream = current, chunk: _Chunk = chunk, version: int = version
        ) -> Steps[_Commit | _Unresolved]:
            return (yield from _resolve_chunk(before, chunk, version))

        try:
            commit = yield from _attempt(partition, send, resolve)
        except TableTransactionError as exc:
            error = _map_transaction_error(partition, exc, chunk.roles)
            if error is None:
                raise
            if isinstance(error, ConcurrencyConflictError):
                try:
                    error.current = yield from _refuse_tombstone(partition, exc)
                except StreamBeingDeletedError as deleting:
                    error = deleting
            if recorded:
                error.committed = WriteResult(current, tuple(recorded), tuple(includes))
            raise error from exc
        for offset, event in enumerate(chunk.events, start=current.version + 1):
            recorded.append(RecordedEvent(offset, event.id, event.properties))
        for role, op, new_etag in zip(chunk.roles, chunk.operations, commit.etags, strict=True):
            if isinstance(role, Include):
                kept = None if op.kind == "delete" else new_etag
                includes.append(Include._applied(role.operation, role.entity, kept))
        current = _stream.Stream._stored(
            partition, commit.etag, version, chunk.header_properties, current.first_version
        )
        if commit.moved and chunk is not chunks[-1]:
            # Ours committed, but others appended after it: the rest would interleave.
            error = ConcurrencyConflictError(
                partition, "the stream changed between the transactions of this write"
            )
            error.committed = WriteResult(current, tuple(recorded), tuple(includes))
            raise error
    return WriteResult(current, tuple(recorded), tuple(includes))


@dataclass(frozen=True, slots=True)
class _Commit:
    """A chunk that committed: the header's new ETag and the ETags of the
    chunk's other operations. ``moved``: found committed after an ambiguous
    answer, with the stream changed by others since (the ETag is then
    :data:`STALE_ETAG`)."""

    etag: str
    etags: Sequence[str | None]
    moved: bool = False


def _resolve_chunk(
    before: _stream.Stream, chunk: _Chunk, version: int
) -> Steps[_Commit | _Unresolved]:
    """Did this chunk commit? Compare the stream with its header and events."""
    partition = before.partition
    row = yield from header_row(partition)
    if row is None if before.etag is None else row is not None and row.etag == before.etag:
        return NOT_APPLIED
    if row is None or _is_deleted(row):
        return CONFLICT
    header = _stream_from_row(partition, row)
    if header.version < version:
        return CONFLICT
    stored = yield from query_entities(
        "PartitionKey eq @pk and RowKey ge @first and RowKey le @last",
        {
            "pk": partition.partition_key,
            "first": partition.event_row_key(before.version + 1),
            "last": partition.event_row_key(version),
        },
        page_size=1000,
    )
    found = [_recorded_from_row(r.properties) for r in stored]
    expected = [
        RecordedEvent(v, e.id, dict(e.properties))
        for v, e in enumerate(chunk.events, start=before.version + 1)
    ]
    if [(e.version, e.id, comparable(e.properties)) for e in found] != [
        (e.version, e.id, comparable(e.properties)) for e in expected
    ]:
        return CONFLICT
    # Our events are there, so our includes were applied with them: read their ETags.
    etags: list[str | None] = []
    for role, op in zip(chunk.roles, chunk.operations, strict=True):
        if not isinstance(role, Include) or op.kind == "delete":
            etags.append(None)
            continue
        included = yield from get_entity(partition.partition_key, op.entity["RowKey"])
        etags.append(included.etag if included is not None else None)
    ours = (version, before.first_version, comparable(chunk.header_properties))
    if (header.version, header.first_version, comparable(header.properties)) != ours:
        # Others changed the stream after our commit. Their header's ETag would
        # let the caller's next write through on top of changes it never saw.
        return _Commit(STALE_ETAG, etags, moved=True)
    return _Commit(row.etag, etags)


def write_to(
    target: _stream.Stream | Partition,
    events: Sequence[EventData],
    expected_version: int | None,
    track_changes: bool = True,
) -> Steps[WriteResult]:
    """``Stream.write``'s two forms: after a header, or at an expected version."""
    if isinstance(target, _stream.Stream):
        if expected_version is not None:
            raise TypeError("expected_version is for writes to a Partition, not to a header")
        return (yield from write(target, events, track_changes))
    if isinstance(target, Partition):
        if expected_version is None:
            raise TypeError("a write to a Partition needs expected_version=N (0: a new stream)")
        return (yield from write_expected(target, events, expected_version, track_changes))
    raise TypeError(f"write target must be a Stream or a Partition, got {target!r}")


def write_expected(
    partition: Partition,
    events: Sequence[EventData],
    expected_version: int,
    track_changes: bool = True,
) -> Steps[WriteResult]:
    if not isinstance(expected_version, int) or isinstance(expected_version, bool):
        raise TypeError(f"expected_version must be an int, got {expected_version!r}")
    if expected_version < 0:
        raise ValueError(f"expected_version must be >= 0, got {expected_version}")
    _check_events(events)
    if expected_version == 0:
        # A new stream: the header insert itself fails if the stream exists.
        stream = _stream.Stream(partition)
    else:
        found = yield from open_for_change(partition)
        if found.version != expected_version:
            raise ConcurrencyConflictError(
                partition, f"expected version {expected_version}, the stream is at {found.version}"
            )
        stream = found
    return (yield from write(stream, events, track_changes))
