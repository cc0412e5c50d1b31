"""Reading a key's state and history from its stream, shared by the sync
:class:`Processor` and :mod:`handlers.aio`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from azure.data.tables import TableClient

from streamstone_py import RecordedEvent, Stream, StreamSlice, join_binary

from ._compression import unpack_stored
from ._errors import UnreadableStateError
from ._handler import Handler
from ._outcome import KeyState, KeyVersion
from ._store import STATE, StateStore, StoredVersion

__all__ = [
    "KeyReader",
    "check_page_size",
    "decode_state",
    "header_state",
    "key_state",
    "key_version",
    "next_page",
    "scan_keys",
    "scan_states",
]

S = TypeVar("S")


def header_state(handler: Handler[Any], stream: Stream | None) -> bytes:
    """The encoded state a header holds (the initial state: never written);
    :class:`UnreadableStateError` if it cannot be read back."""
    if stream is None or f"{STATE}_Parts" not in stream.properties:
        return handler.encode_state(handler.initial_state())
    try:
        return unpack_stored(join_binary(STATE, stream.properties))
    except Exception as exc:  # a damaged row: missing parts, a bad codec, cut zlib
        key = stream.partition.partition_key
        raise UnreadableStateError(handler.name, key, stream.version, str(exc)) from exc


def decode_state(handler: Handler[S], key: str, version: int, state: bytes) -> S:
    """``handler.decode_state(state)``, or :class:`UnreadableStateError` naming
    the key and the version the state was stored at."""
    try:
        return handler.decode_state(state)
    except Exception as exc:  # damaged msgpack, or a state class that cannot load it
        raise UnreadableStateError(handler.name, key, version, str(exc)) from exc


def key_state(handler: Handler[S], key: str, stream: Stream | None) -> KeyState[S]:
    """A key's newest state from its header (``None``: never written)."""
    version = stream.version if stream is not None else 0
    state = decode_state(handler, key, version, header_state(handler, stream))
    return KeyState(key, version, state)


def key_version(handler: Handler[S], key: str, event: RecordedEvent) -> KeyVersion[S]:
    try:
        stored = StoredVersion.from_event(event)
    except Exception as exc:
        raise UnreadableStateError(handler.name, key, event.version, str(exc)) from exc
    message_type = str(event.properties.get("MessageType", ""))
    state = decode_state(handler, key, stored.version, stored.state)
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


class KeyReader(Generic[S]):
    """Reading a handler's keys through its store: the newest state, and the
    kept history (the reading half of :class:`Processor`)."""

    handler: Handler[S]
    store: StateStore

    def current_state(self, key: str) -> KeyState[S]:
        """A key's newest state and version, in one round trip (the header); a key
        never written has version 0 and the handler's initial state."""
        return key_state(self.handler, key, self.store.open(self.store.partition(key)))

    def history(self, key: str, *, page_size: int = 1000) -> Iterator[KeyVersion[S]]:
        """Every kept version of a key, oldest first, read ``page_size`` at a time.

        Versions that retention removed are not in it; the first one is the
        oldest kept. States are decoded by the current state class.
        """
        check_page_size(page_size)
        partition = self.store.partition(key)
        stream = self.store.open(partition)
        start: int | None = stream.first_version if stream is not None else None
        while start is not None:
            page = self.store.read(partition, start, page_size)
            yield from (key_version(self.handler, key, event) for event in page.events)
            start = next_page(page, start)


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
        key = stream.partition.partition_key
        state = decode_state(handler, key, stream.version, header_state(handler, stream))
        yield KeyState(key, stream.version, state, found.updated)


def scan_keys(
    handler: Handler[Any],
    table: TableClient,
    *,
    start_key: str | None = None,
    end_key: str | None = None,
) -> Iterator[str]:
    """The keys :func:`scan_states` would visit, in key order, without their states."""
    return Stream.scan_keys(table, handler.name, start_key=start_key, end_key=end_key)
