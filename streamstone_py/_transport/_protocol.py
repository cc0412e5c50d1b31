"""The storage requests a verb makes: the vocabulary every runner executes.

Each verb is a generator: it yields a request, receives the result, or has
the storage error thrown into it (see ``_faults``), and finally returns its
outcome. The verbs hold all logic (preparing rows, chunking, mapping
errors); a runner only performs I/O: ``_runner.run`` for the sync clients
(the SDK's ``TableClient`` and the wire's ``WireTableClient``), ``_runner_aio.run``
for the async ones. So every client shares every decision, and a test can
drive a verb step by step.
"""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal, NamedTuple, NoReturn, TypeAlias, TypeVar, cast

import tenacity
from azure.core.exceptions import AzureError, DecodeError

from ._faults import error_code, retry_after
from ._retry import DEFAULT_POLICY, RetryPolicy, is_ambiguous, is_transient, out_of_time

__all__ = ["error_code"]  # the rest is imported by name within the package

T = TypeVar("T")

Entity: TypeAlias = dict[str, Any]

OperationKind = Literal[
    "create", "update_replace", "update_merge", "delete", "upsert_replace", "upsert_merge"
]
#: The operations that name the ETag they expect of the row (``"*"``: any).
CONDITIONAL: Final[frozenset[str]] = frozenset({"update_replace", "update_merge", "delete"})


class Row(NamedTuple):
    """An entity read back: its properties (with PartitionKey and RowKey, as
    plain values or as the SDK gives them), its ETag and its Timestamp."""

    properties: Entity
    etag: str
    timestamp: datetime | None = None


@dataclass(frozen=True, slots=True)
class TableOperation:
    """One operation of an entity-group transaction. ``etag`` makes it conditional."""

    kind: OperationKind
    entity: Entity
    etag: str | None = None

    def __post_init__(self) -> None:
        if self.kind in CONDITIONAL:
            expected_etag(self.kind, self.entity, self.etag)


def expected_etag(kind: str, entity: Entity, etag: str | None) -> str:
    """The ETag a conditional write expects. Never left out: a write without
    one would go unconditional, over whatever another writer stored."""
    if not etag:
        raise ValueError(
            f"a conditional {kind} of RowKey {entity.get('RowKey')!r} without an ETag "
            f"({etag!r}); '*' makes one unconditional"
        )
    return etag


@dataclass(frozen=True, slots=True)
class GetEntity:
    partition_key: str
    row_key: str


@dataclass(frozen=True, slots=True)
class QueryEntities:
    filter: str
    parameters: Mapping[str, str]
    page_size: int = 1000
    select: tuple[str, ...] | None = None
    #: Stop after this many rows (``None``: all of them).
    limit: int | None = None


@dataclass(frozen=True, slots=True)
class QueryPage:
    """One page of a query: its rows, and where the next page starts (``None``:
    this was the last), as ``(rows, continuation)``."""

    filter: str
    parameters: Mapping[str, str]
    page_size: int = 1000
    select: tuple[str, ...] | None = None
    #: Where the previous page ended: the service's next partition and row keys.
    continuation: tuple[str, str | None] | None = None


@dataclass(frozen=True, slots=True)
class CreateEntity:
    entity: Entity


@dataclass(frozen=True, slots=True)
class UpdateEntity:
    entity: Entity
    etag: str

    def __post_init__(self) -> None:
        expected_etag("update_replace", self.entity, self.etag)


@dataclass(frozen=True, slots=True)
class SubmitTransaction:
    operations: tuple[TableOperation, ...]


