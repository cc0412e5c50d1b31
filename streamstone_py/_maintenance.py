"""Truncation and deletion: removing rows without losing track of what was there.

Both first change the header, conditional on its ETag, and only then sweep
rows in bounded transactions. The header change is what readers and writers
see; the sweep that follows is idempotent, so an interrupted call is finished
by calling again.
"""

from __future__ import annotations

from typing import Final

from azure.core.exceptions import AzureError
from azure.data.tables import TableTransactionError

from ._codec._values import EVENT_ID
from ._errors import ConcurrencyConflictError, StreamNotFoundError
from ._header_type import H
from ._headers import open_for_change
from ._partition import EVENT_PREFIX, ID_PREFIX, Partition
from ._plan import MAX_BATCH_OPERATIONS
from ._rows import header_entity, header_of, header_row, is_deleted, stream_from_row
from ._transport._protocol import (
    Steps,
    TableOperation,
    error_code,
    pause,
    query_entities,
    submit_transaction,
    update_entity,
)
from ._transport._retry import is_ambiguous

__all__ = ["delete", "truncate"]

#: Re-reads of a header that keeps changing under a truncation.
_HEADER_ATTEMPTS: Final = 10


def _check_batch_size(batch_size: object) -> int:
    if not isinstance(batch_size, int) or isinstance(batch_size, bool):
        raise TypeError(f"batch_size must be an int, got {batch_size!r}")
    if not 2 <= batch_size <= MAX_BATCH_OPERATIONS:
        raise ValueError(
            f"batch_size must be between 2 and {MAX_BATCH_OPERATIONS}, got {batch_size}"
        )
    return batch_size


