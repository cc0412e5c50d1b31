"""The engine's storage requests as HTTP exchanges with the Table service, for
both wire runners: each request is a generator that yields the HTTP calls
to make and receives their answers, so the sync and the async runner share
every decision and differ only in how bytes travel.

An answer that is an error becomes the vocabulary's error (see
:mod:`.._faults`); an answer that cannot be read (a ``$batch`` cut short, a
body that is not the JSON it should be) becomes a ``DecodeError``, which
:mod:`.._retry` counts as a cut response: ambiguous for a write.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, Final, TypeAlias
from urllib.parse import quote, urlsplit

from azure.core.exceptions import DecodeError

from .._faults import parse_retry_after, service_error
from .._protocol import (
    CreateEntity,
    GetEntity,
    QueryEntities,
    QueryPage,
    Request,
    Row,
    SubmitTransaction,
    TableOperation,
    UpdateEntity,
)
from . import _odata

__all__ = ["Answer", "HttpCall", "Service", "exchange", "http_date"]

#: The REST API version the wire runners speak (that of azure-data-tables 12).
API_VERSION: Final = "2019-02-02"
_JSON: Final = "application/json"
_ACCEPT: Final = "application/json;odata=minimalmetadata"


@dataclass(slots=True)
class HttpCall:
    """One HTTP request; ``resource`` is its path as the signature covers it."""

    method: str
    url: str
    resource: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    content_type: str = ""


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    reason: str
    headers: Mapping[str, str]
    data: bytes


Exchange: TypeAlias = Generator[HttpCall, Answer, Any]


class Service:
    """Where a table's requests go: the account's endpoint and the table."""

    def __init__(self, endpoint: str, table: str, sas_query: str = "") -> None:
        parts = urlsplit(endpoint)
        self.base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self.prefix = parts.path.rstrip("/")  # "/account" on the emulator, else ""
        self.table = table
        self.sas = sas_query

    def call(self, method: str, path: str, query: str = "", **kwargs: Any) -> HttpCall:
        queries = "&".join(q for q in (query, self.sas) if q)
        url = self.base + path + ("?" + queries if queries else "")
        return HttpCall(method, url, self.prefix + path, **kwargs)


_now: tuple[int, str] = (0, "")


def http_date() -> str:
    """``x-ms-date``: the time in RFC 1123 form, made once a second (a request's
    signature covers it, the service allows it minutes of skew)."""
    global _now
    second = int(time.time())
    cached = _now
    if cached[0] != second:
        cached = _now = (second, formatdate(second, usegmt=True))
    return cached[1]


def _headers(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    return {
        "x-ms-version": API_VERSION,
        "DataServiceVersion": "3.0",
        "MaxDataServiceVersion": "3.0;NetFx",
        "Accept": _ACCEPT,
        "Accept-Encoding": "identity",
        "x-ms-client-request-id": str(uuid.uuid4()),
        **(extra or {}),
    }


def _fail(answer: Answer, *, transaction: bool = False) -> Exception:
    code, message = _odata.odata_error(answer.data)
    headers = answer.headers
    return service_error(
        answer.status,
        answer.reason,
        headers.get("x-ms-error-code") or code,
        message,
        headers.get("x-ms-request-id"),
        transaction=transaction,
        retry_after=parse_retry_after(headers.get("Retry-After")),
    )


def _json(answer: Answer) -> Any:
    try:
        return json.loads(answer.data)
    except ValueError as exc:
        raise DecodeError(f"the service's answer is not JSON: {exc}") from exc


def _get(service: Service, request: GetEntity) -> Exchange:
    path = _odata.entity_path(service.table, request.partition_key, request.row_key)
    answer = yield service.call("GET", path, headers=_headers())
    if answer.status == 404:
        error = _fail(answer)
        if getattr(error, "error_code", None) == "TableNotFound":
            raise error
        return None
    if answer.status != 200:
        raise _fail(answer)
    properties, etag, stamp = _odata.decode_entity(_json(answer))
    return Row(properties, answer.headers.get("ETag") or etag, stamp)


def _page(service: Service, request: QueryEntities | QueryPage, top: int, token: Any) -> Exchange:
    parts = [
        f"$top={top}",
        "$filter=" + quote(_odata.filter_text(request.filter, request.parameters)),
    ]
    if request.select is not None:
        parts.append("$select=" + quote(",".join(request.select)))
    if token:
        parts += [f"NextPartitionKey={quote(token[0])}", f"NextRowKey={quote(token[1] or '')}"]
    answer = yield service.call("GET", f"/{service.table}()", "&".join(parts), headers=_headers())
    if answer.status != 200:
        raise _fail(answer)
    items = _json(answer).get("value", [])
    rows = []
    for item in items:
        properties, etag, stamp = _odata.decode_entity(item)
        rows.append(Row(properties, etag, stamp))
    headers = answer.headers
    next_pk = headers.get("x-ms-continuation-NextPartitionKey")
    following = (next_pk, headers.get("x-ms-continuation-NextRowKey")) if next_pk else None
    return rows, following


def _query(service: Service, request: QueryEntities) -> Exchange:
    rows: list[Row] = []
    token = None
    while True:
        left = request.page_size if request.limit is None else request.limit - len(rows)
        page, token = yield from _page(service, request, min(request.page_size, left), token)
        rows += page
        if token is None or (request.limit is not None and len(rows) >= request.limit):
            return rows[: request.limit] if request.limit is not None else rows


def _write(
    service: Service, method: str, path: str, entity: Any, extra: dict[str, str]
) -> Exchange:
    body = _odata.encode_entity(entity).encode("utf-8")
    headers = _headers({"Content-Type": _JSON, **extra})
    call = service.call(method, path, headers=headers, body=body, content_type=_JSON)
    answer = yield call
    if answer.status not in (201, 204):
        raise _fail(answer)
    return answer.headers.get("ETag")  # none: a cut answer (see _protocol)


def _transaction(service: Service, operations: tuple[TableOperation, ...]) -> Exchange:
    boundary = uuid.uuid4().hex
    body = _odata.transaction_body(service.base, service.table, operations, boundary)
    content_type = f"multipart/mixed; boundary=batch_{boundary}"
    headers = _headers({"Content-Type": content_type})
    answer = yield service.call(
        "POST", "/$batch", headers=headers, body=body, content_type=content_type
    )
    if answer.status == 413:
        raise _fail(answer, transaction=True)  # RequestTooLargeError, as the SDK raises
    if answer.status != 202:
        raise _fail(answer)  # the whole request failed (authentication, a bad body...)
    try:
        result = _odata.parse_batch(
            answer.headers.get("Content-Type", ""), answer.data, len(operations)
        )
    except (ValueError, IndexError) as exc:
        raise DecodeError(f"the $batch answer cannot be read: {exc}") from exc
    if result.status:
        failed = Answer(result.status, result.reason, answer.headers, result.body)
        raise _fail(failed, transaction=True)
    return result.etags


def exchange(service: Service, request: Request, *, update_as_transaction: bool) -> Exchange:
    """The HTTP calls of ``request``, and its result (or its error).

    ``update_as_transaction``: send a conditional replace as a one-operation
    ``$batch``, a POST, which aiohttp never sends again by itself (it
    repeats an idempotent PUT whose connection dropped, even if the server
    applied it): the async runner's choice.
    """
    match request:
        case GetEntity():
            return (yield from _get(service, request))
        case QueryEntities():
            return (yield from _query(service, request))
        case QueryPage(page_size=size, continuation=token):
            return (yield from _page(service, request, size, token))
        case CreateEntity(entity):
            prefer = {"Prefer": "return-no-content"}
            return (yield from _write(service, "POST", f"/{service.table}", entity, prefer))
        case UpdateEntity(entity, etag) if update_as_transaction:
            operation = TableOperation("update_replace", entity, etag)
            return (yield from _transaction(service, (operation,)))[0]
        case UpdateEntity(entity, etag):
            path = _odata.entity_path(service.table, entity["PartitionKey"], entity["RowKey"])
            return (yield from _write(service, "PUT", path, entity, {"If-Match": etag}))
        case SubmitTransaction(operations):
            return (yield from _transaction(service, operations))
    raise TypeError(f"unknown request {request!r}")
