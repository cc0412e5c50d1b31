"""Output messages on Azure Storage Queues: the publisher that sends outputs
to the queues their route names, each as its envelope (``_envelope``).

The output's id travels in the envelope: a queue delivers at least once, and
a publisher sends an output again whenever its source message is
redelivered, so consumers de-duplicate by ``id`` (a ``Processor`` does by
itself).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueServiceClient, TextBase64EncodePolicy

from .._messages._envelope import encode_envelope
from .._messages._message import Message
from .._publish import unique_outputs
from ._account import QUEUE_NAME

__all__ = ["MAX_QUEUE_MESSAGE_BYTES", "POISON_SUFFIX", "QueuePublisher", "poison_name_refusal"]

#: Azure Storage Queues' limit of one message's text, as sent (base64 here).
MAX_QUEUE_MESSAGE_BYTES: Final = 64 * 1024
#: The longest a queue message can stay hidden, in seconds (seven days).
_MAX_DELAY: Final = 7 * 24 * 3600
#: The longest queue name, and what names a queue's poison queue (Azure Functions').
_LONGEST: Final = 63
POISON_SUFFIX: Final = "-poison"

Route = Mapping[str, str] | Callable[[Message], str]


def poison_name_refusal(queue: str, option: str | None = "poison_queue=") -> str | None:
    """Why ``<queue>-poison`` cannot name a queue (``queue`` is too long), or
    None; ``option``: what names another poison queue, if anything does."""
    poison = f"{queue}{POISON_SUFFIX}"
    if len(poison) <= _LONGEST:
        return None
    most = _LONGEST - len(POISON_SUFFIX)
    return (
        f"queue {queue!r} has {len(queue)} characters: its poison queue {poison!r} would have "
        f"{len(poison)}, over the {_LONGEST} a queue name may have; name the queue in at most "
        f"{most} characters" + (f", or give {option}" if option else "")
    )


class QueuePublisher:
    """Sends outputs to Azure Storage Queues, each to the queue its route
    names: ``route`` maps output types to queue names, or is a function of
    the output; ``default`` takes the types the mapping does not name.

    Queues are created when first used, and again when a send finds one
    deleted. Publishing again sends again (a queue
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
        if not isinstance(name, str) or not QUEUE_NAME.fullmatch(name):
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
                self._send(queue, text)
                continue
            # Hidden until due; then it lives as long as any other message would.
            delay = min(_MAX_DELAY, max(0, math.ceil((message.due - self.clock()).total_seconds())))
            self._send(queue, text, visibility_timeout=delay, time_to_live=delay + _MAX_DELAY)

    def _send(self, name: str, text: str, **options: Any) -> None:
        queue = self._queue(name)
        try:
            queue.send_message(text, **options)
        except ResourceNotFoundError:  # deleted since it was made: made again
            with contextlib.suppress(ResourceExistsError):
                queue.create_queue()
            queue.send_message(text, **options)

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
