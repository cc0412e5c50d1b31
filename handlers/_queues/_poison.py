"""The poison queue: where a queue message goes that cannot be handled.

Azure Functions' convention: ``<queue>-poison`` in the same account. Each
entry is a JSON object with the reason and the original text, so a fixed
message can be sent again as it was. It is ASCII text without XML's markup
characters (``<``, ``>``, ``&`` are written as JSON escapes), so it measures
the same however a service counts it; and it fits the 64 KiB a queue message
may hold whatever the message's size: the text of a message too large for
its entry is kept to its beginning, and the entry says its whole length.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Final

from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import QueueClient

from ._account import queue_beside
from ._publisher import MAX_QUEUE_MESSAGE_BYTES, POISON_SUFFIX

__all__ = ["NEVER", "PoisonEntry", "PoisonQueue", "poison_queue_of"]

_log = logging.getLogger(__name__)

#: A queue message's time to live that never runs out (the service's -1): a
#: poison entry waits for a person however long it takes, never expires unseen.
NEVER: Final = -1
#: An entry's size when a service refuses the full one as too large (413):
#: it counts otherwise (the XML around the text, say); this much always goes.
_REFUSED_LIMIT: Final = 8 * 1024
_MARKUP: Final = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})


def _json(data: dict[str, Any]) -> str:
    text = json.dumps(data, ensure_ascii=True, sort_keys=True, separators=(",", ":"))
    return text.translate(_MARKUP)  # only inside strings: JSON's own syntax has none


@dataclass(frozen=True, slots=True)
class PoisonEntry:
    """A poison queue message: why, and the original text to send again."""

    reason: str
    #: The queue message's text, exactly as it was received; only its
    #: beginning when ``content_length`` is set.
    content: str
    queue: str
    queue_message_id: str
    dequeue_count: int
    #: The text's whole length in characters when it was too large for the
    #: entry and ``content`` holds its beginning; ``None``: ``content`` is whole.
    content_length: int | None = None

    def _data(self, reason: str, content: str, length: int | None) -> dict[str, Any]:
        data: dict[str, Any] = {
            "reason": reason,
            "content": content,
            "queue": self.queue,
            "queueMessageId": self.queue_message_id,
            "dequeueCount": self.dequeue_count,
        }
        if length is not None:
            data["contentLength"] = length
        return data

    def encode(self, limit: int = MAX_QUEUE_MESSAGE_BYTES) -> str:
        """The poison queue message's text: a JSON object of at most ``limit``
        characters (ASCII), the content cut to its longest beginning that fits."""
        whole = _json(self._data(self.reason, self.content, self.content_length))
        if len(whole) <= limit:
            return whole
        # A handler's error may be any size: an eighth of the entry keeps the
        # reason's beginning (at most 6 characters each once escaped).
        reason, most = self.reason, limit // 8
        if len(reason) > most:
            reason = f"{reason[:most]}... ({len(reason)} characters)"
        length = self.content_length if self.content_length is not None else len(self.content)

        def fits(n: int) -> bool:
            return len(_json(self._data(reason, self.content[:n], length))) <= limit

        low, high = 0, len(self.content)  # the longest beginning that fits is in [low, high]
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(middle) else (low, middle - 1)
        return _json(self._data(reason, self.content[:low], length))

    @classmethod
    def decode(cls, text: str) -> PoisonEntry:
        """The entry :meth:`encode` wrote (or base64 of it, as entries were
        written before); ``ValueError`` for any other text."""
        try:
            if not text.lstrip().startswith("{"):
                text = base64.b64decode(text, validate=True).decode("utf-8")
            data = json.loads(text)
            length = data.get("contentLength")
            return cls(
                str(data["reason"]),
                str(data["content"]),
                str(data["queue"]),
                str(data["queueMessageId"]),
                int(data["dequeueCount"]),
                None if length is None else int(length),
            )
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not a poison entry: {exc}") from None

    def send(self, queue: QueueClient) -> None:
        """Send the entry to ``queue``, once: a failure raises, and the caller's
        breaker decides whether to try again (and says so). A queue cannot
        tell a second Put Message from a new one, so each try whose answer
        was lost stores one more entry: left to the SDK's own retries, that
        would happen unseen and uncounted. Entries are at least once: a
        reader tells a copy by its ``queueMessageId`` and ``dequeueCount``.
        A service that refuses it as too large (413) gets it cut to 8 KiB: a
        message's size never keeps it from its shelf."""
        try:
            queue.send_message(self.encode(), time_to_live=NEVER, retry_total=0)
        except HttpResponseError as exc:
            if exc.status_code != 413:
                raise
            _log.warning("poison entry of queue message %r refused as too large, sent "
                         "cut to %d characters: %s", self.queue_message_id, _REFUSED_LIMIT,
                         exc.message)  # fmt: skip
            queue.send_message(self.encode(_REFUSED_LIMIT), time_to_live=NEVER, retry_total=0)


def poison_queue_of(queue: QueueClient) -> QueueClient:
    """``<queue>-poison`` in the same account, with the same credential."""
    return queue_beside(queue, f"{queue.queue_name}{POISON_SUFFIX}")


class PoisonQueue:
    """Sends :class:`PoisonEntry` texts, making the queue when first used, and
    again when a send finds it deleted."""

    def __init__(self, queue: QueueClient) -> None:
        self.queue = queue
        self._made = False
        self._lock = threading.Lock()

    def send(self, entry: PoisonEntry) -> None:
        """Send the entry (cut shorter if the service finds it too large); a
        storage error raises (the caller waits it out)."""
        with self._lock:
            if not self._made:
                self._make()
        try:
            entry.send(self.queue)
        except ResourceNotFoundError:  # deleted since it was made
            self._make()
            entry.send(self.queue)

    def _make(self) -> None:
        with contextlib.suppress(ResourceExistsError):
            self.queue.create_queue()
        self._made = True
