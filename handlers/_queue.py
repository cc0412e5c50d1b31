"""Output messages on Azure Storage Queues: the envelope a queue message
carries, and the publisher that sends outputs to the queues their route names.

A queue message's text is base64 of a UTF-8 JSON envelope (the convention of
Azure Functions' queue trigger)::

    {"id": "...", "key": "...", "type": "...", "body": ..., "headers": {...}}

The output's id travels in it: a queue delivers at least once, and a
publisher sends an output again whenever its source message is redelivered,
so consumers de-duplicate by ``id`` (a ``Processor`` does by itself). Bytes
in a body travel as ``{"$base64": "..."}``.
"""

from __future__ import annotations

import base64
import contextlib
import json
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from azure.core.exceptions import ResourceExistsError
from azure.storage.queue import QueueClient, QueueServiceClient, TextBase64EncodePolicy

from ._message import Message
from ._publish import unique_outputs

__all__ = [
    "MAX_QUEUE_MESSAGE_BYTES",
    "QueuePublisher",
    "decode_envelope",
    "encode_envelope",
    "read_queue_text",
]

#: Azure Storage Queues' limit of one message's text, as sent (base64 here).
MAX_QUEUE_MESSAGE_BYTES: Final = 64 * 1024
#: The longest a queue message can stay hidden, in seconds (seven days).
_MAX_DELAY: Final = 7 * 24 * 3600
#: Azure's rule for queue names: 3 to 63 lowercase letters, digits and single
#: hyphens, starting and ending with a letter or digit.
_QUEUE_NAME: Final = re.compile(r"(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*")

Route = Mapping[str, str] | Callable[[Message], str]


def _to_json(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"$base64": base64.b64encode(value).decode("ascii")}
    raise TypeError(f"cannot send {type(value).__name__} as JSON")


def _from_json(value: dict[str, Any]) -> Any:
    if set(value) == {"$base64"} and isinstance(value["$base64"], str):
        return base64.b64decode(value["$base64"], validate=True)
    return value


def encode_envelope(message: Message) -> str:
    """The JSON text a queue message carries for ``message`` (before base64);
    ``ValueError`` for a body JSON cannot hold (NaN, infinities)."""
    envelope = {
        "id": message.id,
        "key": message.key,
        "type": message.type,
        "body": message.body,
        "headers": dict(message.headers),
    }
    if message.due is not None:
        envelope["due"] = message.due.isoformat()
    try:
        return json.dumps(
            envelope, default=_to_json, allow_nan=False, ensure_ascii=False,
            separators=(",", ":"), sort_keys=True,
        )  # fmt: skip
    except (ValueError, TypeError) as exc:
        raise ValueError(f"output {message.id!r} cannot travel as JSON: {exc}") from None


def decode_envelope(text: str, *, default_id: str | None = None) -> Message:
    """The message of an envelope's JSON text; ``ValueError`` naming what is wrong.

    ``default_id`` stands for an envelope without ``id`` (a queue consumer
    passes the queue message's own id: it then tells redeliveries of one queue
    message apart from new ones, but not a producer's second send)."""
    try:
        envelope = json.loads(text, object_hook=_from_json)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not a message envelope: {exc}") from None
    if not isinstance(envelope, dict):
        raise ValueError(f"not a message envelope: a JSON {type(envelope).__name__}, not an object")
    if "id" not in envelope and default_id is not None:
        envelope["id"] = default_id
    missing = [name for name in ("id", "key", "type") if name not in envelope]
    if missing:
        raise ValueError(f"not a message envelope: it has no {' and no '.join(missing)}")
    headers = envelope.get("headers") or {}
    try:
        due = envelope.get("due")
        if due is not None:
            if not isinstance(due, str):
                raise ValueError(f"due must be ISO-8601 text, got {due!r}")
            due = datetime.fromisoformat(due)
        return Message(
            envelope["id"], envelope["key"], envelope["type"], envelope.get("body"), headers, due
        )
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a message envelope: {exc}") from None


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


class QueuePublisher:
    """Sends outputs to Azure Storage Queues, each to the queue its route
    names: ``route`` maps output types to queue names, or is a function of
    the output; ``default`` takes the types the mapping does not name.

    Queues are created when first used. Publishing again sends again (a queue
    has no idempotent send), so consumers de-duplicate by the id in the
    envelope. :meth:`check` refuses, before the state is stored, an output
    that has no valid queue or is over 64 KiB as sent.
    """

    def __init__(
        self,
        service: QueueServiceClient,
        route: Route,
        *,
        default: str | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.service = service
        self.clock = clock
        self.route = route
        self.default = default
        self._queues: dict[str, QueueClient] = {}
        self._lock = threading.Lock()

    def queue_of(self, message: Message) -> str:
        """The queue an output goes to; ``ValueError`` when none is, or the name is invalid."""
        if callable(self.route):
            name: str | None = self.route(message)
        else:
            name = self.route.get(message.type, self.default)
        if name is None:
            raise ValueError(f"no queue for output {message.id!r} of type {message.type!r}")
        if not isinstance(name, str) or not _QUEUE_NAME.fullmatch(name):
            raise ValueError(
                f"queue name {name!r} for output {message.id!r} is not valid: 3 to 63 "
                "lowercase letters, digits and single hyphens, starting and ending with a "
                "letter or digit"
            )
        return name

    def check(self, message: Message) -> None:
        """Refuse an output this publisher could never send: no valid queue, a
        body JSON cannot hold, or over 64 KiB as sent (base64 of its envelope)."""
        self._sendable(message)

    def _sendable(self, message: Message) -> tuple[str, str]:
        """The output's queue and envelope text, once each checked."""
        queue = self.queue_of(message)
        text = encode_envelope(message)
        size = 4 * ((len(text.encode("utf-8")) + 2) // 3)
        if size > MAX_QUEUE_MESSAGE_BYTES:
            raise ValueError(
                f"output {message.id!r} is {size} bytes as a queue message; a queue "
                f"message holds at most {MAX_QUEUE_MESSAGE_BYTES}"
            )
        return queue, text

    def publish(self, messages: Sequence[Message]) -> None:
        """Send each output once per call, in order. Raises ``ValueError``,
        sending nothing, if one id comes twice with different content, or if
        :meth:`check` refuses one."""
        outputs = unique_outputs(messages).values()
        sendable = [(m, *self._sendable(m)) for m in outputs]
        for message, queue, text in sendable:
            if message.due is None:
                self._queue(queue).send_message(text)
                continue
            # Hidden until due; then it lives as long as any other message would.
            delay = min(_MAX_DELAY, max(0, math.ceil((message.due - self.clock()).total_seconds())))
            self._queue(queue).send_message(
                text, visibility_timeout=delay, time_to_live=delay + _MAX_DELAY
            )

    def _queue(self, name: str) -> QueueClient:
        with self._lock:
            queue = self._queues.get(name)
            if queue is None:
                queue = self.service.get_queue_client(
                    name, message_encode_policy=TextBase64EncodePolicy()
                )
                with contextlib.suppress(ResourceExistsError):  # made by an earlier run
                    queue.create_queue()
                self._queues[name] = queue
            return queue