@dataclass(frozen=True, slots=True)
class Parallel:
    """Requests the runner may send at once; the verb receives their results in order."""

    requests: tuple[GetEntity | QueryEntities, ...]


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait before the verb tries again after ``error``: the runner sleeps by
    its retry policy, and at least ``at_least`` seconds (what the service
    asked, ``Retry-After``); if that would end past the call's deadline, it
    throws ``error`` back into the verb instead."""

    attempt: int
    error: AzureError
    at_least: float = 0.0


#: The shortest connect and read timeout one try gets, however little time is left.
MIN_TIMEOUT: Final = 0.5


def time_left(deadline: float | None) -> float:
    """The connect and read timeout of one try, so that it ends by ``deadline``
    (``None``: the default policy's total time from now)."""
    if deadline is None:
        deadline = DEFAULT_POLICY.deadline()
    return max(MIN_TIMEOUT, deadline - time.monotonic())


def pause_seconds(policy: RetryPolicy, pause: Pause) -> float:
    return max(policy.delay(pause.attempt), pause.at_least)


Request: TypeAlias = (
    GetEntity
    | QueryEntities
    | QueryPage
    | CreateEntity
    | UpdateEntity
    | SubmitTransaction
    | Parallel
    | Pause
)
Steps: TypeAlias = Generator[Request, Any, T]


# Typed helpers, so verbs read `row = yield from get_entity(...)`.
def get_entity(partition_key: str, row_key: str) -> Steps[Row | None]:
    return cast(Row | None, (yield GetEntity(partition_key, row_key)))


def query_entities(
    filter: str,
    parameters: Mapping[str, str],
    page_size: int,
    select: tuple[str, ...] | None = None,
    limit: int | None = None,
) -> Steps[list[Row]]:
    request = QueryEntities(filter, parameters, page_size, select, limit)
    return cast(list[Row], (yield request))


def query_page(request: QueryPage) -> Steps[tuple[list[Row], tuple[str, str | None] | None]]:
    return cast(tuple[list[Row], tuple[str, str | None] | None], (yield request))


def parallel(*requests: GetEntity | QueryEntities) -> Steps[list[Any]]:
    return cast(list[Any], (yield Parallel(requests)))


def pause(attempt: int, error: AzureError) -> Steps[None]:
    """Wait before trying again after ``error``, or have it raised here if the
    call's time would be over first."""
    yield Pause(attempt, error, retry_after(error) or 0.0)


def _answered(etag: object, kind: str, entity: Entity) -> str:
    """The ETag a write's answer carries. An answer without one was cut short
    (amid its headers), whatever its status said: the write may have been
    applied, and what it left is known only by reading."""
    if not isinstance(etag, str) or not etag:
        raise DecodeError(
            f"the answer to the {kind} of RowKey {entity.get('RowKey')!r} carries no ETag "
            f"({etag!r}): it is not a whole answer"
        )
    return etag


def create_entity(entity: Entity) -> Steps[str]:
    return _answered((yield CreateEntity(entity)), "insert", entity)


def update_entity(entity: Entity, etag: str) -> Steps[str]:
    return _answered((yield UpdateEntity(entity, etag)), "update", entity)


def submit_transaction(operations: Sequence[TableOperation]) -> Steps[list[str | None]]:
    """Send a transaction: the new ETag of each operation (``None`` for a delete)."""
    etags = cast(list[object], (yield SubmitTransaction(tuple(operations))))
    if len(etags) != len(operations):
        raise DecodeError(f"a transaction's answer has {len(etags)} results for {len(operations)}")
    return [
        None if op.kind == "delete" else _answered(etag, op.kind, op.entity)
        for op, etag in zip(operations, etags, strict=True)
    ]


class Done(Exception):
    """Raised by :func:`advance` with the verb's outcome once it has returned."""

    def __init__(self, value: object) -> None:
        self.value = value


def retry_args(
    policy: RetryPolicy, request: Request, deadline: float, where: object
) -> dict[str, Any]:
    """tenacity settings for one storage call of a verb whose call ends at
    ``deadline``: reads retry every transient fault, writes only those that
    prove the request was not applied; no pause ends past the deadline."""

    def retryable(exc: BaseException) -> bool:
        if not is_transient(exc):
            return False
        return isinstance(request, GetEntity | QueryEntities | QueryPage) or not is_ambiguous(exc)

    def give_up(state: tenacity.RetryCallState) -> NoReturn:
        assert state.outcome is not None
        error = state.outcome.exception()
        assert error is not None
        if state.attempt_number < policy.attempts:  # stopped by the time, not the count
            out_of_time(error, where, policy, deadline)
        raise error

    return {
        "stop": policy.stop(deadline),
        "wait": policy.wait(),
        "retry": tenacity.retry_if_exception(retryable),
        "retry_error_callback": give_up,
    }


def advance(steps: Steps[Any], result: object, error: AzureError | None) -> Request:
    """Give the verb the last result (or throw it the last error); return its next request."""
    try:
        return steps.throw(error) if error is not None else steps.send(result)
    except StopIteration as stop:
        raise Done(stop.value) from None
