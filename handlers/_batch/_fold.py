"""Folding a key's batch over one header: each message becomes a step, and
each processed one a version to write.

Every message meets the cases below in order, and the first that applies
decides it:

1. an earlier message of the batch failed: abandoned (``stopped``), to be
   delivered again;
2. the handler does not take its type: ``refused``;
3. a copy of a message earlier in this batch: a duplicate of it;
4. its id cannot be a row key of the handler's stream: ``refused`` (before
   anything looks it up);
5. known to be stored (the write found it) or sent before retention's
   watermark: replayed as a duplicate, or ``refused`` when retention forgot it;
   with tokens, a message whose token the write found gone (or that another
   message of the batch carried) is ``consumed``, and a message that carries a
   token is never judged by its sent time: its token says whether it is new;
6. the handler fails on the newest state (or that state cannot be read):
   if the message is stored after all, replayed as a duplicate (or, carrying
   a token that is gone, ``consumed``); otherwise
   abandoned (``failed``), and the key stops (a lookup that fails is this
   message's failure too, never the batch's);
7. it publishes an output id that an earlier message published with other
   content, of the batch or recorded by an earlier one (see ``_records``), or
   two outputs of one id and different content: ``refused``, and the earlier
   one stands;
8. its version cannot be stored (over the table's limits): abandoned (``failed``);
9. otherwise processed: a new version, and its outputs.

What a message *is* is judged by the admission's rules (``_admission``), so
a consumer, the Spark job and a direct caller refuse it with one reason.
"""

from __future__ import annotations

from collections.abc import Sequence

from azure.core.exceptions import AzureError

from streamstone_py import EventData, Stream, StreamstoneError

from .._context import HandlerContext
from .._errors import (
    DuplicateOutsideWindowError,
    HandlerError,
    NonDeterministicHandlerError,
    UnreadableStateError,
)
from .._messages._admission import id_refusal, type_refusal
from .._messages._message import Message
from .._outcome import Found, OutcomeKind, Plan, Step
from .._reading import header_state
from .._store import RETAIN_CUT, WATERMARK, OutputRecord
from ._records import OutputIds
from ._rules import Rules, consumed

__all__ = ["Folder", "NotLookedUp", "consumed"]


class Folder(Rules):
    """Folds a key's batches under the :class:`Rules` it was made with."""

    def fold(
        self,
        key: str,
        messages: Sequence[Message],
        stream: Stream,
        stored: dict[str, Found],
        records: dict[str, OutputRecord],
    ) -> Plan:
        """The batch's steps over ``stream``; ``stored`` holds what earlier
        attempts found stored, and gains what this fold finds; ``records``,
        the output id records earlier attempts found stored."""
        return _Fold(self, key, stream, stored, OutputIds(records)).run(messages)

    def stored_original(self, key: str, message: Message) -> Found | None:
        """A stored message's replay (or why it cannot be), or ``None`` if not stored.

        Duplicates are found when the write fails, so a stored message that
        the fold would abandon (a failing handler, a late message) is looked
        up first, and replayed if it is stored. A lookup that fails for
        anything but storage is this message's failure (:class:`NotLookedUp`),
        never its batch's: storage's faults the chunk, as a write's does.
        """
        try:
            if self.replayer.store.find(self.replayer.store.partition(key), message.id) is None:
                return None
            return self.replay_or_error(key, message)
        except (AzureError, StreamstoneError):
            raise
        except Exception as exc:  # a message's data, or a bug: its own outcome
            return NotLookedUp(f"whether message {message.id!r} is stored cannot be told: "
                               f"{type(exc).__name__}: {exc}")  # fmt: skip

    def replay_or_error(self, key: str, message: Message) -> Found:
        try:
            return self.strategy.replay(key, message)
        except HandlerError as exc:
            return exc


class NotLookedUp(HandlerError):
    """A lookup of a message failed: whether it is stored is not known."""


