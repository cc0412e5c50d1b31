"""Publishers: where output messages go once the state that produced them is stored."""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Final, Protocol, runtime_checkable

from azure.data.tables import TableClient, UpdateMode

from streamstone_py import check_key

from ._codec import pack
from ._message import Message

__all__ = ["InMemoryPublisher", "Publisher", "TablePublisher"]


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
                if earlier.encode() != message.encode():
                    self.divergent.append((earlier, message))


#: Azure Tables' limits that a published row meets.
MAX_PROPERTY_BYTES: Final = 64 * 1024
MAX_TRANSACTION_OPERATIONS: Final = 100
#: Below Azure's 4 MiB per transaction, leaving room for the request's framing.
MAX_TRANSACTION_BYTES: Final = 4 * 1024 * 1024 - 64 * 1024


class TablePublisher:
    """Upserts outputs into a table, one row per output id (PartitionKey: the
    output's key), so publishing again is idempotent."""

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def check(self, message: Message) -> None:
        """Refuse an output no table row can hold: a key or id the table refuses
        (``/ \\ # ?``, control characters, over 1 KiB), or a body or headers
        over 64 KiB encoded."""
        check_key("output key", message.key)
        check_key("output id", message.id)
        for name, value in (("body", message.body), ("headers", dict(message.headers))):
            size = len(pack(value))
            if size > MAX_PROPERTY_BYTES:
                raise ValueError(
                    f"output {message.id!r} has a {name} of {size} bytes encoded; "
                    f"a table row holds at most {MAX_PROPERTY_BYTES}"
                )

    def publish(self, messages: Sequence[Message]) -> None:
        """Upsert the outputs, per key in transactions of at most 100 rows and
        about 4 MiB. Raises ``ValueError``, publishing nothing, if one id comes
        twice with different content."""
        rows: dict[str, Message] = {}
        for message in messages:
            earlier = rows.setdefault(message.id, message)
            if earlier is not message and earlier.encode() != message.encode():
                raise ValueError(
                    f"output id {message.id!r} comes twice with different content "
                    f"({earlier.type!r} and {message.type!r}); nothing was published"
                )
        by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for m in rows.values():
            by_key[m.key].append(
                {
                    "PartitionKey": m.key,
                    "RowKey": m.id,
                    "Type": m.type,
                    "Body": pack(m.body),
                    "Headers": pack(dict(m.headers)),
                }
            )
        for entities in by_key.values():
            for chunk in _transactions(entities):
                self.table.submit_transaction(
                    [("upsert", e, {"mode": UpdateMode.REPLACE}) for e in chunk]
                )


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


def _transactions(entities: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
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
