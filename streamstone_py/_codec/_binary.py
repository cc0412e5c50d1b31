"""Store one binary value larger than a property holds, across numbered properties."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ._values import MAX_PROPERTY_BYTES, PropertyValue

__all__ = ["join_binary", "split_binary"]

#: Suffix of the property that records how many parts follow.
_PARTS: Final = "_Parts"


def _part(name: str, index: int) -> str:
    return f"{name}_{index:02d}"


def split_binary(
    name: str, data: bytes, part_size: int = MAX_PROPERTY_BYTES
) -> dict[str, PropertyValue]:
    """Split ``data`` into properties ``{name}_00``, ``{name}_01``... and ``{name}_Parts``.

    Azure Tables limits one binary property to 64 KiB but an entity to 1 MiB,
    so a state snapshot of up to about 1,000,000 bytes fits in one event row
    this way (the engine refuses a larger entity before sending it)::

        EventData(id="m-7", properties={"Type": "Snapshot", **split_binary("State", blob)})
        ...
        blob = join_binary("State", recorded.properties)
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"binary property name {name!r} must be an identifier")
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    if not 1 <= part_size <= MAX_PROPERTY_BYTES:
        raise ValueError(f"part_size must be between 1 and {MAX_PROPERTY_BYTES}, got {part_size}")
    raw = bytes(data)
    count = max(1, -(-len(raw) // part_size))
    if count > 100:
        raise ValueError(f"{len(raw)} bytes need {count} parts of {part_size}; at most 100")
    parts: dict[str, PropertyValue] = {
        _part(name, i): raw[i * part_size : (i + 1) * part_size] for i in range(count)
    }
    parts[name + _PARTS] = count
    return parts


def join_binary(name: str, properties: Mapping[str, PropertyValue]) -> bytes:
    """Join what :func:`split_binary` stored under ``name``; refuse missing parts."""
    count = properties.get(name + _PARTS)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise KeyError(f"no binary value {name!r}: property {name + _PARTS!r} is missing")
    chunks = []
    for i in range(count):
        part = properties.get(_part(name, i))
        if not isinstance(part, bytes):
            raise ValueError(f"binary value {name!r} lacks part {_part(name, i)!r} of {count}")
        chunks.append(part)
    return b"".join(chunks)
