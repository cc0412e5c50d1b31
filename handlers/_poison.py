"""The poison queue: where a queue message goes that cannot be handled.

Azure Functions' convention: ``<queue>-poison`` in the same account. Each
entry is a base64 JSON object with the reason and the original text, so a
fixed message can be sent again as it was.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
from dataclasses import dataclass

from azure.core.exceptions import AzureError, ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import QueueClient

__all__ = ["PoisonEntry", "PoisonQueue", "poison_queue_of"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PoisonEntry:
    """A poison queue message: why, and the original text to send again."""

    reason: str
    #: The queue message's text, exactly as it was received.
    content: str
    queue: str
    queue_message_id: str
    dequeue_count: int

    def encode(self) -> str:
        """The poison queue message's text: base64 of a JSON object."""
        data = {
            "reason": self.reason,
            "content": self.content,
            "queue": self.queue,
            "queueMessageId": self.queue_message_id,
            "dequeueCount": self.dequeue_count,
        }
        text = json.dumps(data, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        return base64.b64encode(text.encode("utf-8")).decode("ascii")

    @classmethod
    def decode(cls, text: str) -> PoisonEntry:
        """The entry :meth:`encode` wrote; ``ValueError`` for any other text."""
        try:
            data = json.loads(base64.b64decode(text, validate=True).decode("utf-8"))
            return cls(
                str(data["reason"]),
                str(data["content"]),
                str(data["queue"]),
                str(data["queueMessageId"]),
                int(data["dequeueCount"]),
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not a poison entry: {exc}") from None


def poison_queue_of(queue: QueueClient) -> QueueClient:
    """``<queue>-poison`` in the same account, with the same credential."""
    url, _, query = queue.url.partition("?")
    poison_url = f"{url}-poison" + (f"?{query}" if query else "")
    return QueueClient.from_queue_url(poison_url, credential=queue.credential)


class PoisonQueue:
    """Sends :class:`PoisonEntry` texts, making the queue when first used, and
    again when a send finds it deleted."""

    def __init__(self, queue: QueueClient) -> None:
        self.queue = queue
        self._made = False
        self._lock = threading.Lock()

    def send(self, entry: PoisonEntry) -> bool:
        """Whether the entry was sent (a storage error is logged, not raised)."""
        try:
            with self._lock:
                if not self._made:
                    self._make()
            try:
                self.queue.send_message(entry.encode())
            except ResourceNotFoundError:  # deleted since it was made
                self._make()
                self.queue.send_message(entry.encode())
        except AzureError as exc:
            _log.warning("message %r not poisoned: %s", entry.queue_message_id, exc)
            return False
        return True

    def _make(self) -> None:
        with contextlib.suppress(ResourceExistsError):
            self.queue.create_queue()
        self._made = True
