"""Where a message enters: one check of everything the later steps need.

Data enters in three places: a queue consumer's texts, the Spark queue
source's texts, and the Spark job's file rows. Each hands what it read to
:func:`admit` (fields) or :func:`admit_text` (a queue message's text), which
either give a :class:`Message` that can always be encoded (canonical msgpack
and the queue envelope), stored (its key, id and type are what the table
holds) and sent, or a :class:`Refused` with the reason, whatever went wrong
and whatever exception class it raised. A refused message is shelved alone:
poisoned by a consumer, dead-lettered by the Spark job.

The refusals of what a message *is* are decided here only, and read by the
runtime's fold too (:func:`type_refusal`, :func:`id_refusal`), so that both
paths give the same reason: an unknown type, a key, id or type the table
cannot store, a body over the codec's limits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from streamstone_py import EventData, check_key, check_row, id_row_key

from ._envelope import encode_envelope, read_queue_text
from ._message import Message

__all__ = ["Refused", "admit", "admit_text", "id_refusal", "sent_time", "type_refusal"]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
#: A property holds 64 KiB in UTF-16, at most 4 bytes a character: no type
#: this short can be refused, so only longer ones pay for the check.
_ALWAYS_STORABLE: Final = 64 * 1024 // 4

#: Where a message's sent time comes from, and the value found there: the
#: reason of a refusal names the place (``"column 'at'"``, ``"field 'produced'"``).
SentAt = tuple[str, object]


@dataclass(frozen=True, slots=True)
class Refused:
    """A message that can never be handled, and why (the same on every delivery)."""

    reason: str
    #: The message, when the text held one (its type unknown, say).
    message: Message | None = None


def type_refusal(type_: str, accepts: Callable[[str], bool] | None) -> str | None:
    """Why a message of this type can never be handled, or None."""
    if accepts is not None and not accepts(type_):
        return f"unknown type {type_!r}"
    if len(type_) <= _ALWAYS_STORABLE:
        return None
    try:
        check_row({"PartitionKey": "k", "RowKey": "r", "MessageType": type_}, "type")
    except (ValueError, TypeError) as exc:
        return f"type cannot be stored: {str(exc).split(': ', 1)[-1]}"
    return None


def id_refusal(message_id: str, handler: str | None = None) -> str | None:
    """Why the table cannot store this message id as a row key, or None;
    with ``handler`` (its name), as the row key it becomes in that handler's
    stream, ``<handler>|SS-UID-<id>``, which must also hold in 1 KiB."""
    try:
        EventData(id=message_id)
        if handler is not None:
            id_row_key(message_id, handler)
    except (ValueError, TypeError) as exc:
        return f"message id cannot be stored: {exc}"
    return None


def _key_refusal(key: str) -> str | None:
    try:
        check_key("key", key)
        if "|" in key:
            raise ValueError(f"key {key!r} contains the virtual-partition separator '|'")
    except (ValueError, TypeError) as exc:
        return f"key cannot be stored: {exc}"
    return None


def _field_refusal(
    message_id: str, key: str, type_: str, accepts: Callable[[str], bool] | None,
    handler: str | None,
) -> str | None:  # fmt: skip
    return type_refusal(type_, accepts) or _key_refusal(key) or id_refusal(message_id, handler)


def sent_time(value: object, where: str) -> tuple[str | None, str | None]:
    """A sent time as ISO-8601 text in UTC (the ``sent_at`` header the runtime
    reads), or the reason it cannot be one. ``value`` is a datetime, text, or
    microseconds since the epoch (the Spark job's form of a timestamp);
    ``where`` names its place for the reason."""
    if value is None:
        return None, f"missing sent time ({where})"
    try:
        if isinstance(value, datetime):
            sent = value
        elif isinstance(value, int) and not isinstance(value, bool):
            sent = _EPOCH + timedelta(microseconds=value)
        elif isinstance(value, str):
            sent = datetime.fromisoformat(value.strip())
        else:
            return None, f"sent time {value!r} ({where}) is neither a timestamp nor text"
        if sent.utcoffset() is None:
            return None, f"sent time {value!r} ({where}) has no time zone"
        return sent.astimezone(UTC).isoformat(), None
    except (ValueError, OverflowError):
        return None, f"sent time {str(value)[:80]!r} ({where}) is not an ISO-8601 time"


def _with_sent_at(message: Message, sent_at: SentAt | None) -> Message | Refused:
    if sent_at is None:
        return message
    sent, reason = sent_time(sent_at[1], sent_at[0])
    if sent is None:
        return Refused(reason or "no sent time", message)
    headers = {**message.headers, "sent_at": sent}
    return Message(message.id, message.key, message.type, message.body, headers,
                   message.due, message.produced)  # fmt: skip


def admit(
    message_id: str,
    key: str,
    type_: str,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    due: datetime | None = None,
    *,
    accepts: Callable[[str], bool] | None = None,
    sent_at: SentAt | None = None,
    handler: str | None = None,
) -> Message | Refused:
    """The message of these fields, or why it can never be handled.

    ``accepts``: the handler's test of a type (an unknown type is refused);
    ``sent_at``: where the sent time is and its value, which becomes the
    message's ``sent_at`` header (a missing or invalid one is refused);
    ``handler``: the handler's name (the id is checked as the row key it
    becomes in that handler's stream)."""
    try:
        reason = _field_refusal(message_id, key, type_, accepts, handler)
        if reason is not None:
            return Refused(reason)
        message = Message(message_id, key, type_, body, headers or {}, due)
    except Exception as exc:  # fields are data: whatever they make fail refuses them
        return Refused(f"invalid message: {exc}")
    return _sendable(message, sent_at)


def admit_text(
    text: str | bytes | bytearray | None,
    *,
    default_id: str | None = None,
    accepts: Callable[[str], bool] | None = None,
    sent_at: Callable[[Message], SentAt] | None = None,
    handler: str | None = None,
) -> Message | Refused:
    """The message a queue message's text carries (see :func:`read_queue_text`),
    or why it can never be handled; never raises.

    ``sent_at(message)`` gives where the message's sent time is and its value
    (the envelope's ``produced``, the queue's insertion time...); ``accepts``
    and ``handler`` as for :func:`admit`."""
    if not isinstance(text, str):
        try:
            text = bytes(text or b"").decode("utf-8")
        except (UnicodeDecodeError, TypeError):
            return Refused("queue message content is not UTF-8 text")
    try:
        message = read_queue_text(text, default_id=default_id)
    except Exception as exc:  # read_queue_text raises ValueError only; a text is data
        return Refused(str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}")
    try:
        reason = _field_refusal(message.id, message.key, message.type, accepts, handler)
        where = None if sent_at is None else sent_at(message)
    except Exception as exc:  # a handler's type test that raises, say
        return Refused(f"invalid message: {type(exc).__name__}: {exc}", message)
    if reason is not None:
        return Refused(reason, message)
    return _sendable(message, where)


def _sendable(message: Message, sent_at: SentAt | None) -> Message | Refused:
    """The message with its sent time, once its envelope is known to encode."""
    try:
        encode_envelope(message, what="message")
        return _with_sent_at(message, sent_at)
    except Exception as exc:  # a NaN or an infinity in the body, say
        return Refused(f"invalid message: {exc}", message)
