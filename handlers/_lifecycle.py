"""The receive state machine of a non-destructive (peek-lock) receive.

Received -> Completing -> Completed, Received -> Abandoning -> Abandoned, and
Faulted from anywhere:

- complete only from Received, and only once: a second complete is an error;
- abandon from Received, Abandoning or Abandoned: repeating it has no effect;
- fault from any state, repeatable: the receive is then in doubt, and the
  message will be delivered again (more often than needed, never less).

The processor drives one receive per message; its final state is the
message's outcome.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable

from ._errors import IllegalTransitionError

__all__ = ["IllegalTransitionError", "Receive", "ReceiveState"]


class ReceiveState(enum.Enum):
    RECEIVED = "received"
    COMPLETING = "completing"
    COMPLETED = "completed"
    ABANDONING = "abandoning"
    ABANDONED = "abandoned"
    FAULTED = "faulted"


class Receive:
    """One received message's state; thread-safe, since faults race with the rest."""

    def __init__(
        self,
        message_id: str,
        *,
        on_complete: Callable[[Receive], None] | None = None,
        on_abandon: Callable[[Receive], None] | None = None,
    ) -> None:
        self.message_id = message_id
        self._state = ReceiveState.RECEIVED
        self._lock = threading.Lock()
        self._on_complete = on_complete
        self._on_abandon = on_abandon
        self.reason: str | None = None

    @property
    def state(self) -> ReceiveState:
        return self._state

    def complete(self) -> None:
        with self._lock:
            if self._state is not ReceiveState.RECEIVED:
                raise IllegalTransitionError(
                    f"cannot complete message {self.message_id!r} in state {self._state.value}"
                )
            self._state = ReceiveState.COMPLETING
        if self._on_complete is not None:
            self._on_complete(self)
        with self._lock:
            if self._state is ReceiveState.COMPLETING:  # a fault may have won the race
                self._state = ReceiveState.COMPLETED

    def abandon(self, reason: str) -> None:
        with self._lock:
            if self._state in (ReceiveState.ABANDONING, ReceiveState.ABANDONED):
                return
            if self._state is not ReceiveState.RECEIVED:
                raise IllegalTransitionError(
                    f"cannot abandon message {self.message_id!r} in state {self._state.value}"
                )
            self._state = ReceiveState.ABANDONING
            self.reason = reason
        if self._on_abandon is not None:
            self._on_abandon(self)
        with self._lock:
            if self._state is ReceiveState.ABANDONING:
                self._state = ReceiveState.ABANDONED

    def fault(self, reason: str) -> None:
        with self._lock:
            if self._state is ReceiveState.FAULTED:
                return
            self._state = ReceiveState.FAULTED
            self.reason = reason

    def __repr__(self) -> str:
        return f"Receive({self.message_id!r}, {self._state.value})"