def _after(prefix: str) -> str:
    """The smallest key above every key that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _conflict_or_ambiguous(exc: AzureError) -> bool:
    """The header did not change as asked, or may have: read it to know."""
    status = getattr(exc, "status_code", None)
    return status in (404, 412) or is_ambiguous(exc)


def _delete_rows(partition: Partition, row_keys: list[str]) -> Steps[int]:
    """Delete rows in one transaction; rows already gone are skipped, not errors.

    Unconditional deletes are idempotent, so after an ambiguous failure the
    sweep simply looks again.
    """
    keys = list(row_keys)
    while keys:
        ops = [
            TableOperation("delete", {"PartitionKey": partition.partition_key, "RowKey": k}, "*")
            for k in keys
        ]
        try:
            yield from submit_transaction(ops)
            return len(keys)
        except TableTransactionError as exc:
            index = exc.index
            if error_code(exc) != "ResourceNotFound" or index is None or not 0 <= index < len(keys):
                raise
            del keys[index]  # a concurrent sweep removed it first
    return 0


def _sweep(
    partition: Partition, first: str, end: str, batch_size: int, with_id_rows: bool
) -> Steps[int]:
    """Delete every row with ``first <= RowKey < end`` (and their id rows), batch by batch."""
    per_query = batch_size // 2 if with_id_rows else batch_size
    removed = 0
    doubtful = 0
    while True:
        rows = yield from query_entities(
            "PartitionKey eq @pk and RowKey ge @first and RowKey lt @end",
            {"pk": partition.partition_key, "first": first, "end": end},
            page_size=per_query,
            select=("RowKey", EVENT_ID) if with_id_rows else ("RowKey",),
            limit=per_query,
        )
        if not rows:
            return removed
        keys: list[str] = []
        for row in rows:
            keys.append(row.properties["RowKey"])
            event_id = row.properties.get(EVENT_ID) if with_id_rows else None
            if event_id:
                keys.append(partition.id_row_key(str(event_id)))
        try:
            removed += yield from _delete_rows(partition, keys)
        except AzureError as exc:
            doubtful += 1
            if not is_ambiguous(exc) or doubtful >= partition.retry.attempts:
                raise
            yield from pause(doubtful, exc)


def truncate(stream: H, before_version: int, batch_size: int) -> Steps[H]:
    if stream.etag is None:
        raise ValueError("cannot truncate a transient stream")
    if not isinstance(before_version, int) or isinstance(before_version, bool):
        raise TypeError(f"before_version must be an int, got {before_version!r}")
    if not 1 <= before_version <= stream.version + 1:
        raise ValueError(
            f"before_version must be between 1 and {stream.version + 1} "
            f"(the stream is at version {stream.version}), got {before_version}"
        )
    _check_batch_size(batch_size)
    partition = stream.partition
    current = stream
    # Rows below the cut may be swept only once the stored header has it: a
    # header given here may be stale, or from before the stream was recreated.
    stored = False
    for _ in range(_HEADER_ATTEMPTS):
        if current.first_version >= before_version and stored:
            break
        if current.first_version < before_version:
            if before_version > current.version + 1:
                raise ConcurrencyConflictError(
                    partition,
                    f"the stream is at version {current.version} now, below the cut "
                    f"{before_version} asked for",
                )
            entity = header_entity(partition, current.version, current.properties, before_version)
            try:
                # A header read always has an ETag; "" would be refused, never unconditional.
                etag = yield from update_entity(entity, current.etag or "")
            except AzureError as exc:
                if not _conflict_or_ambiguous(exc):
                    raise
            else:
                current = type(stream)._stored(
                    partition, etag, current.version, current.properties, before_version
                )
                break
        # Appends do not change which rows are below the cut: re-read and mark again.
        current = yield from open_for_change(partition, type(stream))
        stored = True
    else:
        raise ConcurrencyConflictError(
            partition, f"the header changed in each of {_HEADER_ATTEMPTS} attempts to truncate"
        )
    yield from _sweep(
        partition,
        partition.row_key_prefix + EVENT_PREFIX,
        partition.event_row_key(before_version),
        batch_size,
        with_id_rows=True,
    )
    return current


def delete(target: H | Partition, batch_size: int, header_type: type[H]) -> Steps[None]:
    """Delete the stream of ``target``: conditional on a header's ETag, or, given
    a partition, on the header as read now (which also finishes a delete that
    another process began)."""
    if isinstance(target, Partition):
        _check_batch_size(batch_size)
        row = yield from header_row(target)
        if row is None:
            raise StreamNotFoundError(target)
        if is_deleted(row):
            yield from _finish_delete(target, row.etag, batch_size)
            return
        stream = stream_from_row(target, row, header_type)
    elif isinstance(target, header_type):
        stream = target
    else:
        raise TypeError(f"delete target must be a Stream or a Partition, got {target!r}")
    if stream.etag is None:
        raise ValueError(
            "cannot delete a transient stream; to finish an interrupted delete, "
            "pass the partition: Stream.delete(partition)"
        )
    _check_batch_size(batch_size)
    partition = stream.partition
    for attempt in range(1, partition.retry.attempts + 1):
        try:
            etag = yield from update_entity(header_of(stream, deleted=True), stream.etag)
            break
        except AzureError as exc:
            if not _conflict_or_ambiguous(exc):
                raise
            row = yield from header_row(partition)
            if row is None:
                raise StreamNotFoundError(partition) from exc
            if is_deleted(row):
                etag = row.etag  # ours after all, or an interrupted delete: finish it
                break
            if row.etag != stream.etag:
                raise ConcurrencyConflictError(partition, "the stream header has changed") from exc
            if attempt == partition.retry.attempts:
                raise  # the header is unchanged: the tombstone was never written
            yield from pause(attempt, exc)
    yield from _finish_delete(partition, etag, batch_size)


def _finish_delete(partition: Partition, etag: str, batch_size: int) -> Steps[None]:
    """Sweep the rows of a stream whose header is the tombstone ``etag``, then the header."""
    events = partition.row_key_prefix + EVENT_PREFIX
    ids = partition.row_key_prefix + ID_PREFIX
    yield from _sweep(partition, events, _after(events), batch_size, with_id_rows=True)
    yield from _sweep(partition, ids, _after(ids), batch_size, with_id_rows=False)
    header = {"PartitionKey": partition.partition_key, "RowKey": partition.header_row_key}
    for attempt in range(1, partition.retry.attempts + 1):
        try:
            yield from submit_transaction([TableOperation("delete", header, etag)])
            return
        except TableTransactionError as exc:
            if error_code(exc) != "ResourceNotFound":  # gone: a concurrent delete finished first
                raise
            return
        except AzureError as exc:
            if not is_ambiguous(exc) or attempt == partition.retry.attempts:
                raise
            if (yield from header_row(partition)) is None:
                return  # the lost answer was a success
            yield from pause(attempt, exc)
