"""Every error the engine raises, in one place, drawn once here::

    StreamstoneError                        a storage outcome (.partition on all below)
    ├── ConcurrencyConflictError            .reason, .current, .committed
    │   └── StreamBeingDeletedError         a delete is pending: finish it
    ├── DuplicateEventError                 .id, .committed
    ├── IncludedOperationConflictError      .operation, .entity, .code, .committed
    ├── PartialWriteError                   .committed, .__cause__
    └── StreamNotFoundError                 .deleting

``committed`` is what earlier transactions of a split write stored before
this one failed (``None`` if nothing was); ``current`` is the header read
just after a conflict.

``StreamstoneError`` is the root of the storage-outcome errors:

- :class:`ConcurrencyConflictError`: someone else changed the stream since the
  header you hold was read (or a stream you meant to create already exists).
  Re-open the stream and decide again.
- :class:`DuplicateEventError`: an event with the same id is already stored in
  the stream. Nothing of that transaction was stored.
- :class:`StreamBeingDeletedError`: a write met a stream whose delete has
  begun and not finished (its header is a tombstone). Finish it with
  ``Stream.delete(partition)``, then write again.
- :class:`StreamNotFoundError`: the stream has no header row (or only a
  tombstone: readers see a stream being deleted as gone).
- :class:`IncludedOperationConflictError`: an included entity could not be
  written (it already exists, or its ETag is stale, or it is missing).
- :class:`PartialWriteError`: a write split over several transactions stored
  some of them, then stopped on an error that is none of the above (its
  ``__cause__``): ``committed`` says what is stored.

Bad arguments are not storage outcomes: they raise the built-in ``ValueError``
or ``TypeError``, naming the bad value, before any request is sent (an id
twice in one write is one of them). Transient faults are retried by the
partition's :class:`RetryPolicy`; a write whose outcome stayed unknown is
resolved by reading the stream, so it ends as a success or as one of the
errors above. What remains after the retries, and the Azure SDK's errors that
the engine cannot interpret (authentication, a missing table), propagate
unchanged, unless earlier transactions of the same write were stored: then
the caller gets a :class:`PartialWriteError` with that error as its cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic

from ._header_type import H_co
from ._model import WriteResult
from ._partition import Partition

__all__ = [
    "ConcurrencyConflictError",
    "DuplicateEventError",
    "IncludedOperationConflictError",
    "PartialWriteError",
    "StreamBeingDeletedError",
    "StreamNotFoundError",
    "StreamstoneError",
]


class StreamstoneError(Exception):
    """Base class of the errors that report a storage outcome."""


class _PartitionError(StreamstoneError):
    def __init__(self, partition: Partition, message: str) -> None:
        super().__init__(f"{message} (partition {partition})")
        self.partition = partition


class _WriteError(_PartitionError, Generic[H_co]):
    # Generic in the header it holds (a Stream: the verbs are that class's), because
    # the errors stand below the class; see _header_type.
    #: For a write split over several transactions: what the earlier
    #: transactions committed before this one failed (``None`` if nothing was).
    committed: WriteResult[H_co] | None = None


class ConcurrencyConflictError(_WriteError[H_co]):
    """The stream changed since its header was read, or already exists.

    The partition is left exactly as it was before the failing transaction.
    ``current`` is the stream as the engine read it just after the conflict
    (it reads the header to tell a conflict from a pending delete): write on
    it to retry without another read. ``None`` when no stream was found, or
    the header was not read.
    """

    def __init__(self, partition: Partition, reason: str) -> None:
        super().__init__(partition, f"Concurrent write detected: {reason}")
        self.reason = reason
        self.current: H_co | None = None


class DuplicateEventError(_WriteError[H_co]):
    """An event with this id already exists in the stream. ``id`` names it."""

    def __init__(self, partition: Partition, id: str) -> None:
        super().__init__(partition, f"An event with id {id!r} already exists in the stream")
        self.id = id


class StreamBeingDeletedError(ConcurrencyConflictError[H_co]):
    """A write met a stream whose delete has begun and not finished.

    Its header is a tombstone: a delete is running, or was interrupted.
    ``Stream.delete(partition)`` finishes it; then the key can hold a new stream.
    """

    def __init__(self, partition: Partition) -> None:
        super().__init__(
            partition,
            "the stream is being deleted (its header is a tombstone: a delete is running or "
            "was interrupted); finish it with Stream.delete(partition), then write again",
        )


class StreamNotFoundError(_PartitionError):
    """The stream's header row does not exist, or is the tombstone of a delete
    that has not finished (``deleting`` is then true)."""

    def __init__(self, partition: Partition, *, deleting: bool = False) -> None:
        message = "Stream not found"
        if deleting:
            message += (
                ": it is being deleted (a delete is running or was interrupted; "
                "Stream.delete(partition) finishes it)"
            )
        super().__init__(partition, message)
        self.deleting = deleting


class IncludedOperationConflictError(_WriteError[H_co]):
    """An included entity operation failed; ``entity`` and ``operation`` name it."""

    def __init__(
        self, partition: Partition, operation: str, entity: Mapping[str, Any], code: str | None
    ) -> None:
        row_key = entity.get("RowKey")
        detail = f" ({code})" if code else ""
        super().__init__(
            partition,
            f"Included {operation!r} of entity with RowKey {row_key!r} had a conflict{detail}",
        )
        self.operation = operation
        self.entity = entity
        self.code = code


class PartialWriteError(_WriteError[H_co]):
    """A write split over several transactions stored some of them, then
    stopped on an error that is none of the engine's outcomes: a fault that
    outlasted the retries or the call's deadline, an error the engine does
    not interpret. That error is ``__cause__``, the one the caller would have
    got had nothing been stored.

    ``committed`` is what the earlier transactions stored (never ``None``
    here). If the cause left the outcome of the failing transaction unknown
    (its answer was lost, and the reads that would tell failed too), that
    transaction may be stored as well: read the stream to know
    (``Stream.find`` gives the version of an event id, or ``None``).
    """

    committed: WriteResult[H_co]

    def __init__(
        self, partition: Partition, committed: WriteResult[H_co], cause: Exception
    ) -> None:
        lines = str(cause).splitlines()
        super().__init__(
            partition,
            f"A write split over several transactions stopped after {len(committed.events)} "
            f"of its events were stored, up to version {committed.stream.version}: "
            f"{type(cause).__name__}: {lines[0] if lines else ''}",
        )
        self.committed = committed
