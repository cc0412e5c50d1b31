"""The processor: every message changes state once and yields the same outputs,
however often it is delivered.

``process_batch(key, messages)`` reads the key's stream once (its header holds
the newest state), folds the messages in memory, writes all new versions in
one conditional transaction (split only when too large; then each
transaction's header holds the state as of its own last message, so a batch
cut short leaves a header that agrees with what is stored), and publishes
last:

- a message already stored is found by the write itself (its id row exists):
  the processor loads the state from just before it was first processed,
  handles it again with the recorded context, checks that the outputs match
  the recorded digest, and republishes them (outbox strategy: it republishes
  the stored outputs if they were not dispatched yet, else nothing);
- a rival writer (another worker with the same key) makes the write fail
  with a conflict before anything is published: reload and fold again,
  keeping what earlier transactions of a split write committed;
- a handler that fails on the newest state may be failing on a duplicate
  whose original is stored: the id is looked up first, and a stored message
  is replayed on the state before its original;
- publishing comes last, so a crash before it leaves a stored state whose
  outputs the redelivered message republishes, and never a published output
  whose state is absent.

``process(message)`` is ``process_batch`` of one message.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Generic, Literal, TypeVar

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient

from streamstone_py import (
    ConcurrencyConflictError,
    DuplicateEventError,
    EventData,
    IncludedOperationConflictError,
    Partition,
    RecordedEvent,
    RetryPolicy,
    Stream,
    StreamSlice,
    StreamstoneError,
    join_binary,
    split_binary,
)

from ._cache import HeaderCache
from ._codec import digest, pack, unpack
from ._context import HandlerContext
from ._errors import (
    DuplicateOutsideWindowError,
    HandlerError,
    HandlerFailedError,
    NonDeterministicHandlerError,
    StateTooLargeError,
)
from ._handler import Handler
from ._lifecycle import Receive, ReceiveState
from ._message import Message
from ._publish import Publisher
from ._store import ID_SCHEME, RETAIN_CUT, STATE, WATERMARK, StateStore, StoredVersion

__all__ = ["KeyState", "KeyVersion", "LoadedState", "Outcome", "Processor", "ProcessorStats"]

S = TypeVar("S")
Strategy = Literal["state", "outbox"]
LateDuplicates = Literal["refuse", "process"]
Dispatch = Literal["after_publish", "by_caller"]
Status = Literal["completed", "duplicate", "abandoned", "faulted"]

#: The largest encoded state one stored version holds (an entity is 1 MiB).
MAX_STATE_BYTES: Final = 1_000_000


@dataclass(frozen=True, slots=True)
class LoadedState(Generic[S]):
    """The state a message is handled on: the newest one, or for a duplicate
    the one from just before its original was processed."""

    state: S
    version: int
    is_duplicate: bool
    original: StoredVersion | None = None


@dataclass(frozen=True, slots=True)
class KeyState(Generic[S]):
    """A key's newest state, and the version that stored it (0: never written)."""

    key: str
    version: int
    state: S


@dataclass(frozen=True, slots=True)
class KeyVersion(Generic[S]):
    """One stored version of a key: the message that made it, and the state after it."""

    version: int
    message_id: str
    message_type: str
    now: datetime
    state: S


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one message: its receive's final state, as a status."""

    message: Message
    status: Status
    version: int | None
    outputs: tuple[Message, ...] = ()
    reason: str | None = None
    error: BaseException | None = field(default=None, compare=False)

    @property
    def message_id(self) -> str:
        return self.message.id


@dataclass(slots=True)
class ProcessorStats:
    """Counters since the processor was made (single-threaded use per processor)."""

    messages: int = 0
    completed: int = 0
    duplicates: int = 0
    abandoned: int = 0
    faulted: int = 0
    outputs: int = 0
    conflicts_retried: int = 0


@dataclass(slots=True)
class _Step:
    message: Message
    status: Status
    version: int | None = None
    outputs: tuple[Message, ...] = ()
    error: BaseException | None = None
    dispatch: bool = False  # outbox: outputs to mark dispatched after publishing


@dataclass(slots=True)
class _Plan:
    steps: list[_Step]
    events: list[EventData]


def _utcnow() -> datetime:
    return datetime.now(UTC)


# --- reading a key, shared by Processor and handlers.aio --------------------------


