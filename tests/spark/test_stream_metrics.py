"""Each micro-batch's figures reach its ``StreamingQueryProgress``: the
processing is part of the streaming plan, which Spark observes by itself."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

from spark_driver import METRICS, JobSettings, Summary, run_batch, run_stream
from tests.spark.conftest import game_messages, write_jsonl
from tests.spark.test_pipeline import client, outcomes, outputs, states

OBSERVED = [
    "messages_in", "processed", "duplicates", "dead_lettered", "abandoned", "faulted",
    "conflicts_retried", "versions_removed", "requests",
]  # fmt: skip


class Progress(StreamingQueryListener):
    """The observed metrics of one named query, by batch id."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.metrics: dict[int, dict[str, int]] = {}

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        if progress.name == self.name and METRICS in progress.observedMetrics:
            self.metrics[progress.batchId] = progress.observedMetrics[METRICS].asDict()

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def observe(
    spark: SparkSession, name: str, inbox: str, out: str, settings: JobSettings
) -> tuple[list[tuple[int, Summary]], dict[int, dict[str, int]]]:
    """Run the stream; return its summaries and the metrics its progress events carried."""
    listener = Progress(name)
    spark.streams.addListener(listener)
    try:
        batches = run_stream(
            spark, inbox, out, out + "-checkpoint", settings,
            partitions=2, max_files_per_trigger=1, query_name=name,
        )  # fmt: skip
        # The listener bus delivers progress events after the batch, asynchronously.
        deadline = time.monotonic() + 60
        while len(listener.metrics) < len(batches) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        spark.streams.removeListener(listener)
    return batches, listener.metrics


def inbox_of(directory: Path, files: list[list[str]]) -> str:
    """One file per micro-batch, oldest first (the file source's order)."""
    for n, lines in enumerate(files):
        path = directory / f"part-{n:02d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(line + "\n" for line in lines))
        os.utime(path, (1_800_000_000 + n, 1_800_000_000 + n))
    return str(directory)


def lines(rows: list[dict[str, Any]]) -> list[str]:
    return [json.dumps(row) for row in rows]


def shot(key: str, n: int, position: int) -> dict[str, Any]:
    body = json.dumps({"position": position, "player": "p"})
    return {"message_id": f"{key}-extra-{n}", "key": key, "type": "FireAt", "body": body}


