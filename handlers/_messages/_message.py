"""Messages: the input and the output of a handler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

import msgpack

from ._codec import digest, pack, unpack, utf8

__all__ = [
    "TRACE_HEADERS",
    "Message",
    "outputs_digest",
    "same_outputs",
    "without_trace",
]

_FORMAT = 1

#: The headers of W3C Trace Context: transport metadata, never part of a
#: message's identity (compared without case, as HTTP names them).
TRACE_HEADERS: Final = frozenset({"traceparent", "tracestate"})


def without_trace(headers: Mapping[str, str]) -> dict[str, str]:
    """``headers`` without those of a trace's context."""
    return {k: v for k, v in headers.items() if k.lower() not in TRACE_HEADERS}


@dataclass(frozen=True, slots=True)
class Message:
    """An immutable message: ``id`` (unique per message, the same for every
    copy of it), ``key`` (whose state it changes), ``type``, ``body`` (msgpack
    data: None, bool, int, float, str, bytes, lists, str-keyed mappings) and
    ``headers`` (str to str), texts all UTF-8. ``due``: for a scheduled
    message, the instant before which it must not be delivered (UTC); None
    for the others.

    ``produced``: when the message was first produced (an output: when its
    source was first processed, the same on every copy; UTC), or None. It
    travels in a queue envelope, so a consumer can tell how old a copy is; it
    is not part of the message's identity: equality and :meth:`encode` leave
    it out, so outputs stored before it existed compare as they did."""

    id: str
    key: str
    type: str
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    due: datetime | None = None
    produced: datetime | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        for name in ("id", "key", "type"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"message {name} must be a non-empty str, got {value!r}")
            utf8(value, f"message {name} {value!r}")
        if not isinstance(self.headers, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.headers.items()
        ):
            raise TypeError(f"message headers must map str to str, got {self.headers!r}")
        for name, value in self.headers.items():
            utf8(name, f"message header name {name!r}")
            utf8(value, f"message header {name!r}")
        pack(self.body, f"body of message {self.id!r}")  # refuse what cannot be encoded
        object.__setattr__(self, "headers", MappingProxyType(dict(self.headers)))
        for name in ("due", "produced"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _in_utc(name, value))

    def __hash__(self) -> int:  # ``produced`` is left out, as from equality
        return hash((self.id, self.key, self.type))

    def encode(self) -> bytes:
        """Canonical msgpack bytes: equal messages encode to equal bytes."""
        return pack(self._fields(dict(self.headers)))

    def identity(self) -> bytes:
        """What the runtime compares of two outputs, and digests: :meth:`encode`
        without the trace headers, so a copy produced under another trace is the
        same output (the same bytes as :meth:`encode` for a message without them)."""
        return pack(self._fields(without_trace(self.headers)))

    def _fields(self, headers: dict[str, str]) -> list[Any]:
        fields = [_FORMAT, self.id, self.key, self.type, self.body, headers]
        if self.due is not None:  # only then: the bytes of every other message stay as they were
            fields.append(self.due.isoformat())
        return fields

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


def outputs_digest(outputs: Sequence[Message]) -> str:
    """The digest a stored version keeps of its outputs: of what they are."""
    return digest(pack([o.identity() for o in outputs]))


def same_outputs(stored: str, outputs: Sequence[Message]) -> bool:
    """Whether ``stored``, a version's digest of its outputs, is of ``outputs``.

    A version stored before trace headers were left out of an output's
    identity digests its outputs' whole encoding. The queue's copy of its
    message carries the same headers, so a handler that passed them on gives
    that digest again: still the same outputs."""
    return stored == outputs_digest(outputs) or stored == digest(
        pack([o.encode() for o in outputs])
    )


def _in_utc(name: str, value: Any) -> datetime:
    """A time of a message in UTC; ``ValueError`` for one without a zone, or
    one whose zone puts it outside the calendar (``9999-12-31T23:00-05:00``)."""
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise ValueError(f"message {name} must be a datetime with a time zone, got {value!r}")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            f"{name} {value.isoformat()!r} is out of the range of times in UTC"
        ) from None
