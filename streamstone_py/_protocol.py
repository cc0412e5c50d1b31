"""The storage requests a verb makes, and the sync runner that executes them.

Each verb is a generator (see ``_operations``): it yields a request, receives
the result, or has the SDK's exception thrown into it, and finally returns
its outcome. The verbs hold all logic (preparing rows, chunking, mapping
errors); a runner only performs I/O. So the sync and async clients share every
decision, and a test can drive a verb step by step.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, TypeAlias, TypeVar, cast

import tenacity
from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceNotFoundError
from azure.data.tables import TableClient, UpdateMode

from ._retry import (
    DEFAULT_POLICY,
    RetryPolicy,
    is_ambiguous,
    is_transient,
    raise_as_storage_error,
)

T = TypeVar("T")

Entity: TypeAlias = dict[str, Any]

OperationKind = Literal[
    "create", "update_replace", "update_merge", "delete", "upsert_replace", "upsert_merge"
]


class Row(NamedTuple):
    """An entity read back: its properties (with PartitionKey and RowKey) and ETag."""

    properties: Entity
    etag: str


@dataclass(frozen=True, slots=True)
class TableOperation:
    """One operation of an entity-group transaction. ``etag`` makes it conditional."""

    kind: OperationKind
    entity: Entity
    etag: str | None = None


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
class CreateEntity:
    entity: Entity


@dataclass(frozen=True, slots=True)
class UpdateEntity:
    entity: Entity
    etag: str


@dataclass(frozen=True, slots=True)
class SubmitTransaction:
    operations: tuple[TableOperation, ...]


@dataclass(frozen=True, slots=True)
class Parallel:
    """Requests the runner may send at once; the verb receives their results in order."""

    requests: tuple[GetEntity | QueryEntities, ...]


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait before the verb tries again; the runner sleeps by its retry policy."""

    attempt: int


#: Per-call option that switches the SDK's own retries off: the runners retry,
#: knowing which failures of a write are ambiguous (see ``_retry``).
NO_SDK_RETRY: Final[dict[str, Any]] = {"retry_total": 0}
#: The shortest connect and read timeout one try gets, however little time is left.
MIN_TIMEOUT: Final = 0.5


def call_options(deadline: float | None) -> dict[str, Any]:
    """Per-call options: no SDK retries, and timeouts that end the try by ``deadline``
    (``None``: the default policy's total time from now)."""
    if deadline is None:
        deadline = DEFAULT_POLICY.deadline()
    left = max(MIN_TIMEOUT, deadline - time.monotonic())
    return {**NO_SDK_RETRY, "connection_timeout": left, "read_timeout": left}


