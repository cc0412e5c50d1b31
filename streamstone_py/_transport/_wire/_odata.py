"""The Table service's wire format, for the wire runners: entities as OData
JSON, the URLs of entities and queries, and ``$batch`` bodies and answers.

Entities are written with a type annotation where JSON cannot tell the
type (``Edm.Int64``, ``Edm.Double``, ``Edm.Binary``, ``Edm.DateTime``,
``Edm.Guid``), as azure-data-tables writes them, and read back as the plain
values the verbs take from the SDK's entities (:func:`._values.from_table`):
an ``Edm.Int64`` is an ``int``, an ``Edm.DateTime`` a ``datetime`` in UTC.
A transaction's body is built with string joins, its answer split on its
boundaries: the ``email`` package is what makes the SDK's cost.
"""

from __future__ import annotations

import base64
import json
import math
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final
from urllib.parse import quote

from azure.data.tables import EntityProperty

from .._protocol import TableOperation, expected_etag

__all__ = [
    "BatchAnswer",
    "decode_entity",
    "encode_entity",
    "entity_path",
    "filter_text",
    "odata_error",
    "operation_request",
    "parse_batch",
    "transaction_body",
]

_INT32: Final = (-(2**31), 2**31 - 1)
_EPOCH_TEXT: Final = "%Y-%m-%dT%H:%M:%S.%fZ"


def _annotated(name: str, kind: str, value: str, out: dict[str, Any]) -> None:
    out[name] = value
    out[name + "@odata.type"] = kind


def encode_entity(entity: Mapping[str, Any]) -> str:
    """An entity as the JSON body of a request."""
    out: dict[str, Any] = {}
    for name, value in entity.items():
        if isinstance(value, bool):
            out[name] = bool(value)
        elif isinstance(value, str):
            out[name] = str(value)
        elif isinstance(value, EntityProperty):
            if value.edm_type != "Edm.Int64" or not isinstance(value.value, int):
                raise TypeError(f"property {name!r}: unsupported {value!r}")
            _annotated(name, "Edm.Int64", str(int(value.value)), out)
        elif isinstance(value, int):
            if _INT32[0] <= value <= _INT32[1]:
                out[name] = int(value)
            else:
                _annotated(name, "Edm.Int64", str(int(value)), out)
        elif isinstance(value, float):
            if math.isfinite(value):
                out[name] = float(value)
                out[name + "@odata.type"] = "Edm.Double"
            else:
                text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
                _annotated(name, "Edm.Double", text, out)
        elif isinstance(value, bytes | bytearray | memoryview):
            text = base64.b64encode(bytes(value)).decode("ascii")
            _annotated(name, "Edm.Binary", text, out)
        elif isinstance(value, datetime):
            if value.utcoffset() is None:
                raise ValueError(f"property {name!r}: datetime {value!r} must be timezone-aware")
            _annotated(name, "Edm.DateTime", value.astimezone(UTC).strftime(_EPOCH_TEXT), out)
        elif isinstance(value, uuid.UUID):
            _annotated(name, "Edm.Guid", str(value), out)
        else:
            raise TypeError(f"property {name!r} has unsupported type {type(value).__name__}")
    return json.dumps(out, separators=(",", ":"))


def _datetime(text: str) -> datetime:
    """The service's DateTime (up to 7 fractional digits, truncated to 6 as the
    SDK does) as a datetime in UTC."""
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def _typed(kind: str, value: Any) -> Any:
    if kind == "Edm.Int64":
        return int(value)
    if kind == "Edm.Double":
        return float(value)  # also "NaN", "Infinity", "-Infinity"
    if kind == "Edm.Binary":
        return base64.b64decode(value)
    if kind == "Edm.DateTime":
        return _datetime(value)
    if kind == "Edm.Guid":
        return uuid.UUID(value)
    if kind in ("Edm.String", "Edm.Int32", "Edm.Boolean"):
        return value
    raise ValueError(f"unknown property type {kind!r}")


def decode_entity(item: Mapping[str, Any]) -> tuple[dict[str, Any], str, datetime | None]:
    """An entity as read: its properties (PartitionKey and RowKey included, as
    plain values), its ETag and its Timestamp."""
    properties: dict[str, Any] = {}
    kinds: list[tuple[str, str]] = []
    etag = ""
    stamp: str | None = None
    for name, value in item.items():
        if name[-11:] == "@odata.type":
            kinds.append((name[:-11], value))
        elif name[:6] == "odata.":
            if name == "odata.etag":
                etag = value
        elif name == "Timestamp":
            stamp = value
        else:
            properties[name] = value
    for name, kind in kinds:
        if name in properties:
            properties[name] = _typed(kind, properties[name])
    if not etag and stamp is not None:
        etag = "W/\"datetime'" + quote(stamp) + "'\""
    return properties, etag, _datetime(stamp) if stamp is not None else None


def _key(value: str) -> str:
    return quote(value.replace("'", "''"), safe="")


def entity_path(table: str, partition_key: str, row_key: str) -> str:
    """The path of one entity below the account: ``/table(PartitionKey='..',RowKey='..')``."""
    return f"/{table}(PartitionKey='{_key(partition_key)}',RowKey='{_key(row_key)}')"


def filter_text(text: str, parameters: Mapping[str, str]) -> str:
    """A filter with its ``@name`` parameters put in as quoted literals (the
    engine's parameters are strings), as azure-data-tables substitutes them."""
    if not parameters:
        return text
    words = text.split(" ")
    for index, word in enumerate(words):
        if word.startswith("@"):
            value = parameters[word[1:]]
            words[index] = "'" + str(value).replace("'", "''") + "'"
    return " ".join(words)


