"""Azure Storage Queues around the pipeline's micro-batches: outputs sent to
queues, and the queue messages of a batch completed, released or poisoned
once its results are written.

The functions ending in ``_partition`` run on executors; each yields one row
of figures that the driver adds up into a :class:`Delivery`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, Final

from azure.core.exceptions import HttpResponseError
from azure.storage.queue import QueueClient
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from handlers import Message, PoisonEntry, QueuePublisher, from_json_data

from .._tasks._executor import OUTCOME, RESULT_SCHEMA
from .._tasks._telemetry import counted
from ._config import (
    MAX_HIDDEN,
    QueueConfig,
    check_queue_name,
    delete,
    lost_lock,
    poison,
    queue_call,
    queue_service,
)
from ._fanout import each

__all__ = [
    "Delivery", "OutputRoute", "send_outputs", "send_partition", "send_written_outputs",
    "settle_messages", "settle_partition",
]  # fmt: skip

_log = logging.getLogger(__name__)

_lock = threading.Lock()
#: Keyed by the whole configuration and the routes, never by a queue name
#: alone: two accounts may hold queues of the same name.
_publishers: dict[tuple[QueueConfig, OutputRoute], QueuePublisher] = {}
_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class OutputRoute:
    """Which queue each output type goes to: ``routes`` by type, ``default``
    for the other types (None: those are not sent, they stay in the files)."""

    routes: tuple[tuple[str, str], ...] = ()
    default: str | None = None

    @classmethod
    def parse(cls, specs: Sequence[str]) -> OutputRoute:
        """From ``QUEUE`` (the default) and ``TYPE=QUEUE`` options, each checked."""
        routes: dict[str, str] = {}
        default: str | None = None
        for spec in specs:
            type_, sep, queue = spec.rpartition("=")
            check_queue_name(queue, f"--output-queue {spec!r}: the queue")
            if not sep:
                if default is not None and default != queue:
                    raise ValueError(f"--output-queue names two default queues: {default!r} "
                                     f"and {queue!r} (route a type with TYPE=QUEUE)")  # fmt: skip
                default = queue
            elif not type_:
                raise ValueError(f"--output-queue {spec!r} names no type before '='")
            elif routes.get(type_, queue) != queue:
                raise ValueError(f"--output-queue routes type {type_!r} to two queues")
            else:
                routes[type_] = queue
        return cls(tuple(sorted(routes.items())), default)

    def queue_of(self, type_: str) -> str | None:
        return dict(self.routes).get(type_, self.default)


def _publisher(route: OutputRoute) -> QueuePublisher:
    config = QueueConfig.from_env()
    with _lock:
        publisher = _publishers.get((config, route))
        if publisher is None:
            publisher = QueuePublisher(queue_service(), dict(route.routes), default=route.default)
            _publishers[(config, route)] = publisher
        return publisher


def _time(micros: int | None) -> datetime | None:
    return None if micros is None else _EPOCH + timedelta(microseconds=micros)


def send_partition(rows: Iterable[Any], route: OutputRoute) -> Iterator[tuple[Any, ...]]:
    """Send output rows (``message_id, key, type, body, headers, due,
    produced``, the times in microseconds since the epoch) to their queues,
    the headers in each envelope's, waiting out the Queue service's faults;
    yield ``(sent, unrouted, refused, reason)``."""
    publisher = _publisher(route)
    sendable: list[Message] = []
    unrouted = refused = 0
    reason: str | None = None
    for row in rows:
        if route.queue_of(row["type"]) is None:
            unrouted += 1
            continue
        try:
            body = None if row["body"] is None else from_json_data(json.loads(row["body"]))
            message = Message(
                row["message_id"], row["key"], row["type"], body, dict(row["headers"] or {}),
                due=_time(row["due"]), produced=_time(row["produced"]),
            )  # fmt: skip
            publisher.check(message)
        except (ValueError, TypeError) as exc:
            refused += 1
            reason = reason or str(exc)
            _log.warning("output %r not sent to a queue: %s", row["message_id"], exc)
            continue
        sendable.append(message)
    # Sent again whole after a fault of the Queue service: an output sent
    # twice is the same message, which consumers de-duplicate by id.
    queue_call(lambda: publisher.publish(sendable), f"sending {len(sendable)} outputs")
    yield len(sendable), unrouted, refused, reason


def settle_partition(
    rows: Iterable[Any], queue_name: str, max_dequeue_count: int, backoff: int
) -> Iterator[tuple[Any, ...]]:
    """Complete each queue message of a written micro-batch: delete it; or,
    when its outcome is not settled (``reason`` set), release it: at once if
    it was only held back by a key-mate (``cause`` stopped or held), else
    after ``backoff`` seconds doubled per receive, or poison it on its
    ``max_dequeue_count``-th receive. Up to ``DELETERS`` messages are settled
    at once, each on its own: the Queue service's faults are waited out
    (``queue_call``): a throttled delete pauses the task, never fails it,
    and costs the message no receive. Yields ``(deleted, released,
    poisoned, lost)``."""
    queue = queue_service().get_queue_client(queue_name)
    done = each(rows, partial(_settle, queue, max_dequeue_count, backoff))
    counted(["poisoned"] * done.count("poisoned"), **{"messaging.destination.name": queue_name})
    yield done.count("deleted"), done.count("released"), done.count("poisoned"), done.count("lost")


def _settle(queue: QueueClient, max_dequeue_count: int, backoff: int, row: Any) -> str:
    """What became of one message: deleted, released, poisoned, lost (its
    lock), or kept (its poison entry refused: it comes again)."""
    receipt = json.loads(row["receipt"])
    count = int(receipt["dequeueCount"])
    try:
        if row["reason"] is None:
            if delete(queue, receipt["id"], receipt["popReceipt"]):
                return "deleted"
            # It comes again, recognised then as a duplicate.
            _log.info("queue message %r: lock lost before it was deleted", receipt["id"])
            return "lost"
        if row["cause"] not in ("stopped", "held") and count >= max_dequeue_count:
            reason = f"failed on receive {count} of {max_dequeue_count}: {row['reason']}"
            entry = PoisonEntry(reason, receipt["text"], queue.queue_name, receipt["id"], count)
            return poison(queue, entry, receipt["popReceipt"])
        # A key-mate's failure is not this message's: no backoff.
        held_back = row["cause"] in ("stopped", "held")
        delay = 0 if held_back else min(MAX_HIDDEN, backoff * 2 ** (count - 1))
        queue_call(partial(queue.update_message, receipt["id"], receipt["popReceipt"],
                           visibility_timeout=delay),
                   f"release of queue message {receipt['id']!r}")  # fmt: skip
        return "released"
    except Exception as exc:
        if isinstance(exc, HttpResponseError) and lost_lock(exc):
            # Visible again already: it comes in a later batch, where the
            # runtime recognises it as a duplicate.
            _log.info("queue message %r: lock lost before it was settled (%s)",
                      receipt["id"], exc.message)  # fmt: skip
            return "lost"
        # Settled in flight with others: the task raises only the first
        # failure, so each says its own here.
        _log.error("queue message %r: not settled (%s: %s); the task fails and the message "
                   "comes again once its lock runs out", receipt["id"], type(exc).__name__,
                   exc)  # fmt: skip
        raise


@dataclass
class Delivery:
    """What a micro-batch did on queues: its outputs sent, and (queue input)
    its queue messages completed, released for redelivery or poisoned."""

    sent: int = 0
    #: Outputs of a type no route names: in the output files only.
    unrouted: int = 0
    #: Outputs no queue could take (over 64 KiB, say): in the output files only.
    refused: int = 0
    refusal: str | None = None
    deleted: int = 0
    released: int = 0
    poisoned: int = 0
    #: Messages whose lock ran out before they were settled: they come again.
    lost_locks: int = 0

    def add_sent(self, figures: Iterable[tuple[Any, ...]]) -> None:
        for sent, unrouted, refused, reason in figures:
            self.sent, self.unrouted = self.sent + sent, self.unrouted + unrouted
            self.refused += refused
            self.refusal = self.refusal or reason

    def add_settled(self, figures: Iterable[tuple[Any, ...]]) -> None:
        for deleted, released, poisoned, lost in figures:
            self.deleted, self.released = self.deleted + deleted, self.released + released
            self.poisoned, self.lost_locks = self.poisoned + poisoned, self.lost_locks + lost

    def lines(self, outputs: bool, messages: bool) -> list[str]:
        """The figures in words: ``outputs`` sent to queues, ``messages`` of an input queue."""
        shown: list[str] = []
        if messages:
            shown.append(
                f"  queue messages: {self.deleted:,} completed (deleted), {self.released:,} "
                f"released for redelivery, {self.poisoned:,} poisoned, {self.lost_locks:,} "
                "locks lost (they come again)"
            )
        if outputs:
            shown.append(
                f"  outputs to queues: {self.sent:,} sent, {self.unrouted:,} of a type no "
                f"--output-queue routes, {self.refused:,} refused"
                + (f" (first: {self.refusal})" if self.refusal else "")
            )
        return shown

    def figures(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "refusal"}


def send_outputs(outputs: DataFrame, route: OutputRoute) -> list[tuple[Any, ...]]:
    """Send the output rows (:attr:`JobResult.outputs`, or as written) from the
    executors; the figures of each partition, for :meth:`Delivery.add_sent`."""
    rows = outputs.select(
        "message_id", "key", "type", "body", "headers", F.unix_micros("due").alias("due"),
        F.unix_micros("produced").alias("produced"),
    )  # fmt: skip
    return rows.rdd.mapPartitions(lambda part: send_partition(part, route)).collect()


def send_written_outputs(
    spark: SparkSession, output: str, output_format: str, route: OutputRoute
) -> list[tuple[Any, ...]]:
    """:func:`send_outputs` of a run's ``{output}/outputs``, as written."""
    # Outputs written before they had headers read with none.
    names = ("message_id", "key", "type", "body", "source_message_id", "source_key", "due",
             "produced", "headers")  # fmt: skip
    schema = StructType([RESULT_SCHEMA[name] for name in names])
    written = spark.read.schema(schema).format(output_format).load(f"{output}/outputs")
    return send_outputs(written, route)


