"""Reading a key's state and history from its stream, shared by the sync
:class:`Processor` and :mod:`handlers.aio`."""

from __future__ import annotations

from typing import Any, TypeVar

from streamstone_py import RecordedEvent, Stream, StreamSlice, join_binary

from ._handler import Handler
from ._outcome import KeyState, KeyVersion
from ._store import STATE, StoredVersion

__all__ = ["check_page_size", "header_state", "key_state", "key_version", "next_page"]

S = TypeVar("S")


def header_state(handler: Handler[Any], stream: Stream | None) -> bytes:
    """The encoded state a header holds (the initial state: never written)."""
    if stream is None or f"{STATE}_Parts" not in stream.properties:
        return handler.encode_state(handler.initial_state())
    return join_binary(STATE, stream.properties)


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
