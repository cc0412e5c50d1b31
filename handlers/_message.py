"""Messages: the input and the output of a handler."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import msgpack

from ._codec import pack, unpack

__all__ = ["Message"]

_FORMAT = 1


@dataclass(frozen=True, slots=True)
class Message:
    """An immutable message: ``id`` (unique per message, the same for every
    copy of it), ``key`` (whose state it changes), ``type``, ``body`` (msgpack
    data: None, bool, int, float, str, bytes, lists, str-keyed mappings) and
    ``headers`` (str to str)."""

    id: str
    key: str
    type: str
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("id", "key", "type"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"message {name} must be a non-empty str, got {value!r}")
        if not isinstance(self.headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()
        ):
            raise TypeError(f"message headers must map str to str, got {self.headers!r}")
        pack(self.body, f"body of message {self.id!r}")  # refuse what cannot be encoded
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))

    def __hash__(self) -> int:
        return hash((self.id, self.key, self.type))

    def encode(self) -> bytes:
        """Canonical msgpack bytes: equal messages encode to equal bytes."""
        return pack([_FORMAT, self.id, self.key, self.type, self.body, dict(self.headers)])

    @classmethod
    def decode(cls, data: bytes) -> Message:
        """The message :meth:`encode` produced; ``ValueError`` for anything else."""
        try:
            fields = unpack(data)
        except (msgpack.UnpackException, ValueError, TypeError) as exc:
            raise ValueError(f"not an encoded message: {exc}") from None
        if not isinstance(fields, list) or len(fields) != 6 or fields[0] != _FORMAT:
            raise ValueError("not an encoded message: unexpected layout")
        _, id, key, type, body, headers = fields
        return cls(id, key, type, body, headers)