_METHODS: Final = {
    "create": ("POST", False),
    "update_replace": ("PUT", True),
    "update_merge": ("PATCH", True),
    "delete": ("DELETE", True),
    "upsert_replace": ("PUT", False),
    "upsert_merge": ("PATCH", False),
}


def operation_request(
    base: str, table: str, op: TableOperation
) -> tuple[str, str, dict[str, str], str | None]:
    """One operation as an HTTP request: method, URL, headers and body."""
    method, conditional = _METHODS[op.kind]
    headers: dict[str, str] = {}
    if op.kind == "create":
        url = f"{base}/{table}"
        headers["Prefer"] = "return-no-content"
    else:
        entity = op.entity
        url = base + entity_path(table, entity["PartitionKey"], entity["RowKey"])
        if conditional:
            headers["If-Match"] = expected_etag(op.kind, entity, op.etag)
    body = None if op.kind == "delete" else encode_entity(op.entity)
    return method, url, headers, body


def transaction_body(
    base: str, table: str, operations: Sequence[TableOperation], boundary: str
) -> bytes:
    """The multipart body of a ``$batch`` holding ``operations`` as one changeset."""
    changeset = "changeset_" + boundary
    parts = [f"--batch_{boundary}\r\nContent-Type: multipart/mixed; boundary={changeset}\r\n"]
    for index, op in enumerate(operations):
        method, url, headers, body = operation_request(base, table, op)
        head = [
            f"--{changeset}",
            "Content-Type: application/http",
            "Content-Transfer-Encoding: binary",
            f"Content-ID: {index}",
            "",
            f"{method} {url} HTTP/1.1",
            "Accept: application/json;odata=minimalmetadata",
            "DataServiceVersion: 3.0",
        ]
        head += [f"{name}: {value}" for name, value in headers.items()]
        if body is not None:
            head += ["Content-Type: application/json", "", body]
        else:
            head += ["", ""]
        parts.append("\r\n".join(head))
    parts.append(f"--{changeset}--\r\n--batch_{boundary}--\r\n")
    return "\r\n".join(parts).encode("utf-8")


@dataclass(frozen=True, slots=True)
class BatchAnswer:
    """A transaction's answer: each operation's ETag, or the failure's parts."""

    etags: list[str | None]
    status: int = 0
    reason: str = ""
    body: bytes = b""


def _boundary(content_type: str) -> str:
    for field in content_type.split(";"):
        name, _, value = field.strip().partition("=")
        if name.lower() == "boundary":
            return value.strip('"')
    raise ValueError(f"a multipart answer without a boundary: {content_type!r}")


def parse_batch(content_type: str, data: bytes, count: int) -> BatchAnswer:
    """The answer of a ``$batch`` of ``count`` operations (status 202).

    ``ValueError`` if it cannot be read as one: the caller treats that as a
    response cut short (the transaction may have committed).
    """
    outer = data.split(b"--" + _boundary(content_type).encode())
    if len(outer) < 3:
        raise ValueError("a $batch answer without parts")
    head, _, inner = outer[1].partition(b"\r\n\r\n")
    changeset = None
    for line in head.decode("latin-1").split("\r\n"):
        if line.lower().startswith("content-type:") and "boundary" in line.lower():
            changeset = _boundary(line.split(":", 1)[1])
    if changeset is None:  # the whole batch failed before its changeset
        return _failure(outer[1])
    responses = [p for p in inner.split(b"--" + changeset.encode()) if p.strip(b"\r\n-")]
    etags: list[str | None] = []
    for part in responses:
        _, _, http = part.partition(b"\r\n\r\n")
        status_line, _, rest = http.partition(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        if status >= 300:
            return _failure(part)
        etag = None
        for line in rest.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.strip().lower() == "etag":
                etag = value.strip()
        etags.append(etag)
    if len(etags) != count:
        raise ValueError(f"a $batch answer with {len(etags)} results for {count} operations")
    return BatchAnswer(etags)


def _failure(part: bytes) -> BatchAnswer:
    """The answer of a failed transaction: the failed operation's HTTP response."""
    _, _, http = part.partition(b"\r\n\r\n")
    status_line, _, rest = http.lstrip(b"\r\n").partition(b"\r\n")
    pieces = status_line.decode("latin-1").split(" ", 2)
    status = int(pieces[1])
    reason = pieces[2] if len(pieces) > 2 else ""
    body = rest.partition(b"\r\n\r\n")[2].strip(b"\r\n")
    return BatchAnswer([], status, reason, body)


_XML_CODE: Final = re.compile(rb"<Code>([^<]*)</Code>")
_XML_MESSAGE: Final = re.compile(rb"<Message>([^<]*)</Message>")


def odata_error(body: bytes) -> tuple[str | None, str | None]:
    """The code and message of an error body: OData JSON, or the XML the service
    (and Azurite) answer some authentication failures with."""
    if body.lstrip().startswith(b"<"):
        code, message = _XML_CODE.search(body), _XML_MESSAGE.search(body)
        return (
            code.group(1).decode("utf-8", "replace") if code else None,
            message.group(1).decode("utf-8", "replace") if message else None,
        )
    try:
        error = json.loads(body or b"{}").get("odata.error", {})
    except (ValueError, AttributeError):
        return None, body.decode("utf-8", "replace")[:500] or None
    message = error.get("message", {})
    text = message.get("value") if isinstance(message, dict) else message
    return error.get("code"), text
