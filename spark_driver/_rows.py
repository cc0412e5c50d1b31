"""Input rows as the executors read them: a message, or the reason the row is
dead-lettered, and the raw input a dead letter keeps to be fixed and sent again."""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from handlers import MAX_NESTING, Message, read_queue_text
from streamstone_py import EventData, check_key, check_row

__all__ = ["body_json", "parse_row", "raw_input", "sent_time"]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
# The columns the job adds (see ``_input``): the unparsed line, the sent time,
# and the first text column that is not UTF-8 with its bytes.
_RAW: Final = "_raw"
_SENT_AT: Final = "_sent_at"
_NOT_UTF8: Final = "_not_utf8"
_NOT_UTF8_BYTES: Final = "_not_utf8_bytes"
#: A queue message's text (the queue source): the message is read from it,
#: as a queue consumer reads it, and a dead letter keeps it to send again.
_QUEUE_TEXT: Final = "_queue_text"
UNPARSEABLE_LINE: Final = (
    "unparseable line: not a JSON object, or one nested too deep for Spark's JSON reader"
)
_SHOWN: Final = {_RAW: "the line", _SENT_AT: "the sent time"}
#: A JSON string (with its escapes), or one bracket: what nesting is counted on.
_JSON_TOKENS: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$base64": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def body_json(body: Any) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=_json_default)


def _field(row: Any, name: str) -> Any:
    """A column the job adds, or None in a row built by a caller without it."""
    try:
        return row[name]
    except (KeyError, ValueError):  # a dict, or a pyspark Row, without that column
        return None


def _unparsed(row: Any) -> str | None:
    """The input line Spark could not parse into columns (None: it parsed)."""
    line = _field(row, _RAW)
    return None if line is None else str(line)


def _not_utf8(row: Any) -> tuple[str, str] | None:
    """The first text column whose bytes are not UTF-8, and those bytes escaped
    (``\\xff``), so that two different inputs stay two different texts."""
    name = _field(row, _NOT_UTF8)
    if name is None:
        return None
    data = bytes(_field(row, _NOT_UTF8_BYTES) or b"")
    return str(name), data.decode("utf-8", "backslashreplace")


def raw_input(row: Any) -> str:
    """The input a dead letter came from, as a line that can be fixed and sent again."""
    bad = _not_utf8(row)
    if bad is not None and bad[0] == _RAW:
        return bad[1]
    queued = _field(row, _QUEUE_TEXT)
    if queued is not None:
        return str(queued)
    line = _unparsed(row)
    if line is not None:
        return line
    fields = {name: row[name] for name in ("message_id", "key", "type", "body")}
    if bad is not None and bad[0] in fields:
        fields[bad[0]] = bad[1]
    return json.dumps(fields, sort_keys=True, default=_json_default)


def json_nests_deeper(text: str, limit: int = MAX_NESTING) -> bool:
    """Whether JSON ``text`` nests arrays and objects deeper than ``limit``,
    told without parsing it (parsing a deep document recurses), in one scan."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for token in _JSON_TOKENS.finditer(text):
        mark = token.group()
        if mark in "[{":
            depth += 1
            if depth > limit:
                return True
        elif mark in "]}":
            depth -= 1
    return False


def sent_time(value: object, column: str) -> tuple[str | None, str | None]:
    """A sent time as ISO-8601 text in UTC (the ``sent_at`` header the runtime
    reads), or the reason it cannot be one. ``value`` is text, or microseconds
    since the epoch (the job's form of a Spark timestamp)."""
    where = f"(column {column!r})"
    if value is None:
        return None, f"missing sent time {where}"
    try:
        if isinstance(value, int) and not isinstance(value, bool):
            sent = _EPOCH + timedelta(microseconds=value)
        elif isinstance(value, str):
            sent = datetime.fromisoformat(value.strip())
        else:
            return None, f"sent time {value!r} {where} is neither a timestamp nor text"
    except (ValueError, OverflowError):
        return None, f"sent time {str(value)[:80]!r} {where} is not an ISO-8601 time"
    if sent.utcoffset() is None:
        return None, f"sent time {value!r} {where} has no time zone"
    return sent.astimezone(UTC).isoformat(), None


#: A property holds 64 KiB in UTF-16, at most 4 bytes a character: no type
#: this short can be refused, so only longer ones pay for the check.
_ALWAYS_STORABLE: Final = 64 * 1024 // 4


def _type_refusal(type_: str) -> str | None:
    """Why a type cannot be stored as a property, or None."""
    if len(type_) <= _ALWAYS_STORABLE:
        return None
    try:
        check_row({"PartitionKey": "k", "RowKey": "r", "MessageType": type_}, "type")
    except (ValueError, TypeError) as exc:
        return f"type cannot be stored: {str(exc).split(': ', 1)[-1]}"
    return None


def parse_row(
    row: Any, handler_accepts: Any, sent_at: str | None = None
) -> tuple[Message | None, str | None]:
    """A message from an input row, or the reason it is dead-lettered; with
    ``sent_at`` (the input's column name) it carries its sent time."""
    bad = _not_utf8(row)
    if bad is not None:
        name, escaped = bad
        shown = escaped if len(escaped) <= 200 else escaped[:200] + "..."
        return None, f"{_SHOWN.get(name, name)} is not valid UTF-8: {shown!r}"
    if _unparsed(row) is not None:
        return None, UNPARSEABLE_LINE
    message_id, key, type_, body = row["message_id"], row["key"], row["type"], row["body"]
    if not message_id:
        return None, "missing message_id"
    if not key:
        return None, "missing key"
    if not type_:
        return None, "missing type"
    if not handler_accepts(type_):
        return None, f"unknown type {type_!r}"
    try:
        check_key("key", key)
        if "|" in key:
            raise ValueError(f"key {key!r} contains the virtual-partition separator '|'")
    except (ValueError, TypeError) as exc:
        return None, f"key cannot be stored: {exc}"
    # The id becomes a row key and the type a property of the message's stored
    # version: what the table refuses would be refused on every delivery.
    try:
        EventData(id=message_id)
    except (ValueError, TypeError) as exc:
        return None, f"message id cannot be stored: {exc}"
    refused = _type_refusal(type_)
    if refused is not None:
        return None, refused
    headers: dict[str, str] = {}
    queued = _field(row, _QUEUE_TEXT)
    if queued is not None:  # checked on the driver: it reads as this row's message
        try:
            queued_message = read_queue_text(str(queued), default_id=message_id)
        except ValueError as exc:
            return None, str(exc)
        parsed: Any = queued_message.body
        headers = dict(queued_message.headers)
    elif body is None:
        parsed = None
    elif isinstance(body, bytes | bytearray):
        parsed = bytes(body)
    elif json_nests_deeper(str(body)):
        return None, f"body nests arrays and objects deeper than {MAX_NESTING} levels"
    else:
        try:
            parsed = json.loads(body)
        except (ValueError, TypeError, RecursionError) as exc:
            return None, f"unparseable body: {exc}"
    if sent_at is not None:
        sent, reason = sent_time(row[_SENT_AT], sent_at)
        if sent is None:
            return None, reason
        headers["sent_at"] = sent
    try:
        return Message(message_id, key, type_, parsed, headers), None
    except (ValueError, TypeError) as exc:
        return None, f"invalid message: {exc}"
