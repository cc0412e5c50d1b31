"""Optional compression of what a processor stores: states and outbox outputs.

A compressed value starts with the byte 0xC1, which msgpack never uses, then
a codec byte; anything else is stored msgpack as it is. So reading needs no
setting: values written before compression was turned on, or by a processor
with it off, read back unchanged, and a table may hold both.
"""

from __future__ import annotations

import zlib
from typing import Final, Literal

__all__ = ["Compression", "check_compression", "pack_stored", "unpack_stored"]

#: ``None`` (the default: store as is) or ``"zlib"`` (the standard library's deflate).
Compression = Literal["zlib"] | None

#: The first byte of a compressed value: never the first byte of msgpack data.
MARK: Final = b"\xc1"
_ZLIB: Final = 1
#: zlib's fastest level compresses states of repeated field names and values
#: nearly as well as its default, at a fraction of the CPU.
ZLIB_LEVEL: Final = 1
#: Values shorter than this are stored as they are: a few bytes gain nothing.
MIN_SIZE: Final = 200


def check_compression(compression: object) -> None:
    if compression not in (None, "zlib"):
        raise ValueError(f"compression must be None or 'zlib', got {compression!r}")


def pack_stored(data: bytes, compression: Compression) -> bytes:
    """``data`` as it is stored: compressed when asked and when that is smaller."""
    if compression is None or len(data) < MIN_SIZE:
        return data
    packed = MARK + bytes([_ZLIB]) + zlib.compress(data, ZLIB_LEVEL)
    return packed if len(packed) < len(data) else data


def unpack_stored(data: bytes) -> bytes:
    """What :func:`pack_stored` was given, whatever the setting it was stored with."""
    if not data.startswith(MARK):
        return data
    codec = data[1:2]
    if codec != bytes([_ZLIB]):
        raise ValueError(f"stored value compressed with unknown codec {codec!r}")
    try:
        return zlib.decompress(data[2:])
    except zlib.error as exc:
        raise ValueError(
            f"stored value compressed with zlib cannot be decompressed: {exc}"
        ) from exc
