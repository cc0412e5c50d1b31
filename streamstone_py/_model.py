"""The values that go into and come out of a stream."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal

from ._codec._values import (
    RESERVED_NAMES,
    SYSTEM_NAMES,
    PropertyValue,
    check_entity,
    convert_properties,
    freeze,
)
from ._header_type import H_co
from ._partition import RESERVED_PREFIX, SEPARATOR, check_key

__all__ = [
    "EventData",
    "Include",
    "RecordedEvent",
    "StreamSlice",
    "WriteResult",
    "check_row",
    "fold_includes",
    "is_stream_row_key",
]

IncludeOperation = Literal["insert", "replace", "delete", "insert_or_merge", "insert_or_replace"]


def is_stream_row_key(row_key: str) -> bool:
    """Could a row with this RowKey be one of a stream's rows? Those of a plain
    stream start with ``SS-``; those of virtual stream ``name`` with
    ``name|SS-``, and a name holds no ``|``. So exactly the keys that start
    with ``SS-``, or whose rest after the first ``|`` does."""
    return row_key.startswith(RESERVED_PREFIX) or row_key.partition(SEPARATOR)[2].startswith(
        RESERVED_PREFIX
    )


def check_row(entity: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """The row as Azure Tables would store it, or ``ValueError``/``TypeError``
    naming ``owner`` and what cannot be stored: a key the table refuses, a
    property of an unsupported type or over 64 KiB, too many properties, or
    an entity over 1 MiB. Nothing is sent."""
    converted: dict[str, Any] = {}
    for name in ("PartitionKey", "RowKey"):
        converted[name] = check_key(f"{owner}'s {name}", entity.get(name))
    try:
        body = {k: v for k, v in entity.items() if k not in ("PartitionKey", "RowKey")}
        converted.update(convert_properties(body, frozenset(), owner))
        check_entity(converted, owner)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"{owner} cannot be a table row: {exc}") from None
    return converted


@dataclass(frozen=True, slots=True)
class Include:
    """An extra entity written in the same transaction as an event.

    Use the constructors: ``Include.insert(entity)``, ``Include.replace(entity)``,
    ``Include.delete(entity)``, ``Include.insert_or_merge(entity)`` and
    ``Include.insert_or_replace(entity)``. The entity's ``PartitionKey`` is set
    to the stream's; its ``RowKey`` is required, and may neither start with
    ``SS-`` nor have a rest after its first ``|`` that does: those are where
    streams keep their rows (see :func:`is_stream_row_key`).
    ``replace`` and ``delete`` are conditional on ``etag``: given explicitly,
    or taken from an entity read with azure-data-tables
    (``entity.metadata["etag"]``); ``"*"`` makes them unconditional.
    """

    operation: IncludeOperation
    entity: Mapping[str, Any]
    etag: str | None = None

    def __post_init__(self) -> None:
        row_key = self.entity.get("RowKey") if isinstance(self.entity, Mapping) else None
        check_key("included entity RowKey", row_key)
        assert isinstance(row_key, str)
        if is_stream_row_key(row_key):
            raise ValueError(
                f"included entity RowKey {row_key!r} is reserved for stream rows: it may not "
                f"start with {RESERVED_PREFIX!r}, nor may its rest after the first "
                f"{SEPARATOR!r}"
            )
        if self.operation in ("replace", "delete") and not self.etag:
            raise ValueError(
                f"included {self.operation!r} of RowKey {row_key!r} needs an etag "
                "(pass etag='*' to make it unconditional)"
            )
        # Validate now, so a bad include fails where it is built, not at write time.
        self.table_entity("")

    @property
    def row_key(self) -> str:
        return str(self.entity["RowKey"])

    @classmethod
    def _applied(
        cls, operation: IncludeOperation, entity: Mapping[str, Any], etag: str | None
    ) -> Include:
        """The include as written, with the row's new ETag (``None`` once deleted)."""
        applied = object.__new__(cls)
        for name, value in (("operation", operation), ("entity", entity), ("etag", etag)):
            object.__setattr__(applied, name, value)
        return applied

    def table_entity(self, partition_key: str) -> dict[str, Any]:
        """The entity as sent: user properties converted, PartitionKey set."""
        body = {k: v for k, v in self.entity.items() if k not in ("PartitionKey", "RowKey")}
        converted = convert_properties(body, SYSTEM_NAMES, "included entity")
        return {"PartitionKey": partition_key, "RowKey": self.row_key, **converted}

    @staticmethod
    def _etag_of(entity: Mapping[str, Any], etag: str | None) -> str | None:
        if etag is not None:
            return etag
        metadata = getattr(entity, "metadata", None)
        found = metadata.get("etag") if isinstance(metadata, Mapping) else None
        return str(found) if found else None

    @classmethod
    def insert(cls, entity: Mapping[str, Any]) -> Include:
        """Insert; fails if the row exists."""
        return cls("insert", dict(entity))

    @classmethod
    def replace(cls, entity: Mapping[str, Any], etag: str | None = None) -> Include:
        """Replace the whole row; fails if it is missing or its ETag changed."""
        return cls("replace", dict(entity), cls._etag_of(entity, etag))

    @classmethod
    def delete(cls, entity: Mapping[str, Any], etag: str | None = None) -> Include:
        """Delete the row; fails if it is missing or its ETag changed."""
        return cls("delete", dict(entity), cls._etag_of(entity, etag))

    @classmethod
    def insert_or_merge(cls, entity: Mapping[str, Any]) -> Include:
        """Insert, or merge these properties into the existing row."""
        return cls("insert_or_merge", dict(entity))

    @classmethod
    def insert_or_replace(cls, entity: Mapping[str, Any]) -> Include:
        """Insert, or replace the existing row."""
        return cls("insert_or_replace", dict(entity))


