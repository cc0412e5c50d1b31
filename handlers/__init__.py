"""handlers: exactly-once effects over at-least-once delivery, on streamstone_py.

A :class:`Processor` runs a :class:`Handler` over messages. With the
state-based strategy (the default) each processed message stores a new
version of its key's state, tagged with the message id; a duplicate is
handled again on the state from just before its original, with a
deterministic handler, so it yields the same state and the same outputs.
With ``strategy="outbox"`` the outputs are stored beside the state and
replayed instead.

    >>> from handlers import Message, Processor, InMemoryPublisher
    >>> from handlers.examples import shooting_range
    >>> processor = Processor(shooting_range, table_client, InMemoryPublisher())   # doctest: +SKIP
    >>> processor.process(Message("m-1", "game-1", "FireAt", {"position": 3}))     # doctest: +SKIP

Errors are listed in :mod:`handlers._errors`.
"""

from ._cache import HeaderCache
from ._codec import MAX_NESTING
from ._consumer import ConsumerStats, PoisonEntry, QueueConsumer
from ._context import MAX_SCHEDULE_DELAY, HandlerContext
from ._errors import (
    DuplicateOutsideWindowError,
    HandlerError,
    HandlerFailedError,
    IllegalTransitionError,
    NonDeterministicHandlerError,
    StateTooLargeError,
    UnreadableStateError,
)
from ._handler import Handler, handler
from ._lifecycle import Receive, ReceiveState
from ._message import Message
from ._outcome import KeyState, KeyVersion, LoadedState, Outcome, ProcessorStats
from ._processor import Processor
from ._publish import InMemoryPublisher, Publisher, TablePublisher
from ._queue import (
    MAX_QUEUE_MESSAGE_BYTES,
    QueuePublisher,
    decode_envelope,
    encode_envelope,
    read_queue_text,
)
from ._reading import scan_keys, scan_states
from ._store import StateStore, StoredVersion

__all__ = [
    "MAX_NESTING",
    "MAX_QUEUE_MESSAGE_BYTES",
    "MAX_SCHEDULE_DELAY",
    "ConsumerStats",
    "DuplicateOutsideWindowError",
    "Handler",
    "HandlerContext",
    "HandlerError",
    "HandlerFailedError",
    "HeaderCache",
    "IllegalTransitionError",
    "InMemoryPublisher",
    "KeyState",
    "KeyVersion",
    "LoadedState",
    "Message",
    "NonDeterministicHandlerError",
    "Outcome",
    "PoisonEntry",
    "Processor",
    "ProcessorStats",
    "Publisher",
    "QueueConsumer",
    "QueuePublisher",
    "Receive",
    "ReceiveState",
    "StateStore",
    "StateTooLargeError",
    "StoredVersion",
    "TablePublisher",
    "UnreadableStateError",
    "decode_envelope",
    "encode_envelope",
    "handler",
    "read_queue_text",
    "scan_keys",
    "scan_states",
]
