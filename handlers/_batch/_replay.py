"""Invoking a handler, and handling a stored message again on the state just
before its original (the state-based strategy's answer to a duplicate)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from .._context import HandlerContext
from .._errors import (
    DuplicateOutsideWindowError,
    HandlerError,
    HandlerFailedError,
    NonDeterministicHandlerError,
    StateTooLargeError,
)
from .._handler import Handler
from .._messages._message import Message, same_outputs
from .._outcome import Found, Step
from .._reading import decode_state
from .._store import WATERMARK, StateStore, StoredVersion

__all__ = ["MAX_STATE_BYTES", "Replayer"]

#: The largest encoded state one stored version holds (an entity is 1 MiB).
MAX_STATE_BYTES: Final = 1_000_000

#: Why a duplicate found by its id can no longer be replayed.
ID_REMOVED: Final = "its id row was removed by retention after the write found it"
VERSION_REMOVED: Final = "its version was removed by retention after its id was found"
WINDOW_REMOVED: Final = "its stored version or the one before it was removed by retention"


class Replayer:
    """Runs the handler: on the newest state, or again on a duplicate's original one."""

    def __init__(self, handler: Handler[Any], store: StateStore) -> None:
        self.handler = handler
        self.store = store

    def invoke(
        self, state: bytes, version: int, message: Message, context: HandlerContext
    ) -> bytes:
        """The encoded state after ``message``, handled on ``state`` (stored at
        ``version``); the handler's own failure is wrapped."""
        decoded = decode_state(self.handler, message.key, version, state)
        try:
            encoded = self.handler.encode_state(self.handler.apply(decoded, message, context))
        except HandlerError:
            raise
        except Exception as exc:
            raise HandlerFailedError(self.handler.name, message.id, exc) from exc
        if len(encoded) > MAX_STATE_BYTES:
            raise StateTooLargeError(self.handler.name, message.id, len(encoded), MAX_STATE_BYTES)
        return encoded

    def initial(self) -> bytes:
        return self.handler.encode_state(self.handler.initial_state())

    def outside(
        self, message_id: str, reason: str, watermark: object = None
    ) -> DuplicateOutsideWindowError:
        known = watermark if isinstance(watermark, datetime) else None
        return DuplicateOutsideWindowError(self.handler.name, message_id, reason, watermark=known)

    def versions_around(
        self, key: str, message_id: str, version: int
    ) -> tuple[StoredVersion, bytes]:
        """The stored version of a message, and the encoded state before it."""
        partition = self.store.partition(key)
        first = max(1, version - 1)
        page = self.store.read(partition, first, version - first + 1)
        found = {e.version: e for e in page.events}
        if version not in found or (version > 1 and version - 1 not in found):
            raise self.outside(message_id, WINDOW_REMOVED, page.stream.properties.get(WATERMARK))
        original = self.store.stored_version(key, found[version])
        if version == 1:
            return original, self.initial()
        return original, self.store.stored_version(key, found[version - 1]).state

    def replay(self, key: str, message: Message) -> Step:
        """A message found stored: its outputs again, checked against the original."""
        version = self.store.find(self.store.partition(key), message.id)
        if version is None:  # removed between the write and now
            raise self.outside(message.id, ID_REMOVED)
        original, before = self.versions_around(key, message.id, version)
        return self.again(message, original, before)

    def again(self, message: Message, original: StoredVersion, before: bytes) -> Step:
        """Handle ``message`` on ``before`` with its original's context, and check
        that the outputs and the state are the original's."""
        name = self.handler.name
        context = HandlerContext(
            message,
            handler=name,
            now=original.now,
            captures=original.captures,
            replay=True,
            id_scheme=original.id_scheme,
        )
        try:
            after = self.invoke(before, original.version - 1, message, context)
        except HandlerFailedError as exc:
            raise NonDeterministicHandlerError(
                name, message.id, f"it raised {exc.__cause__!r} this time"
            ) from exc
        outputs = context.outputs
        if not same_outputs(original.digest, outputs):
            raise NonDeterministicHandlerError(name, message.id, "output digest differs")
        # Both through the current state class: a field added with a default, or
        # removed, since the original was stored is not a difference in behaviour.
        if after != original.state and after != self._current(message.key, original):
            raise NonDeterministicHandlerError(name, message.id, "new state differs")
        return Step(
            message, "duplicate", version=original.version, outputs=outputs,
            tokens=original.tokens > 0,
        )  # fmt: skip

    def _current(self, key: str, original: StoredVersion) -> bytes:
        decoded = decode_state(self.handler, key, original.version, original.state)
        return self.handler.encode_state(decoded)

    def window(self, key: str, unresolved: Sequence[Message], anchor: str) -> dict[str, Found]:
        """Resolve the duplicates of a batch together, starting from one found stored.

        A redelivered batch's originals are usually consecutive versions: one
        read of the versions from the anchor's predecessor on finds all those
        that lie there (each with the state before it), so a whole redelivered
        batch costs two round trips instead of several per message.
        """
        partition = self.store.partition(key)
        version = self.store.find(partition, anchor)
        if version is None:
            return {anchor: self.outside(anchor, ID_REMOVED)}
        start = max(1, version - 1)
        page = self.store.read(partition, start, min(len(unresolved) + 1, 1000))
        events = {e.id: e for e in page.events if e.id is not None}
        by_version = {e.version: e for e in page.events}
        results: dict[str, Found] = {}
        for message in unresolved:
            event = events.get(message.id)
            if event is None:
                continue
            try:
                previous = by_version.get(event.version - 1)
                if event.version == 1:
                    before = self.initial()
                elif previous is not None:
                    before = self.store.stored_version(key, previous).state
                else:  # the predecessor lies before the window or was truncated
                    _, before = self.versions_around(key, message.id, event.version)
                original = self.store.stored_version(key, event)
                results[message.id] = self.again(message, original, before)
            except HandlerError as exc:
                results[message.id] = exc
        if anchor not in results:  # removed between the find and the read
            results[anchor] = self.outside(anchor, VERSION_REMOVED)
        return results
