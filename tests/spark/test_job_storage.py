"""What the job stores: retention inside the job (``keep_last``/``retain_for``)
keeps storage bounded over micro-batches while what Spark repeats before a
commit is still recognised, and states can be stored compressed."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from handlers._compression import MARK
from handlers._outcome import StrategyName
from spark_driver import JobSettings, run_batch, run_stream
from spark_driver._settings import parse_duration
from streamstone_py import Partition, Stream, join_binary
from tests.spark.conftest import write_jsonl
from tests.spark.test_pipeline import Clean, arrange, assert_as_clean, clean, client, outputs

__all__ = ["clean"]  # the fixture: the reference run of test_pipeline's games, here once

GAMES, BATCHES = 4, 4


def shots(game: int, first: int, count: int) -> list[dict[str, Any]]:
    key = f"game-{game:03d}"
    return [
        {
            "message_id": f"{key}-shot-{n}",
            "key": key,
            "type": "FireAt",
            "body": json.dumps({"position": (game * 7 + n * 13) % 100, "player": "p"}),
        }
        for n in range(first, first + count)
    ]


def kept_versions(table: str, key: str, handler: str = "ShootingRange") -> list[int]:
    partition = Partition(client(table), key, handler)
    return [e.version for e in Stream.read(partition, start_version=1).events]


def batch_rows(b: int) -> list[dict[str, Any]]:
    """Micro-batch b brings shots 2b+1 and 2b+2 of every game: two versions per key."""
    return [row for g in range(GAMES) for row in shots(g, 2 * b + 1, 2)]


@pytest.fixture(scope="module")
def clean_outputs(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[StrategyName], list[Any]]:
    """The outputs of every batch's messages run once, in one batch, without
    retention, by strategy: run once per strategy for the whole file."""
    found: dict[StrategyName, list[Any]] = {}

    def of(strategy: StrategyName) -> list[Any]:
        if strategy not in found:
            tmp, table = tmp_path_factory.mktemp("clean"), "clean" + uuid.uuid4().hex[:12]
            client(table)
            everything = [row for b in range(BATCHES) for row in batch_rows(b)]
            settings = JobSettings(table=table, handler="shooting_range", strategy=strategy)
            run_batch(spark, write_jsonl(tmp / "all.jsonl", everything), str(tmp / "out"),
                      settings, partitions=2)  # fmt: skip
            found[strategy] = outputs(spark, str(tmp / "out"))
        return found[strategy]

    return of


@pytest.mark.parametrize(
    ("strategy", "at_least"), [("state", 1), ("outbox", 1), ("state", 3)],
    ids=["state", "outbox", "state-at-least-3"],
)  # fmt: skip
def test_keep_last_bounds_each_key_over_micro_batches_and_a_replay_is_recognised(
    spark: SparkSession,
    tmp_path: Path,
    table_name: str,
    strategy: Any,
    at_least: int,
    clean_outputs: Callable[[StrategyName], list[Any]],
) -> None:
    inbox = tmp_path / "inbox"
    for b in range(BATCHES):
        path = write_jsonl(inbox / f"part-{b:02d}.jsonl", batch_rows(b))
        # The file source takes files oldest first: make that the order written.
        os.utime(path, (1_800_000_000 + b, 1_800_000_000 + b))
    expected = clean_outputs(strategy)
    client(table_name)
    settings = JobSettings(
        table=table_name, handler="shooting_range", strategy=strategy, keep_last=2,
        retain_at_least=at_least,
    )  # fmt: skip
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    batches = run_stream(
        spark, str(inbox), out, checkpoint, settings, partitions=2, max_files_per_trigger=1
    )

    # Each batch keeps the versions it touched. The state strategy also keeps
    # the one before the oldest kept (a duplicate is replayed on it); the
    # outbox strategy removes a version once its outputs were dispatched.
    # With at_least=3 a key is cut only once 3 versions can go: in batch 2
    # (versions 1-3), not in batch 3 (4-5 could go), and not in the replay.
    per_batch, kept = {
        ("state", 1): ([0, 1, 2, 2], [6, 7, 8]),
        ("outbox", 1): ([0, 2, 2, 2], [7, 8]),
        ("state", 3): ([0, 0, 3, 0], [4, 5, 6, 7, 8]),
    }[strategy, at_least]
    assert [s.versions_removed for _, s in batches] == [n * GAMES for n in per_batch]
    keys = [f"game-{g:03d}" for g in range(GAMES)]
    assert {key: kept_versions(table_name, key) for key in keys} == dict.fromkeys(keys, kept)
    merged = sorted(row for p in Path(out).iterdir() for row in outputs(spark, str(p)))
    assert merged == expected

    # The last batch's commit was never logged: it replays, and every message
    # of it is found stored, since retention kept what that batch touched.
    commits = Path(checkpoint) / "commits"
    for entry in (commits / str(BATCHES - 1), commits / f".{BATCHES - 1}.crc"):
        entry.unlink(missing_ok=True)
    replay = run_stream(
        spark, str(inbox), out, checkpoint, settings, partitions=2, max_files_per_trigger=1
    )

    [(batch, summary)] = replay
    assert (batch, summary.processed, summary.duplicates) == (BATCHES - 1, 0, 2 * GAMES)
    assert summary.versions_removed == 0
    merged = sorted(row for p in Path(out).iterdir() for row in outputs(spark, str(p)))
    assert merged == expected
    assert {key: kept_versions(table_name, key) for key in keys} == dict.fromkeys(keys, kept)


def test_a_retried_task_finds_what_its_first_attempt_stored_with_keep_last_zero(
    spark: SparkSession, tmp_path: Path, table_name: str, clean: Clean
) -> None:
    """The first attempt of each task stores a key, runs retention, and dies: the
    retry must still find every message of that key (keep_from), not redo it."""
    rows, path = clean.rows, arrange(tmp_path, table_name, clean)
    settings = JobSettings(
        table=table_name, handler="tests.spark.flaky:first_attempt_dies", keep_last=0
    )

    summary = run_batch(spark, path, str(tmp_path / "out"), settings, partitions=3)

    assert_as_clean(spark, str(tmp_path / "out"), table_name, clean)
    # The retried keys are duplicates of what their first attempts stored.
    assert summary.processed + summary.duplicates == len(rows)
    assert summary.duplicates > 0
    # Every key's versions were touched by the run that wrote them: none removed yet.
    assert summary.versions_removed == 0
    # The next run over new messages removes all but what it touched (and the one before).
    key = rows[0]["key"]
    more = write_jsonl(tmp_path / "more.jsonl", shots(0, 100, 1))
    assert key == "game-000"
    again = run_batch(spark, more, str(tmp_path / "out2"), settings, partitions=1)
    assert (again.processed, again.versions_removed) == (1, 9)
    assert kept_versions(table_name, key) == [10, 11]


def test_retain_for_and_bad_settings(spark: SparkSession, tmp_path: Path, table_name: str) -> None:
    client(table_name)
    settings = JobSettings(
        table=table_name, handler="shooting_range", retain_for=timedelta(0), keep_last=None
    )
    first = write_jsonl(tmp_path / "a.jsonl", shots(1, 1, 3))
    second = write_jsonl(tmp_path / "b.jsonl", shots(1, 4, 1))

    assert run_batch(spark, first, str(tmp_path / "a"), settings).versions_removed == 0
    assert run_batch(spark, second, str(tmp_path / "b"), settings).versions_removed == 2
    assert kept_versions(table_name, "game-001") == [3, 4]

    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("1h30m") == timedelta(hours=1, minutes=30)
    assert parse_duration("90s") == timedelta(seconds=90)
    for bad in ("", "7", "1w", "h", "-3d"):
        with pytest.raises(ValueError, match=f"duration {bad!r} is not like 7d"):
            parse_duration(bad)
    with pytest.raises(ValueError, match="keep_last must be an int >= 0, got -1"):
        JobSettings(table="t", handler="shooting_range", keep_last=-1)
    with pytest.raises(ValueError, match=r"retain_for must be a timedelta >= 0, got 7"):
        JobSettings(table="t", handler="shooting_range", retain_for=7)  # type: ignore[arg-type]


def test_the_job_stores_compressed_states_and_reads_them_back(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    rows = [
        {"message_id": f"m-{n}", "key": f"acct-{n % 3}", "type": "Book",
         "body": json.dumps({"amount": n})}
        for n in range(30)
    ]  # fmt: skip
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    settings = JobSettings(
        table=table_name, handler="tests.test_handlers_compression:ledger", compression="zlib"
    )

    first = run_batch(spark, path, str(tmp_path / "one"), settings, partitions=2)
    again = run_batch(spark, path, str(tmp_path / "two"), settings, partitions=2)

    assert (first.processed, again.duplicates, again.processed) == (30, 30, 0)
    assert outputs(spark, str(tmp_path / "two")) == outputs(spark, str(tmp_path / "one"))
    for key in ("acct-0", "acct-1", "acct-2"):
        header = Stream.open(Partition(client(table_name), key, "Ledger"))
        assert join_binary("State", header.properties)[:2] == MARK + b"\x01"
    with pytest.raises(ValueError, match="compression must be None or 'zlib', got 'lz4'"):
        JobSettings(table="t", handler="shooting_range", compression="lz4")  # type: ignore[arg-type]
