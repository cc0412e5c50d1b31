"""The Spark queue source beside the file source, on the demo's workload.

The same ShootingRange messages (20% duplicated), once as queue messages
(base64 envelopes on Azurite's Queue service) and once as JSON-lines files
of as many rows as a queue micro-batch takes:

- ``spark.queue_source``: ``run_queue`` until a micro-batch finds the queue
  empty (1,000 messages a micro-batch, each deleted after its batch is
  written), in messages per second;
- peer: ``run_stream`` over the files, one file (1,000 rows) a micro-batch
  (``availableNow``), into a fresh table each run;
- ``spark.queue_source.vs_consumer``: the same runs beside a ``QueueConsumer``
  with as many key threads as the job has (``local[2]``'s 2 task slots x the
  job's 8 keys in flight: ``workers=16``, its defaults otherwise) draining the
  same queued messages into a fresh table (outputs to an ``InMemoryPublisher``,
  where the job writes files);
- ``spark.queue_source.shallow``: the two sources again on the first
  ``SHALLOW`` of those messages, a quarter as deep a queue, since Azurite's
  Queue service takes longer for each request the deeper a queue is
  (``bench_azurite_queue.py``): the ratio the code gives with less of the
  emulator's depth in it.

Filling the queue is not timed, nor a first run of each source over 100
messages (the JVM's warm-up would fall on whichever runs first). Runs
alternate (queue, files, consumer, queue, ...) so drift strikes all three.
Run: ``python benchmarks/bench_spark_queue.py [--quick]``.
"""

from __future__ import annotations

import base64
import json
import os
import random
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from _common import account, check, emit, quick
from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueServiceClient

from handlers import InMemoryPublisher, Message, Processor, QueueConsumer, encode_envelope
from handlers.examples import shooting_range
from spark_driver import JobSettings, Summary, run_queue, run_stream, session
from streamstone_py import WireTableClient

PER_BATCH = 1000
#: The consumer's threads: as many keys in flight as the job's (2 slots x 8).
CONSUMER_WORKERS = 16
#: The shallow pair's messages: the quick run's size, a quarter of the full one.
SHALLOW = 1200


def workload(games: int, per_game: int) -> tuple[int, list[Message]]:
    """The distinct count, and every message in delivery order (duplicates included)."""
    rng = random.Random(7)
    messages = []
    for g in range(games):
        key = f"game-{g:05d}"
        messages.append(Message(f"{key}-round", key, "StartNewRound"))
        messages += [
            Message(f"{key}-shot-{n}", key, "FireAt", {"position": rng.randrange(100)})
            for n in range(1, per_game)
        ]
    distinct = len(messages)
    messages += rng.sample(messages, distinct // 5)
    rng.shuffle(messages)
    return distinct, messages


def write_files(directory: Path, messages: list[Message]) -> None:
    directory.mkdir(parents=True)
    for n in range(0, len(messages), PER_BATCH):
        rows = [
            {"message_id": m.id, "key": m.key, "type": m.type,
             "body": None if m.body is None else json.dumps(m.body)}
            for m in messages[n : n + PER_BATCH]
        ]  # fmt: skip
        (directory / f"part-{n // PER_BATCH:05d}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows)
        )


def consume(
    queues: QueueServiceClient, tables: TableServiceClient, connection_string: str,
    texts: list[str], distinct: int,
) -> float:  # fmt: skip
    """Messages/s of a ``QueueConsumer`` over ``texts``, queued (not timed)."""
    queue = queues.create_queue(f"bench-{uuid.uuid4().hex[:10]}")
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(queue.send_message, texts))
    name = tables.create_table(f"bench{uuid.uuid4().hex[:10]}").table_name
    # The wire runner's client, as the job's tasks have it.
    table = WireTableClient.from_connection_string(connection_string, name)
    processor = Processor(shooting_range, table, InMemoryPublisher())
    consumer = QueueConsumer(processor, queue, workers=CONSUMER_WORKERS)
    start = time.perf_counter()
    stats = consumer.run(until_empty=True)
    rate = len(texts) / (time.perf_counter() - start)
    got = (stats.completed, stats.duplicates)
    check(got == (distinct, len(texts) - distinct), f"consumer: {stats}")
    check(queue.get_queue_properties().approximate_message_count == 0, "queue left")
    queues.delete_queue(queue.queue_name)
    table.close()
    return rate


