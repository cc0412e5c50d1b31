"""Canonical msgpack: the same value gives the same bytes in every process."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

import msgpack

__all__ = ["MAX_NESTING", "canonical", "digest", "pack", "unpack", "utf8"]


#: The integers msgpack can hold: signed and unsigned 64-bit.
INT_MIN: Final = -(2**63)
INT_MAX: Final = 2**64 - 1


#: How deep lists and mappings may nest in a body, a header, a capture or a
#: state: checked level by level, so no value nears Python's recursion limit.
MAX_NESTING: Final = 256


def utf8(text: str, what: str) -> str:
    """``text`` if it encodes as UTF-8, else ``ValueError`` naming ``what``:
    a lone surrogate (``"\\udfff"``, which JSON text may carry) cannot be
    stored nor sent, so it is refused where it enters."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"{what} is not UTF-8 text ({exc.reason})") from None
    return text


def canonical(value: Any, path: str = "value", depth: int = 0) -> Any:
    """``value`` with every mapping's keys sorted, checking it is msgpack data
    nested at most :data:`MAX_NESTING` levels (``depth``: the levels above it),
    its texts UTF-8."""
    if isinstance(value, str):
        return utf8(value, path)
    if isinstance(value, int) and not isinstance(value, bool):
        if not INT_MIN <= value <= INT_MAX:
            raise ValueError(
                f"{path} is the integer {value}, outside msgpack's range "
                f"[{INT_MIN}, {INT_MAX}]; send it as a string"
            )
        return value
    if value is None or isinstance(value, bool | float | bytes):
        return value
    if isinstance(value, Mapping | list | tuple) and depth >= MAX_NESTING:
        shown = path if len(path) <= 80 else f"{path[:40]}...{path[-30:]}"
        raise ValueError(f"{shown} nests lists and mappings deeper than {MAX_NESTING} levels")
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"{path} has a non-str key {key!r}; keys must be str")
            utf8(key, f"{path} key {key!r}")
        return {key: canonical(value[key], f"{path}[{key!r}]", depth + 1) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [canonical(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise TypeError(
        f"{path} is a {type(value).__name__}; messages and states hold None, bool, int, "
        "float, str, bytes, lists and str-keyed mappings"
    )


def pack(value: Any, path: str = "value") -> bytes:
    return msgpack.packb(canonical(value, path), use_bin_type=True)  # type: ignore[no-any-return]


def unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=True)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
