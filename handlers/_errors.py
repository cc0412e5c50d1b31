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
  its ``__cause__``, ``where`` is the innermost line of the handler's own
  code, and ``handler_traceback`` the handler's frames.
- :class:`UnreadableStateError`: a state stored in the table cannot be read
  back (damaged by an outside write, or a state class that no longer loads
  it); names the key and the version. The key's messages are abandoned, the
  other keys go on; nothing is written on a state that cannot be read.

Storage errors come from :mod:`streamstone_py` (its tree is drawn in
``streamstone_py._errors``); a processor reports them as faulted outcomes.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from datetime import datetime
from typing import Final

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
    """The handler raised while handling a message.

    The message names where, in the handler's own code: ``(at cart.py:12 in
    apply)``; :attr:`handler_traceback` holds the handler's part of the
    traceback, without the runtime's frames around it.
    """

    def __init__(self, handler: str, message_id: str, error: BaseException) -> None:
        frames = _handler_frames(error)
        self.where = _where(frames)
        at = f" (at {self.where})" if self.where else ""
        super().__init__(
            f"handler {handler!r} failed on message {message_id!r}: "
            f"{type(error).__name__}: {error}{at}"
        )
        self.handler = handler
        self.message_id = message_id
        self.handler_traceback = "".join(
            ["The handler's frames, innermost last:\n", *traceback.format_list(frames),
             *traceback.format_exception_only(type(error), error)]
        )  # fmt: skip


# The runtime's own modules: a handler's frames are the others of a traceback.
_RUNTIME_DIRS: Final = tuple(
    os.path.join(os.path.dirname(os.path.dirname(__file__)), package, "")
    for package in ("handlers", "streamstone_py")
)
# Where libraries live: the innermost frame a user can act on is not in them.
_LIBRARY_DIRS: Final = tuple(
    {os.path.join(path, "") for name, path in sysconfig.get_paths().items() if "lib" in name}
)


def _is_runtime(filename: str) -> bool:
    """A frame of this runtime's own code (its public examples count as handlers)."""
    return filename.startswith(_RUNTIME_DIRS) and os.path.basename(filename).startswith("_")


def _handler_frames(error: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``error``'s traceback below the runtime's: the handler's."""
    frames = traceback.extract_tb(error.__traceback__)
    while frames and _is_runtime(frames[0].filename):
        frames.pop(0)
    return list(frames)


def _where(frames: list[traceback.FrameSummary]) -> str | None:
    """``file:line in function`` of the innermost frame of the user's own code
    (not a library it called), the path relative to the working directory."""
    own = [
        f for f in frames
        if not f.filename.startswith((*_LIBRARY_DIRS, "<")) and not _is_runtime(f.filename)
    ]  # fmt: skip
    if not frames:
        return None
    frame = (own or frames)[-1]
    path = frame.filename
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        relative = path
    shown = path if relative.startswith("..") else relative
    return f"{shown}:{frame.lineno} in {frame.name}"


class IllegalTransitionError(HandlerError, RuntimeError):
    """A transition the receive state machine does not allow (e.g. a second complete)."""