def header_state(handler: Handler[Any], stream: Stream | None) -> bytes:
    """The encoded state a header holds (the initial state: never written)."""
    if stream is None or f"{STATE}_Parts" not in stream.properties:
        return handler.encode_state(handler.initial_state())
    return join_binary(STATE, stream.properties)


def key_state(handler: Handler[S], key: str, stream: Stream | None) -> KeyState[S]:
    """A key's newest state from its header (``None``: never written)."""
    state = handler.decode_state(header_state(handler, stream))
    return KeyState(key, stream.version if stream is not None else 0, state)


def key_version(handler: Handler[S], event: RecordedEvent) -> KeyVersion[S]:
    stored = StoredVersion.from_event(event)
    message_type = str(event.properties.get("MessageType", ""))
    state = handler.decode_state(stored.state)
    return KeyVersion(stored.version, stored.message_id, message_type, stored.now, state)


def check_page_size(page_size: object) -> None:
    if not isinstance(page_size, int) or isinstance(page_size, bool) or page_size < 1:
        raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")


def next_page(page: StreamSlice, start: int) -> int | None:
    """Where the next page of a history starts (None: this was the last)."""
    if page.is_end_of_stream:
        return None
    # A slice of versions truncated meanwhile is empty: go on from the first kept.
    following = page.events[-1].version + 1 if page.events else page.first_available_version
    return following if following > start else None


