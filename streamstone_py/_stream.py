"""The stream header and the verbs that read and write streams."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from functools import partial
from typing import Any

from azure.data.tables import TableClient

from . import _headers, _maintenance, _plan, _reads, _scan, _writes
from ._codec._values import RESERVED_NAMES, PropertyValue, comparable, convert_properties, freeze
from ._model import EventData, StreamSlice, WriteResult
from ._partition import Partition
from ._transport._retry import DEFAULT_POLICY, RetryPolicy
from ._transport._runner import pages, run

__all__ = ["Stream"]


class Stream:
    """An immutable stream header: where the stream is, its version and ETag.

    ``Stream(partition, properties)`` is a *transient* header, for a stream not
    stored yet: the first write creates it. Every verb that stores something
    returns a new header; pass it to the next write, and the write succeeds only
    if nobody else wrote in between (optimistic concurrency on the header's
    ETag).

    The verbs are static methods: ``Stream.provision``, ``Stream.open``,
    ``Stream.try_open``, ``Stream.exists``, ``Stream.find``, ``Stream.write``,
    ``Stream.check_write``, ``Stream.read``, ``Stream.set_properties``,
    ``Stream.truncate``, ``Stream.delete``, ``Stream.scan`` and
    ``Stream.scan_keys``; :mod:`streamstone_py.aio` has the same verbs as
    coroutines (``check_write`` sends nothing, so it stays a plain function
    there), but for the two scans.
    """

    __slots__ = ("etag", "first_version", "partition", "properties", "version")

    partition: Partition
    etag: str | None
    version: int
    properties: Mapping[str, PropertyValue]
    #: The oldest version still stored: 1, or where :meth:`truncate` cut the stream.
    first_version: int

    def __init__(
        self, partition: Partition, properties: Mapping[str, PropertyValue] | None = None
    ) -> None:
        if not isinstance(partition, Partition):
            raise TypeError(f"partition must be a Partition, got {partition!r}")
        convert_properties(properties or {}, RESERVED_NAMES, "stream")
        self._set(partition, None, 0, properties)

    def _set(
        self,
        partition: Partition,
        etag: str | None,
        version: int,
        properties: Mapping[str, Any] | None,
        first_version: int = 1,
    ) -> None:
        object.__setattr__(self, "partition", partition)
        object.__setattr__(self, "first_version", first_version)
        object.__setattr__(self, "etag", etag)
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "properties", freeze(properties))

    @classmethod
    def _stored(
        cls,
        partition: Partition,
        etag: str,
        version: int,
        properties: Mapping[str, Any] | None,
        first_version: int = 1,
    ) -> Stream:
        stream = cls.__new__(cls)
        stream._set(partition, etag, version, properties, first_version)
        return stream

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Stream is immutable; verbs return a new header")

    def with_properties(self, properties: Mapping[str, PropertyValue]) -> Stream:
        """This header with other properties: the next write stores them, in
        the same transaction as its events (and conditional on the same ETag)."""
        convert_properties(properties, RESERVED_NAMES, "stream")
        copy = Stream.__new__(Stream)
        copy._set(self.partition, self.etag, self.version, properties, self.first_version)
        return copy

    def with_partition(self, partition: Partition) -> Stream:
        """This header on another :class:`Partition` object of the same stream
        (same endpoint, table and key), such as one built on a client of your
        own: the verbs then send through that partition's client, with its
        retry policy. Raises ``ValueError`` for a partition of another stream."""
        if not isinstance(partition, Partition):
            raise TypeError(f"partition must be a Partition, got {partition!r}")
        if partition != self.partition:
            raise ValueError(
                f"{partition!r} at {partition.endpoint!r} is not the partition of this header, "
                f"{self.partition!r} at {self.partition.endpoint!r}"
            )
        copy = type(self).__new__(type(self))
        copy._set(partition, self.etag, self.version, self.properties, self.first_version)
        return copy

    @property
    def is_transient(self) -> bool:
        """True for a header that is not stored yet (no ETag)."""
        return self.etag is None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stream):
            return NotImplemented
        return self._key() == other._key()

    def _key(self) -> tuple[object, ...]:
        props = comparable(self.properties)
        return (self.partition, self.etag, self.version, props, self.first_version)

    __hash__ = None  # type: ignore[assignment]  # equal headers may have unhashable properties

    def __repr__(self) -> str:
        return (
            f"Stream(partition={self.partition!r}, version={self.version}, "
            f"etag={self.etag!r}, properties={dict(self.properties)!r}"
            + (f", first_version={self.first_version}" if self.first_version > 1 else "")
            + ")"
        )

    # --- verbs ------------------------------------------------------------

    @staticmethod
    def provision(
        partition: Partition, properties: Mapping[str, PropertyValue] | None = None
    ) -> Stream:
        """Create an empty stream (version 0).

        Raises :class:`ConcurrencyConflictError` if the stream already exists.
        """
        return run(partition, _headers.provision(partition, properties, Stream))

    @staticmethod
    def open(partition: Partition) -> Stream:
        """Read the stream's header. Raises :class:`StreamNotFoundError` if missing."""
        return run(partition, _headers.open_stream(partition, Stream))

    @staticmethod
    def try_open(partition: Partition) -> Stream | None:
        """Read the stream's header, or ``None`` if the stream does not exist."""
        return run(partition, _headers.try_open(partition, Stream))

    @staticmethod
    def exists(partition: Partition) -> bool:
        """True if the stream has a header row."""
        return run(partition, _headers.exists(partition))

    @staticmethod
    def find(partition: Partition, event_id: str) -> int | None:
        """The version of the event with id ``event_id``, or ``None`` if the
        stream holds no such event (one point read of its id row)."""
        return run(partition, _headers.find(partition, event_id))

    @staticmethod
    def write(
        target: Stream | Partition,
        *events: EventData,
        expected_version: int | None = None,
        track_changes: bool = True,
    ) -> WriteResult[Stream]:
        """Append events to a stream in one entity-group transaction.

        ``Stream.write(stream, *events)`` writes after the header ``stream``
        (a transient header creates the stream). ``Stream.write(partition,
        *events, expected_version=N)`` writes if the stream is at version ``N``
        (``0``: it must not exist yet).

        Raises :class:`ConcurrencyConflictError` if the stream changed since the
        header was read, or an event version is taken; :class:`DuplicateEventError`
        if an event id is already stored; :class:`IncludedOperationConflictError`
        if an include fails. In each case the partition is left as it was.

        The result's ``stream`` is the header as this write left it. If the
        answer was lost and others changed the stream before the engine found
        the write committed, that header carries an ETag that matches no row:
        a write, ``set_properties`` or ``delete`` with it conflicts, so the
        caller re-reads instead of acting on changes it has not seen.

        Several includes of one RowKey in one transaction fold into one
        operation (see :func:`fold_includes`); ``track_changes=False`` sends
        them as given.

        A write of more than 99 rows, or over 4 MiB, is split into consecutive
        transactions, each conditional on the header of the one before: it is
        atomic per transaction only. If a later transaction fails, the error's
        ``committed`` holds what the earlier ones stored. A header that carries
        a snapshot of the stream should take it from each event's
        ``stream_properties``: then every committed transaction's header
        matches the events it stored.
        """
        partition = target.partition if isinstance(target, Stream) else target
        return run(
            partition, _writes.write_to(target, events, expected_version, track_changes, Stream)
        )

    @staticmethod
    def check_write(stream: Stream, *events: EventData, track_changes: bool = True) -> None:
        """Raise the ``ValueError`` or ``TypeError`` that writing ``events`` after
        ``stream`` would raise (a bad id or row key, an entity or an event over
        Azure's limits), without sending anything.

        Storage outcomes (conflicts, duplicates) are not predicted: only what
        the write refuses before its first request.
        """
        _plan.check_write(stream, events, track_changes)

    @staticmethod
    def read(
        partition: Partition, start_version: int = 1, slice_size: int = 1000
    ) -> StreamSlice[Stream]:
        """Read up to ``slice_size`` events from ``start_version`` on, in version order.

        Page through a stream with ``start_version = last.version + 1`` until
        ``is_end_of_stream``. Raises :class:`StreamNotFoundError` if missing.
        The events are contiguous: every version from ``max(start_version,
        stream.first_version)`` to ``min(start_version + slice_size - 1,
        stream.version)`` of the header the slice reports.
        """
        return run(partition, _reads.read(partition, start_version, slice_size, Stream))

    @staticmethod
    def set_properties(stream: Stream, properties: Mapping[str, PropertyValue]) -> Stream:
        """Replace the stream's properties, conditional on the header's ETag."""
        return run(stream.partition, _headers.set_properties(stream, properties))

    @staticmethod
    def truncate(stream: Stream, before_version: int, *, batch_size: int = 100) -> Stream:
        """Delete the events below ``before_version`` (and their id rows).

        The header records the new first version first (conditional on its
        ETag; on a conflict it is re-read and marked again, since appends do
        not move the cut), then old rows are deleted in transactions of at most
        ``batch_size`` rows. Rows are deleted only below a cut the stored
        header carries: a stale header is checked against the stored one, and
        if the stream is now shorter than the cut (it was deleted and created
        again) :class:`ConcurrencyConflictError` is raised and nothing is
        deleted. A stream being deleted raises :class:`StreamBeingDeletedError`.
        Reads of the removed range report ``truncated=True``; ids of removed
        events are no longer detected as duplicates. An interrupted truncation
        is finished by calling again. Returns the new header.
        """
        return run(stream.partition, _maintenance.truncate(stream, before_version, batch_size))

    @staticmethod
    def delete(target: Stream | Partition, *, batch_size: int = 100) -> None:
        """Delete the whole stream, conditional on its header's ETag.

        The header becomes a tombstone first (the stream then no longer exists
        for readers, and writers get :class:`StreamBeingDeletedError`), then
        event and id rows go in transactions of at most ``batch_size`` rows,
        then the header. Included entities are not part of the stream and stay.

        ``Stream.delete(partition)`` deletes the stream as it is now (the
        header read then), and finishes a delete that was interrupted, in this
        process or another: call it when a write raised
        :class:`StreamBeingDeletedError`. Any header of a tombstoned stream
        finishes it too.
        """
        partition = target.partition if isinstance(target, Stream) else target
        run(partition, _maintenance.delete(target, batch_size, Stream))

    @staticmethod
    def scan(
        table: TableClient,
        stream_name: str | None = None,
        *,
        start_key: str | None = None,
        end_key: str | None = None,
        page_size: int = 1000,
        retry: RetryPolicy = DEFAULT_POLICY,
    ) -> Iterator[_scan.ScannedStream[Stream]]:
        """Every stream called ``stream_name`` (``None``: the plain streams) in the
        table whose partition key is ``>= start_key`` and ``< end_key`` (either
        bound may be left open), in partition-key order, a page at a time.

        One query over the range: the service reads every row of it to find the
        headers, so give a range to split a large table among workers (list the
        keys with :meth:`scan_keys`). Streams being deleted are left out.
        """
        first = partial(_scan.query, table, stream_name, start_key, end_key, page_size, None)
        return _scan.scan(pages(table, retry, first), table, stream_name, retry, Stream)

    @staticmethod
    def scan_keys(
        table: TableClient,
        stream_name: str | None = None,
        *,
        start_key: str | None = None,
        end_key: str | None = None,
        page_size: int = 1000,
    ) -> Iterator[str]:
        """The partition keys :meth:`scan` would visit, without their headers' properties."""
        first = partial(_scan.query, table, stream_name, start_key, end_key, page_size, _scan.KEYS)
        return _scan.scan_keys(pages(table, DEFAULT_POLICY, first))
