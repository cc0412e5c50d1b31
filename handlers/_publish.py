"""Publishers: where output messages go once the state that produced them is stored."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from azure.data.tables import TableClient, UpdateMode

from ._codec import pack
from ._message import Message

__all__ = ["InMemoryPublisher", "Publisher", "TablePublisher"]


@runtime_checkable
class Publisher(Protocol):
    """Sends output messages. It is called again with the same outputs when a
    message is redelivered, so it must tolerate repeats (outputs have stable ids)."""

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


class TablePublisher:
    """Upserts outputs into a table, one row per output id (PartitionKey: the
    output's key), so publishing again is idempotent."""

    def __init__(self, table: TableClient) -> None:
        self.table = table

    def publish(self, messages: Sequence[Message]) -> None:
        by_key: dict[str, list[Message]] = defaultdict(list)
        for message in messages:
            by_key[message.key].append(message)
        for key, group in by_key.items():
            rows = {m.id: m for m in group}  # one operation per row in a transaction
            ops = [
                (
                    "upsert",
                    {
                        "PartitionKey": key,
                        "RowKey": m.id,
                        "Type": m.type,
                        "Body": pack(m.body),
                        "Headers": pack(dict(m.headers)),
                    },
                    {"mode": UpdateMode.REPLACE},
                )
                for m in rows.values()
            ]
            for start in range(0, len(ops), 100):
                self.table.submit_transaction(ops[start : start + 100])