class Processor(Generic[S]):
    """Runs one handler over messages with exactly-once effects.

    ``strategy="state"`` (the default) stores a state version per message and
    handles duplicates again on the state before their original; the handler
    must be deterministic (use the context). ``strategy="outbox"`` stores the
    outputs beside the state and replays them; the handler need not be
    deterministic.

    ``dispatch`` (outbox only) says when outputs count as delivered.
    ``"after_publish"`` (the default): once :meth:`Publisher.publish` returns,
    the outbox rows are marked dispatched and their outputs dropped, so a
    later duplicate re-sends nothing. ``"by_caller"``: for a caller whose
    publication becomes final later, or may be discarded (a Spark task's
    output before its job commits): the processor never marks, a duplicate
    always re-sends its stored outputs, and the caller calls
    :meth:`mark_dispatched` once its publication is final (the outputs stay,
    so a rerun can emit them again; retention may then remove the version).

    ``cache`` (a :class:`HeaderCache`, shareable between processors and
    threads) keeps the headers this worker wrote: a key's next batch is
    written conditionally on the cached header without reading it first, and
    a key the cache has not seen is written as a new stream. A refused write
    (another writer moved the stream) drops the entry and reads. Outcomes that
    no write confirms (an abandoned message, a duplicate) are only ever
    decided on a header read in this call.
    """

    def __init__(
        self,
        handler: Handler[S],
        table: TableClient,
        publisher: Publisher,
        *,
        strategy: Strategy = "state",
        clock: Callable[[], datetime] = _utcnow,
        retry: RetryPolicy | None = None,
        max_attempts: int = 10,
        late_duplicates: LateDuplicates = "refuse",
        store: StateStore | None = None,
        dispatch: Dispatch = "after_publish",
        cache: HeaderCache | None = None,
    ) -> None:
        if strategy not in ("state", "outbox"):
            raise ValueError(f"strategy must be 'state' or 'outbox', got {strategy!r}")
        if late_duplicates not in ("refuse", "process"):
            raise ValueError(
                f"late_duplicates must be 'refuse' or 'process', got {late_duplicates!r}"
            )
        if dispatch not in ("after_publish", "by_caller"):
            raise ValueError(f"dispatch must be 'after_publish' or 'by_caller', got {dispatch!r}")
        if not handler.name.isidentifier():
            raise ValueError(f"handler name {handler.name!r} must be an identifier")
        self.handler = handler
        self.publisher = publisher
        self.strategy = strategy
        self.clock = clock
        self.retry = retry or RetryPolicy()
        self.max_attempts = max_attempts
        self.late_duplicates = late_duplicates
        self.dispatch = dispatch
        self.store = store or StateStore(table, handler.name, self.retry)
        self.cache = cache
        self.stats = ProcessorStats()

    def _now(self) -> datetime:
        """The clock in UTC: a replay compares what the first run stored, in UTC."""
        now = self.clock()
        if not isinstance(now, datetime) or now.utcoffset() is None:
            raise ValueError(
                f"the processor's clock returned a naive datetime {now!r}; "
                "give a clock with a time zone, such as lambda: datetime.now(UTC)"
            )
        return now.astimezone(UTC)

    # --- loading --------------------------------------------------------------

    def current_state(self, key: str) -> KeyState[S]:
        """A key's newest state and version, in one round trip (the header).

        A key never written has version 0 and the handler's initial state.
        """
        return key_state(self.handler, key, self.store.open(self.store.partition(key)))

    def history(self, key: str, *, page_size: int = 1000) -> Iterator[KeyVersion[S]]:
        """Every kept version of a key, oldest first, read ``page_size`` at a time.

        Versions that retention removed are not in it; the first one is the
        oldest kept. States are decoded by the current state class.
        """
        check_page_size(page_size)
        partition = self.store.partition(key)
        stream = self.store.open(partition)
        start: int | None = stream.first_version if stream is not None else None
        while start is not None:
            page = self.store.read(partition, start, page_size)
            yield from (key_version(self.handler, event) for event in page.events)
            start = next_page(page, start)

    def load_state(self, key: str, message_id: str) -> LoadedState[S]:
        """The state to handle ``message_id`` on, in at most two round trips.

        New message: the newest state (from the header). Duplicate: the state
        just before its original, and the original's recorded context.
        """
        partition = self.store.partition(key)
        version = self.store.find(partition, message_id)
        if version is None:
            stream = self.store.open(partition)
            state = self.handler.decode_state(header_state(self.handler, stream))
            return LoadedState(state, stream.version if stream else 0, False)
        original, before = self._versions_around(key, message_id, version)
        return LoadedState(self.handler.decode_state(before), version - 1, True, original)

    def _versions_around(
        self, key: str, message_id: str, version: int
    ) -> tuple[StoredVersion, bytes]:
        partition = self.store.partition(key)
        first = max(1, version - 1)
        page = self.store.read(partition, first, version - first + 1)
        found = {e.version: e for e in page.events}
        if version not in found or (version > 1 and version - 1 not in found):
            watermark = page.stream.properties.get(WATERMARK)
            raise DuplicateOutsideWindowError(
                self.handler.name, message_id, "?", str(watermark or "the retention cut")
            )
        original = StoredVersion.from_event(found[version])
        if version == 1:
            before = self.handler.encode_state(self.handler.initial_state())
        else:
            before = StoredVersion.from_event(found[version - 1]).state
        return original, before

    # --- handling --------------------------------------------------------------

    def _invoke(self, state_bytes: bytes, message: Message, context: HandlerContext) -> bytes:
        state = self.handler.decode_state(state_bytes)
        try:
            new_state = self.handler.apply(state, message, context)
            encoded = self.handler.encode_state(new_state)
        except HandlerError:
            raise
        except Exception as exc:
            raise HandlerFailedError(self.handler.name, message.id, exc) from exc
        if len(encoded) > MAX_STATE_BYTES:
            raise StateTooLargeError(self.handler.name, message.id, len(encoded), MAX_STATE_BYTES)
        return encoded

    def _replay(self, key: str, message: Message) -> _Step:
        """A message found stored: its outputs again, checked against the original."""
        partition = self.store.partition(key)
        if self.strategy == "outbox":
            return self._replay_outbox(key, message)
        version = self.store.find(partition, message.id)
        if version is None:  # truncated between the write and now
            raise DuplicateOutsideWindowError(self.handler.name, message.id, "?", "retention")
        original, before = self._versions_around(key, message.id, version)
        return self._replay_state(message, original, before)

    def _replay_outbox(self, key: str, message: Message) -> _Step:
        record = self.store.outbox(self.store.partition(key), message.id)
        if record is None:
            raise DuplicateOutsideWindowError(self.handler.name, message.id, "?", "retention")
        if record.outputs is None or (record.dispatched and self.dispatch == "after_publish"):
            return _Step(message, "duplicate")
        outputs = tuple(Message.decode(o) for o in unpack(record.outputs))
        return _Step(message, "duplicate", outputs=outputs, dispatch=True)

    def _replay_state(self, message: Message, original: StoredVersion, before: bytes) -> _Step:
        context = HandlerContext(
            message,
            handler=self.handler.name,
            now=original.now,
            captures=original.captures,
            replay=True,
            id_scheme=original.id_scheme,
        )
        try:
            after = self._invoke(before, message, context)
        except HandlerFailedError as exc:
            raise NonDeterministicHandlerError(
                self.handler.name, message.id, f"it raised {exc.__cause__!r} this time"
            ) from exc
        outputs = context.outputs
        if digest(pack([o.encode() for o in outputs])) != original.digest:
            raise NonDeterministicHandlerError(
                self.handler.name, message.id, "output digest differs"
            )
        # Both through the current state class: a field added with a default, or
        # removed, since the original was stored is not a difference in behaviour.
        if after != original.state and after != self._current(original.state):
            raise NonDeterministicHandlerError(self.handler.name, message.id, "new state differs")
        return _Step(message, "duplicate", version=original.version, outputs=outputs)

    def _current(self, state: bytes) -> bytes:
        return self.handler.encode_state(self.handler.decode_state(state))

    def _stored_original(self, key: str, message: Message) -> _Step | BaseException | None:
        """A message whose handler failed on the newest state: is it a duplicate?

        Duplicates are found when the write fails, so a stored message whose
        handler now fails (its original's effects changed the state) is
        looked up before it is abandoned, and replayed if it is stored.
        """
        if self.store.find(self.store.partition(key), message.id) is None:
            return None
        return self._replay_or_error(key, message)

    @staticmethod
    def _stored_step(message: Message, found: _Step | BaseException) -> _Step:
        return found if isinstance(found, _Step) else _Step(message, "abandoned", error=found)

    def _replay_window(
        self, key: str, unresolved: Sequence[Message], anchor: str
    ) -> dict[str, _Step | BaseException]:
        """Resolve the duplicates of a batch together, starting from one found stored.

        A redelivered batch's originals are usually consecutive versions: one
        read of the versions from the anchor's predecessor on finds all those
        that lie there (each with the state before it), so a whole redelivered
        batch costs two round trips instead of several per message.
        """
        partition = self.store.partition(key)
        results: dict[str, _Step | BaseException] = {}
        if self.strategy == "outbox":
            # The outbox row itself says whether a message is stored: probe each.
            for message in unresolved:
                try:
                    results[message.id] = self._replay_outbox(key, message)
                except DuplicateOutsideWindowError as exc:
                    if message.id == anchor:
                        results[message.id] = exc
                    # no row: not stored, so it is new
            return results
        version = self.store.find(partition, anchor)
        if version is None:
            results[anchor] = DuplicateOutsideWindowError(
                self.handler.name, anchor, "?", "retention"
            )
            return results
        start = max(1, version - 1)
        count = min(len(unresolved) + 1, 1000)
        page = self.store.read(partition, start, count)
        events = {e.id: e for e in page.events if e.id is not None}
        by_version = {e.version: e for e in page.events}
        initial = self.handler.encode_state(self.handler.initial_state())
        for message in unresolved:
            event = events.get(message.id)
            if event is None:
                continue
            try:
                previous = by_version.get(event.version - 1)
                if event.version == 1:
                    before = initial
                elif previous is not None:
                    before = StoredVersion.from_event(previous).state
                else:  # the predecessor lies before the window or was truncated
                    _, before = self._versions_around(key, message.id, event.version)
                step = self._replay_state(message, StoredVersion.from_event(event), before)
                results[message.id] = step
            except HandlerError as exc:
                results[message.id] = exc
        if anchor not in results:  # truncated between the find and the read
            results[anchor] = DuplicateOutsideWindowError(
                self.handler.name, anchor, "?", "retention"
            )
        return results

    def _late(self, message: Message, watermark: Any) -> DuplicateOutsideWindowError | None:
        sent_at = message.headers.get("sent_at")
        if (
            self.late_duplicates != "refuse"
            or sent_at is None
            or not isinstance(watermark, datetime)
        ):
            return None
        try:
            sent = datetime.fromisoformat(sent_at)
        except ValueError:
            sent = None
        if sent is None or sent.tzinfo is None:
            return DuplicateOutsideWindowError(
                self.handler.name, message.id, repr(sent_at), "an unreadable sent_at header"
            )
        if sent <= watermark:
            return DuplicateOutsideWindowError(
                self.handler.name, message.id, sent.isoformat(), watermark.isoformat()
            )
        return None

    def _fold(
        self,
        key: str,
        messages: Sequence[Message],
        stream: Stream,
        stored: dict[str, _Step | BaseException],
    ) -> _Plan:
        state = header_state(self.handler, stream if not stream.is_transient else None)
        watermark = stream.properties.get(WATERMARK)
        # Retention's marks survive every write: a recorded cut may still be unfinished.
        header = {
            k: stream.properties[k] for k in (WATERMARK, RETAIN_CUT) if k in stream.properties
        }
        version = stream.version
        steps: list[_Step] = []
        events: list[EventData] = []
        seen: dict[str, _Step] = {}
        stopped: str | None = None
        for message in messages:
            if stopped is not None:
                steps.append(_Step(message, "abandoned", error=HandlerError(stopped)))
                continue
            if not self.handler.accepts(message.type):
                reason = f"handler {self.handler.name!r} does not handle type {message.type!r}"
                steps.append(_Step(message, "abandoned", error=HandlerError(reason)))
                continue
            earlier = seen.get(message.id)
            if earlier is not None:  # a duplicate inside this batch
                outputs = earlier.outputs if self.strategy == "state" else ()
                steps.append(_Step(message, "duplicate", earlier.version, outputs))
                continue
            found = stored.get(message.id)
            late = self._late(message, watermark) if found is None else None
            if late is not None:
                # Sent before the watermark: a duplicate whose record is kept is
                # still handled as one; only a forgotten id is refused.
                found = self._stored_original(key, message)
                if found is None:
                    steps.append(_Step(message, "abandoned", error=late))
                    continue
                stored[message.id] = found
            if found is not None:
                step = self._stored_step(message, found)
                steps.append(step)
                if isinstance(found, NonDeterministicHandlerError):
                    stopped = f"an earlier message of key {key!r} failed: {found}"
                elif isinstance(found, _Step):
                    seen[message.id] = step
                continue
            try:
                EventData(id=message.id)  # the id must be storable as a row key
            except ValueError as exc:
                reason = f"message id {message.id!r} cannot be stored: {exc}"
                steps.append(_Step(message, "abandoned", error=HandlerError(reason)))
                continue
            context = HandlerContext(message, handler=self.handler.name, now=self._now())
            try:
                after = self._invoke(state, message, context)
            except HandlerError as exc:
                found = self._stored_original(key, message)
                if found is None:
                    steps.append(_Step(message, "abandoned", error=exc))
                    stopped = f"an earlier message of key {key!r} failed: {exc}"
                    continue
                stored[message.id] = found
                steps.append(self._stored_step(message, found))
                if isinstance(found, _Step):
                    seen[message.id] = found
                continue
            try:
                event = self._event(stream, message, context, after, header)
            except (ValueError, TypeError) as exc:
                # Its version cannot be stored (a capture, an id or outputs over the
                # table's limits): the same on every delivery, so only it is dropped.
                reason = f"message {message.id!r} cannot be stored: {exc}"
                steps.append(_Step(message, "abandoned", error=HandlerError(reason)))
                continue
            state = after
            version += 1
            events.append(event)
            outputs = context.outputs
            step = _Step(message, "completed", version, outputs, dispatch=self.strategy == "outbox")
            steps.append(step)
            seen[message.id] = step
        return _Plan(steps, events)

    def _event(
        self,
        stream: Stream,
        message: Message,
        context: HandlerContext,
        state: bytes,
        header: dict[str, Any],
    ) -> EventData:
        """The stored version of a processed message, checked against the table's
        limits and against what the publisher can deliver."""
        self._check_outputs(context.outputs)
        encoded_outputs = pack([o.encode() for o in context.outputs])
        properties: dict[str, Any] = {
            "MessageType": message.type,
            "Now": context.now(),
            "Digest": digest(encoded_outputs),
            ID_SCHEME: context.id_scheme,
            **split_binary(STATE, state),
        }
        if context.captures:
            properties["Captures"] = pack(context.captures)
        includes = []
        if self.strategy == "outbox":
            includes.append(
                self.store.outbox_include(message.id, split_binary("Outputs", encoded_outputs))
            )
        event = EventData(
            id=message.id,
            properties=properties,
            includes=includes,
            stream_properties={**header, **split_binary(STATE, state)},
        )
        Stream.check_write(stream, event)
        return event

    def _check_outputs(self, outputs: Sequence[Message]) -> None:
        check = getattr(self.publisher, "check", None)
        seen: dict[str, Message] = {}
        for output in outputs:
            earlier = seen.setdefault(output.id, output)
            if earlier is not output and earlier.encode() != output.encode():
                raise ValueError(f"two outputs have the id {output.id!r} and different content")
            if check is not None:
                check(output)

    # --- processing ------------------------------------------------------------

    def process(self, message: Message) -> Outcome:
        """Handle one message; see :meth:`process_batch`.

        Raises :class:`NonDeterministicHandlerError` when a duplicate does not
        reproduce its original's outputs (nothing is published then).
        """
        (outcome,) = self.process_batch(message.key, [message])
        if isinstance(outcome.error, NonDeterministicHandlerError):
            raise outcome.error
        return outcome

    def process_batch(self, key: str, messages: Sequence[Message]) -> list[Outcome]:
        """Handle a key's messages in order: one read (none with a warm
        :class:`HeaderCache`), one write, then publish.

        Gives the same states and outputs as processing them one by one. A
        handler error abandons that message and the key's later messages of
        this batch (they are reported, not lost: deliver them again); storage
        or publishing failures fault the messages not yet completed.
        """
        for message in messages:
            if message.key != key:
                raise ValueError(f"message {message.id!r} has key {message.key!r}, not {key!r}")
        partition = self.store.partition(key)  # ValueError for a key the table cannot store
        receives = [Receive(m.id) for m in messages]
        self.stats.messages += len(messages)
        stored: dict[str, _Step | BaseException] = {}
        conflicts = 0
        cache = self.cache
        cached = cache.get(partition) if cache is not None else None
        # A key the cache has not seen: learn once whether it was new.
        unseen = cache is not None and cached is None

        def learned(new: bool) -> None:
            nonlocal unseen
            if unseen and cache is not None:
                cache.guessed(new)
                unseen = False

        # The header to write on without reading: cached, or a new stream.
        guess = cached
        if unseen and cache is not None and cache.guess_new():
            guess = Stream(partition)
        read: Stream | None = None  # a header the engine read after a conflict
        try:
            while True:
                if guess is not None:
                    stream = guess
                else:
                    stream = self._open(partition) if read is None else self._seen(read)
                    read = None
                    learned(stream.is_transient)
                plan = self._fold(key, messages, stream, stored)
                if guess is not None and not self._confirmed_by_write(plan):
                    guess = None  # decide these outcomes on the stored header
                    continue
                if not plan.events:
                    break
                try:
                    written = self.store.write(stream, plan.events)
                    learned(stream.is_transient)
                    if cache is not None:
                        cache.put(written.stream)
                    break
                except ConcurrencyConflictError as exc:
                    self._keep_committed(exc, plan, stored)
                    read = exc.current
                    if guess is not None:  # the guess was stale: not a rival's conflict
                        assert cache is not None
                        learned(False)
                        cache.refused(partition)
                        continue
                    conflicts += 1
                    self.stats.conflicts_retried += 1
                    if conflicts >= self.max_attempts:
                        raise
                    time.sleep(self.retry.delay(conflicts))
                    read = None  # after the pause, read afresh
                except DuplicateEventError as exc:
                    # Stored before (an earlier delivery or a rival): resolve it and
                    # the batch's other stored messages as duplicates.
                    self._keep_committed(exc, plan, stored)
                    unresolved = list({m.id: m for m in messages if m.id not in stored}.values())
                    stored.update(self._replay_window(key, unresolved, exc.id))
                except IncludedOperationConflictError as exc:
                    self._keep_committed(exc, plan, stored)
                    found = self._outbox_owner(key, messages, exc)
                    if found is None:
                        raise
                    stored[found.id] = self._replay_or_error(key, found)
                finally:
                    guess = None  # after a refused write, the stored header decides
        except (AzureError, StreamstoneError) as exc:
            if cache is not None:
                cache.drop(partition)  # in doubt: the next batch reads first
            return self._finish(messages, receives, None, exc)
        publish = [o for step in plan.steps for o in step.outputs]
        try:
            if publish:
                self.publisher.publish(publish)
            dispatched = [s.message.id for s in plan.steps if s.dispatch]
            if dispatched and self.dispatch == "after_publish":
                self.store.mark_dispatched(partition, dispatched)
        except Exception as exc:  # in doubt: some outputs may be out; redelivery republishes
            return self._finish(messages, receives, plan, exc)
        return self._finish(messages, receives, plan, None)

    def _open(self, partition: Partition) -> Stream:
        """The stored header (or a new stream), and the cache told of it."""
        stream = self.store.open(partition)
        if self.cache is None:
            return stream or Stream(partition)
        if stream is None:
            self.cache.drop(partition)
            return Stream(partition)
        self.cache.put(stream)
        return stream

    def _seen(self, stream: Stream) -> Stream:
        if self.cache is not None:
            self.cache.put(stream)
        return stream

    @staticmethod
    def _confirmed_by_write(plan: _Plan) -> bool:
        """Whether the plan's write, if it succeeds, proves every outcome right.

        A conditional write succeeds only on the header the plan folded over,
        so completed messages (and their copies inside the batch) are right.
        Anything else was decided without a write, on a header that may be
        stale: an abandoned message, a duplicate of a stored one.
        """
        if not plan.events:
            return False
        done = {s.message.id for s in plan.steps if s.status == "completed"}
        return all(
            s.status == "completed" or (s.status == "duplicate" and s.message.id in done)
            for s in plan.steps
        )

    def mark_dispatched(self, key: str, message_ids: Sequence[str]) -> None:
        """Mark these messages' outbox outputs delivered (``dispatch="by_caller"``).

        Call it once the publication of their outputs is final. Ids without an
        outbox row (removed by retention, or never stored) are skipped. Under
        the state strategy there is nothing to mark.
        """
        if self.strategy != "outbox":
            return
        self.store.mark_dispatched(
            self.store.partition(key), message_ids, keep_outputs=self.dispatch == "by_caller"
        )

    @staticmethod
    def _keep_committed(
        error: DuplicateEventError | ConcurrencyConflictError | IncludedOperationConflictError,
        plan: _Plan,
        stored: dict[str, _Step | BaseException],
    ) -> None:
        """Earlier transactions of a split write committed: those messages are done.

        Their header holds the state after them, so the next fold starts there
        and reports them as completed by this call, with their outputs.
        """
        if error.committed is None:
            return
        ids = {e.id for e in error.committed.events}
        for step in plan.steps:
            if step.status == "completed" and step.message.id in ids:
                stored[step.message.id] = step

    def _outbox_owner(
        self, key: str, messages: Sequence[Message], error: IncludedOperationConflictError
    ) -> Message | None:
        """The message whose outbox row already exists, if that is what failed.

        An outbox row outlives its version when retention was interrupted by an
        older release: its message was processed, so it is a duplicate.
        """
        if self.strategy != "outbox" or error.operation != "insert":
            return None
        row_key = error.entity.get("RowKey")
        for message in messages:
            if self.store.outbox_row_key(message.id) == row_key:
                return message
        return None

    def _replay_or_error(self, key: str, message: Message) -> _Step | BaseException:
        try:
            return self._replay(key, message)
        except HandlerError as exc:
            return exc

    def _finish(
        self,
        messages: Sequence[Message],
        receives: list[Receive],
        plan: _Plan | None,
        fault: BaseException | None,
    ) -> list[Outcome]:
        outcomes = []
        steps = plan.steps if plan is not None else [_Step(m, "faulted") for m in messages]
        for step, receive in zip(steps, receives, strict=True):
            if fault is not None and step.status != "abandoned":
                receive.fault(f"{type(fault).__name__}: {fault}")
                outcome = Outcome(
                    step.message, "faulted", step.version, step.outputs, receive.reason, fault
                )
            elif step.status == "abandoned":
                receive.abandon(str(step.error))
                outcome = Outcome(step.message, "abandoned", None, (), receive.reason, step.error)
            else:
                receive.complete()
                outcome = Outcome(step.message, step.status, step.version, step.outputs)
            assert receive.state in (
                ReceiveState.COMPLETED,
                ReceiveState.ABANDONED,
                ReceiveState.FAULTED,
            )
            outcomes.append(outcome)
            self.stats.outputs += len(outcome.outputs) if outcome.status != "faulted" else 0
            if outcome.status == "completed":
                self.stats.completed += 1
            elif outcome.status == "duplicate":
                self.stats.duplicates += 1
            elif outcome.status == "abandoned":
                self.stats.abandoned += 1
            else:
                self.stats.faulted += 1
        return outcomes

    # --- retention ------------------------------------------------------------

    def retain(
        self, key: str, *, keep_last: int | None = None, older_than: timedelta | None = None
    ) -> int:
        """Remove old versions of a key's stream; the newest state always stays.

        ``keep_last=N`` answers the duplicates of the last ``N`` messages, and
        ``older_than`` those of every message processed less than that long
        ago (either bound alone, or both: a version stays if either keeps it).
        The state strategy replays a duplicate on the state before its
        original, so it also keeps the version before the oldest one answered
        (a duplicate of that version itself is refused as outside the window).
        The outbox strategy never removes a version whose outputs were not
        dispatched yet, nor any version after it. Outbox rows of removed
        versions go first, then the versions (``Stream.truncate``).

        Returns how many versions this call removed. The cut is recorded in
        the header (``RetainCut``) before anything is removed, and a later
        call finishes a recorded cut whatever its own bounds: an interrupted
        call is finished by calling again, with any arguments. Ids of removed
        versions no longer detect duplicates: the header's ``Watermark``
        records the newest removed ``Now``, and a message whose ``sent_at``
        header is not after it is refused (``late_duplicates="refuse"``) or
        handled as new.
        """
        if keep_last is None and older_than is None:
            raise ValueError("give keep_last, older_than, or both")
        if keep_last is not None and (
            not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 0
        ):
            raise ValueError(f"keep_last must be an int >= 0, got {keep_last!r}")
        if older_than is not None and (
            not isinstance(older_than, timedelta) or older_than < timedelta(0)
        ):
            raise ValueError(f"older_than must be a timedelta >= 0, got {older_than!r}")
        partition = self.store.partition(key)
        if self.cache is not None:
            self.cache.drop(partition)  # the header changes below; put back at the end
        stream = self.store.open(partition)
        if stream is None:
            return 0
        first = stream.first_version
        removed = self._removable(key, stream, keep_last, older_than)
        if removed:
            cut = removed[-1].version + 1
            stream = self._record_cut(stream, max(r.now for r in removed), cut)
            if self.strategy == "outbox":
                # Before the versions: once their ids are gone, these rows could
                # no longer be found, and would outlive them.
                self.store.delete_outbox(partition, [r.message_id for r in removed])
        else:
            cut = first
        if cut > 1:
            # Also sweeps what an interrupted call left below the header's cut.
            stream = self.store.truncate(stream, max(cut, stream.first_version))
        if self.cache is not None:
            self.cache.put(stream)  # the header as this call left it
        return len(removed)

    def _removable(
        self,
        key: str,
        stream: Stream,
        keep_last: int | None,
        older_than: timedelta | None,
    ) -> list[StoredVersion]:
        """The versions retention may remove now, oldest first: ``[first, cut)``.

        An earlier call that was interrupted may have recorded a higher cut
        (and removed outbox rows below it): that cut is finished whatever this
        call's bounds, so no kept version is left without its outbox row.
        """
        first = stream.first_version
        cut = stream.version + 1
        if keep_last is not None:
            cut = min(cut, max(first, stream.version - keep_last + 1))
        recorded = stream.properties.get(RETAIN_CUT)
        started = recorded if isinstance(recorded, int) and first < recorded else first
        started = min(started, stream.version + 1)
        upper = max(cut, started)
        if upper <= first:
            return []
        partition = self.store.partition(key)
        page = self.store.read(partition, first, upper - first)
        candidates = [StoredVersion.from_event(e) for e in page.events]
        if older_than is not None:
            limit = self._now() - older_than
            young = [r.version for r in candidates if r.now >= limit]
            if young:
                cut = min(cut, min(young))
        if self.strategy == "state" and cut <= stream.version:
            cut -= 1  # the oldest answered duplicate is replayed on this version's state
        if self.strategy == "outbox" and candidates:
            pending = self.store.undispatched(partition)
            held = [r.version for r in candidates if r.message_id in pending]
            if held:
                cut = min(cut, min(held))
        cut = max(cut, started)
        return [r for r in candidates if r.version < cut]

    def _record_cut(self, stream: Stream, watermark: datetime, cut: int) -> Stream:
        """Store the watermark and the cut in the header before removing anything."""
        partition = stream.partition
        while True:
            previous = stream.properties.get(WATERMARK)
            recorded = stream.properties.get(RETAIN_CUT)
            changes: dict[str, Any] = {}
            if not isinstance(previous, datetime) or previous < watermark:
                changes[WATERMARK] = watermark
            if not isinstance(recorded, int) or recorded < cut:
                changes[RETAIN_CUT] = cut
            if not changes:
                return stream
            try:
                return self.store.set_properties(stream, {**stream.properties, **changes})
            except ConcurrencyConflictError:
                reopened = self.store.open(partition)
                assert reopened is not None
                stream = reopened
