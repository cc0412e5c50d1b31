"""The bytes an entity-group transaction carries, on either runner: the
planner sizes transactions in them, so that every one it sends fits the
service's 4 MiB, and refuses before sending an event that cannot fit.

Both runners write JSON with every character beyond ASCII escaped
(``\\uXXXX``: six bytes, twelve beyond U+FFFF), names included.
azure-data-tables writes a space after each ``:`` and ``,`` and annotates
every property but booleans and Int32 with its ``@odata.type``, so most
names travel twice; each operation is a part of the multipart body that
repeats a dozen headers and its URL, whose keys are percent-encoded UTF-8.
The sizes here are upper bounds of that form, the larger of the two (the
wire runner writes no spaces and annotates fewer types);
``tests/test_limits.py`` holds them against the bodies both runners send.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from json.encoder import encode_basestring_ascii
from typing import Any, Final
from urllib.parse import quote

from azure.data.tables import EntityProperty

__all__ = ["TRANSACTION_BYTES", "entity_bytes", "operation_bytes"]

#: One property beyond its name and value: ``: `` and ``, `` around the value,
#: and its annotation ``"NAME@odata.type": "Edm.DateTime", `` beside the name.
_PROPERTY: Final = 4 + len('@odata.type": "Edm.DateTime", ')
#: A part's headers beside its URL and ETag: the changeset boundary, content
#: type, transfer encoding and id, the request line's method and version,
#: content type and length, x-ms-version, DataServiceVersion, Accept,
#: x-ms-date, Date, Prefer, and the blank lines (about 420 bytes as sent).
_PART: Final = 512
#: The body's own boundaries and the changeset's header, around the parts.
TRANSACTION_BYTES: Final = 512
#: An ETag as the service gives them (``W/"datetime'2026-...Z'"``, about 50).
_ETAG: Final = 128
#: The URL of an operation on one entity, beside its endpoint, table and keys.
_ENTITY_PATH: Final = len("/(PartitionKey='',RowKey='')")

#: JSON of the fixed-size types, at their longest: ``-1.7976931348623157e+308``,
#: ``"-9223372036854775808"``, ``"9999-12-31T23:59:59.999999Z"``, a quoted GUID.
_FIXED: Final[dict[type, int]] = {
    bool: 5,
    float: 24,
    datetime: 29,
    uuid.UUID: 38,
}


def _value_bytes(value: Any) -> int:
    kind = type(value)
    if kind is str:
        return len(encode_basestring_ascii(value))
    if kind is bytes:
        return 4 * ((len(value) + 2) // 3) + 2  # base64, quoted
    if kind is int:
        return 11  # an Int32
    if isinstance(value, EntityProperty):
        return 22  # an Int64, quoted
    return _FIXED.get(kind, 64)


def entity_bytes(entity: Mapping[str, Any]) -> int:
    """The JSON of a converted entity (keys included), at most."""
    size = 2
    for name, value in entity.items():
        size += 2 * len(encode_basestring_ascii(name)) + _PROPERTY + _value_bytes(value)
    return size


def _key(value: str) -> int:
    return len(quote(value.replace("'", "''"), safe=""))


def operation_bytes(
    table_url: int, kind: str, entity: Mapping[str, Any], etag: str | None = None
) -> int:
    """One operation's part of a transaction, at most: ``table_url`` is the
    length of the table's URL (account endpoint, ``/``, table name)."""
    size = _PART + table_url + entity_bytes(entity)
    if kind != "create":  # addressed by its keys, and maybe conditional
        size += _ENTITY_PATH + _key(entity["PartitionKey"]) + _key(entity["RowKey"])
        size += len(etag) if etag is not None and etag != "*" else _ETAG
    return size
