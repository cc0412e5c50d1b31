"""Partitions: where a stream lives, and the row keys of its rows."""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

from azure.data.tables import TableClient
from azure.data.tables.aio import TableClient as AsyncTableClient

from ._codec._text import EMULATOR_ACCOUNT, exact_str, lone_surrogate, utf16_size
from ._transport._retry import DEFAULT_POLICY, RetryPolicy

__all__ = ["Partition", "check_key", "id_row_key", "key_order", "table_endpoint"]

#: Separates the physical partition key from a virtual stream's name.
SEPARATOR: Final = "|"
#: Azure's limit for PartitionKey and RowKey values.
MAX_KEY_BYTES: Final = 1024

HEADER_SUFFIX: Final = "SS-HEAD"
EVENT_PREFIX: Final = "SS-SE-"
ID_PREFIX: Final = "SS-UID-"
#: Every engine row key starts with this (after a virtual stream's ``name|``). A
#: virtual stream name that started with it would put its rows inside the
#: ranges of the plain stream of the same physical partition.
RESERVED_PREFIX: Final = "SS-"

# Characters Azure Tables refuses in keys: / \ # ? and the control characters.
_FORBIDDEN = re.compile(r"[/\\#?\x00-\x1f\x7f-\x9f]")


def id_row_key(event_id: str, virtual: str | None = None) -> str:
    """The row key that records ``event_id`` in a stream (in the virtual
    stream ``virtual`` of its partition, when given): ``ValueError`` naming
    it when the table cannot store it (over 1 KiB in UTF-16, say), so a
    caller can refuse an id before it meets a write or a ``Stream.find``."""
    prefix = "" if virtual is None else virtual + SEPARATOR
    return _id_row_key(prefix, exact_str("event id", event_id))


def _id_row_key(prefix: str, event_id: str) -> str:
    return check_key("event id row key", prefix + ID_PREFIX + event_id)


def table_endpoint(table: object) -> str:
    """``scheme://host/path`` of a table client's account, query dropped: the
    same for every client of one account, different for two accounts."""
    url = getattr(table, "url", None)
    if not isinstance(url, str):
        return ""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}".rstrip("/").lower()


def _account(endpoint: str) -> str:
    """The account an endpoint names: its host's first label, or on the
    emulator (``http://127.0.0.1:10002/devstoreaccount1``) its path's first part."""
    parts = urlsplit(endpoint)
    first = parts.path.strip("/").partition("/")[0]
    return first or (parts.hostname or "").partition(".")[0]


def key_order(key: str) -> bytes:
    """A sort key that orders strings as the table orders keys: by UTF-16 code
    units, where Python's ``sorted`` compares code points (the two differ for
    characters beyond U+FFFF against U+E000 to U+FFFF)."""
    return key.encode("utf-16-be", "surrogatepass")


def check_key(kind: str, key: object) -> str:
    """Return ``key`` if Azure Tables can store it as (part of) a key, else raise."""
    key = exact_str(kind, key)
    if not key:
        raise ValueError(f"{kind} must not be empty")
    bad = _FORBIDDEN.search(key)
    if bad:
        raise ValueError(
            f"{kind} {key!r} contains {bad.group()!r}; Azure Tables keys may not contain "
            "'/', '\\', '#', '?' or control characters"
        )
    if (lone := lone_surrogate(key)) is not None:  # no Unicode text: it cannot travel
        raise ValueError(
            f"{kind} {key!r} holds a lone surrogate {lone.group()!r} at index {lone.start()}, "
            "which is not Unicode text"
        )
    if utf16_size(key) > MAX_KEY_BYTES:
        raise ValueError(
            f"{kind} {key[:40]!r}... is {utf16_size(key)} bytes in UTF-16; "
            f"the limit is {MAX_KEY_BYTES}"
        )
    return key


