"""The code that runs on executors: one table client per Python worker, and a
partition's messages handed key by key to the handlers runtime."""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from azure.core.exceptions import AzureError
from pyspark.sql.types import (
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from handlers import (
    TOKEN_HEADER,
    HandlerFailedError,
    InMemoryPublisher,
    Message,
    Outcome,
    Processor,
    process_until_settled,
)
from streamstone_py import StreamstoneError

from .._logs import configure as configure_logging
from .._settings import JobSettings, resolve_handler
from . import _telemetry, _worker
from ._rows import body_json, parse_row, raw_input
from ._worker import table_client

__all__ = [
    "OUTCOME",
    "OUTPUT",
    "RESULT_SCHEMA",
    "RETENTION",
    "TASK",
    "FailFastError",
    "mark_partition",
    "process_partition",
    "result_row",
]  # fmt: skip

OUTPUT = "output"
OUTCOME = "outcome"
#: One row per key retention ran for: ``version`` holds how many versions it removed.
RETENTION = "retention"
#: One row per task, last: ``requests`` holds the storage requests it sent.
TASK = "task"

#: The rows a task emits, of every kind; each kind uses some of the columns.
RESULT_SCHEMA = StructType(
    [
        StructField("kind", StringType(), False),
        StructField("message_id", StringType()),
        StructField("key", StringType()),
        StructField("type", StringType()),
        StructField("status", StringType()),
        StructField("version", IntegerType()),
        StructField("reason", StringType()),
        StructField("body", StringType()),
        StructField("source_message_id", StringType()),
        StructField("conflicts", IntegerType()),
        StructField("requests", LongType()),
        StructField("source_key", StringType()),
        # An output's due time, when its handler scheduled it (``ctx.schedule``).
        StructField("due", TimestampType()),
        # An output's: when its source was first processed (the same on every copy).
        StructField("produced", TimestampType()),
        # An outcome's kind (``handlers.OutcomeKind``): why, as data.
        StructField("cause", StringType()),
        # An output's headers as it was published: the handler's, and the
        # trace context of the span that published it (transport metadata).
        StructField("headers", MapType(StringType(), StringType())),
    ]
)
_COLUMNS = RESULT_SCHEMA.fieldNames()
_STATUS = _COLUMNS.index("status")


def result_row(kind: str, **columns: Any) -> tuple[Any, ...]:
    """A row of :data:`RESULT_SCHEMA`: its kind, the named columns, null elsewhere."""
    unknown = columns.keys() - set(_COLUMNS)
    if unknown:
        raise TypeError(f"not columns of a result row: {sorted(unknown)}")
    return (kind, *(columns.get(name) for name in _COLUMNS[1:]))


_log = logging.getLogger(__name__)


def _outcome_row(message_id: str | None, key: str | None, type_: str | None, status: str,
                 version: int | None, reason: str | None, conflicts: int = 0,
                 raw: str | None = None, cause: str | None = None,
                 headers: dict[str, str] | None = None) -> tuple[Any, ...]:  # fmt: skip
    return result_row(
        OUTCOME, message_id=message_id, key=key, type=type_, status=status, version=version,
        reason=reason, body=raw, conflicts=conflicts, cause=cause or status, headers=headers,
    )  # fmt: skip


def _token_carried(processor: Processor[Any], message: Message) -> dict[str, str] | None:
    """An outcome's headers: the token its message carried for the handler,
    if any (the driver ends, after the commit, what its version awaits)."""
    value = message.headers.get(TOKEN_HEADER, "")
    return {TOKEN_HEADER: value} if value.startswith(f"{processor.handler.name}:") else None


def _output_rows(
    key: str, outcome: Outcome, published: Mapping[str, Message]
) -> Iterator[tuple[Any, ...]]:
    for out in outcome.outputs:
        sent = published.get(out.id, out)  # as published: carrying its trace context
        yield result_row(
            OUTPUT, message_id=out.id, key=out.key, type=out.type, body=body_json(out.body),
            source_message_id=outcome.message_id, source_key=key, due=out.due,
            produced=out.produced, headers=dict(sent.headers),
        )  # fmt: skip


def _processor(settings: JobSettings) -> Processor[Any]:
    if settings.log_level:
        # A worker's stderr reaches the executor's log (the console in local mode).
        configure_logging(settings.log_level)
    return Processor(
        resolve_handler(settings.handler),
        table_client(settings.table, settings.transport, settings.concurrency),
        InMemoryPublisher(),  # the outputs DataFrame is the publication
        strategy=settings.strategy,
        max_attempts=settings.max_attempts,
        # A task's rows are final only when the job commits them, and a retried,
        # speculative or rerun task must emit a stored outbox entry again: the
        # driver marks outputs dispatched after the commit (mark_partition).
        dispatch="by_caller",
        cache=_worker.header_cache if settings.header_cache else None,
        compression=settings.compression,
        max_batch=settings.batch_size,
        trace_context=settings.trace_context,
        # The checkpoints too are marked by the driver, after the commit.
        tokens=settings.tokens,
    )


def _groups(rows: Iterable[Any]) -> Iterator[tuple[str, list[Any]]]:
    for key, group in itertools.groupby(rows, key=lambda r: r["key"]):
        yield key, list(group)


def _process_key(
    processor: Processor[Any], key: str, rows: list[Any], settings: JobSettings
) -> list[tuple[Any, ...]]:
    """One key's rows: its dead letters, then its outcomes and outputs, in order."""
    out: list[tuple[Any, ...]] = []
    messages: list[Message] = []
    sources: list[Any] = []  # each message's input row
    for row in rows:
        message, reason = parse_row(row, processor.handler.accepts, settings.sent_at,
                                    processor.store.handler_name)  # fmt: skip
        if message is None:
            dead = _outcome_row(
                row["message_id"], row["key"], row["type"], "dead_lettered", None, reason,
                raw=raw_input(row), cause="refused",
            )  # fmt: skip
            out.append(dead)
        else:
            messages.append(message)
            sources.append(row)
    publisher = processor.publisher
    published = publisher.messages if isinstance(publisher, InMemoryPublisher) else {}
    conflicts_before = processor.stats.conflicts_retried
    outcomes = _process_messages(processor, key, messages, settings) if messages else []
    # On the key's first outcome row, so the outcome rows add up to the run's total.
    conflicts = processor.stats.conflicts_retried - conflicts_before
    for index, outcome in enumerate(outcomes):
        if outcome.kind == "refused":
            # Refused on every delivery (an unknown type, a late duplicate that
            # retention forgot, a clash of output ids): a dead letter with its
            # reason, never applied again.
            out.append(
                _outcome_row(
                    outcome.message_id, key, outcome.message.type, "dead_lettered", None,
                    outcome.reason, conflicts, raw=raw_input(sources[index]), cause="refused",
                )
            )  # fmt: skip
            conflicts = 0
            continue
        if outcome.status in ("abandoned", "faulted"):
            _log_unsettled(key, outcome)
            if settings.fail_fast:
                raise FailFastError(
                    f"message {outcome.message_id!r} of key {key!r} {outcome.status}: "
                    f"{outcome.reason}"
                )
        out.extend(_output_rows(key, outcome, published))
        out.append(
            _outcome_row(
                outcome.message_id,
                key,
                outcome.message.type,
                outcome.status,
                outcome.version,
                outcome.reason,
                conflicts,
                cause=outcome.kind,
                headers=_token_carried(processor, outcome.message),
            )
        )
        conflicts = 0
    if settings.retains and outcomes:
        out.append(_retain(processor, key, outcomes, settings))
    _telemetry.counted((r[_STATUS] for r in out if r[0] == OUTCOME), **{
        "streamstone.handler": processor.handler.name})  # fmt: skip
    return out


def _process_messages(
    processor: Processor[Any], key: str, messages: list[Message], settings: JobSettings
) -> list[Outcome]:
    """``process_batch`` (in chunks of ``batch_size``), and a bulkhead: whatever
    escapes it faults this key's messages (in doubt: some may be written),
    never the task's other keys. From a queue, until each is settled
    (``handlers.process_until_settled``): those a failing message stopped
    are handled again without it, and an outage is waited out."""
    try:
        if settings.source == "queue":
            settled = dict(process_until_settled(processor, key, messages, breaker=_worker.storage))
            return [o for _, o in sorted(settled.items()) if o is not None]
        return processor.process_batch(key, messages)
    except Exception as exc:
        if settings.fail_fast:
            raise
        _log.exception("key %r: %d messages faulted by an unexpected error", key, len(messages))
        reason = f"{type(exc).__name__}: {exc}"
        return [Outcome(m, "faulted", None, (), reason, exc, stops_key=True) for m in messages]


class FailFastError(RuntimeError):
    """``--fail-fast`` stops the job at a message that was abandoned or faulted;
    the driver finds this error's one line in Spark's and prints it."""


def _log_unsettled(key: str, outcome: Outcome) -> None:
    """At INFO, why a message is left for redelivery; a handler's own error
    with the handler's part of its traceback (the runtime's frames left out)."""
    if not _log.isEnabledFor(logging.INFO):
        return
    error = outcome.error
    detail = f"\n{error.handler_traceback}" if isinstance(error, HandlerFailedError) else ""
    _log.info("key %r: message %r %s: %s%s", key, outcome.message_id, outcome.status,
              outcome.reason, detail)  # fmt: skip


def _retain(
    processor: Processor[Any], key: str, outcomes: list[Outcome], settings: JobSettings
) -> tuple[Any, ...]:
    """Retention for a key right after its batch; the row says what it removed.

    Every version the batch touched stays (``keep_from``): until the job
    commits, Spark may run the task again and deliver the same messages,
    which must still be found. A message in doubt (faulted) may be stored at
    a version no outcome names, so its key waits for a later run. A failed
    call only postpones the removal: the next one finishes it.
    """
    if any(o.status == "faulted" for o in outcomes):
        return result_row(
            RETENTION, key=key, version=0, reason="skipped: a message is in doubt (faulted)"
        )
    touched = [o.version for o in outcomes if o.version is not None]
    try:
        removed = processor.retain(
            key,
            keep_last=settings.keep_last,
            older_than=settings.retain_for,
            keep_from=min(touched) if touched else None,
            at_least=settings.retain_at_least,
        )
    except (AzureError, StreamstoneError) as exc:
        _log.warning("retention of key %r failed, a later run finishes it: %r", key, exc)
        return result_row(RETENTION, key=key, version=0, reason=f"failed: {exc!r}")
    return result_row(RETENTION, key=key, version=removed)


def process_partition(rows: Iterable[Any], settings: JobSettings) -> Iterator[tuple[Any, ...]]:
    """Rows arrive grouped by key and ordered within each key.

    Up to ``settings.concurrency`` keys are in flight at once, each on its own
    thread and processor (one writer per key, its messages in order); rows come
    out key by key in the input's order, whatever finishes first. A last row
    (kind ``task``) counts the storage requests the task sent.
    """
    _telemetry.configure()  # from this worker's OTEL_* variables, once
    before = _worker.request_count.value
    yield from _process_keys(rows, settings)
    _telemetry.flush()
    yield result_row(TASK, requests=_worker.request_count.value - before)


def _process_keys(rows: Iterable[Any], settings: JobSettings) -> Iterator[tuple[Any, ...]]:
    if settings.concurrency <= 1:
        processor = _processor(settings)
        for key, group in _groups(rows):
            yield from _process_key(processor, key, group, settings)
        return
    local = threading.local()

    def work(key: str, group: list[Any]) -> list[tuple[Any, ...]]:
        processor = getattr(local, "processor", None)
        if processor is None:
            processor = local.processor = _processor(settings)
        return _process_key(processor, key, group, settings)

    pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="streamstone-key")
    pending: deque[Future[list[tuple[Any, ...]]]] = deque()
    try:
        for key, group in _groups(rows):
            # Bounded look-ahead: at most twice the threads' worth of keys in memory.
            while len(pending) >= 2 * settings.concurrency:
                yield from pending.popleft().result()
            pending.append(pool.submit(work, key, group))
        while pending:
            yield from pending.popleft().result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def mark_partition(rows: Iterable[Any], settings: JobSettings) -> None:
    """Mark the outbox outputs of committed outcomes dispatched (rows grouped by key)."""
    processor: Processor[Any] | None = None
    for key, group in itertools.groupby(rows, key=lambda r: r["key"]):
        # Made on the first row: most partitions of a job without tokens have none.
        processor = processor or _processor(settings)
        processor.mark_dispatched(key, [row["message_id"] for row in group])
