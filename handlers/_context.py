"""HandlerContext: everything a handler may not take from its environment."""

from __future__ import annotations

import hashlib
import random as _random
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final, TypeVar

from ._errors import NonDeterministicHandlerError
from ._messages._codec import canonical
from ._messages._message import Message

__all__ = ["HandlerContext"]

T = TypeVar("T")

#: The namespace of every id a context derives (uuid5 of the message id and a counter).
NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "https://streamstone-py/handlers")
#: How ids are derived: 1 = handler, message id, counter; 2 (current) adds the key,
#: since a message id need only be unique per key. Each stored version records
#: its scheme, so a duplicate of an older version is replayed with the old one.
ID_SCHEME: Final = 2
#: The longest a message may be scheduled ahead: Azure Storage Queues hide a
#: message for at most seven days, and a handler should run the same whatever
#: publisher its outputs go to.
MAX_SCHEDULE_DELAY: Final = timedelta(days=7)


class HandlerContext:
    """What a handler uses instead of clocks, random numbers, uuid4 and globals.

    Everything here is derived from the input message id, or captured at the
    first processing and stored with the new state, so handling a duplicate
    again gives byte-identical outputs in any process:

    - :meth:`new_uuid` / :meth:`new_id`: uuid5 of the handler, the message's
      key and id, and a counter.
    - :meth:`random`: a ``random.Random`` seeded from the message id.
    - :meth:`now`: the time of the first processing.
    - :meth:`capture`: any other environmental value, taken once and replayed.
    - :meth:`publish`: an output message (its id is derived too, unless given).
    - :meth:`schedule`: an output message due later (a timer).
    """

    def __init__(
        self,
        message: Message,
        *,
        handler: str,
        now: datetime,
        captures: Mapping[str, Any] | None = None,
        replay: bool = False,
        id_scheme: int = ID_SCHEME,
    ) -> None:
        if id_scheme not in (1, 2):
            raise ValueError(f"id_scheme must be 1 or 2, got {id_scheme!r}")
        self.message = message
        self._handler = handler
        self._now = now
        self._captures: dict[str, Any] = dict(captures or {})
        self._replay = replay
        self._id_scheme = id_scheme
        self._counter = 0
        self._outputs: list[Message] = []
        self._given: set[str] = set()
        seed = hashlib.sha256(b"random\x00" + message.id.encode("utf-8")).digest()
        self._random = _random.Random(int.from_bytes(seed[:16], "big"))

    def new_uuid(self) -> uuid.UUID:
        """The next id of this message: the same sequence on every run.

        Derived from the handler's name and the message's key too, so two
        handlers that consume the same message, or two keys that reuse a
        message id, never mint the same ids."""
        self._counter += 1
        if self._id_scheme == 1:
            name = f"{self._handler}\x00{self.message.id}\x00{self._counter}"
        else:
            name = f"{self._handler}\x00{self.message.key}\x00{self.message.id}\x00{self._counter}"
        return uuid.uuid5(NAMESPACE, name)

    def new_id(self) -> str:
        return str(self.new_uuid())

    def random(self) -> _random.Random:
        """A random generator seeded from the message id (not from the clock)."""
        return self._random

    def now(self) -> datetime:
        """When the message was first processed (a duplicate sees the same instant)."""
        return self._now

    def capture(self, name: str, fn: Callable[[], T]) -> T:
        """``fn()`` at the first processing; the recorded value on every later one."""
        if name in self._captures:
            return self._captures[name]  # type: ignore[no-any-return]
        if self._replay:
            raise NonDeterministicHandlerError(
                self._handler, self.message.id, f"capture {name!r} was not taken the first time"
            )
        value = fn()
        canonical(value, f"capture {name!r}")
        self._captures[name] = value
        return value

    def publish(
        self,
        type: str,
        body: Any = None,
        *,
        key: str | None = None,
        id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Message:
        """Queue an output message; it is published after the new state is stored."""
        return self._output(type, body, key, id, headers, None)

    def _output(
        self,
        type: str,
        body: Any,
        key: str | None,
        id: str | None,
        headers: Mapping[str, str] | None,
        due: datetime | None,
    ) -> Message:
        output = Message(
            id=id if id is not None else self.new_id(),
            key=key if key is not None else self.message.key,
            type=type,
            body=body,
            headers=headers or {},
            due=due,
            # The first processing's time: the same on every copy (a context
            # made by hand may hold a naive time, which says no zone).
            produced=self._now if self._now.utcoffset() is not None else None,
        )
        self._outputs.append(output)
        if id is not None:
            self._given.add(output.id)
        return output

    def schedule(
        self,
        type: str,
        body: Any = None,
        *,
        after: timedelta | None = None,
        at: datetime | None = None,
        key: str | None = None,
        id: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Message:
        """Queue an output message due ``after`` the message's :meth:`now`, or
        ``at`` an instant: a timer, such as a payment timeout.

        Its ``due`` derives from :meth:`now`, so a duplicate schedules the same
        message for the same instant. Publishers deliver it no earlier than
        that; a file output carries the instant. At most seven days ahead
        (:data:`MAX_SCHEDULE_DELAY`); a due in the past means at once.
        """
        if (after is None) == (at is None):
            raise ValueError("schedule needs exactly one of after= or at=")
        if after is not None:
            if not isinstance(after, timedelta):
                raise TypeError(f"after must be a timedelta, got {after!r}")
            if after < timedelta(0):
                raise ValueError(f"after must not be negative, got {after}")
            due = self._now + after
        else:
            if not isinstance(at, datetime) or at.utcoffset() is None:
                raise ValueError(f"at must be a datetime with a time zone, got {at!r}")
            due = at
        if due - self._now > MAX_SCHEDULE_DELAY:
            raise ValueError(
                f"cannot schedule {type!r} {due - self._now} ahead (due {due.isoformat()}): "
                f"at most {MAX_SCHEDULE_DELAY.days} days, the longest Azure Storage Queues "
                "hide a message"
            )
        return self._output(type, body, key, id, headers, due)

    @property
    def outputs(self) -> tuple[Message, ...]:
        return tuple(self._outputs)

    @property
    def given_ids(self) -> frozenset[str]:
        """The ids the handler gave its outputs (``id=``), rather than derived:
        only these can meet another message's output, so only these are recorded."""
        return frozenset(self._given)

    @property
    def captures(self) -> dict[str, Any]:
        return dict(self._captures)

    @property
    def id_scheme(self) -> int:
        return self._id_scheme
