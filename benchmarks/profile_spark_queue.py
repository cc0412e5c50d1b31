"""Where the Spark queue source's time goes, on the demo workload of
``bench_spark_queue.py`` (``run_queue``, 1,000 messages a micro-batch).

One run of the job on each source (after a first run of each over 100
messages, not measured: the JVM's warm-up), timed from three places in the
same process:

- Spark's own ``StreamingQueryProgress.durationMs`` of every micro-batch
  (``latestOffset``: the source's receive on the driver; ``addBatch``: the
  ``foreachBatch`` sink; planning, offset log and commit log);
- inside the sink, around its steps on the driver: ``write_result`` (the
  batch's results written), ``settle_messages`` (the Spark job that deletes
  the queue messages from the tasks) and the rest (the first action, which
  runs the handlers in the tasks, and the checks before the write);
- then, outside Spark, one micro-batch's receive (``QueueStreamReader``'s
  ``_receive``) and one partition's deletes (``settle_partition``) alone
  under cProfile, to split their time between this process's CPU and
  waiting for Azurite.

It prints one JSON line per share (of the job's wall time, or of a step's),
each with its seconds in ``params``. The handlers' own time in the tasks is
``profile_task.py``'s. Run: ``python benchmarks/profile_spark_queue.py [--quick]``.
"""

from __future__ import annotations

import base64
import cProfile
import json
import os
import pstats
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from _common import account, check, emit, log, quick
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueServiceClient
from bench_spark_queue import PER_BATCH, workload, write_files
from pyspark.sql.streaming.listener import StreamingQueryListener

from handlers import encode_envelope
from spark_driver import JobSettings, run_queue, run_stream, session
from spark_driver import _stream as stream_module

PHASES = (
    "latestOffset", "queryPlanning", "walCommit", "commitOffsets", "outside triggers",
    "addBatch outside the sink", "sink outside its steps", "sink.handlers", "sink.write_result",
    "sink.settle_messages", "sink.settle_messages: its Spark job alone",
)  # fmt: skip


class Progress(StreamingQueryListener):
    """Each micro-batch's ``durationMs``, added up by phase."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)
        self.batches = 0

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        self.batches += 1
        for name, value in event.progress.durationMs.items():
            self.ms[name] += value

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def timing(name: str, into: dict[str, float], fn: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into[name] += time.perf_counter() - start

    return timed


def fill(queues: QueueServiceClient, texts: list[str]) -> Any:
    queue = queues.create_queue(f"prof-{uuid.uuid4().hex[:10]}")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(queue.send_message, texts))
    return queue


def cpu_share(profiled: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall seconds, the share of them this thread spent waiting on sockets
    and locks (not its CPU), and the result."""
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    result = profiled()
    profiler.disable()
    wall = time.perf_counter() - start
    waiting = sum(
        tottime
        for (_, _, function), (_, _, tottime, _, _) in pstats.Stats(profiler).stats.items()  # type: ignore[attr-defined]
        if any(word in function for word in ("socket", "ssl", "select", "acquire", "wait"))
    )
    return wall, waiting / wall, result


def dry_settle(rows: Any, *_: Any) -> Any:
    """``settle_partition`` without its requests (defined here, so that Spark
    ships it to the tasks by value): the settle job's own cost."""
    yield sum(1 for _ in rows), 0, 0, 0


def settle_split(steps: dict[str, float], real: Callable[..., Any]) -> Callable[..., Any]:
    """The sink's ``settle_messages``, run once dry first (timed apart)."""
    from spark_driver._queues import _sink

    def settle(*args: Any) -> Any:
        kept = _sink.settle_partition
        _sink.settle_partition = dry_settle  # type: ignore[assignment]
        try:
            timing("settle job without its requests", steps, real)(*args)
        finally:
            _sink.settle_partition = kept
        return timing("settle_messages", steps, real)(*args)

    return settle


def job(spark: Any, run: Callable[[], Any], distinct: int) -> tuple[float, dict[str, float]]:
    """One job's wall seconds, and its seconds by phase and sink step."""
    listener, steps = Progress(), defaultdict[str, float](float)
    spark.streams.addListener(listener)
    wrapped = {name: getattr(stream_module, name) for name in ("write_result", "settle_messages")}
    sink = stream_module.BatchSink
    methods = {"_write": sink._write, "__call__": sink.__call__}
    setattr(stream_module, "write_result", timing("write_result", steps, wrapped["write_result"]))  # noqa: B010
    setattr(stream_module, "settle_messages", settle_split(steps, wrapped["settle_messages"]))  # noqa: B010
    for name, fn in methods.items():
        setattr(sink, name, timing(name, steps, fn))
    try:
        start = time.perf_counter()
        summaries = run()
        wall = time.perf_counter() - start
        time.sleep(2)  # the listener hears of the last batch asynchronously
    finally:
        spark.streams.removeListener(listener)
        for name, fn in wrapped.items():
            setattr(stream_module, name, fn)
        for name, fn in methods.items():
            setattr(sink, name, fn)
    check(sum(s.processed for _, s in summaries) == distinct, "not every message processed")
    # The dry settle runs only for these figures: taken out of every time it is in.
    dry = steps["settle job without its requests"]
    wall -= dry
    seconds = {phase: ms / 1000 for phase, ms in listener.ms.items()}
    for phase in ("triggerExecution", "addBatch"):
        seconds[phase] = seconds.get(phase, 0.0) - dry
    seconds["outside triggers"] = wall - seconds["triggerExecution"]
    seconds["addBatch outside the sink"] = seconds["addBatch"] - (steps["__call__"] - dry)
    seconds["sink outside its steps"] = steps["__call__"] - steps["_write"]
    seconds["sink.handlers"] = (
        steps["_write"] - dry - steps["write_result"] - steps["settle_messages"]
    )
    seconds["sink.write_result"] = steps["write_result"]
    seconds["sink.settle_messages"] = steps["settle_messages"]
    seconds["sink.settle_messages: its Spark job alone"] = dry
    log(f"{wall:.1f} s: {seconds}; batches {listener.batches}")
    return wall, seconds


