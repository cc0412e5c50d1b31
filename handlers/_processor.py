"""The processor: every message changes state once and yields the same outputs,
however often it is delivered.

``process_batch(key, messages)`` reads the key's stream once (its header holds
the newest state), folds the messages in memory, writes all new versions in
one conditional transaction (split only when too large: each transaction's
header then holds the state as of its own last message), and publishes last:

- a message already stored is found by the write itself (its id row exists):
  the processor loads the state from just before it was first processed,
  handles it again with the recorded context, checks that the outputs match
  the recorded digest, and republishes them (outbox strategy: it republishes
  the stored outputs if they were not dispatched yet, else nothing);
- a rival writer makes the write fail with a conflict before anything is
  published: reload and fold again, keeping what a split write committed;
- a handler that fails on the newest state may be failing on a duplicate
  whose original is stored: the id is looked up first, and a stored message
  is replayed on the state before its original;
- publishing comes last, so a crash before it leaves a stored state whose
  outputs the redelivered message republishes, and never a published output
  whose state is absent.

It reads as the seed's LoadState (``_cache.BatchHeader``), invoke (``_fold``
through ``_replay``), StoreState and Publish; ``_strategy`` holds what the two
strategies do differently, ``_retention`` removes old versions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

from azure.core.exceptions import AzureError
from azure.data.tables import TableClient

from streamstone_py import Partition, RetryPolicy, StreamstoneError

from ._batch._replay import Replayer
from ._batch._strategy import strategy_of
from ._batch._token_receivers import TokenReceiver, tokens_of
from ._batch._tracing import BatchSpans, processing
from ._batch._writing import store_batch
from ._cache import HeaderCache
from ._compression import Compression
from ._errors import NonDeterministicHandlerError
from ._handler import Handler
from ._messages._message import Message
from ._messages._tracing import TraceContext, check_trace_context
from ._outcome import (
    Dispatch,
    LateDuplicates,
    LoadedState,
    Outcome,
    Plan,
    ProcessorStats,
    Step,
    StrategyName,
    checked_now,
    held,
    outcome_of,
    utcnow,
)
from ._publish import Publisher
from ._reading import KeyReader, decode_state, key_state
from ._retention import retain
from ._store import StateStore

__all__ = ["Processor", "TokenReceiver"]

S = TypeVar("S")
_log = logging.getLogger(__name__)


class Processor(KeyReader[S]):
    """Runs one handler over messages with exactly-once effects.

    ``strategy="state"`` (the default) stores a state version per message and
    handles duplicates again on the state before their original; the handler
    must be deterministic (use the context). ``strategy="outbox"`` stores the
    outputs beside the state and replays them; the handler need not be
    deterministic.

    ``dispatch`` (outbox, and tokens' checkpoints) says when outputs count as delivered.
    ``"after_publish"`` (the default): once :meth:`Publisher.publish` returns,
    the outbox rows are marked dispatched and their outputs dropped, so a
    later duplicate re-sends nothing. ``"by_caller"``: for a caller whose
    publication becomes final later, or may be discarded (a Spark task's
    output before its job commits): the processor never marks, a duplicate
    always re-sends its stored outputs, and the caller calls
    :meth:`mark_dispatched` once its publication is final (the outputs stay,
    so a rerun can emit them again; retention may then remove the version).

    ``cache`` (a :class:`HeaderCache`, shareable between processors and
    threads): a key's next batch is written conditionally on its cached
    header without reading first, and a key not seen is written as a new
    stream; a refused write drops the entry and reads. Outcomes no write
    confirms (abandoned, duplicate) are only decided on a header read.
    ``compression="zlib"`` stores new states and outbox outputs compressed
    (when smaller); reads take both forms, whatever the setting.
    ``max_batch``: a :meth:`process_batch` of more messages is folded,
    written and published in consecutive chunks of at most this many.
    ``tokens=True`` (state strategy; the handler names its ``types``): an
    output of a type the handler takes is a message to one of its own keys in
    this table, and carries a token that the receiver's write consumes, so a
    copy of it is dropped however late it comes (see ``_batch/_tokens``);
    with ``"by_caller"``, retention keeps a sender's version until marked.
    Whatever ``tokens`` says, a message carrying a token for this handler
    consumes it, so workers can turn tokens on one at a time.
    ``token_receivers``: output types that other handlers take, each with
    its :class:`TokenReceiver` (the handler's name and states table): with
    ``tokens=True`` their tokens are made there (keep them while turning
    tokens off: a duplicate finishes what its version promised).
    ``trace_context``: what the trace context in a message's headers is to
    the spans made for it (see docs/observability.md): their ``"parent"``
    (the default), or a ``"link"`` from spans in the caller's context.

    Threads may call :meth:`process_batch` at once if the publisher is thread-safe.
    """

    def __init__(
        self,
        handler: Handler[S],
        table: TableClient,
        publisher: Publisher,
        *,
        strategy: StrategyName = "state",
        clock: Callable[[], datetime] = utcnow,
        retry: RetryPolicy | None = None,
        max_attempts: int = 10,
        late_duplicates: LateDuplicates = "refuse",
        store: StateStore | None = None,
        dispatch: Dispatch = "after_publish",
        cache: HeaderCache | None = None,
        compression: Compression = None,
        max_batch: int = 500,
        tokens: bool = False,
        trace_context: TraceContext = "parent",
        token_receivers: Mapping[str, TokenReceiver] | None = None,
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
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
        self.max_batch = max_batch
        self.trace_context = check_trace_context(trace_context)
        self.handler = handler
        self.publisher = publisher
        self.clock = clock
        self.retry = retry or RetryPolicy()
        self.max_attempts = max_attempts
        self.late_duplicates = late_duplicates
        self.store = store or StateStore(table, handler.name, self.retry, compression)
        self.cache = cache
        self.stats = ProcessorStats()
        self._counting = threading.Lock()  # keys may be processed from several threads
        self._strategy = strategy_of(strategy, Replayer(handler, self.store), dispatch)
        #: The token steps: a receiver's whatever ``tokens`` says, a sender's with it.
        self._tokens = tokens_of(handler, self.store, strategy, dispatch, tokens, token_receivers)

    @property
    def tokens(self) -> bool:
        """Whether outputs to the handler's own keys carry tokens, as given."""
        return self._tokens.sends

    @property
    def strategy(self) -> StrategyName:
        """``"state"`` or ``"outbox"``, as given."""
        return self._strategy.name

    @property
    def dispatch(self) -> Dispatch:
        """When outbox outputs count as delivered, as given."""
        return self._strategy.dispatch

    def _now(self) -> datetime:
        return checked_now(self.clock)

    # --- reading ----------------------------------------------------------------

    def load_state(self, key: str, message_id: str) -> LoadedState[S]:
        """The state to handle ``message_id`` on, in at most two round trips.

        New message: the newest state (from the header). Duplicate: the state
        just before its original, and the original's recorded context.
        """
        partition = self.store.partition(key)
        version = self.store.find(partition, message_id)
        if version is None:
            newest = key_state(self.handler, key, self.store.open(partition))
            return LoadedState(newest.state, newest.version, False)
        replayer = self._strategy.replayer
        original, before = replayer.versions_around(key, message_id, version)
        return LoadedState(
            decode_state(self.handler, key, version - 1, before), version - 1, True, original
        )

    # --- processing ---------------------------------------------------------------

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
        :class:`HeaderCache`), one write, then publish, per ``max_batch``
        messages.

        Gives the same states and outputs as processing them one by one. A
        handler error abandons that message and the key's later messages of
        this call (they are reported, not lost: deliver them again); a storage
        or publishing failure faults its chunk, and the key's later messages
        are abandoned. Whatever the chunk size, the same messages apply.
        """
        for message in messages:
            if message.key != key:
                raise ValueError(f"message {message.id!r} has key {message.key!r}, not {key!r}")
        partition = self.store.partition(key)  # ValueError for a key the table cannot store
        with self._counting:
            self.stats.messages += len(messages)
        outcomes: list[Outcome] = []
        stopped: Outcome | None = None
        with processing(self.handler.name, key, messages, self.trace_context) as spans:
            for start in range(0, len(messages), self.max_batch):
                chunk = messages[start : start + self.max_batch]
                if stopped is not None:  # as inside one chunk: the rest waits for the failed one
                    plan = Plan([held(m, stopped) for m in chunk], [])
                    outcomes += self._finish(chunk, plan, None)
                    continue
                done = self._chunk(key, partition, chunk, spans)
                stopped = next((o for o in done if o.stops_key), None)
                outcomes += done
            spans.tell(outcomes)
        return outcomes

    def _chunk(
        self, key: str, partition: Partition, messages: Sequence[Message], spans: BatchSpans
    ) -> list[Outcome]:
        try:
            plan = store_batch(self, key, partition, messages)
        except (AzureError, StreamstoneError) as exc:
            if self.cache is not None:
                self.cache.drop(partition)  # in doubt: the next batch reads first
            return self._finish(messages, None, exc)
        except BaseException:
            if self.cache is not None:
                self.cache.drop(partition)  # an entry never outlives a failure it took part in
            raise
        try:
            # After the state, before the outputs: their tokens (see _batch/_tokens).
            tokens = self._tokens
            sending = tokens.before_dispatch(partition, plan)
            with spans.publishing(plan.steps, getattr(self.publisher, "check", None)) as publish:
                if publish:
                    self.publisher.publish(publish)
            dispatched = [s.message.id for s in plan.steps if s.dispatch]
            if dispatched and self.dispatch == "after_publish":
                self.store.mark_dispatched(partition, dispatched)
            if sending is not None:
                tokens.after_dispatch(sending)
            tokens.published(partition, plan, sending)
        except Exception as exc:  # in doubt: some outputs may be out; redelivery republishes
            return self._finish(messages, plan, exc)
        return self._finish(messages, plan, None)

    def mark_dispatched(self, key: str, message_ids: Sequence[str]) -> None:
        """Mark these messages' outbox outputs delivered (``dispatch="by_caller"``).

        Call it once the publication of their outputs is final. Ids without an
        outbox row (removed by retention, or never stored) are skipped. Under
        the state strategy, the token checkpoints of those that sent tokens
        are marked, and those of messages that consumed a token and have
        outputs deleted (one query: pass only such messages): retention waits
        for it."""
        partition = self.store.partition(key)
        self._strategy.mark_dispatched(partition, message_ids)
        if self.strategy == "state" and message_ids:
            self._tokens.mark(partition, message_ids)

    def _finish(
        self, messages: Sequence[Message], plan: Plan | None, fault: BaseException | None
    ) -> list[Outcome]:
        steps = plan.steps if plan is not None else [Step(m, "faulted") for m in messages]
        outcomes = [outcome_of(step, fault) for step in steps]
        for outcome in outcomes:
            if outcome.kind == "consumed":
                _log.info("message %r of key %r dropped: %s", outcome.message_id,
                          outcome.message.key, outcome.reason)  # fmt: skip
        with self._counting:
            for outcome in outcomes:
                self.stats.count(outcome)
        return outcomes

    # --- retention ------------------------------------------------------------------

    def retain(
        self,
        key: str,
        *,
        keep_last: int | None = None,
        older_than: timedelta | None = None,
        keep_from: int | None = None,
        at_least: int = 1,
    ) -> int:
        """Remove old versions of a key's stream; the newest state always stays.

        ``keep_last=N`` answers the duplicates of the last ``N`` messages,
        ``older_than`` those processed less than that long ago (a version
        stays if either bound keeps it); ``keep_from`` keeps that version and
        every later one (a Spark task passes the oldest version its batch
        touched: a retry delivers the same messages again). The state strategy
        also keeps the version before the oldest one answered (it replays a
        duplicate on it); the outbox strategy keeps every version from the
        first with undispatched outputs, and removes outbox rows first.
        ``at_least=N`` waits until N versions can go: fewer, larger cuts.

        Returns how many versions it removed. The cut is recorded in the
        header (``RetainCut``) first; any later call finishes an interrupted
        one. Removed ids no longer detect duplicates: the ``Watermark`` holds
        the newest removed ``Now``, and a message whose ``sent_at`` is not
        after it is refused (``late_duplicates="refuse"``) or handled as new.
        No request is made when a :class:`HeaderCache` shows too little to
        remove under ``keep_last`` alone. With tokens, a version whose
        outputs' tokens were not dispatched yet stays (and the one before it),
        and a removed version's checkpoint goes with it.
        """
        return retain(
            self._strategy, self.cache, self._now, key, keep_last, older_than, keep_from,
            at_least, self._tokens,
        )  # fmt: skip
