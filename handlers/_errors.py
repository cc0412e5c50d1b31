"""The errors of the consistent-messaging runtime, in one place.

- :class:`NonDeterministicHandlerError`: a duplicate, handled again on the
  state before its original, produced other outputs than the original did.
  Nothing is published for it.
- :class:`DuplicateOutsideWindowError`: a message is older than what
  retention keeps, so whether it is a duplicate cannot be told (raised only
  with ``late_duplicates="refuse"``).
- :class:`StateTooLargeError`: a new state does not fit one table entity.
- :class:`HandlerFailedError`: the handler raised; the original exception is
  its ``__cause__``.

They derive from :class:`HandlerError`. Storage errors come from
:mod:`streamstone_py`.
"""

from __future__ import annotations

__all__ = [
    "DuplicateOutsideWindowError",
    "HandlerError",
    "HandlerFailedError",
    "NonDeterministicHandlerError",
    "StateTooLargeError",
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


class DuplicateOutsideWindowError(HandlerError):
    """The message is older than the de-duplication window retention keeps."""

    def __init__(self, handler: str, message_id: str, sent_at: str, watermark: str) -> None:
        super().__init__(
            f"message {message_id!r} for handler {handler!r} was sent at {sent_at}, before "
            f"the retention watermark {watermark}: it may be a duplicate whose record is gone"
        )
        self.handler = handler
        self.message_id = message_id


class StateTooLargeError(HandlerError, ValueError):
    """The state after a message does not fit one table entity."""

    def __init__(self, handler: str, message_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"state of handler {handler!r} after message {message_id!r} is {size} bytes "
            f"encoded; at most {limit} fit one stored version"
        )
        self.size = size


class HandlerFailedError(HandlerError):
    """The handler raised while handling a message."""

    def __init__(self, handler: str, message_id: str, error: BaseException) -> None:
        super().__init__(
            f"handler {handler!r} failed on message {message_id!r}: {type(error).__name__}: {error}"
        )
        self.handler = handler
        self.message_id = message_id
