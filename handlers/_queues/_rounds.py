"""One key's messages handled until each is settled, for callers whose input
keeps no order across messages (a queue): the queue consumer, and the Spark
job reading a queue.

:meth:`Processor.process_batch` stops a key at its first failure; such a
caller need not wait for the failing message to be delivered again. So:

- the messages a failing one stopped (``stopped``) are handled again at once
  without it, as if it had not come;
- the messages met by an outage (``faulted`` by a failure that is the
  storage's, see :func:`is_outage`, and those ``held`` behind them) are kept
  and tried again after the breaker's pause, until storage answers: a
  message is never given up for the state of the storage, and its receive
  is not repeated meanwhile;
- every other outcome is settled and handed back as it comes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .._messages._message import Message
from .._outcome import Outcome
from .._processor import Processor
from ._breaker import Breaker, is_outage

__all__ = ["process_until_settled"]


def process_until_settled(
    processor: Processor[Any],
    key: str,
    messages: Sequence[Message],
    *,
    breaker: Breaker,
    stopping: Callable[[], bool] = lambda: False,
    pause: Callable[[float], object] = time.sleep,
    on_fault: Callable[[int, Outcome], None] | None = None,
) -> Iterator[tuple[int, Outcome | None]]:
    """``(index, outcome)`` for each of ``messages`` once it is settled:
    completed, a duplicate, refused, failed, or faulted by a failure that is
    not an outage. When ``stopping()`` turns true between tries, the messages
    not settled yet come with ``None``.

    ``pause(seconds)`` waits between tries during an outage (a consumer
    passes its stop event's ``wait``); ``on_fault(index, outcome)`` hears of
    each message an outage kept, once per message."""
    pending = list(range(len(messages)))
    kept: set[int] = set()
    while pending:
        if stopping():
            yield from ((index, None) for index in pending)
            return
        started = breaker.stamp()
        outcomes = processor.process_batch(key, [messages[i] for i in pending])
        again: list[int] = []
        outage: Outcome | None = None
        for index, outcome in zip(pending, outcomes, strict=True):
            if outcome.kind == "faulted" and is_outage(outcome.error):
                outage = outage or outcome
            elif outcome.kind not in ("stopped", "held"):
                yield index, outcome
                continue
            again.append(index)
            if outcome.kind == "faulted" and index not in kept and on_fault is not None:
                kept.add(index)
                on_fault(index, outcome)
        if outage is None:
            breaker.succeeded()
            if len(again) == len(pending):  # none settled and no outage: cannot progress
                yield from zip(again, outcomes, strict=True)
                return
        else:
            pause(breaker.failed(outage.reason or "faulted", started))
        pending = again
