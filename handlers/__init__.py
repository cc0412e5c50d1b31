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
from ._failed._select import PoisonFilter, PoisonSummary, reason_group
from ._failed._sendback import PurgeReport, SendBackReport, purge_poison, send_back
from ._failed._shelf import PoisonDepth, ShelvedEntry, find_poison, poison_depth, read_poison
from ._handler import Handler, handler
from ._lifecycle import Receive, ReceiveState
from ._messages._admission import Refused, admit, admit_text
from ._messages._codec import MAX_NESTING
from ._messages._envelope import (
    decode_envelope,
    encode_envelope,
    from_json_data,
    json_data,
    read_queue_text,
)
from ._messages._message import Message
from ._outcome import KeyState, KeyVersion, LoadedState, Outcome, OutcomeKind, ProcessorStats
from ._processor import Processor, TokenReceiver
from ._publish import InMemoryPublisher, Publisher, TablePublisher
from ._queues._account import QUEUE_NAME, QueueConfig, check_queue_name
from ._queues._breaker import Breaker, is_outage
from ._queues._consumer import ConsumerStats, PoisonEntry, QueueConsumer, QueueOutcome
from ._queues._locks import log_gone, lost_lock, message_gone, queue_fault
from ._queues._poison import PoisonQueue
from ._queues._publisher import MAX_QUEUE_MESSAGE_BYTES, QueuePublisher, poison_name_refusal
from ._queues._rounds import process_until_settled
from ._reading import scan_keys, scan_states
from ._store import TOKEN_HEADER, StateStore, StoredVersion

__all__ = [
    "MAX_NESTING",
    "MAX_QUEUE_MESSAGE_BYTES",
    "MAX_SCHEDULE_DELAY",
    "QUEUE_NAME",
    "TOKEN_HEADER",
    "Breaker",
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
    "OutcomeKind",
    "PoisonDepth",
    "PoisonEntry",
    "PoisonFilter",
    "PoisonQueue",
    "PoisonSummary",
    "Processor",
    "ProcessorStats",
    "Publisher",
    "PurgeReport",
    "QueueConfig",
    "QueueConsumer",
    "QueueOutcome",
    "QueuePublisher",
    "Receive",
    "ReceiveState",
    "Refused",
    "SendBackReport",
    "ShelvedEntry",
    "StateStore",
    "StateTooLargeError",
    "StoredVersion",
    "TablePublisher",
    "TokenReceiver",
    "UnreadableStateError",
    "admit",
    "admit_text",
    "check_queue_name",
    "decode_envelope",
    "encode_envelope",
    "find_poison",
    "from_json_data",
    "handler",
    "is_outage",
    "json_data",
    "log_gone",
    "lost_lock",
    "message_gone",
    "poison_depth",
    "poison_name_refusal",
    "process_until_settled",
    "purge_poison",
    "queue_fault",
    "read_poison",
    "read_queue_text",
    "reason_group",
    "scan_keys",
    "scan_states",
    "send_back",
]