def test_each_micro_batch_reports_its_figures_in_the_streaming_progress(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    rows = game_messages(3, 4)  # 15 messages over 3 keys
    unknown = {"message_id": "alien", "key": "game-000", "type": "Teleport", "body": "{}"}
    far = shot("game-001", 1, 99)  # refused by the handler: abandoned
    inbox = inbox_of(
        tmp_path / "inbox",
        [
            lines(rows),
            [*lines(rows[:5]), *lines([unknown, far, shot("game-002", 2, 10)]), "not json"],
            lines([far, shot("game-002", 3, 20), rows[0]]),
        ],
    )
    client(table_name)
    settings = JobSettings(
        table=table_name, handler="tests.spark.flaky:refuses_far_shots", keep_last=2
    )

    batches, metrics = observe(spark, "figures", inbox, str(tmp_path / "out"), settings)

    assert [batch for batch, _ in batches] == [0, 1, 2]
    assert sorted(metrics) == [0, 1, 2]
    figures = [{name: metrics[b][name] for name in OBSERVED} for b in range(3)]
    # Exactly the figures of each batch's summary, which comes from the rows written.
    assert figures == [{name: getattr(s, name) for name in OBSERVED} for _, s in batches]
    counts = ["messages_in", "processed", "duplicates", "dead_lettered", "abandoned", "faulted"]
    assert [[f[name] for name in counts] for f in figures] == [
        [15, 15, 0, 0, 0, 0],
        [9, 1, 5, 2, 1, 0],
        [3, 1, 1, 0, 1, 0],
    ]
    assert [f["conflicts_retried"] for f in figures] == [0, 0, 0]
    # keep_last=2 keeps two versions, and the state strategy the one before
    # them. Batch 1: game-001 (5 versions) loses 1-2; game-002 (now 6) loses
    # 1-3; game-000's duplicates touched version 1, which stays. Batch 2:
    # game-002 (now 7) loses 4.
    assert [f["versions_removed"] for f in figures] == [0, 5, 1]
    assert all(f["requests"] > 0 for f in figures)


def test_metrics_count_each_task_once_when_first_attempts_die(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    rows = game_messages(4, 6)  # 28 messages over 4 keys, shots 1 to 6
    files = [lines(rows[0::2]), lines(rows[1::2])]
    inbox = inbox_of(tmp_path / "inbox", files)
    clean_table = table_name + "c"
    client(clean_table)
    clean = JobSettings(table=clean_table, handler="shooting_range")
    _, clean_metrics = observe(spark, "clean", inbox, str(tmp_path / "clean"), clean)
    client(table_name)
    # Every task's first attempt dies after storing its first key's messages.
    dying = JobSettings(table=table_name, handler="tests.spark.flaky:first_attempt_dies")

    batches, metrics = observe(spark, "retried", inbox, str(tmp_path / "out"), dying)

    assert sorted(metrics) == sorted(clean_metrics) == [0, 1]
    for b, (_, summary) in enumerate(batches):
        assert {n: metrics[b][n] for n in OBSERVED} == {n: getattr(summary, n) for n in OBSERVED}
        # Counted once: a dead attempt's rows are not in the figures, and what
        # it stored is found by the retry (duplicates, not changes).
        assert metrics[b]["messages_in"] == 14
        assert metrics[b]["processed"] + metrics[b]["duplicates"] == 14
        assert (clean_metrics[b]["processed"], clean_metrics[b]["duplicates"]) == (14, 0)
    assert sum(metrics[b]["duplicates"] for b in (0, 1)) > 0  # some attempt did die
    for b in (0, 1):
        name = f"batch={b}"
        assert outputs(spark, str(tmp_path / "out" / name)) == outputs(
            spark, str(tmp_path / "clean" / name)
        )
    keys = sorted({row["key"] for row in rows})
    assert states(table_name, keys) == states(clean_table, keys)


def test_a_stream_orders_each_key_by_the_order_column(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    # The rows written in reverse, ``seq`` giving the real order: a streaming
    # plan may not sort, so the tasks order each key by ``seq`` themselves.
    rows = game_messages(3, 4)
    clean_table = table_name + "c"
    client(clean_table)
    clean = JobSettings(table=clean_table, handler="shooting_range")
    # The reference is a batch run over the rows in order (Spark sorts there).
    in_order = write_jsonl(tmp_path / "clean.jsonl", rows)
    run_batch(spark, in_order, str(tmp_path / "clean-out"), clean, partitions=2)
    backwards = [{**row, "seq": n} for n, row in reversed(list(enumerate(rows)))]
    inbox = inbox_of(tmp_path / "inbox", [lines(backwards)])
    client(table_name)
    settings = JobSettings(table=table_name, handler="shooting_range")

    batches = run_stream(spark, inbox, str(tmp_path / "out"), str(tmp_path / "checkpoint"),
                         settings, partitions=2, order_by="seq")  # fmt: skip

    assert [(b, s.processed) for b, s in batches] == [(0, len(rows))]
    assert outputs(spark, str(tmp_path / "out" / "batch=0")) == outputs(
        spark, str(tmp_path / "clean-out")
    )
    # Each message at the version the real order gives it (outputs alone would
    # not show a wrong order: this handler misses either way).
    assert outcomes(spark, str(tmp_path / "out" / "batch=0")) == outcomes(
        spark, str(tmp_path / "clean-out")
    )
    keys = sorted({row["key"] for row in rows})
    assert states(table_name, keys) == states(clean_table, keys)