def settle_messages(
    receipts: DataFrame, results: DataFrame, queue: str, max_dequeue_count: int, backoff: int
) -> list[tuple[Any, ...]]:
    """Complete a written micro-batch's queue messages (``receipts``: one row
    per message, its receipt as JSON in ``body``) by the outcomes in its
    ``results``: every outcome of the message's id settled (completed, a
    duplicate or dead-lettered), or else the first reason it was not."""
    status = F.col("status")
    done = status.isin("completed", "duplicate", "dead_lettered")
    verdicts = (
        results.where(F.col("kind") == OUTCOME)
        .groupBy("key", "message_id")
        .agg(
            F.min(done.cast("int")).alias("_done"),
            F.first(F.when(~done, F.coalesce(F.col("reason"), status)), ignorenulls=True).alias(
                "_why"
            ),
            F.first(F.when(~done, F.col("cause")), ignorenulls=True).alias("_cause"),
        )
    )
    rows = receipts.join(verdicts, ["key", "message_id"], "left").select(
        F.col("body").alias("receipt"),
        F.when(F.col("_done") == 1, F.lit(None))
        .otherwise(F.coalesce(F.col("_why"), F.lit("no outcome")))
        .alias("reason"),
        F.col("_cause").alias("cause"),
    )
    return rows.rdd.mapPartitions(
        lambda part: settle_partition(part, queue, max_dequeue_count, backoff)
    ).collect()
