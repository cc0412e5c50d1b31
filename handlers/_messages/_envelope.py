"""The envelope a queue message carries, and the JSON form of a body.

A queue message's text is base64 of a UTF-8 JSON envelope (the convention of
Azure Functions' queue trigger)::

    {"id": "...", "key": "...", "type": "...", "body": ..., "headers": {...},
     "due": "...", "produced": "..."}

``due`` (a scheduled message) and ``produced`` (when the message was first
produced) are there when set. A body is JSON, and two objects of one key are
markers: bytes travel as ``{"$base64": "..."}``, and a body's own object
whose only key is ``$base64`` or ``$object`` travels wrapped as
``{"$object": {...}}``, so that no value a handler may publish reads back as
another (a plain ``{"$base64": "aGk="}`` stays a mapping, never ``b"hi"``).
Envelopes of earlier versions read as they did, except a body object whose
only key is ``$object``, which they did not wrap.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Final

from ._codec import MAX_NESTING
from ._message import TRACE_HEADERS, Message

__all__ = [
    "decode_envelope", "encode_envelope", "from_json_data", "json_data", "read_queue_text",
]  # fmt: skip

_BYTES: Final = "$base64"
_OBJECT: Final = "$object"
_MARKERS: Final = frozenset({_BYTES, _OBJECT})


def json_data(value: Any) -> Any:
    """A body as JSON data, as the envelope holds it: bytes as ``$base64``
    markers, a mapping that looks like a marker wrapped in ``$object``."""
    if isinstance(value, bytes | bytearray | memoryview):
        return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        data = {key: json_data(item) for key, item in value.items()}
        return {_OBJECT: data} if len(data) == 1 and next(iter(data)) in _MARKERS else data
    if isinstance(value, list | tuple):
        return [json_data(item) for item in value]
    return value


def from_json_data(value: Any, depth: int = 0) -> Any:
    """The body :func:`json_data` made these JSON data of; ``ValueError`` for
    a ``$base64`` marker that is not base64."""
    if depth > MAX_NESTING + 1:  # deeper than any message holds: stop before the stack does
        raise ValueError(f"the body nests lists and mappings deeper than {MAX_NESTING} levels")
    if isinstance(value, dict):
        if len(value) == 1:
            ((name, inner),) = value.items()
            if name == _BYTES and isinstance(inner, str):
                try:
                    return base64.b64decode(inner, validate=True)
                except binascii.Error:
                    raise ValueError(
                        f"'$base64' holds {inner[:40]!r}, which is not base64"
                    ) from None
            if name == _OBJECT and isinstance(inner, dict):
                return {key: from_json_data(item, depth + 1) for key, item in inner.items()}
        return {key: from_json_data(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [from_json_data(item, depth + 1) for item in value]
    return value


def _bytes_marked(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {_BYTES: base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"cannot send {type(value).__name__} as JSON")


def _dumps(data: Any) -> str:
    return json.dumps(
        data, allow_nan=False, ensure_ascii=False, separators=(",", ":"), sort_keys=True,
        default=_bytes_marked,
    )  # fmt: skip


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON can hold")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constant)


def _may_hold_markers(text: str) -> bool:
    """Whether JSON ``text`` may hold a marker's key: it holds ``"$base64"`` or
    ``"$object"``, or writes a ``$`` as an escape. Most texts hold neither, so
    they skip the walk that marking takes (a key is written whole, quotes
    included; inside a string value the quotes would be escaped)."""
    return '"$base64"' in text or '"$object"' in text or "\\u0024" in text


def encode_envelope(message: Message, *, what: str = "output") -> str:
    """The JSON text a queue message carries for ``message`` (before base64);
    ``ValueError`` for a body JSON cannot hold (NaN, infinities), naming the
    message as ``what``."""
    envelope: dict[str, Any] = {
        "id": message.id,
        "key": message.key,
        "type": message.type,
        "body": message.body,  # marked below if it may need it
        "headers": dict(message.headers),
    }
    if message.due is not None:
        envelope["due"] = message.due.isoformat()
    if message.produced is not None:
        envelope["produced"] = message.produced.isoformat()
    try:
        text = _dumps(envelope)
        if _may_hold_markers(text):  # a body's own mapping may look like a marker: mark it
            text = _dumps({**envelope, "body": json_data(message.body)})
        return text
    except (ValueError, TypeError) as exc:
        raise ValueError(f"{what} {message.id!r} cannot travel as JSON: {exc}") from None


def _time(envelope: dict[str, Any], name: str) -> datetime | None:
    text = envelope.get(name)
    if text is None:
        return None
    if not isinstance(text, str):
        raise ValueError(f"{name} must be ISO-8601 text, got {text!r}")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{name} {text[:60]!r} is not an ISO-8601 time") from None


def _text(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which JSON text may carry
        return False
    return True


def _headers(headers: Any) -> Any:
    """An envelope's headers without the trace headers that are not text (a
    number, a lone surrogate): they tell how it travelled, not what it is, so
    they never shelve it; whatever else is wrong with the headers is the
    message's, refused by :class:`Message`."""
    if not isinstance(headers, dict):
        return headers
    return {
        k: v
        for k, v in headers.items()
        if not (isinstance(k, str) and k.lower() in TRACE_HEADERS and not _text(v))
    }


def _message(text: str, default_id: str | None) -> Message:
    envelope = _loads(text)
    if not isinstance(envelope, dict):
        raise ValueError(f"a JSON {type(envelope).__name__}, not an object")
    if "id" not in envelope and default_id is not None:
        envelope["id"] = default_id
    missing = [name for name in ("id", "key", "type") if name not in envelope]
    if missing:
        raise ValueError(f"it has no {' and no '.join(missing)}")
    body = envelope.get("body")
    return Message(
        envelope["id"],
        envelope["key"],
        envelope["type"],
        from_json_data(body) if _may_hold_markers(text) else body,
        _headers(envelope.get("headers") or {}),
        _time(envelope, "due"),
        _time(envelope, "produced"),
    )


def decode_envelope(text: str, *, default_id: str | None = None) -> Message:
    """The message of an envelope's JSON text; ``ValueError`` naming what is
    wrong, whatever it is (a text never raises anything else).

    ``default_id`` stands for an envelope without ``id`` (a queue consumer
    passes the queue message's own id: it then tells redeliveries of one queue
    message apart from new ones, but not a producer's second send)."""
    try:
        return _message(text, default_id)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a message envelope: {exc}") from None
    except RecursionError:
        raise ValueError("not a message envelope: it nests too deep to read") from None
    except Exception as exc:  # a text is data: whatever it makes fail refuses it
        raise ValueError(f"not a message envelope: {type(exc).__name__}: {exc}") from None


def read_queue_text(text: str, *, default_id: str | None = None) -> Message:
    """The message a queue message's text carries: base64 of a JSON envelope
    (what :class:`QueuePublisher` and Azure Functions send), or the envelope
    as plain text. ``ValueError`` says why neither reads."""
    try:
        raw = base64.b64decode(text, validate=True)
        decoded: str | None = raw.decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        decoded = None  # not base64 of UTF-8 text: plain text, then
    if decoded is not None and decoded.lstrip()[:1] == "{":
        return decode_envelope(decoded, default_id=default_id)
    if text.lstrip()[:1] != "{":
        raise ValueError(
            f"queue message text is neither base64 of a JSON envelope nor a JSON envelope: "
            f"{text[:60]!r}"
        )
    return decode_envelope(text, default_id=default_id)
