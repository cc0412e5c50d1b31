"""Messages: the input and the output of a handler."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
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
    ``headers`` (str to str). ``due``: for a scheduled message, the instant
    before which it must not be delivered (UTC); None for the others."""

    id: str
    key: str
    type: str
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    due: datetime | None = None

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
        if self.due is not None:
            if not isinstance(self.due, datetime) or self.due.utcoffset() is None:
                raise ValueError(
                    f"message due must be a datetime with a time zone, got {self.due!r}"
                )
            object.__setattr__(self, "due", self.due.astimezone(UTC))

    def __hash__(self) -> int:
        return hash((self.id, self.key, self.type))

    def encode(self) -> bytes:
        """Canonical msgpack bytes: equal messages encode to equal bytes."""
        fields = [_FORMAT, self.id, self.key, self.type, self.body, dict(self.headers)]
        if self.due is not None:  # only then: the bytes of every other message stay as they were
            fields.append(self.due.isoformat())
        return pack(fields)

    @classmethod
    def decode(cls, data: bytes) -> Message:
        """The message :meth:`encode` produced; ``ValueError`` for anything else."""
        try:
            fields = unpack(data)
        except (msgpack.UnpackException, ValueError, TypeError) as exc:
            raise ValueError(f"not an encoded message: {exc}") from None
        if not isinstance(fields, list) or len(fields) not in (6, 7) or fields[0] != _FORMAT:
            raise ValueError("not an encoded message: unexpected layout")
        due = datetime.fromisoformat(fields[6]) if len(fields) == 7 else None
        _, id, key, type, body, headers = fields[:6]
        return cls(id, key, type, body, headers, due)
