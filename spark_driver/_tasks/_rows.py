"""Input rows as the executors read them: a message, or the reason the row is
dead-lettered, and the raw input a dead letter keeps to be fixed and sent again."""

from __future__ import annotations

import json
import re
from typing import Any, Final

from handlers import MAX_NESTING, Message, Refused, admit, admit_text, json_data

__all__ = ["body_json", "parse_row", "raw_input"]

# The columns the job adds (see ``_input``): the unparsed line, the sent time,
# and the first text column that is not UTF-8 with its bytes.
_RAW: Final = "_raw"
_SENT_AT: Final = "_sent_at"
_HEADERS: Final = "_headers"
_NOT_UTF8: Final = "_not_utf8"
_NOT_UTF8_BYTES: Final = "_not_utf8_bytes"
#: A queue message's text (the queue source): the message is read from it,
#: as a queue consumer reads it, and a dead letter keeps it to send again.
_QUEUE_TEXT: Final = "_queue_text"
UNPARSEABLE_LINE: Final = (
    "unparseable line: not a JSON object, or one nested too deep for Spark's JSON reader"
)
_SHOWN: Final = {_RAW: "the line", _SENT_AT: "the sent time", _HEADERS: "the headers"}
#: A JSON string (with its escapes), or one bracket: what nesting is counted on.
_JSON_TOKENS: Final = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def body_json(body: Any) -> str:
    """A body, an output's or a state, as the JSON text a row holds: bytes and
    look-alikes marked as in a queue envelope (``handlers.json_data``)."""
    return json.dumps(json_data(body), sort_keys=True, separators=(",", ":"))


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
    headers = _field(row, _HEADERS)
    if headers is not None:  # as read: a dead letter for its headers keeps them to fix
        fields["headers"] = headers
    if bad is not None and bad[0] in fields:
        fields[bad[0]] = bad[1]
    if bad is not None and bad[0] == _HEADERS:
        fields["headers"] = bad[1]
    return json.dumps(json_data(fields), sort_keys=True)


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


def parse_row(
    row: Any, handler_accepts: Any, sent_at: str | None = None, handler: str | None = None
) -> tuple[Message | None, str | None]:
    """A message from an input row, or the reason it is dead-lettered; with
    ``sent_at`` (the input's column name) it carries its sent time; with
    ``handler`` (its name), its id is checked as the row key it becomes.

    The row's own form is read here (bytes that are not UTF-8, a line that is
    not JSON, missing columns, a body's JSON text); everything else a message
    needs is checked by the one admission every entry shares
    (:func:`handlers.admit`, :func:`handlers.admit_text`)."""
    bad = _not_utf8(row)
    if bad is not None:
        name, escaped = bad
        shown = escaped if len(escaped) <= 200 else escaped[:200] + "..."
        return None, f"{_SHOWN.get(name, name)} is not valid UTF-8: {shown!r}"
    if _unparsed(row) is not None:
        return None, UNPARSEABLE_LINE
    message_id, key, type_, body = row["message_id"], row["key"], row["type"], row["body"]
    for name, value in (("message_id", message_id), ("key", key), ("type", type_)):
        if not value:
            return None, f"missing {name}"
    where = None if sent_at is None else (f"column {sent_at!r}", row[_SENT_AT])
    queued = _field(row, _QUEUE_TEXT)
    if queued is not None:  # a queue message: read from its text, as a consumer reads it
        admitted = admit_text(
            str(queued), default_id=message_id, accepts=handler_accepts, handler=handler,
            sent_at=None if where is None else lambda _: where,
        )  # fmt: skip
    else:
        parsed, reason = _body(body)
        headers, refused = _headers(_field(row, _HEADERS))
        if reason is not None or refused is not None:
            return None, reason or refused
        admitted = admit(message_id, key, type_, parsed, headers, accepts=handler_accepts,
                         sent_at=where, handler=handler)  # fmt: skip
    if isinstance(admitted, Refused):
        return None, admitted.reason
    return admitted, None


def _headers(text: Any) -> tuple[dict[str, str], str | None]:
    """A row's headers (JSON text: an object of strings; null: none), or why not."""
    if text is None:
        return {}, None
    shown = str(text) if len(str(text)) <= 200 else str(text)[:200] + "..."
    if json_nests_deeper(str(text)):
        return {}, f"headers nest deeper than {MAX_NESTING} levels: {shown!r}"
    try:
        headers = json.loads(text)
    except (ValueError, TypeError, RecursionError) as exc:
        return {}, f"unparseable headers {shown!r}: {exc}"
    if not isinstance(headers, dict):
        return {}, f"headers {shown!r} are not a JSON object"
    wrong = next(((k, v) for k, v in headers.items() if not isinstance(v, str)), None)
    if wrong is not None:
        return {}, f"header {wrong[0]!r} is {json.dumps(wrong[1])[:80]}, not a string"
    return headers, None


def _body(body: Any) -> tuple[Any, str | None]:
    """A row's body as the message holds it (its JSON text parsed), or why not."""
    if body is None:
        return None, None
    if isinstance(body, bytes | bytearray):
        return bytes(body), None
    if json_nests_deeper(str(body)):
        return None, f"body nests arrays and objects deeper than {MAX_NESTING} levels"
    try:
        return json.loads(body), None
    except (ValueError, TypeError, RecursionError) as exc:
        return None, f"unparseable body: {exc}"
