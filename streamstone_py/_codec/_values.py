"""Table property values: validation, conversion and Azure's size accounting.

Azure Table Storage types each property (Edm.String, Edm.Int32, ...) and limits
each one; the service answers a violation with a bare ``400``. Everything here
runs before a request is sent so that a bad value becomes a ``ValueError`` that
names the property, its size and the limit.
"""

from __future__ import annotations

import enum
import math
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Final, TypeAlias, cast

from azure.data.tables import EdmType, EntityProperty

from ._text import EMULATOR_ACCOUNT, emulator_drop, exact_str, lone_surrogate, type_name, utf16_size

PropertyValue: TypeAlias = str | int | float | bool | bytes | datetime | uuid.UUID
"""A value the engine stores in a table property."""

#: Largest string (in UTF-16 bytes) or binary value of one property.
MAX_PROPERTY_BYTES: Final = 64 * 1024
#: Largest entity, by Azure's own size formula.
MAX_ENTITY_BYTES: Final = 1024 * 1024
#: Custom properties per entity (255 minus PartitionKey, RowKey and Timestamp).
MAX_PROPERTIES: Final = 252
#: Longest property name.
MAX_NAME_LENGTH: Final = 255

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)

#: Names owned by Azure itself; compared case-insensitively.
SYSTEM_NAMES: Final = frozenset({"partitionkey", "rowkey", "timestamp", "etag", "odata.etag"})
#: Column that holds the stream or event version on engine rows (Streamstone's name).
VERSION: Final = "Version"
#: Column that holds an event's id on its event row.
EVENT_ID: Final = "SS_Id"
#: Column on a truncated stream's header: its first available version.
FIRST_VERSION: Final = "SS_First"
#: Column on the header of a stream being deleted.
DELETED: Final = "SS_Deleted"
#: Names that event and stream properties may not use.
RESERVED_NAMES: Final = SYSTEM_NAMES | {
    name.lower() for name in (VERSION, EVENT_ID, FIRST_VERSION, DELETED)
}


def check_name(name: object, reserved: frozenset[str], owner: str) -> str:
    name = exact_str(f"{owner} property name", name)
    if name.lower() in reserved:
        raise ValueError(f"{owner} property name {name!r} is reserved")
    # The service counts a name's length in UTF-16 code units, as .NET does.
    if not name.isidentifier() or (len(name) > 127 and utf16_size(name) > 2 * MAX_NAME_LENGTH):
        raise ValueError(
            f"{owner} property name {name!r} is not valid: Azure Tables needs an identifier "
            f"of at most {MAX_NAME_LENGTH} UTF-16 code units"
        )
    return name


#: The service's range of Edm.DateTime.
MIN_DATETIME: Final = datetime(1601, 1, 1, tzinfo=UTC)
MAX_DATETIME: Final = datetime.max.replace(tzinfo=UTC)  # 9999-12-31, the end of both ranges


def _text(name: str, value: str) -> str:
    if (lone := lone_surrogate(value)) is not None:
        raise ValueError(
            f"property {name!r}: the str holds a lone surrogate {lone.group()!r} at index "
            f"{lone.start()}, which is not Unicode text and cannot be sent: repair the "
            "text, or store bytes (value.encode('utf-8', 'surrogatepass'))"
        )
    # A str of n code points is at most 4n bytes in UTF-16: measure only those
    # that could be over the limit.
    if len(value) > MAX_PROPERTY_BYTES // 4:
        size = utf16_size(value)
        if size > MAX_PROPERTY_BYTES:
            raise ValueError(
                f"property {name!r} is a string of {size} bytes in UTF-16; "
                f"the limit is {MAX_PROPERTY_BYTES}"
            )
    return value


def _integer(name: str, value: int) -> Any:
    if _INT32[0] <= value <= _INT32[1]:
        return value
    if _INT64[0] <= value <= _INT64[1]:
        return EntityProperty(value, EdmType.INT64)
    raise ValueError(
        f"property {name!r}: integer {value} does not fit in 64 bits; store it as a str"
    )


def _binary(name: str, value: bytes) -> bytes:
    if len(value) > MAX_PROPERTY_BYTES:
        raise ValueError(
            f"property {name!r} is {len(value)} bytes of binary; the limit is {MAX_PROPERTY_BYTES}"
        )
    return value