class Partition:
    """The place of one stream: a table client (sync, or async for
    :mod:`streamstone_py.aio`) and a key.

    ``Partition(table, "order-42")`` puts the stream in its own table partition.
    ``Partition(table, "tenant-7|order-42")`` or ``Partition(table, "tenant-7",
    "order-42")`` is a virtual partition: stream ``order-42`` inside physical
    partition ``tenant-7``, its rows prefixed ``order-42|``. Several virtual
    streams share one physical partition but never each other's rows, nor
    those of the plain stream ``Partition(table, "tenant-7")``: a virtual
    stream name may not contain ``|`` nor start with ``SS-``.
    """

    __slots__ = (
        "_emulator", "_endpoint", "_key", "partition_key", "retry", "row_key_prefix", "table",
    )  # fmt: skip

    table: TableClient | AsyncTableClient
    partition_key: str
    row_key_prefix: str
    #: How transient faults of this partition's storage calls are retried.
    retry: RetryPolicy
    _key: str
    _endpoint: str
    _emulator: bool

    def __init__(
        self,
        table: TableClient | AsyncTableClient,
        key: str,
        stream: str | None = None,
        *,
        retry: RetryPolicy = DEFAULT_POLICY,
    ) -> None:
        if stream is None:
            physical, _, virtual = exact_str("partition key", key).partition(SEPARATOR)
            virtual_or_none = virtual if SEPARATOR in key else None
        else:
            physical, virtual_or_none = key, stream
        check_key("partition key", physical)
        if SEPARATOR in physical:
            raise ValueError(f"partition key {physical!r} contains the separator {SEPARATOR!r}")
        prefix = ""
        full = physical
        if virtual_or_none is not None:
            check_key("virtual stream name", virtual_or_none)
            if SEPARATOR in virtual_or_none:
                raise ValueError(
                    f"virtual stream name {virtual_or_none!r} contains the separator "
                    f"{SEPARATOR!r}; it could address another stream's rows"
                )
            if virtual_or_none.startswith(RESERVED_PREFIX):
                raise ValueError(
                    f"virtual stream name {virtual_or_none!r} starts with {RESERVED_PREFIX!r}, "
                    "which is reserved: its rows would fall among the rows of the plain "
                    f"stream of partition {physical!r}"
                )
            prefix = virtual_or_none + SEPARATOR
            full = physical + SEPARATOR + virtual_or_none
        if not isinstance(retry, RetryPolicy):
            raise TypeError(f"retry must be a RetryPolicy, got {retry!r}")
        object.__setattr__(self, "retry", retry)
        object.__setattr__(self, "table", table)
        object.__setattr__(self, "partition_key", physical)
        object.__setattr__(self, "row_key_prefix", prefix)
        object.__setattr__(self, "_key", full)
        object.__setattr__(self, "_endpoint", table_endpoint(table))
        object.__setattr__(self, "_emulator", _account(self._endpoint) == EMULATOR_ACCOUNT)
        # The longest engine row key is an id row; check the fixed part here.
        check_key("row key", self.header_row_key)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Partition is immutable")

    @property
    def key(self) -> str:
        """The key as given: ``"pk"`` or ``"pk|stream"``."""
        return self._key

    @property
    def table_name(self) -> str:
        return str(self.table.table_name)

    @property
    def endpoint(self) -> str:
        """The account endpoint the table client talks to, without its query
        (so never a SAS token): with the table name and the key, what
        identifies the stream."""
        return self._endpoint

    @property
    def is_emulator(self) -> bool:
        """True on the storage emulator's account (``devstoreaccount1``, as
        Azurite's endpoint names it), whose writes the engine holds to the
        emulator's quirks besides Azure's limits."""
        return self._emulator

    @property
    def is_virtual(self) -> bool:
        return bool(self.row_key_prefix)

    @property
    def header_row_key(self) -> str:
        return self.row_key_prefix + HEADER_SUFFIX

    def event_row_key(self, version: int) -> str:
        return f"{self.row_key_prefix}{EVENT_PREFIX}{version:010d}"

    def id_row_key(self, event_id: str) -> str:
        return _id_row_key(self.row_key_prefix, event_id)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Partition):
            return NotImplemented
        # Two accounts (or emulators) may hold tables of the same name.
        return (self._endpoint, self.table_name, self._key) == (
            other._endpoint, other.table_name, other._key,
        )  # fmt: skip

    def __hash__(self) -> int:
        return hash((self._endpoint, self.table_name, self._key))

    def __repr__(self) -> str:
        return f"Partition(table={self.table_name!r}, key={self._key!r})"

    def __str__(self) -> str:
        return f"{self.table_name}.{self._key}"
