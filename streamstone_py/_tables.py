"""Rows outside the streams, through the same runners as the verbs: for the
layers above that keep rows of their own beside a stream (the handlers'
outbox, a publisher's outputs), so that every data path takes the client's
transport, wire or SDK, with the engine's retries and error vocabulary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ._transport._protocol import (
    GetEntity,
    QueryEntities,
    Row,
    TableOperation,
    get_entity,
    query_entities,
    submit_transaction,
)
from ._transport._retry import DEFAULT_POLICY, RetryPolicy
from ._transport._runner import Target, run

__all__ = ["query_rows", "read_row", "submit"]


def read_row(
    table: object, partition_key: str, row_key: str, *, retry: RetryPolicy = DEFAULT_POLICY
) -> Row | None:
    """One row, or None if there is none (a missing table raises)."""
    request = GetEntity(partition_key, row_key)
    return run(Target(table, retry), get_entity(request.partition_key, request.row_key))


def query_rows(
    table: object,
    filter: str,
    parameters: Mapping[str, str],
    *,
    select: Sequence[str] | None = None,
    retry: RetryPolicy = DEFAULT_POLICY,
) -> list[Row]:
    """Every row ``filter`` matches (its ``@name`` parameters are strings)."""
    request = QueryEntities(filter, dict(parameters), select=tuple(select) if select else None)
    steps = query_entities(request.filter, request.parameters, request.page_size, request.select)
    return run(Target(table, retry), steps)


def submit(
    table: object, operations: Sequence[TableOperation], *, retry: RetryPolicy = DEFAULT_POLICY
) -> list[str | None]:
    """One entity-group transaction (at most 100 operations, one partition):
    each operation's ETag, or ``TableTransactionError`` naming the failed one.
    A write that fails ambiguously is not sent again: the caller resolves it."""
    return run(Target(table, retry), submit_transaction(operations))