def _moment(name: str, value: datetime) -> datetime:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(
            f"property {name!r}: datetime {value!r} must be timezone-aware "
            "(for UTC: value.replace(tzinfo=timezone.utc))"
        )
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not MIN_DATETIME <= utc <= MAX_DATETIME:
        raise ValueError(
            f"property {name!r}: datetime {value.isoformat()} is outside the range Azure "
            "Tables stores, 1601-01-01 to 9999-12-31 UTC: store it as a str "
            "(value.isoformat()) instead"
        )
    if utc != value:  # PEP 495: never equal across zones in a gap or a fold
        wall = value.replace(tzinfo=None, fold=0)
        where = (
            "falls in a repeated hour of its time zone"
            if utc.astimezone(value.tzinfo).replace(tzinfo=None, fold=0) == wall
            else "does not exist in its time zone (its clocks skipped that hour)"
        )
        raise ValueError(
            f"property {name!r}: datetime {value!r} {where}, so it would not compare "
            "equal to the UTC time it reads back as: store value.astimezone(timezone.utc)"
        )
    return value


def _same(name: str, value: Any) -> Any:
    return value


#: How a value of each accepted type (exactly that type) is checked and sent.
_ACCEPTED: Final[dict[type, Any]] = {
    str: _text,
    int: _integer,
    bool: _same,
    float: _same,
    bytes: _binary,
    datetime: _moment,
    uuid.UUID: _same,
}

#: What to do with a subclass of an accepted type, which reads back as its base.
_PLAIN_OF: Final = (
    (bool, "bool(value)"),
    (int, "int(value)"),
    (float, "float(value)"),
    (str, "str.__str__(value), which keeps its characters"),
    (bytes, "bytes(value)"),
    (datetime, "a plain datetime (pandas: value.to_pydatetime())"),
    (uuid.UUID, "uuid.UUID(int=value.int)"),
)


def _refusal(name: str, value: object) -> Exception:
    """Why ``value`` cannot be stored, and what to store instead."""
    kind = type_name(value)
    if value is None:
        return ValueError(
            f"property {name!r} is None; Azure Tables cannot store a null: leave it out"
        )
    if isinstance(value, enum.Enum):
        return TypeError(
            f"property {name!r} is a {kind} member ({value!r}), which would read back as a "
            f"plain value, not as the member: store its .value ({value.value!r}) and turn it "
            f"back with {type(value).__qualname__}(value) when reading"
        )
    if kind.startswith("numpy.") and hasattr(value, "item"):
        return TypeError(
            f"property {name!r} is a {kind}, which would not read back as one: store "
            "value.item(), the plain Python value"
        )
    if isinstance(value, Decimal):
        return TypeError(
            f"property {name!r} is a {kind}, which Azure Tables has no type for: store "
            "str(value) to keep every digit, or float(value)"
        )
    if isinstance(value, bytearray | memoryview):
        return TypeError(
            f"property {name!r} is a {kind}, which would read back as bytes: store bytes(value)"
        )
    for base, plain in _PLAIN_OF:
        if isinstance(value, base):
            return TypeError(
                f"property {name!r} is a {kind}, a subclass of {base.__name__} that would "
                f"read back as a plain {base.__name__}: store {plain}"
            )
    return TypeError(
        f"property {name!r} has unsupported type {kind}; a property holds a str, int, bool, "
        "float, bytes, timezone-aware datetime or uuid.UUID"
    )


def to_table(name: str, value: object) -> Any:
    """Convert a Python value to what azure-data-tables sends, checking its limits.

    Only values of exactly the accepted types are stored, so that each reads
    back equal and of the same type; anything else (a subclass, an enum, a
    numpy scalar, a Decimal) is refused with what to store instead.
    """
    convert = _ACCEPTED.get(type(value))
    if convert is None:
        raise _refusal(name, value)
    return convert(name, value)


_PLAIN_TYPES: Final = frozenset({str, int, float, bool, bytes, uuid.UUID})