def main() -> int:
    is_quick = quick(__doc__)
    games, per_game, repeats = (50, 20, 2) if is_quick else (100, 40, 3)
    distinct, messages = workload(games, per_game)
    texts = [base64.b64encode(encode_envelope(m).encode()).decode() for m in messages]
    with account(queues=True) as connection_string, tempfile.TemporaryDirectory() as work:
        os.environ["STREAMSTONE_CONNECTION_STRING"] = connection_string
        root = Path(work)
        write_files(root / "inbox", messages)
        write_files(root / "shallow", messages[:SHALLOW])
        shallow_distinct = len({m.id for m in messages[:SHALLOW]})
        tables = TableServiceClient.from_connection_string(connection_string)
        queues = QueueServiceClient.from_connection_string(connection_string)
        spark = session("local[2]", "bench", **{"spark.ui.showConsoleProgress": "false"})
        spark.sparkContext.setLogLevel("ERROR")
        from_queue: list[float] = []
        from_files: list[float] = []
        from_consumer: list[float] = []
        shallow_queue: list[float] = []
        shallow_files: list[float] = []

        def settings() -> JobSettings:
            table = f"bench{uuid.uuid4().hex[:10]}"
            tables.create_table(table)
            return JobSettings(table=table, handler="shooting_range")

        def processed(summaries: list[tuple[int, Summary]]) -> tuple[int, int]:
            return sum(s.processed for _, s in summaries), sum(s.duplicates for _, s in summaries)

        def from_queue_source(given: list[str]) -> tuple[float, list[tuple[int, Summary]]]:
            queue = queues.create_queue(f"bench-{uuid.uuid4().hex[:10]}")
            with ThreadPoolExecutor(16) as pool:  # filling is not timed
                list(pool.map(queue.send_message, given))
            job, run = settings(), uuid.uuid4().hex
            start = time.perf_counter()
            summaries = run_queue(
                spark, queue.queue_name, str(root / f"q{run}"), str(root / f"qc{run}"), job,
                partitions=4, max_messages=PER_BATCH,
            )  # fmt: skip
            elapsed = time.perf_counter() - start
            check(queue.get_queue_properties().approximate_message_count == 0, "queue left")
            queues.delete_queue(queue.queue_name)
            return elapsed, summaries

        def from_file_source(inbox: Path) -> tuple[float, list[tuple[int, Summary]]]:
            job, run = settings(), uuid.uuid4().hex
            start = time.perf_counter()
            summaries = run_stream(
                spark, str(inbox), str(root / f"f{run}"), str(root / f"fc{run}"), job,
                partitions=4, max_files_per_trigger=1,
            )  # fmt: skip
            return time.perf_counter() - start, summaries

        try:
            # Not timed: the first query of a JVM pays its warm-up, whichever source it reads.
            write_files(root / "warm", messages[:100])
            from_queue_source(texts[:100])
            from_file_source(root / "warm")
            for _ in range(repeats):
                elapsed, summaries = from_queue_source(texts)
                from_queue.append(len(messages) / elapsed)
                got = processed(summaries)
                check(got[0] == distinct, f"queue source processed {got} of {distinct}")
                elapsed, summaries = from_file_source(root / "inbox")
                from_files.append(len(messages) / elapsed)
                got = processed(summaries)
                check(got == (distinct, len(messages) - distinct), f"file source: {got}")
                from_consumer.append(consume(queues, tables, connection_string, texts, distinct))
                if len(messages) > SHALLOW:
                    elapsed, summaries = from_queue_source(texts[:SHALLOW])
                    shallow_queue.append(SHALLOW / elapsed)
                    got = processed(summaries)
                    check(got[0] == shallow_distinct, f"shallow queue: {got}")
                    elapsed, summaries = from_file_source(root / "shallow")
                    shallow_files.append(SHALLOW / elapsed)
                    got = processed(summaries)
                    check(got == (shallow_distinct, SHALLOW - shallow_distinct), f"{got}")
        finally:
            spark.stop()
    params = {"messages": len(messages), "distinct": distinct, "games": games,
              "per_micro_batch": PER_BATCH, "master": "local[2]"}  # fmt: skip
    emit(
        "spark.queue_source", "messages/s", "higher", from_queue,
        "the file source, one 1,000-row file a micro-batch", from_files, params,
    )  # fmt: skip
    emit(
        "spark.queue_source.vs_consumer", "messages/s", "higher", from_queue,
        f"a QueueConsumer, workers={CONSUMER_WORKERS}, on the same queued messages",
        from_consumer, params,
    )  # fmt: skip
    if shallow_queue:
        emit(
            "spark.queue_source.shallow", "messages/s", "higher", shallow_queue,
            "the file source on the same messages", shallow_files,
            {**params, "messages": SHALLOW, "distinct": shallow_distinct},
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
