"""Streaming mode: a file source over an input directory, one job per micro-batch.

The micro-batch sink and the query's run are shared with the queue source
(``_queue_stream``): outputs may go to queues too, and a query may run until
its input is drained (``availableNow``) or on a processing-time trigger until
it is told to stop, letting the micro-batch in progress finish and starting
no other. The processing itself, inside the streaming plan, is ``_plan``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ._files._intake import FileIntake, LeftOut
from ._files._landing import dead_letters
from ._job import write_result
from ._plan import METRICS, process_stream
from ._queues._sink import Delivery, OutputRoute, send_outputs, settle_messages
from ._settings import JobSettings
from ._summary import JobResult, Summary

__all__ = [
    "METRICS",
    "RECEIPT",
    "BatchSink",
    "Settle",
    "StopRequested",
    "process_stream",
    "run_query",
    "run_stream",
    "stop_on_signals",
]

#: The kind of the rows a queue source adds to a micro-batch beside its
#: results: one per queue message, its receipt in ``body``, to complete it
#: once the batch is written.
RECEIPT: Final = "queue_message"


@dataclass(frozen=True)
class Settle:
    """How a micro-batch's queue messages are completed once it is written
    (see :func:`settle_messages`): their queue, the receive that poisons an
    unsettled one, and the seconds it is hidden, doubled per receive."""

    queue: str
    max_dequeue_count: int
    backoff: int


class StopRequested(RuntimeError):
    """Raised by the sink at the start of a micro-batch once the stream is to
    stop: nothing of the batch has run, and it runs at the next start."""


class BatchSink:
    """``foreachBatch``: each micro-batch's results written to
    ``{output}/batch={id}``, then its outputs sent to queues (``route``), then
    its queue messages completed (``settle``), all before Spark records the
    batch as done. ``summaries`` and ``deliveries`` grow by one per batch.

    With ``intake`` (a file stream), each file the batch could not read (see
    :class:`FileIntake`) is dead-lettered in its results."""

    def __init__(
        self,
        output: str,
        output_format: str,
        settings: JobSettings,
        partitions: int,
        *,
        route: OutputRoute | None = None,
        settle: Settle | None = None,
        on_batch: Callable[[int, Summary], None] | None = None,
        on_delivery: Callable[[int, Delivery], None] | None = None,
        intake: FileIntake | None = None,
    ) -> None:
        self.output, self.output_format = output, output_format
        self.settings, self.partitions = settings, partitions
        self.route, self.settle, self.intake = route, settle, intake
        self.on_batch, self.on_delivery = on_batch, on_delivery
        self.summaries: list[tuple[int, Summary]] = []
        self.deliveries: list[tuple[int, Delivery]] = []
        # The stop protocol with run_query: once ``stop`` is set, a batch that
        # starts is refused before it does anything, and the one in progress
        # (``busy``) is waited for.
        self.stop: threading.Event | None = None
        self.busy = False
        self.refused: int | None = None
        self.failed: BaseException | None = None
        self.written: int | None = None
        self._state = threading.Condition()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self._state:
            if self.stop is not None and self.stop.is_set():
                self.refused = batch_id
                raise StopRequested(f"micro-batch {batch_id} is left for the next start")
            self.busy = True
        try:
            self._run(batch, batch_id)
        except BaseException as exc:
            self.failed = exc
            raise
        finally:
            with self._state:
                self.busy = False
                self._state.notify_all()

    def begin(self, stop: threading.Event | None) -> None:
        """A new run of the query, to stop once ``stop`` is set."""
        self.stop, self.refused, self.failed, self.written = stop, None, None, None

    def wait_idle(self) -> None:
        """Return once no micro-batch is in the sink."""
        with self._state:
            self._state.wait_for(lambda: not self.busy)

    def _run(self, batch: DataFrame, batch_id: int) -> None:
        whole = batch.persist()
        try:
            done = self._write(whole, batch_id)
        finally:
            whole.unpersist()  # a long-running stream would otherwise keep every batch
        self.written = batch_id
        if done is None:
            return
        summary, delivery = done
        self.summaries.append((batch_id, summary))
        self.deliveries.append((batch_id, delivery))
        if self.on_batch is not None:
            self.on_batch(batch_id, summary)
        if self.on_delivery is not None:
            self.on_delivery(batch_id, delivery)

    def _write(self, whole: DataFrame, batch_id: int) -> tuple[Summary, Delivery] | None:
        if self.intake is not None and self.intake.look_at(batch_id):
            raise LeftOut(f"micro-batch {batch_id} runs again without the files it leaves out")
        # The batch before is committed: its files are looked at once more.
        notes = () if self.intake is None else tuple(self.intake.written_after_taken())
        kind = F.col("kind")
        results = whole if self.settle is None else whole.where(kind != RECEIPT)
        # The first action runs the handlers once, in a result stage, whose
        # observed metrics count each task once, whatever attempts failed.
        whole.write.format("noop").mode("overwrite").save()
        receipts = None if self.settle is None else whole.where(kind == RECEIPT)
        if receipts is not None and receipts.isEmpty():
            # Replayed after a restart: the source holds its messages no more
            # (they come again), and what its first run wrote stays as it is.
            return None
        if self.intake is not None and self.intake.unreadable_in(batch_id):
            results = results.unionByName(self._unreadable(whole, batch_id))
        result = JobResult.of(results, self.settings, self.partitions)
        summary = write_result(result, f"{self.output}/batch={batch_id}", self.output_format)
        summary = dataclasses.replace(summary, notes=notes)
        delivery = Delivery()
        if self.route is not None:
            delivery.add_sent(send_outputs(result.outputs, self.route))
        if self.settle is not None and receipts is not None:
            settle = self.settle
            delivery.add_settled(
                settle_messages(receipts, results, settle.queue, settle.max_dequeue_count,
                                settle.backoff)
            )  # fmt: skip
        return summary, delivery

    def _unreadable(self, whole: DataFrame, batch_id: int) -> DataFrame:
        """A dead letter for each file of the batch not read, or not whole."""
        assert self.intake is not None
        entries = self.intake.unreadable_in(batch_id)
        return dead_letters(whole.sparkSession, [(entry.uri, entry.reason) for entry in entries])


def run_query(
    results: DataFrame,
    sink: BatchSink,
    checkpoint: str,
    *,
    trigger: timedelta | None = None,
    stop: threading.Event | None = None,
    query_name: str | None = None,
) -> None:
    """Run the streaming query of ``results`` into ``sink``: what is there now
    (``availableNow``), or with ``trigger`` a micro-batch every such interval
    until ``stop`` is set.

    Stopping lets the micro-batch in progress finish and be committed, and
    starts no other: a batch that starts once ``stop`` is set is refused by
    the sink before it does anything (it runs at the next start), so the
    query stops within the time the batch in progress needs, however busy
    the stream is."""
    writer = results.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    if query_name is not None:
        writer = writer.queryName(query_name)
    if trigger is None:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger.total_seconds():g} seconds")
    sink.begin(stop)
    query: Any = writer.start()
    if stop is None:
        query.awaitTermination()
        return
    stopped = False
    try:
        while not query.awaitTermination(0.5):
            if stop.is_set():
                stopped = _stop_after_batch(query, sink)
                break
        query.awaitTermination()  # raises if the query failed
    except Exception:
        if sink.failed is not None and not isinstance(sink.failed, StopRequested):
            raise  # a batch failed: the stop did not cause it
        if sink.refused is None and not stopped:
            raise


def _stop_after_batch(query: Any, sink: BatchSink) -> bool:
    """Stop ``query`` once the micro-batch in the sink, if any, is written and
    committed; whether this stopped a query still active."""
    sink.wait_idle()
    written = sink.written
    # Spark logs a batch's commit, then reports its progress: stopping before
    # would leave the batch to run again at the next start.
    while written is not None and query.isActive:
        progress = query.lastProgress
        if progress is not None and progress["batchId"] >= written:
            break
        time.sleep(0.05)
    if not query.isActive:
        return False
    query.stop()
    return True


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """While inside, SIGTERM and the first Ctrl-C set ``stop``; a second
    Ctrl-C goes to the handler before this one (which interrupts the run).
    Outside the main thread no handler can be installed: nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        previous = before[signal.SIGINT]
        if signum == signal.SIGINT and stop.is_set():
            if callable(previous):
                previous(signum, frame)
                return
            raise KeyboardInterrupt
        if not stop.is_set():
            print("stopping: the micro-batch in progress finishes first (Ctrl-C again "
                  "interrupts it)", file=sys.stderr)  # fmt: skip
        stop.set()

    for signum in before:
        signal.signal(signum, on_signal)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def run_stream(
    spark: SparkSession,
    input_dir: str,
    output: str,
    checkpoint: str,
    settings: JobSettings,
    *,
    input_format: str = "json",
    output_format: str = "parquet",
    partitions: int = 8,
    order_by: str | None = None,
    max_files_per_trigger: int | None = None,
    on_batch: Callable[[int, Summary], None] | None = None,
    query_name: str | None = None,
    output_queues: OutputRoute | None = None,
    trigger: timedelta | None = None,
    stop: threading.Event | None = None,
    on_delivery: Callable[[int, Delivery], None] | None = None,
) -> list[tuple[int, Summary]]:
    """Process what is in ``input_dir`` now (``availableNow``), micro-batch by
    micro-batch; with ``trigger``, a micro-batch of the new files every such
    interval until ``stop`` is set (the batch in progress finishes first).

    The files are JSON lines or Parquet (``input_format``), taken oldest
    first, whatever their age; a key's messages apply in the order of their
    files, then of their lines, however the files fall into micro-batches (or
    by ``order_by``). The input's schema is kept in ``checkpoint`` for its
    life (see :class:`FileIntake`); a file that cannot be read, or that
    Spark would leave out for its name, and a line over 8 MiB, are
    dead-lettered by name and the stream goes on without them. A folder
    whose path holds glob characters is refused (ValueError).

    Each batch's outputs go to ``{output}/batch={id}``, overwritten when Spark
    replays the batch after a restart (its commit never got logged), so a
    replay yields the same files, never extra ones. State changes are
    exactly-once by the handlers runtime itself. Each batch's cached rows
    are released once it is written, so a long stream does not accumulate
    them. ``on_batch(batch_id, summary)`` is called after each batch. With
    ``output_queues``, each batch's outputs are then sent to queues (a
    replayed batch sends them again: consumers de-duplicate by id), and
    ``on_delivery(batch_id, delivery)`` tells what was sent.

    Each micro-batch's figures also appear in its ``StreamingQueryProgress``,
    under ``observedMetrics["streamstone"]`` (:data:`METRICS`), for a
    ``StreamingQueryListener`` or a monitoring tool. ``query_name`` names the
    query in its progress.
    """
    intake = FileIntake(
        spark, input_dir, checkpoint, input_format, order_by, settings.sent_at,
        max_files_per_trigger,
    )  # fmt: skip
    sink = BatchSink(
        output, output_format, settings, partitions,
        route=output_queues, on_batch=on_batch, on_delivery=on_delivery, intake=intake,
    )  # fmt: skip
    if not intake.wait_for_schema(trigger, stop):
        return sink.summaries
    while True:
        results = process_stream(intake.frame(), settings, partitions, order_by)
        try:
            run_query(results, sink, checkpoint, trigger=trigger, stop=stop, query_name=query_name)
        except Exception as exc:
            if not isinstance(sink.failed, LeftOut) and not intake.examine(exc):
                raise
            if stop is not None and stop.is_set():
                return sink.summaries  # the batch runs at the next start
            continue  # the batch again, without the files it could not read
        intake.written_after_taken()  # logged: no batch is left to tell it
        intake.tell_unlisted()
        return sink.summaries
