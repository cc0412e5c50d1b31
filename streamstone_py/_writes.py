"""Writing events: each transaction of the plan, conditional on the header
of the one before, with its outcome resolved when the answer is lost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from azure.data.tables import TableTransactionError

from ._attempts import CONFLICT, NOT_APPLIED, Unresolved, attempt, refuse_tombstone
from ._codec._values import comparable
from ._errors import (
    ConcurrencyConflictError,
    DuplicateEventError,
    IncludedOperationConflictError,
    PartialWriteError,
    StreamBeingDeletedError,
    _WriteError,
)
from ._header_type import H, Header
from ._headers import open_for_change
from ._model import EventData, Include, RecordedEvent, WriteResult
from ._partition import Partition
from ._plan import Chunk, check_events, plan
from ._rows import header_entity, header_row, is_deleted, recorded_from_row, stream_from_row
from ._transport._protocol import (
    Steps,
    TableOperation,
    error_code,
    get_entity,
    query_entities,
    submit_transaction,
)

__all__ = ["STALE_ETAG", "write", "write_expected", "write_to"]

#: A well-formed ETag that no row ever has (its time precedes every write): a
#: header that carries it makes the next conditional write conflict.
STALE_ETAG: Final = "W/\"datetime'1970-01-01T00%3A00%3A00.0000000Z'\""


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


def write(stream: H, events: Sequence[EventData], track_changes: bool) -> Steps[WriteResult[H]]:
    check_events(events)
    partition = stream.partition
    header_type = type(stream)
    chunks = plan(stream, events, track_changes)
    current = stream
    recorded: list[RecordedEvent] = []
    includes: list[Include] = []

    def so_far() -> WriteResult[H]:
        return WriteResult(current, tuple(recorded), tuple(includes))

    for chunk in chunks:
        version = current.version + len(chunk.events)
        try:
            commit = yield from _commit(current, chunk, version)
        except _WriteError as error:
            if recorded:
                error.committed = so_far()
            raise
        except Exception as exc:
            if not recorded:
                raise  # nothing of this write is stored: the error as it came
            raise PartialWriteError(partition, so_far(), exc) from exc
        for offset, event in enumerate(chunk.events, start=current.version + 1):
            recorded.append(RecordedEvent(offset, event.id, event.properties))
        for role, new_etag in zip(chunk.roles, commit.etags, strict=True):
            if isinstance(role, Include):  # a deleted row has no ETag: None
                includes.append(Include._applied(role.operation, role.entity, new_etag))
        current = header_type._stored(
            partition, commit.etag, version, chunk.header_properties, current.first_version
        )
        if commit.moved and chunk is not chunks[-1]:
            # Ours committed, but others appended after it: the rest would interleave.
            moved = ConcurrencyConflictError(
                partition, "the stream changed between the transactions of this write"
            )
            moved.committed = so_far()
            raise moved
    return so_far()


def _commit(before: Header, chunk: Chunk, version: int) -> Steps[_Commit]:
    """One transaction of the plan, conditional on the header ``before`` it,
    its outcome resolved if the answer is lost; a failure as the engine's error."""
    partition = before.partition
    header_type = type(before)
    header = header_entity(partition, version, chunk.header_properties, before.first_version)
    header_op = (
        TableOperation("create", header)
        if before.etag is None
        else TableOperation("update_replace", header, before.etag)
    )
    operations = [header_op, *chunk.operations]

    def send() -> Steps[_Commit]:
        etags = yield from submit_transaction(operations)
        return _Commit(str(etags[0]), etags[1:])

    def resolve() -> Steps[_Commit | Unresolved]:
        return (yield from _resolve_chunk(before, chunk, version))

    try:
        return (yield from attempt(partition, send, resolve, header_type))
    except TableTransactionError as exc:
        error = _map_transaction_error(partition, exc, chunk.roles)
        if error is None:
            raise
        if isinstance(error, ConcurrencyConflictError):
            try:
                error.current = yield from refuse_tombstone(partition, exc, header_type)
            except StreamBeingDeletedError as deleting:
                error = deleting
        raise error from exc


@dataclass(frozen=True, slots=True)
class _Commit:
    """A chunk that committed: the header's new ETag and the ETags of the
    chunk's other operations (``None`` for a delete). ``moved``: found
    committed after an ambiguous answer, with the stream changed by others
    since (the ETag is then :data:`STALE_ETAG`)."""

    etag: str
    etags: Sequence[str | None]
    moved: bool = False


def _resolve_chunk(before: Header, chunk: Chunk, version: int) -> Steps[_Commit | Unresolved]:
    """Did this chunk commit? Compare the stream with its header and events."""
    partition = before.partition
    row = yield from header_row(partition)
    if row is None if before.etag is None else row is not None and row.etag == before.etag:
        return NOT_APPLIED
    if row is None or is_deleted(row):
        return CONFLICT
    header = stream_from_row(partition, row, type(before))
    if header.version < version:
        return CONFLICT
    stored = yield from query_entities(
        "PartitionKey eq @pk and RowKey ge @first and RowKey le @last",
        {
            "pk": partition.partition_key,
            "first": partition.event_row_key(before.version + 1),
            "last": partition.event_row_key(version),
        },
        page_size=len(chunk.events),  # the rows the range can hold: one page
    )
    found = [recorded_from_row(r.properties) for r in stored]
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
    target: H | Partition,
    events: Sequence[EventData],
    expected_version: int | None,
    track_changes: bool,
    header_type: type[H],
) -> Steps[WriteResult[H]]:
    """``Stream.write``'s two forms: after a header, or at an expected version."""
    if isinstance(target, header_type):
        if expected_version is not None:
            raise TypeError("expected_version is for writes to a Partition, not to a header")
        return (yield from write(target, events, track_changes))
    if isinstance(target, Partition):
        if expected_version is None:
            raise TypeError("a write to a Partition needs expected_version=N (0: a new stream)")
        return (
            yield from write_expected(target, events, expected_version, track_changes, header_type)
        )
    raise TypeError(f"write target must be a Stream or a Partition, got {target!r}")


def write_expected(
    partition: Partition,
    events: Sequence[EventData],
    expected_version: int,
    track_changes: bool,
    header_type: type[H],
) -> Steps[WriteResult[H]]:
    if not isinstance(expected_version, int) or isinstance(expected_version, bool):
        raise TypeError(f"expected_version must be an int, got {expected_version!r}")
    if expected_version < 0:
        raise ValueError(f"expected_version must be >= 0, got {expected_version}")
    check_events(events)
    if expected_version == 0:
        # A new stream: the header insert itself fails if the stream exists.
        stream = header_type(partition)
    else:
        found = yield from open_for_change(partition, header_type)
        if found.version != expected_version:
            raise ConcurrencyConflictError(
                partition, f"expected version {expected_version}, the stream is at {found.version}"
            )
        stream = found
    return (yield from write(stream, events, track_changes))
