"""Reading a key's state and history from its stream, shared by the sync
:class:`Processor` and :mod:`handlers.aio`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from azure.data.tables import TableClient

from streamstone_py import RecordedEvent, Stream, StreamSlice, join_binary

from ._compression import unpack_stored
from ._handler import Handler
from ._outcome import KeyState, KeyVersion
from ._store import STATE, StoredVersion

__all__ = [
    "check_page_size",
    "header_state",
    "key_state",
    "key_version",
    "next_page",
    "scan_keys",
    "scan_states",
]

S = TypeVar("S")


def header_state(handler: Handler[Any], stream: Stream | None) -> bytes:
    """The encoded state a header holds (the initial state: never written)."""
    if stream is None or f"{STATE}_Parts" not in stream.properties:
        return handler.encode_state(handler.initial_state())
    return unpack_stored(join_binary(STATE, stream.properties))


def key_state(handler: Handler[S], key: str, stream: Stream | None) -> KeyState[S]:
    """A key's newest state from its header (``None``: never written)."""
    state = handler.decode_state(header_state(handler, stream))
    return KeyState(key, stream.version if stream is not None else 0, state)


def key_version(handler: Handler[S], event: RecordedEvent) -> KeyVersion[S]:
    stored = StoredVersion.from_event(event)
    message_type = str(event.properties.get("MessageType", ""))
    state = handler.decode_state(stored.state)
    return KeyVersion(stored.version, stored.message_id, message_type, stored.now, state)


def check_page_size(page_size: object) -> None:
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")


def next_page(page: StreamSlice, start: int) -> int | None:
    """Where the next page of a history starts (None: this was the last)."""
    if page.is_end_of_stream:
        return None
    # A slice of versions truncated meanwhile is empty: go on from the first kept.
    following = page.events[-1].version + 1 if page.events else page.first_available_version
    return following if following > start else None


def scan_states(
    handler: Handler[S],
    table: TableClient,
    *,
    start_key: str | None = None,
    end_key: str | None = None,
) -> Iterator[KeyState[S]]:
    """The newest state of every key of ``handler`` in ``table`` (keys ``>=
    start_key`` and ``< end_key`` when given), in key order, with ``updated`` set.

    One scan of the range (see :meth:`streamstone_py.Stream.scan`); other
    handlers' streams and other streams in the same partitions are skipped.
    """
    for found in Stream.scan(table, handler.name, start_key=start_key, end_key=end_key):
        stream = found.stream
        state = handler.decode_state(header_state(handler, stream))
        yield KeyState(stream.partition.partition_key, stream.version, state, found.updated)


def scan_keys(
    handler: Handler[Any],
    table: TableClient,
    *,
    start_key: str | None = None,
    end_key: str | None = None,
) -> Iterator[str]:
    """The keys :func:`scan_states` would visit, in key order, without their states."""
    return Stream.scan_keys(table, handler.name, start_key=start_key, end_key=end_key)
