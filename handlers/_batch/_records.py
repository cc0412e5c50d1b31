"""An output id goes out with one content only, however its key's messages
are batched (one page or many, a restart between them, either strategy).

A derived id belongs to its message (uuid5 of the handler, the key, the
message id and a counter): no other message can publish it. An id the
handler gives (``ctx.publish(..., id=...)``) may be published by any message
of the key, so the first message that publishes it records it, in the same
transaction as its version: a row keyed by the id's SHA-256, holding that
message's id and the output's digest (see ``_store``). A later message that
publishes the id with other content is refused, alone, whether the first came
in its batch (the fold has seen it) or in an earlier one (its record's insert
fails, the write reads the record and folds again, as it does for a stored
message); the same content may go out again, and writes no record. A record
is removed by retention with the version that wrote it, as the id rows that
detect duplicates are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from streamstone_py import IncludedOperationConflictError

from .._messages._codec import digest
from .._messages._message import Message
from .._store import OutputRecord

if TYPE_CHECKING:
    from .._outcome import Step
    from .._store import StateStore

__all__ = ["OutputIds", "id_digest", "record_in_the_way"]


def id_digest(output_id: str) -> str:
    return hashlib.sha256(output_id.encode("utf-8", "surrogatepass")).hexdigest()


def record_in_the_way(store: StateStore, error: IncludedOperationConflictError) -> str | None:
    """The digest of the output id whose record a write could not insert
    (stored by an earlier batch's message), if that is what failed."""
    row_key = str(error.entity.get("RowKey", ""))
    prefix = store.record_row_key("")
    return (
        row_key[len(prefix) :]
        if error.operation == "insert" and row_key.startswith(prefix)
        else None
    )


class OutputIds:
    """What one fold knows of its key's output ids: those its batch published
    (with the message that did), and the records found stored (``stored``,
    by id digest, kept across the folds of one write)."""

    def __init__(self, stored: dict[str, OutputRecord]) -> None:
        self.stored = stored
        self.published: dict[str, tuple[Message, str]] = {}

    def clash(
        self, message: Message, outputs: Sequence[Message], given: frozenset[str]
    ) -> str | None:
        """Why these outputs cannot go out: an id published by another message
        with other content (or two outputs of one id and different content)."""
        mine: dict[str, Message] = {}
        for output in outputs:
            earlier = mine.setdefault(output.id, output)
            if earlier is not output and earlier.identity() != output.identity():
                return f"two outputs have the id {output.id!r} and different content"
            found = self.published.get(output.id)
            if found is not None:
                by = found[1] if found[0].identity() != output.identity() else None
            else:
                record = self.stored.get(id_digest(output.id)) if output.id in given else None
                same = record is None or record.digest == digest(output.identity())
                by = None if same or record is None else record.message_id
            if by is not None:
                return (
                    f"output id {output.id!r} of message {message.id!r} was published by "
                    f"message {by!r} with other content"
                )
        return None

    def to_record(
        self, message: Message, outputs: Sequence[Message], given: frozenset[str]
    ) -> list[tuple[str, OutputRecord]]:
        """The records a completed message writes: each id it gave that no
        message published before (of the batch, or stored)."""
        records: dict[str, OutputRecord] = {}
        for output in outputs:
            key = id_digest(output.id)
            if output.id in given and output.id not in self.published and key not in self.stored:
                records.setdefault(key, OutputRecord(message.id, digest(output.identity())))
        return list(records.items())

    def add(self, step: Step) -> None:
        for output in step.outputs:
            self.published.setdefault(output.id, (output, step.message.id))