def _follow(current: Include | None, following: Include) -> Include | None:
    """Streamstone's change-tracking table: one row's two includes as one (None: no-op)."""
    kind = following.operation
    if current is None:  # an Insert then a Delete left nothing to act on
        if kind in ("insert", "insert_or_merge", "insert_or_replace"):
            return following
    elif current.operation == "insert":
        if kind == "replace":
            return Include("insert", following.entity)
        if kind == "delete":
            return None
    elif current.operation == "replace":
        # The first operation's ETag guards the row as it was read.
        if kind == "replace":
            return Include("replace", following.entity, current.etag)
        if kind == "delete":
            return Include("delete", following.entity, current.etag)
    elif current.operation == "delete":
        if kind == "insert":
            return Include("replace", following.entity, current.etag)
    elif current.operation == "insert_or_merge":
        if kind == "insert_or_merge":
            return Include("insert_or_merge", {**current.entity, **following.entity})
    elif current.operation == "insert_or_replace" and kind == "insert_or_replace":
        return following
    before = current.operation if current is not None else "insert then delete"
    raise ValueError(
        f"included {kind!r} of RowKey {following.row_key!r} cannot follow {before!r} "
        "of the same row in one write"
    )


def fold_includes(includes: Sequence[Include]) -> list[Include]:
    """Fold several includes of one RowKey into one operation, in first-seen order.

    Insert+Replace -> Insert; Insert+Delete -> nothing; Replace+Replace ->
    Replace; Replace+Delete -> Delete; Delete+Insert -> Replace; InsertOrMerge
    twice -> InsertOrMerge (properties merged); InsertOrReplace twice ->
    InsertOrReplace; after Insert+Delete only an insert kind may follow. Any
    other pair is a ``ValueError``, raised before anything is sent.
    """
    state: dict[str, Include | None] = {}
    for include in includes:
        key = include.row_key
        state[key] = _follow(state[key], include) if key in state else include
    return [include for include in state.values() if include is not None]


@dataclass(frozen=True, slots=True, init=False)
class EventData:
    """An event to write.

    ``id`` (optional) identifies the event for duplicate detection: a stream
    never stores two events with the same id. ``properties`` are stored as the
    event row's columns: values of exactly str, int, float, bool, bytes,
    timezone-aware datetime or UUID, which read back equal and of the same
    type; anything else (an enum, a subclass, a numpy scalar, a Decimal) is a
    ``TypeError`` that says what to store instead. ``includes`` are written in
    the same transaction.

    ``stream_properties`` (optional) are the stream header's properties as of
    this event, for a header that carries a snapshot of the stream. The
    transaction that stores this event writes them into the header, and they
    stay until a later event of the write gives its own. A write split over
    several transactions therefore never commits a header that is ahead of
    the events it committed. Without them the header keeps the properties of
    the ``Stream`` the write was given.
    """

    id: str | None
    properties: Mapping[str, PropertyValue]
    includes: tuple[Include, ...]
    stream_properties: Mapping[str, PropertyValue] | None
    _table_properties: Mapping[str, Any] = field(repr=False, compare=False)

    def __init__(
        self,
        id: str | None = None,
        properties: Mapping[str, PropertyValue] | None = None,
        includes: Sequence[Include] = (),
        *,
        stream_properties: Mapping[str, PropertyValue] | None = None,
    ) -> None:
        if id is not None:
            check_key("event id", id)
        converted = convert_properties(properties or {}, RESERVED_NAMES, "event")
        if stream_properties is not None:
            convert_properties(stream_properties, RESERVED_NAMES, "stream")
        for include in includes:
            if not isinstance(include, Include):
                raise TypeError(f"includes must be Include values, got {include!r}")
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "properties", freeze(properties))
        object.__setattr__(self, "includes", tuple(includes))
        object.__setattr__(
            self,
            "stream_properties",
            None if stream_properties is None else freeze(stream_properties),
        )
        object.__setattr__(self, "_table_properties", freeze(converted))


@dataclass(frozen=True, slots=True)
class RecordedEvent:
    """An event as stored: its version in the stream, its id and its properties."""

    version: int
    id: str | None
    properties: Mapping[str, PropertyValue]


@dataclass(frozen=True, slots=True)
class StreamSlice(Generic[H_co]):
    """One page of a stream read: the header as read, and events in version order.

    ``truncated`` is true when the slice asked for versions that
    :meth:`Stream.truncate` has removed; ``first_available_version`` says where
    the stream now begins.
    """

    stream: H_co
    events: tuple[RecordedEvent, ...]
    is_end_of_stream: bool
    truncated: bool = False

    @property
    def has_events(self) -> bool:
        return bool(self.events)

    @property
    def first_available_version(self) -> int:
        return self.stream.first_version


@dataclass(frozen=True, slots=True)
class WriteResult(Generic[H_co]):
    """The outcome of a write: the new header (reuse it for the next write),
    the events as recorded, and the included entities with their new ETags
    (``None`` for deletes)."""

    stream: H_co
    events: tuple[RecordedEvent, ...]
    includes: tuple[Include, ...] = ()
