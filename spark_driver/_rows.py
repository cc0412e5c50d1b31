"""Input rows as the executors read them: a message, or the reason the row is
dead-lettered, and the raw input a dead letter keeps to be fixed and sent again."""

from __future__ import annotations

import base64
import json
from typing import Any

from handlers import Message
from streamstone_py import check_key

__all__ = ["body_json", "parse_row", "raw_input"]


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


def parse_row(row: Any, handler_accepts: Any) -> tuple[Message | None, str | None]:
    """A message from an input row, or the reason it is dead-lettered."""
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
    try:
        return Message(message_id, key, type_, parsed), None
    except (ValueError, TypeError) as exc:
        return None, f"invalid message: {exc}"