def main() -> int:
    is_quick = quick(__doc__)
    games, per_game = (50, 20) if is_quick else (100, 40)
    distinct, messages = workload(games, per_game)
    texts = [base64.b64encode(encode_envelope(m).encode()).decode() for m in messages]
    with account(queues=True) as connection_string, tempfile.TemporaryDirectory() as work:
        os.environ["STREAMSTONE_CONNECTION_STRING"] = connection_string
        tables = TableServiceClient.from_connection_string(connection_string)
        queues = QueueServiceClient.from_connection_string(connection_string)
        write_files(Path(work) / "inbox", messages)
        spark = session("local[2]", "profile", **{"spark.ui.showConsoleProgress": "false"})

        def settings() -> JobSettings:
            table = f"prof{uuid.uuid4().hex[:10]}"
            tables.create_table(table)
            return JobSettings(table=table, handler="shooting_range")

        try:
            # Not measured: a first run of each over 100 messages (the JVM's warm-up).
            write_files(Path(work) / "warm", messages[:100])
            run_stream(spark, f"{work}/warm", f"{work}/w", f"{work}/wc", settings())
            warm = fill(queues, texts[:100])
            run_queue(spark, warm.queue_name, f"{work}/wq", f"{work}/wqc", settings())
            file_wall, file_seconds = job(spark, lambda: run_stream(
                spark, f"{work}/inbox", f"{work}/f", f"{work}/fc", settings(), partitions=4,
                max_files_per_trigger=1), distinct)  # fmt: skip
            queue = fill(queues, texts)
            queue_wall, queue_seconds = job(spark, lambda: run_queue(
                spark, queue.queue_name, f"{work}/q", f"{work}/qc", settings(), partitions=4,
                max_messages=PER_BATCH), distinct)  # fmt: skip
        finally:
            spark.stop()
        # One micro-batch's receive and one partition's deletes, alone.
        from spark_driver._queues._options import QueueOptions
        from spark_driver._queues._sink import settle_partition
        from spark_driver._queues._source import QueueStreamReader

        queue = fill(queues, texts[:PER_BATCH])
        reader = QueueStreamReader(QueueOptions(queue.queue_name, max_messages=PER_BATCH))
        receive_wall, receive_wait, rows = cpu_share(reader._receive)
        check(len(rows) == min(PER_BATCH, len(texts)), f"received {len(rows)}")
        receipts = [{"receipt": json.dumps({"id": r[9], "popReceipt": r[10], "dequeueCount": 1,
                                            "text": ""}), "reason": None, "cause": None}
                    for r in rows]  # fmt: skip
        part = receipts[: len(receipts) // 4]
        delete_wall, delete_wait, figures = cpu_share(
            lambda: list(settle_partition(part, queue.queue_name, 5, 1))
        )
        check(figures[0][0] == len(part), f"settled {figures}")
    params = {"messages": len(messages), "per_micro_batch": PER_BATCH, "master": "local[2]",
              "queue_job_seconds": round(queue_wall, 2),
              "file_job_seconds": round(file_wall, 2)}  # fmt: skip
    for phase in PHASES:
        seconds, peer = queue_seconds.get(phase, 0.0), file_seconds.get(phase, 0.0)
        emit(f"profile.spark_queue.{phase}", "share of job time", "lower",
             [seconds / queue_wall], "the file source's share", [peer / file_wall],
             {**params, "seconds": round(seconds, 2), "file_seconds": round(peer, 2)})  # fmt: skip
    alone = {"messages": len(rows), "master": None}
    emit("profile.spark_queue.receive.per_message", "ms", "lower",
         [1000 * receive_wall / len(rows)], None, None,
         {**alone, "waiting_share": round(receive_wait, 3)})  # fmt: skip
    emit("profile.spark_queue.delete.per_message", "ms", "lower",
         [1000 * delete_wall / len(part)], None, None,
         {**alone, "messages": len(part), "waiting_share": round(delete_wait, 3)})  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
