"""The SDK runners' I/O: the engine's requests performed with azure-data-tables'
``TableClient`` (sync) and ``aio.TableClient`` (async), the reference the wire
runners are checked against.

Each call switches the SDK's own retries off (the engine retries, knowing
which failures of a write are ambiguous) and gets timeouts that end it by
the verb's deadline. azure-core applies those to each socket operation, so
an answer that trickles in holds a sync call for as long as it trickles;
an async call is cancelled at its deadline besides (a lost answer then).
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import datetime
from typing import Any, Final

from azure.core import MatchConditions
from azure.core.exceptions import ResourceNotFoundError, ServiceResponseTimeoutError
from azure.data.tables import TableClient, UpdateMode
from azure.data.tables.aio import TableClient as AsyncTableClient

from ._faults import table_missing
from ._protocol import (
    CONDITIONAL,
    CreateEntity,
    GetEntity,
    QueryEntities,
    QueryPage,
    Request,
    Row,
    SubmitTransaction,
    TableOperation,
    UpdateEntity,
    expected_etag,
    time_left,
)
from ._retry import raise_as_storage_error
from ._tracing import sdk_hook

__all__ = ["perform", "perform_async", "sdk_operation"]

#: Per-call option that switches the SDK's own retries off.
NO_SDK_RETRY: Final[dict[str, Any]] = {"retry_total": 0}


def call_options(table: object, deadline: float | None) -> dict[str, Any]:
    left = time_left(deadline)
    return {
        **NO_SDK_RETRY,
        "connection_timeout": left,
        "read_timeout": left,
        "raw_response_hook": sdk_hook(table),
    }


def sdk_operation(op: TableOperation) -> tuple[Any, ...]:
    """The tuple azure-data-tables' ``submit_transaction`` takes."""
    conditional: dict[str, Any] = {}
    if op.kind in CONDITIONAL:
        etag = expected_etag(op.kind, op.entity, op.etag)
        conditional = (
            {"match_condition": MatchConditions.Unconditionally}
            if etag == "*"
            else {"etag": etag, "match_condition": MatchConditions.IfNotModified}
        )
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


def _update_args(etag: str, options: dict[str, Any]) -> dict[str, Any]:
    return {
        **options,
        "mode": UpdateMode.REPLACE,
        "etag": etag,
        "match_condition": MatchConditions.IfNotModified,
    }


def _query_args(request: QueryEntities | QueryPage, options: dict[str, Any]) -> dict[str, Any]:
    limit = request.limit if isinstance(request, QueryEntities) else None
    args: dict[str, Any] = {
        **options,
        "parameters": dict(request.parameters),
        "results_per_page": min(request.page_size, limit or request.page_size),
    }
    if request.select is not None:
        args["select"] = list(request.select)
    return args


def _row(entity: Any) -> Row:
    stamp = entity.metadata.get("timestamp")
    if isinstance(stamp, datetime):  # the SDK's subclass carries the raw string: a plain one
        stamp = datetime.fromtimestamp(stamp.timestamp(), stamp.tzinfo)
    return Row(dict(entity), str(entity.metadata["etag"]), stamp)


def _token(pager: Any) -> tuple[str, str | None] | None:
    token = pager.continuation_token
    if not token:
        return None
    return str(token["PartitionKey"]), token.get("RowKey")


def _page_token(request: QueryPage) -> Any:
    """The SDK's continuation token: a mapping, though its pager is typed with str."""
    if request.continuation is None:
        return None
    partition_key, row_key = request.continuation
    return {"PartitionKey": partition_key, "RowKey": row_key}


def perform(table: TableClient, request: Request, deadline: float | None = None) -> object:
    """Perform one request with the sync SDK client."""
    try:
        return _send(table, request, call_options(table, deadline))
    except Exception as exc:
        raise_as_storage_error(exc)


def _send(table: TableClient, request: Request, options: dict[str, Any]) -> object:
    match request:
        case GetEntity(partition_key, row_key):
            try:
                entity = table.get_entity(partition_key, row_key, **options)
            except ResourceNotFoundError as exc:
                if table_missing(exc):
                    raise
                return None
            return _row(entity)
        case QueryEntities(filter=filter, limit=limit):
            pages = table.query_entities(filter, **_query_args(request, options))
            return [_row(e) for e in itertools.islice(pages, limit)]
        case QueryPage(filter=filter):
            pager = table.query_entities(filter, **_query_args(request, options)).by_page(
                continuation_token=_page_token(request)
            )
            rows = [_row(e) for e in next(pager, [])]
            return rows, _token(pager)
        case CreateEntity(entity):
            return table.create_entity(entity, **options).get("etag")
        case UpdateEntity(entity, etag):
            return table.update_entity(entity, **_update_args(etag, options)).get("etag")
        case SubmitTransaction(operations):
            results = table.submit_transaction([sdk_operation(op) for op in operations], **options)
            return [r.get("etag") for r in results]
    raise TypeError(f"unknown request {request!r}")


async def perform_async(
    table: AsyncTableClient, request: Request, deadline: float | None = None
) -> object:
    """Perform one request with the async SDK client, cancelled at its deadline."""
    left = time_left(deadline)
    try:
        return await asyncio.wait_for(
            _send_async(table, request, call_options(table, deadline)), left
        )
    except TimeoutError as exc:  # azure-core raises its own errors: this is ours
        raise ServiceResponseTimeoutError(
            f"no complete answer in {left:.1f} s, the call's time left", error=exc
        ) from exc
    except Exception as exc:
        raise_as_storage_error(exc)


async def _send_async(table: AsyncTableClient, request: Request, options: dict[str, Any]) -> object:
    match request:
        case GetEntity(partition_key, row_key):
            try:
                entity = await table.get_entity(partition_key, row_key, **options)
            except ResourceNotFoundError as exc:
                if table_missing(exc):
                    raise
                return None
            return _row(entity)
        case QueryEntities(filter=filter, limit=limit):
            rows: list[Row] = []
            async for entity in table.query_entities(filter, **_query_args(request, options)):
                if limit is not None and len(rows) >= limit:
                    break
                rows.append(_row(entity))
            return rows
        case QueryPage(filter=filter):
            pager = table.query_entities(filter, **_query_args(request, options)).by_page(
                continuation_token=_page_token(request)
            )
            page = [_row(e) async for e in await pager.__anext__()]
            return page, _token(pager)
        case CreateEntity(entity):
            return (await table.create_entity(entity, **options)).get("etag")
        case UpdateEntity(entity, etag):
            # aiohttp sends an idempotent method (PUT) again by itself when the
            # connection drops, even after the server applied it; a conditional
            # replace then meets its own change (412). As a one-operation
            # transaction (POST) it is never re-sent below the engine, which
            # resolves a lost answer by reading instead.
            operation = TableOperation("update_replace", entity, etag)
            results = await table.submit_transaction([sdk_operation(operation)], **options)
            return results[0].get("etag")
        case SubmitTransaction(operations):
            results = await table.submit_transaction(
                [sdk_operation(op) for op in operations], **options
            )
            return [r.get("etag") for r in results]
    raise TypeError(f"unknown request {request!r}")
