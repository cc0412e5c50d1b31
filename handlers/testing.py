"""Helpers for testing handlers and the runtime against a reference.

:func:`check_handler` is the first thing to run on a new handler: it handles
each message twice on the same state, as a duplicate would be, and in
subprocesses with other string-hash seeds, and reports every field in which
the state or the outputs differ::

    report = check_handler(shooting_range, messages)
    report.raise_for_differences()

:func:`replay_load` is the seed's LoadState, done the slow way: it reads a
key's stream from its first version and stops at the message's own version.
:meth:`Processor.load_state` must agree with it on every history; it takes
time linear in the stream's length, so use it in tests, never in a pipeline::

    state, version, is_duplicate = replay_load(processor, "game-1", "m-7")
"""

from __future__ import annotations

from typing import TypeVar

from streamstone_py import Stream

from ._determinism import Difference, HandlerReport, check_handler
from ._processor import Processor
from ._store import StoredVersion

__all__ = ["Difference", "HandlerReport", "check_handler", "replay_load"]

S = TypeVar("S")


def replay_load(processor: Processor[S], key: str, message_id: str) -> tuple[S, int, bool]:
    """The state to handle ``message_id`` on, its version, and whether it is a
    duplicate, by reading the key's versions from the first one kept."""
    handler = processor.handler
    state = handler.encode_state(handler.initial_state())
    version = 0
    partition = processor.store.partition(key)
    start = 1
    while True:
        page = Stream.read(partition, start_version=start, slice_size=1000)
        for event in page.events:
            if event.id == message_id:
                return handler.decode_state(state), version, True
            state = StoredVersion.from_event(event).state
            version = event.version
        if page.is_end_of_stream:
            return handler.decode_state(state), version, False
        start = page.events[-1].version + 1