class _Fold:
    """One batch over one header: the running state, version and steps."""

    def __init__(
        self, folder: Folder, key: str, stream: Stream, stored: dict[str, Found], ids: OutputIds
    ):
        self.folder = folder
        self.key = key
        self.stream = stream
        self.stored = stored
        # A header whose state cannot be read fails each message as a handler
        # error would: the key stops, and a stored duplicate is still replayed.
        self.unreadable: UnreadableStateError | None = None
        try:
            self.state = header_state(folder.handler, None if stream.is_transient else stream)
        except UnreadableStateError as exc:
            self.state, self.unreadable = b"", exc
        self.watermark = stream.properties.get(WATERMARK)
        # Retention's marks survive every write: a recorded cut may still be unfinished.
        self.header = {
            k: stream.properties[k] for k in (WATERMARK, RETAIN_CUT) if k in stream.properties
        }
        self.version = stream.version
        self.steps: list[Step] = []
        self.events: list[EventData] = []
        self.seen: dict[str, Step] = {}
        self.stopped: str | None = None
        self.ids = ids
        self.tokens: set[str] = set()  # carried by this batch's messages

    def run(self, messages: Sequence[Message]) -> Plan:
        for message in messages:
            self._step(message)
        return Plan(self.steps, self.events)

    def _step(self, message: Message) -> None:
        if self.stopped is not None:
            return self._abandon(message, HandlerError(self.stopped), stops_key=True,
                                 kind="stopped")  # fmt: skip
        refused = type_refusal(message.type, self.folder.handler.accepts)
        if refused is not None:
            return self._abandon(message, HandlerError(refused), kind="refused")
        earlier = self.seen.get(message.id)
        if earlier is not None:
            outputs = self.folder.strategy.repeated(earlier)
            return self._add(Step(message, "duplicate", earlier.version, outputs))
        refused = id_refusal(message.id, self.folder.replayer.store.handler_name)
        if refused is None:
            refused = self._token_refusal(message)
        if refused is not None:
            return self._abandon(message, HandlerError(refused), kind="refused")
        if self._known(message):
            return None
        self._handle(message)
        return None

    def _token_refusal(self, message: Message) -> str | None:
        token = self.folder.token_of(message)
        if token is None or self.folder.tokens is None:
            return None
        try:
            self.folder.tokens.consume(token)
        except ValueError as exc:
            return f"message {message.id!r} carries a token no row key can hold: {exc}"
        return None

    def _known(self, message: Message) -> bool:
        """Case 4: a message the write found stored, or a late one."""
        found = self.stored.get(message.id)
        token = self.folder.token_of(message)
        if found is None and token is not None and token in self.tokens:
            found = consumed(message)  # another message of the batch carries it: forged
        late = self.folder.late(message, self.watermark) if found is None else None
        if late is not None:
            # Sent before the watermark: a duplicate whose record is kept is
            # still handled as one; only a forgotten id is refused.
            found = self.folder.stored_original(self.key, message)
            if found is None:
                self._abandon(message, late, kind="refused")
                return True
            self.stored[message.id] = found
        if found is None:
            return False
        self._take(message, found, stop_if_nondeterministic=True)
        return True

    def _handle(self, message: Message) -> None:
        """Cases 6 to 8: the handler on the newest state."""
        folder = self.folder
        context = HandlerContext(message, handler=folder.handler.name, now=folder.now())
        try:
            if self.unreadable is not None:
                raise self.unreadable
            after = folder.replayer.invoke(self.state, self.version, message, context)
        except HandlerError as exc:
            found = folder.stored_original(self.key, message)
            if found is None:  # with tokens: a copy whose token is gone, failing on today's state
                found = folder.spent(self.key, message)
            if found is None or isinstance(found, NotLookedUp):
                error = exc if found is None else HandlerError(f"{exc}; and {found}")
                self._abandon(message, error, stops_key=True)
                self.stopped = f"an earlier message of key {self.key!r} failed: {error}"
                return
            self.stored[message.id] = found
            self._take(message, found, stop_if_nondeterministic=False)
            return
        clash = self.ids.clash(message, context.outputs, context.given_ids)
        if clash is not None:
            self._abandon(message, HandlerError(clash), kind="refused")
            return
        records = self.ids.to_record(message, context.outputs, context.given_ids)
        try:
            event = folder.event(self.stream, message, context, after, self.header, records)
        except (ValueError, TypeError) as exc:
            # Its version cannot be stored (a capture, an id or outputs over the
            # table's limits): the same on every delivery, so only it is dropped.
            reason = f"message {message.id!r} cannot be stored: {exc}"
            self._abandon(message, HandlerError(reason))
            return
        self.state = after
        self.version += 1
        self.events.append(event)
        token = folder.token_of(message)
        if token is not None:
            self.tokens.add(token)
        dispatch = folder.strategy.dispatches()
        self._add(
            Step(
                message, "completed", self.version, context.outputs, dispatch=dispatch, tokens=True
            )
        )

    def _take(self, message: Message, found: Found, *, stop_if_nondeterministic: bool) -> None:
        """A stored message's replay as its step (or its error, as abandoned)."""
        if isinstance(found, Step):
            self._add(found)
            return
        if isinstance(found, DuplicateOutsideWindowError):  # retention forgot it: for good
            # Stored, not replayable (keep_last=1 keeps a version without its
            # predecessor): with its token gone, a copy whose outputs went out.
            spent = self.folder.spent(self.key, message)
            if spent is not None:
                self._add(spent)
                return
            self._abandon(message, found, kind="refused")
            return
        stops = stop_if_nondeterministic and isinstance(found, NonDeterministicHandlerError)
        self.steps.append(Step(message, "abandoned", error=found, stops_key=stops))
        if stops:
            self.stopped = f"an earlier message of key {self.key!r} failed: {found}"

    def _add(self, step: Step) -> None:
        self.steps.append(step)
        self.seen[step.message.id] = step
        self.ids.add(step)

    def _abandon(
        self,
        message: Message,
        error: BaseException,
        *,
        stops_key: bool = False,
        kind: OutcomeKind = "failed",
    ) -> None:
        self.steps.append(Step(message, "abandoned", error=error, stops_key=stops_key, kind=kind))
