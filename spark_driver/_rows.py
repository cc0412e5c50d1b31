"""Input rows as the executors read them: a message, or the reason the row is
dead-lettered, and the raw input a dead letter keeps to be fixed and sent again."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from handlers import Message
from streamstone_py import check_key

__all__ = ["body_json", "parse_row", "raw_input", "sent_time"]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
#: The column the job puts each row's sent time in (see ``_job.SENT_AT``).
_SENT_AT: Final = "_sent_at"


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$base64": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def body_json(body: Any) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), default=_json_default)


def _unparsed(row: Any) -> str | None:
    """The input line Spark could not parse into columns (None: it parsed)."""
    try:
        line = row["_raw"]
    except KeyError:  # rows built by a caller, not read by Spark
        return None
    return None if line is None else str(line)


def raw_input(row: Any) -> str:
    """The input a dead letter came from, as a line that can be fixed and sent again."""
    line = _unparsed(row)
    if line is not None:
        return line
    fields = {name: row[name] for name in ("message_id", "key", "type", "body")}
    return json.dumps(fields, sort_keys=True, default=_json_default)


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


def parse_row(
    row: Any, handler_accepts: Any, sent_at: str | None = None
) -> tuple[Message | None, str | None]:
    """A message from an input row, or the reason it is dead-lettered; with
    ``sent_at`` (the input's column name) it carries its sent time."""
    if _unparsed(row) is not None:
        return None, "unparseable line: not a JSON object"
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
    if body is None:
        parsed: Any = None
    elif isinstance(body, bytes | bytearray):
        parsed = bytes(body)
    else:
        try:
            parsed = json.loads(body)
        except (ValueError, TypeError) as exc:
            return None, f"unparseable body: {exc}"
    headers: dict[str, str] = {}
    if sent_at is not None:
        sent, reason = sent_time(row[_SENT_AT], sent_at)
        if sent is None:
            return None, reason
        headers["sent_at"] = sent
    try:
        return Message(message_id, key, type_, parsed, headers), None
    except (ValueError, TypeError) as exc:
        return None, f"invalid message: {exc}"
