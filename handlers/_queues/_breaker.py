"""A circuit breaker for storage that is away, and what counts as away.

A message is shelved for what it is or for what its handler did, never for
the state of the infrastructure. So a failure that is the storage's (a
service that does not answer, throttles, refuses the credentials, or lacks
its table) opens the breaker: work pauses, tries again after a pause that
doubles per failed try up to a bound, and the breaker closes at the first
answer. One line is logged when it opens and one when it closes, whatever
the tries in between. The queue consumer keeps one for the storage and one
for the Queue service, whose faults (a throttled delete, a send that gets
no answer...) are outages too: they pause and try again, and cost no
receive of a message.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from azure.core.exceptions import ClientAuthenticationError, ResourceNotFoundError

from streamstone_py import ConcurrencyConflictError, is_transient

__all__ = ["Breaker", "is_outage"]

T = TypeVar("T")


def is_outage(error: BaseException | None) -> bool:
    """Whether a failure is the storage's state, not the message's: a
    transient fault (no connection, a lost answer, 408, 429, 5xx), refused
    credentials, a missing table or queue, or contention that outlasted the
    retries; looked for along the error's causes."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if is_transient(error) or isinstance(
            error,
            ClientAuthenticationError | ResourceNotFoundError | ConcurrencyConflictError | OSError,
        ):
            return True
        error = error.__cause__ or error.__context__
    return False


class Breaker:
    """Open while ``what`` is away: each failed try gets a pause (``first``,
    doubled per failure since it opened, up to ``most``); the first answer
    closes it. Thread-safe: the keys of a page share one."""

    def __init__(
        self,
        what: str = "storage",
        pausing: str = "pausing",
        first: timedelta = timedelta(seconds=1),
        most: timedelta = timedelta(minutes=1),
        log: logging.Logger | None = None,
        on_open: Callable[[], None] | None = None,
    ) -> None:
        if first < timedelta(0) or most < first:
            raise ValueError(f"need 0 <= first <= most, got {first} and {most}")
        self.what, self.pausing = what, pausing
        self.first, self.most = first.total_seconds(), most.total_seconds()
        self.log = log or logging.getLogger(__name__)
        self.on_open = on_open
        #: How often it opened.
        self.opened = 0
        self._failures = 0
        self._since: float | None = None  # when it opened (None: closed)
        self._answered = float("-inf")  # the last close
        self._lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        return self._since is not None

    def stamp(self) -> float:
        """When a try starts; give it to :meth:`failed` after."""
        return time.monotonic()

    def failed(self, reason: str, started: float | None = None) -> float:
        """A try that started at ``started`` met the outage: the seconds to
        pause before the next. A try older than the last answer does not open
        the breaker again (it met the outage that was over): no pause. The
        line shows the reason's first line (an error's later lines repeat it)."""
        with self._lock:
            if started is not None and started < self._answered and self._since is None:
                return 0.0
            self._failures += 1
            pause = min(self.most, self.first * (1 << min(self._failures - 1, 30)))
            if self._since is None:
                self._since = time.monotonic()
                self.opened += 1
                self.log.warning(
                    "%s unavailable: %s, trying again in %g s, then less often: %s",
                    self.what, self.pausing, pause, reason.split("\n", 1)[0],
                )  # fmt: skip
                if self.on_open is not None:
                    self.on_open()
            return pause

    def succeeded(self) -> None:
        """An answer: closes the breaker if it is open."""
        with self._lock:
            since, self._since = self._since, None
            self._failures = 0
            self._answered = time.monotonic()
        if since is not None:
            self.log.warning(
                "%s answers again after %.1f s: going on", self.what, time.monotonic() - since
            )

    def call(
        self,
        attempt: Callable[[], T],
        what: str,
        *,
        outage: Callable[[BaseException], bool] = is_outage,
        stopping: Callable[[], bool] = lambda: False,
        pause: Callable[[float], object] = time.sleep,
    ) -> T:
        """``attempt()`` until it answers, which closes the breaker. A failure
        that ``outage`` says is the service's opens it (``what`` names the
        call in its line), then ``pause(seconds)`` and try again; any other
        failure raises, and so does an outage once ``stopping()``."""
        while True:
            started = self.stamp()
            try:
                result = attempt()
            except Exception as exc:
                if not outage(exc) or stopping():
                    raise
                pause(self.failed(f"{what}: {exc}", started))
                continue
            self.succeeded()
            return result
