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
from ._locks import Held
from ._settling import Settler

__all__ = ["process_until_settled", "received_too_often"]


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


def received_too_often(
    items: list[tuple[Held, Message]],
    max_dequeue_count: int,
    settle: Settler,
    stored: Callable[[Message], bool],
    stopping: Callable[[], bool],
) -> list[tuple[Held, Message]]:
    """A key's messages of a page to process. One received more than
    ``max_dequeue_count`` times is processed only if it is ``stored`` (a
    duplicate: its outputs published again, then deleted, however often the
    queue lost its receives); else it is poisoned unprocessed, which stops a
    message that kills its worker. Storage away: the look-up waits."""
    over = [(held, m) for held, m in items if held.count > max_dequeue_count]
    if not over:
        return items
    try:
        found = {m.id for _, m in over if stored(m)}
    except Exception as exc:  # stopping, or not an outage: they all come again
        for held, message in items:
            why = "stopping" if stopping() else f"{type(exc).__name__}: {exc}"
            settle.release(held, 0 if stopping() else settle.later(held), message, why)
        return []
    for held, message in over:
        if message.id not in found:
            reason = (
                f"received {held.count} times, more than max_dequeue_count="
                f"{max_dequeue_count}, without being completed"
            )
            settle.poison(held, message, reason)
    return [(held, m) for held, m in items if held.count <= max_dequeue_count or m.id in found]