def from_table(value: Any) -> PropertyValue:
    """Convert a value read by azure-data-tables back to a plain Python value."""
    if type(value) in _PLAIN_TYPES:  # the common case, on the read path's hot loop
        return cast(PropertyValue, value)
    if isinstance(value, EntityProperty):
        value = value.value
    if isinstance(value, datetime) and type(value) is not datetime:
        # The SDK returns a datetime subclass that carries the raw service string.
        return datetime(
            value.year, value.month, value.day, value.hour, value.minute,
            value.second, value.microsecond, tzinfo=value.tzinfo,
        )  # fmt: skip
    if isinstance(value, str | int | float | bool | bytes | datetime | uuid.UUID):
        return value
    raise TypeError(f"unexpected value of type {type(value).__name__} read from the table")


def value_size(value: Any) -> int:
    """Size of one property value by Azure's entity-size formula."""
    if isinstance(value, EntityProperty):
        value = value.value
        return 8 if isinstance(value, int) else value_size(value)
    if isinstance(value, bool):
        return 1
    if isinstance(value, int):
        return 4
    if isinstance(value, float | datetime):
        return 8
    if isinstance(value, uuid.UUID):
        return 16
    if isinstance(value, str):
        return 4 + utf16_size(value)
    if isinstance(value, bytes):
        return 4 + len(value)
    raise TypeError(f"no size for {type(value).__name__}")


def entity_size(entity: Mapping[str, Any]) -> int:
    """Size of a converted entity by Azure's formula (keys count in UTF-16)."""
    size = 4
    for name, value in entity.items():
        if name in ("PartitionKey", "RowKey"):
            size += utf16_size(value)
        else:
            size += 8 + utf16_size(name) + value_size(value)
    return size


def check_entity(entity: Mapping[str, Any], owner: str, *, emulator: bool = False) -> None:
    """Refuse a converted entity over Azure's per-entity limits, and, for the
    ``emulator``'s account, one whose names it would drop."""
    if emulator and (name := emulator_drop(entity)) is not None:
        raise ValueError(
            f"{owner} property {name!r} would be dropped by Azurite, which loses the names "
            "of JavaScript's Object.prototype members: the partition's account is "
            f"{EMULATOR_ACCOUNT}, the emulator's (Azure stores the name): choose another"
        )
    custom = len(entity) - 2  # PartitionKey and RowKey
    if custom > MAX_PROPERTIES:
        raise ValueError(
            f"{owner} has {custom} properties; Azure Tables allows {MAX_PROPERTIES} per entity"
        )
    size = entity_size(entity)
    if size > MAX_ENTITY_BYTES:
        raise ValueError(f"{owner} is {size} bytes; the limit of one entity is {MAX_ENTITY_BYTES}")


def freeze(properties: Mapping[str, PropertyValue] | None) -> Mapping[str, PropertyValue]:
    """A read-only copy, so the immutable headers and events stay immutable."""
    return MappingProxyType(dict(properties or {}))


def convert_properties(
    properties: Mapping[str, object], reserved: frozenset[str], owner: str
) -> dict[str, Any]:
    """Check names and values of user properties and convert them for the table."""
    if not isinstance(properties, Mapping):
        raise TypeError(f"{owner} properties must be a mapping, got {type(properties).__name__}")
    return {check_name(k, reserved, owner): to_table(k, v) for k, v in properties.items()}


#: The columns of engine rows that are not user properties, exactly as written.
ENGINE_COLUMNS: Final = frozenset(
    {"PartitionKey", "RowKey", VERSION, EVENT_ID, FIRST_VERSION, DELETED}
)


def plain_properties(row: Mapping[str, Any]) -> dict[str, PropertyValue]:
    """User properties of an engine row read back.

    Writes refuse reserved names in any case, so the exact names suffice here.
    """
    plain = _PLAIN_TYPES
    # Inlined plain-type test: this runs once per property of every row read.
    return {
        k: v if type(v) in plain else from_table(v)
        for k, v in row.items()
        if k not in ENGINE_COLUMNS
    }


class _NaN:
    """Stands for every float NaN, so that property maps holding one compare equal."""

    def __repr__(self) -> str:
        return "nan"


_NAN: Final = _NaN()


def comparable(properties: Mapping[str, Any]) -> dict[str, Any]:
    """Properties as compared with what was stored or sent: NaN equals NaN here,
    because a value read back must match the value written."""
    return {k: _NAN if isinstance(v, float) and math.isnan(v) else v for k, v in properties.items()}
