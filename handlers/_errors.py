"""The errors of the consistent-messaging runtime, drawn once here::

    HandlerError
    ├── HandlerFailedError            the handler raised (the cause is its __cause__)
    ├── NonDeterministicHandlerError  a duplicate's outputs differ from its original's
    ├── DuplicateOutsideWindowError   older than what retention keeps (reason, sent_at,
    │                                 watermark)
    ├── StateTooLargeError            a new state does not fit one stored version
    │                                 (also a ValueError)
    ├── UnreadableStateError          a stored state cannot be read (key, version)
    └── IllegalTransitionError        a receive moved against its state machine
                                      (also a RuntimeError)

- :class:`NonDeterministicHandlerError`: a duplicate, handled again on the
  state before its original, produced other outputs than the original did.
  Nothing is published for it.
- :class:`DuplicateOutsideWindowError`: whether a message is a duplicate can
  no longer be told, because retention removed what would show it. Raised
  (or reported as the outcome's error) only with ``late_duplicates="refuse"``
  for a late message, and whenever a found duplicate's record is gone.
- :class:`StateTooLargeError`: names the handler, the message and the size.
- :class:`HandlerFailedError`: the handler raised; the original exception is
  its ``__cause__``.
- :class:`UnreadableStateError`: a state stored in the table cannot be read
  back (damaged by an outside write, or a state class that no longer loads
  it); names the key and the version. The key's messages are abandoned, the
  other keys go on; nothing is written on a state that cannot be read.

Storage errors come from :mod:`streamstone_py` (its tree is drawn in
``streamstone_py._errors``); a processor reports them as faulted outcomes.
"""

from __future__ import annotations

from datetime import datetime

__all__ = [
    "DuplicateOutsideWindowError",
    "HandlerError",
    "HandlerFailedError",
    "IllegalTransitionError",
    "NonDeterministicHandlerError",
    "StateTooLargeError",
    "UnreadableStateError",
]


class HandlerError(Exception):
    """Base class of the runtime's errors."""


class NonDeterministicHandlerError(HandlerError):
    """A duplicate's outputs differ from those of its original."""

    def __init__(self, handler: str, message_id: str, detail: str) -> None:
        super().__init__(
            f"handler {handler!r} is not deterministic: message {message_id!r} handled again "
            f"on the same state produced different outputs ({detail}); nothing was published"
        )
        self.handler = handler
        self.message_id = message_id
        self.detail = detail


class DuplicateOutsideWindowError(HandlerError):
    """Whether the message is a duplicate cannot be told: retention removed its record.

    ``reason`` says what is missing; ``sent_at`` (the message's ``sent_at``
    header, a string when it could not be read) and ``watermark`` (the newest
    ``Now`` retention removed) are given where they are known.
    """

    def __init__(
        self,
        handler: str,
        message_id: str,
        reason: str,
        *,
        sent_at: datetime | str | None = None,
        watermark: datetime | None = None,
    ) -> None:
        known = []
        if sent_at is not None:
            shown = sent_at.isoformat() if isinstance(sent_at, datetime) else repr(sent_at)
            known.append(f"sent at {shown}")
        if watermark is not None:
            before = "before " if known else ""
            known.append(f"{before}the retention watermark {watermark.isoformat()}")
        detail = f" ({', '.join(known)})" if known else ""
        super().__init__(
            f"message {message_id!r} for handler {handler!r} is outside the de-duplication "
            f"window: {reason}{detail}; it may be a duplicate whose record is gone"
        )
        self.handler = handler
        self.message_id = message_id
        self.reason = reason
        self.sent_at = sent_at
        self.watermark = watermark


class StateTooLargeError(HandlerError, ValueError):
    """The state after a message does not fit one table entity."""

    def __init__(self, handler: str, message_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"state of handler {handler!r} after message {message_id!r} is {size} bytes "
            f"encoded; at most {limit} fit one stored version"
        )
        self.handler = handler
        self.message_id = message_id
        self.size = size
        self.limit = limit


class UnreadableStateError(HandlerError):
    """A stored state (or stored version) of a key cannot be read back."""

    def __init__(self, handler: str, key: str, version: int, detail: str) -> None:
        super().__init__(
            f"the stored state of key {key!r} (handler {handler!r}) at version {version} "
            f"cannot be read: {detail}"
        )
        self.handler = handler
        self.key = key
        self.version = version
        self.detail = detail


class HandlerFailedError(HandlerError):
    """The handler raised while handling a message."""

    def __init__(self, handler: str, message_id: str, error: BaseException) -> None:
        super().__init__(
            f"handler {handler!r} failed on message {message_id!r}: {type(error).__name__}: {error}"
        )
        self.handler = handler
        self.message_id = message_id


class IllegalTransitionError(HandlerError, RuntimeError):
    """A transition the receive state machine does not allow (e.g. a second complete)."""