Request: TypeAlias = (
    GetEntity | QueryEntities | CreateEntity | UpdateEntity | SubmitTransaction | Parallel | Pause
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


def query_args(request: QueryEntities, options: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``query_entities`` for both clients."""
    args: dict[str, Any] = {
        **options,
        "parameters": dict(request.parameters),
        "results_per_page": min(request.page_size, request.limit or request.page_size),
    }
    if request.select is not None:
        args["select"] = list(request.select)
    return args


def parallel(*requests: GetEntity | QueryEntities) -> Steps[list[Any]]:
    return cast(list[Any], (yield Parallel(requests)))


def pause(attempt: int) -> Steps[None]:
    yield Pause(attempt)


def create_entity(entity: Entity) -> Steps[str]:
    return cast(str, (yield CreateEntity(entity)))


def update_entity(entity: Entity, etag: str) -> Steps[str]:
    return cast(str, (yield UpdateEntity(entity, etag)))


def submit_transaction(operations: Sequence[TableOperation]) -> Steps[list[str | None]]:
    return cast(list[str | None], (yield SubmitTransaction(tuple(operations))))


def sdk_operation(op: TableOperation) -> tuple[Any, ...]:
    """The tuple azure-data-tables' ``submit_transaction`` takes."""
    conditional: dict[str, Any] = {}
    if op.etag and op.etag != "*":
        conditional = {"etag": op.etag, "match_condition": MatchConditions.IfNotModified}
    elif op.etag == "*":
        conditional = {"match_condition": MatchConditions.Unconditionally}
    match op.kind:
        case "create":
            return ("create", op.entity)
        case "update_replace":
            return ("update", op.entity, {"mode": UpdateMode.REPLACE, **conditional})
        case "update_merge":
            return ("update", op.entity, {"mode": UpdateMode.MERGE, **conditional})
        case "delete":
            return ("delete", op.entity, conditional)
        case "upsert_replace":
            return ("upsert", op.entity, {"mode": UpdateMode.REPLACE})
        case "upsert_merge":
            return ("upsert", op.entity, {"mode": UpdateMode.MERGE})


def error_code(exc: BaseException) -> str | None:
    """The service's error code (``EntityAlreadyExists``...), whatever form the SDK gives it."""
    code = getattr(exc, "error_code", None)
    code = getattr(code, "value", code)
    return str(code) if code else None


def _table_missing(exc: ResourceNotFoundError) -> bool:
    """A missing table is an error to report, not a missing stream."""
    return error_code(exc) == "TableNotFound"


class Done(Exception):
    """Raised by :func:`advance` with the verb's outcome once it has returned."""

    def __init__(self, value: object) -> None:
        self.value = value


def update_args(etag: str, options: dict[str, Any]) -> dict[str, Any]:
    """Keyword arguments of a conditional replace, for both clients."""
    return {
        **options,
        "mode": UpdateMode.REPLACE,
        "etag": etag,
        "match_condition": MatchConditions.IfNotModified,
    }


def retry_args(policy: RetryPolicy, request: Request) -> dict[str, Any]:
    """tenacity settings for one call: reads retry every transient fault, writes
    only those that prove the request was not applied."""

    def retryable(exc: BaseException) -> bool:
        if not is_transient(exc):
            return False
        return isinstance(request, GetEntity | QueryEntities) or not is_ambiguous(exc)

    return {
        "stop": policy.stop(),
        "wait": policy.wait(),
        "retry": tenacity.retry_if_exception(retryable),
        "reraise": True,
    }


def advance(steps: Steps[Any], result: object, error: AzureError | None) -> Request:
    """Give the verb the last result (or throw it the last error); return its next request."""
    try:
        return steps.throw(error) if error is not None else steps.send(result)
    except StopIteration as stop:
        raise Done(stop.value) from None


def _execute(table: TableClient, request: Request, deadline: float | None = None) -> object:
    try:
        return _send(table, request, call_options(deadline))
    except Exception as exc:
        raise_as_storage_error(exc)


def _send(table: TableClient, request: Request, options: dict[str, Any]) -> object:
    match request:
        case GetEntity(partition_key, row_key):
            try:
                entity = table.get_entity(partition_key, row_key, **options)
            except ResourceNotFoundError as exc:
                if _table_missing(exc):
                    raise
                return None
            return Row(dict(entity), str(entity.metadata["etag"]))
        case QueryEntities(filter=filter, limit=limit):
            pages = table.query_entities(filter, **query_args(request, options))
            return [Row(e, str(e.metadata["etag"])) for e in itertools.islice(pages, limit)]
        case CreateEntity(entity):
            return str(table.create_entity(entity, **options)["etag"])
        case UpdateEntity(entity, etag):
            metadata = table.update_entity(entity, **update_args(etag, options))
            return str(metadata["etag"])
        case SubmitTransaction(operations):
            results = table.submit_transaction([sdk_operation(op) for op in operations], **options)
            return [r.get("etag") for r in results]
    raise TypeError(f"unknown request {request!r}")


C = TypeVar("C")


def require_client(
    table: object, expected: type[C], name: str, instead: str, steps: Steps[Any]
) -> C:
    """Refuse a verb whose partition holds the other kind of client, before any I/O."""
    if not isinstance(table, expected):
        steps.close()
        raise TypeError(
            f"the partition's table must be an {name}, got {type(table).__name__} (use {instead})"
        )
    return table


_pool: ThreadPoolExecutor | None = None


def _threads() -> ThreadPoolExecutor:
    """Threads for the sync client's parallel reads (the header beside the events)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="streamstone")
    return _pool


def run(partition: object, steps: Steps[T]) -> T:
    """Drive a verb to its outcome with the partition's sync ``TableClient``."""
    table = getattr(partition, "table", None)
    policy: RetryPolicy = getattr(partition, "retry", DEFAULT_POLICY)
    result: object = None
    error: AzureError | None = None
    while True:
        try:
            request = advance(steps, result, error)
        except Done as done:
            return cast(T, done.value)
        client = require_client(
            table, TableClient, "azure.data.tables.TableClient",
            "streamstone_py.aio with the async client", steps,
        )  # fmt: skip
        result, error = None, None
        if isinstance(request, Pause):
            time.sleep(policy.delay(request.attempt))
            continue

        def call(request: Request, client: TableClient = client) -> object:
            retrying = tenacity.Retrying(**retry_args(policy, request))
            return retrying(_execute, client, request, policy.deadline())

        try:
            if isinstance(request, Parallel):
                futures = [_threads().submit(call, r) for r in request.requests]
                result = [future.result() for future in futures]
            else:
                result = call(request)
        except AzureError as exc:
            error = exc
