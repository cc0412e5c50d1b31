"""Helpers of the token tests: the accounts' rows as the runtime keeps them,
and a sender that dies at a chosen token step."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from azure.data.tables import TableClient

from handlers import InMemoryPublisher, Message, Processor
from handlers._batch._token_rows import Attempt, TokenRows
from handlers._messages._codec import unpack
from handlers._store import TOKEN_HEADER
from handlers.examples import accounts
from streamstone_py import Partition, is_stream_row_key
from tests.helpers import rows

H = accounts.name


class Crash(BaseException):
    """The worker died here (a BaseException: nothing mistakes it for an outcome)."""


def stream_rows(table: TableClient, key: str) -> list[str]:
    """The row keys of the key's stream (header, versions, ids), sorted."""
    return sorted(k for k in rows(Partition(table, key)) if is_stream_row_key(k))


def expected_stream(table: TableClient, key: str, versions: Sequence[tuple[int, str]]) -> list[str]:
    """The stream rows a key holds with these (version, message id) kept."""
    partition = Partition(table, key, H)
    return sorted(
        [partition.header_row_key]
        + [partition.event_row_key(v) for v, _ in versions]
        + [partition.id_row_key(m) for _, m in versions]
    )


def token_rows(table: TableClient, key: str) -> dict[str, dict[str, Any]]:
    """The key's rows beside its stream (tokens, registrations, checkpoints),
    exactly, with packed lists unpacked."""
    found: dict[str, dict[str, Any]] = {}
    for row_key, props in rows(Partition(table, key)).items():
        if is_stream_row_key(row_key):
            continue
        found[row_key] = {
            k: unpack(v) if k in ("Tokens", "Targets") else v
            for k, v in props.items()
            if k != "Timestamp"
        }
    return found


def token_of(message: Message) -> str:
    """The token id an output carries (its header names the handler first)."""
    handler, _, token = message.headers[TOKEN_HEADER].partition(":")
    assert handler == H
    return token


def credits(messages: Sequence[Message]) -> list[Message]:
    return [m for m in messages if m.type == "Credit"]


class CrashingRows(TokenRows):
    """The real token rows, dying once after the named step (``create`` after
    its first receiving key)."""

    def __init__(self, rows: TokenRows, point: str) -> None:
        super().__init__(rows.store)
        self.point = point
        self.creates = 0

    def _maybe(self, point: str) -> None:
        if self.point == point:
            self.point = "done"
            raise Crash(point)

    def register(self, partition: Partition, attempts: Sequence[Attempt]) -> None:
        super().register(partition, attempts)
        self._maybe("after register")

    def create(self, key: str, tokens: Sequence[tuple[str, str, str]]) -> None:
        super().create(key, tokens)
        self.creates += len(tokens)
        self._maybe("after creating some tokens")

    def record(self, partition: Partition, attempts: Sequence[Attempt]) -> Any:
        found = super().record(partition, attempts)
        self._maybe("after checkpoint")
        return found

    def finish(self, partition: Partition, dispatched: Any, registrations: Any) -> None:
        self._maybe("before finishing")
        super().finish(partition, dispatched, registrations)


def with_rows(processor: Processor[Any], point: str) -> CrashingRows:
    """Put crashing rows under a processor's tokens; returns them (to count creates)."""
    tokens = processor._tokens
    assert tokens is not None
    crashing = CrashingRows(tokens.rows, point)
    tokens.rows = crashing
    return crashing


class FailsOnce(InMemoryPublisher):
    """A publisher whose first publish fails (after the state is stored)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def publish(self, messages: Sequence[Message]) -> None:
        if not self.failed:
            self.failed = True
            raise OSError("the queue is down")
        super().publish(messages)
