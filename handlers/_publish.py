"""Publishers: where output messages go once the state that produced them is stored."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Final, Protocol, runtime_checkable

from azure.data.tables import TableClient

from streamstone_py import TableOperation, check_key, check_row, is_stream_row_key, submit

from ._messages._codec import pack
from ._messages._message import Message
from ._store import (
    CHECKPOINT_PREFIX,
    OUTBOX_PREFIX,
    RECORD_PREFIX,
    REGISTRATION_PREFIX,
    TOKEN_PREFIX,
)

#: The row keys (after ``name|``) the runtime keeps beside a stream.
_RUNTIME_ROWS: Final = (
    OUTBOX_PREFIX,
    RECORD_PREFIX,
    TOKEN_PREFIX,
    CHECKPOINT_PREFIX,
    REGISTRATION_PREFIX,
)

__all__ = ["InMemoryPublisher", "Publisher", "TablePublisher", "transactions", "unique_outputs"]


@runtime_checkable
class Publisher(Protocol):
    """Sends output messages. It is called again with the same outputs when a
    message is redelivered, so it must tolerate repeats (outputs have stable ids).

    A publisher may also define ``check(message)``, raising ``ValueError`` for
    an output it could never deliver. The processor calls it on every new
    output before the state is stored, and abandons that message alone with
    the reason, instead of storing a state whose outputs fail forever.
    """

    def publish(self, messages: Sequence[Message]) -> None: ...


class InMemoryPublisher:
    """Collects outputs: ``deliveries`` in order (repeats included), ``messages``
    by id, and ``divergent``: any republished id whose content differed."""

    def __init__(self) -> None:
        self.deliveries: list[Message] = []
        self.messages: dict[str, Message] = {}
        self.divergent: list[tuple[Message, Message]] = []
        self._lock = threading.Lock()

    def publish(self, messages: Sequence[Message]) -> None:
        with self._lock:
            for message in messages:
                self.deliveries.append(message)
                earlier = self.messages.setdefault(message.id, message)
                if earlier.identity() != message.identity():
                    self.divergent.append((earlier, message))


def unique_outputs(messages: Sequence[Message]) -> dict[str, Message]:
    """The outputs by id, each once; ``ValueError``, before anything is
    published, if one id comes twice with different content."""
    unique: dict[str, Message] = {}
    for message in messages:
        earlier = unique.setdefault(message.id, message)
        if earlier is not message and earlier.identity() != message.identity():
            raise ValueError(
                f"output id {message.id!r} comes twice with different content "
                f"({earlier.type!r} and {message.type!r}); nothing was published"
            )
    return unique


#: Azure Tables' limits that a transaction of published rows meets.
MAX_TRANSACTION_OPERATIONS: Final = 100
#: Below Azure's 4 MiB per transaction, leaving room for the request's framing.
MAX_TRANSACTION_BYTES: Final = 4 * 1024 * 1024 - 64 * 1024


class TablePublisher:
    """Upserts outputs into a table, one row per output id (PartitionKey: the
    output's key), so publishing again is idempotent.

    Give it a table of its own. On any table it refuses an output whose row
    could be one of a stream's rows or a runtime's outbox row (see
    :meth:`check`), so no output can replace another key's state.
    """

    def __init__(self, table: TableClient) -> None:
        self.table = table

    @staticmethod
    def row(message: Message) -> dict[str, Any]:
        """The row an output is stored as."""
        return {
            "PartitionKey": message.key,
            "RowKey": message.id,
            "Type": message.type,
            "Body": pack(message.body),
            "Headers": pack(dict(message.headers)),
        }

    def check(self, message: Message) -> None:
        """Refuse an output this publisher could never store, or should not:
        a row the table refuses (a key or id with ``/ \\ # ?`` or control
        characters, or over 1 KiB; a type, body or headers over 64 KiB), or an
        id that is a stream's, an outbox's, an output id record's or a token
        row's key (``SS-...``, ``name|SS-...``, ``name|OB-...``, ``name|OI-...``,
        ``name|TK-...``, ``name|TC-...``, ``name|TR-...``)."""
        check_key("output key", message.key)
        check_key("output id", message.id)
        row_key = message.id
        if is_stream_row_key(row_key) or row_key.partition("|")[2].startswith(_RUNTIME_ROWS):
            raise ValueError(
                f"output id {row_key!r} is the row key of a stream's, an outbox's, an output "
                "id record's or a token's row: publishing it could replace another key's state"
            )
        check_row(self.row(message), f"output {message.id!r}")

    def publish(self, messages: Sequence[Message]) -> None:
        """Upsert the outputs, per key in transactions of at most 100 rows and
        about 4 MiB. Raises ``ValueError``, publishing nothing, if one id comes
        twice with different content, or if :meth:`check` refuses one."""
        rows = unique_outputs(messages)
        for message in rows.values():
            self.check(message)
        by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for m in rows.values():
            by_key[m.key].append(self.row(m))
        for entities in by_key.values():
            for chunk in transactions(entities):
                submit(self.table, [TableOperation("upsert_replace", e) for e in chunk])


def _wire_size(entity: dict[str, Any]) -> int:
    """An upper bound of an entity's bytes in a batch request (binary travels as base64)."""
    size = 1024  # the changeset part's headers and the JSON framing
    for name, value in entity.items():
        size += 2 * len(name) + 48
        if isinstance(value, bytes):
            size += 4 * ((len(value) + 2) // 3)
        elif isinstance(value, str):
            size += len(json.dumps(value))
        else:
            size += 16
    return size


def transactions(entities: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The entities in transactions of at most 100 rows and about 4 MiB."""
    chunks: list[list[dict[str, Any]]] = [[]]
    size = 0
    for entity in entities:
        wire = _wire_size(entity)
        if chunks[-1] and (
            len(chunks[-1]) >= MAX_TRANSACTION_OPERATIONS or size + wire > MAX_TRANSACTION_BYTES
        ):
            chunks.append([])
            size = 0
        chunks[-1].append(entity)
        size += wire
    return chunks
