"""The job as a user meets it: ordering columns, the summary and its marker, long
streams, and the command line's first-run checks and exit statuses."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from spark_driver import (
    JobSettings,
    process_messages,
    read_messages,
    run_batch,
    run_stream,
    session,
    write_result,
)
from spark_driver.__main__ import main
from spark_driver._checks import check_table, note_replaced_output
from tests.spark.conftest import game_messages, spread, write_jsonl
from tests.spark.test_pipeline import client, outcomes, outputs
from tests.test_config import valid_sas


def reversed_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows written in reverse, each with ``seq`` giving the real order."""
    return [{**row, "seq": n} for n, row in reversed(list(enumerate(rows)))]


@pytest.fixture(scope="module")
def in_order(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    """The results of a run of the games' messages in their order, and its settings:
    each format's run in reverse order by ``seq`` must give the same."""
    tmp, table = tmp_path_factory.mktemp("in-order"), "ordered" + uuid.uuid4().hex[:12]
    client(table)
    settings = JobSettings(table=table, handler="shooting_range")
    path = write_jsonl(tmp / "clean.jsonl", game_messages(3, 4))
    run_batch(spark, path, str(tmp / "clean"), settings, partitions=2)
    return str(tmp / "clean"), settings


@pytest.mark.parametrize("input_format", ["json", "parquet"])
def test_order_by_a_column_of_the_input(
    spark: SparkSession,
    tmp_path: Path,
    table_name: str,
    input_format: str,
    in_order: tuple[str, Any],
) -> None:
    rows = game_messages(3, 4)
    client(table_name)
    clean, settings = in_order

    path = write_jsonl(tmp_path / "in.jsonl", reversed_order(rows))
    if input_format == "parquet":
        spark.read.json(path).write.parquet(str(tmp_path / "in.parquet"))
        path = str(tmp_path / "in.parquet")
    summary = run_batch(
        spark, path, str(tmp_path / "out"), JobSettings(table=table_name, handler="shooting_range"),
        input_format=input_format, partitions=2, order_by="seq",
    )  # fmt: skip

    assert summary.processed == len(rows)
    assert outputs(spark, str(tmp_path / "out")) == outputs(spark, clean)
    # Each message at the version the real order gives it (outputs alone would
    # not show a wrong order: this handler misses either way).
    assert outcomes(spark, str(tmp_path / "out")) == outcomes(spark, clean)
    with pytest.raises(ValueError, match="order column 'nope' is not in the input"):
        run_batch(
            spark, path, str(tmp_path / "x"), settings,
            input_format=input_format, order_by="nope",
        )  # fmt: skip


def test_the_summary_is_the_written_rows_and_is_written_last(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    rows = game_messages(3, 3)
    bad = {"message_id": "alien", "key": "game-000", "type": "Teleport", "body": "{}"}
    client(table_name)
    path = write_jsonl(tmp_path / "in.jsonl", [*rows, *rows[:4], bad])
    out = tmp_path / "out"

    summary = run_batch(
        spark, path, str(out), JobSettings(table=table_name, handler="shooting_range")
    )

    statuses = [r[3] for r in outcomes(spark, str(out))]
    assert summary.messages_in == len(statuses) == len(rows) + 5
    assert (
        (summary.processed, summary.duplicates, summary.dead_lettered)
        == (
            statuses.count("completed"),
            statuses.count("duplicate"),
            statuses.count("dead_lettered"),
        )
        == (len(rows), 4, 1)
    )
    assert summary.outputs == len(outputs(spark, str(out))) == 9
    assert summary.exit_status == 0
    marker = spark.read.json(str(out / "summary")).collect()
    assert [row.asDict() for row in marker] == [
        {
            "messages_in": 17,
            "processed": 12,
            "duplicates": 4,
            "new_outputs": 9,
            "reemitted_outputs": 0,
            "dead_lettered": 1,
            "abandoned": 0,
            "faulted": 0,
            "conflicts_retried": 0,
            "versions_removed": 0,
            # One write per key: the worker's header cache knows each new stream.
            "requests": 3,
        }
    ]
    assert (out / "summary" / "_SUCCESS").exists()
    newest = max(p.stat().st_mtime for p in (out / "outcomes").iterdir())
    assert (out / "summary" / "_SUCCESS").stat().st_mtime >= newest

    # Delivered again: the same output rows, each a re-emitted copy, none new.
    # No header cache, so the request count does not depend on which Python
    # worker ran a key the first time.
    settings = JobSettings(table=table_name, handler="shooting_range", header_cache=False)
    again = run_batch(spark, path, str(tmp_path / "again"), settings)
    assert (again.processed, again.duplicates, again.new_outputs, again.reemitted_outputs) == (
        0, 16, 0, 9,
    )  # fmt: skip
    # A header read per key (3), and a read per stored message delivered again (12).
    assert again.requests == 15
    assert outputs(spark, str(tmp_path / "again")) == outputs(spark, str(out))
    lines = [line.split() for line in again.table().splitlines()]
    assert ["output", "messages,", "new", "0"] in lines
    assert ["output", "messages,", "re-emitted", "9"] in lines


def test_the_summary_equals_the_written_rows_when_spark_recomputes(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    # A lost executor or an evicted cache makes Spark run the task body again for
    # each write: counters updated inside the tasks would count every run.
    rows = game_messages(2, 3)
    client(table_name)
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    settings = JobSettings(table=table_name, handler="shooting_range")
    result = process_messages(read_messages(spark, path, "json"), settings, 2)
    result.unpersist()  # as if evicted: every write below recomputes

    summary = write_result(result, str(tmp_path / "out"), "parquet")

    statuses = [r[3] for r in outcomes(spark, str(tmp_path / "out"))]
    assert summary.messages_in == len(statuses) == len(rows)
    assert (summary.processed, summary.duplicates) == (
        statuses.count("completed"),
        statuses.count("duplicate"),
    )
    assert summary.outputs == len(outputs(spark, str(tmp_path / "out")))


def test_micro_batches_release_what_they_cached(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    # Four: what one batch left cached would show from the second batch on.
    rows = game_messages(4, 4)
    client(table_name)
    inbox = spread(tmp_path / "inbox", rows, 4)
    settings = JobSettings(table=table_name, handler="shooting_range")
    jvm_context: Any = spark.sparkContext._jsc

    def cached() -> tuple[int, int]:
        """Spark's own figures: persisted RDDs, and the memory their blocks hold."""
        infos = jvm_context.sc().getRDDStorageInfo()
        return jvm_context.getPersistentRDDs().size(), sum(i.memSize() for i in infos)

    before = cached()
    after_batches: list[tuple[int, int]] = []

    summaries = run_stream(
        spark, inbox, str(tmp_path / "out"), str(tmp_path / "checkpoint"), settings,
        partitions=2, max_files_per_trigger=1,
        on_batch=lambda batch, summary: after_batches.append(cached()),
    )  # fmt: skip

    assert [batch for batch, _ in summaries] == list(range(4))
    assert sum(s.processed for _, s in summaries) == len(rows)
    assert after_batches == [before] * 4


# --- the command line ----------------------------------------------------------


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as done:
        main(args)
    return int(done.value.code or 0), capsys.readouterr().err


def test_help_states_every_default_and_what_stream_and_output_do(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    for default in ("json", "parquet", "handlerstate", "shooting_range", "state", "8",
                    "WARNING", "ERROR"):  # fmt: skip
        assert f"(default: {default})" in text
    assert "(default: the one spark-submit set, else local[2])" in text
    assert "(default: None)" not in text
    assert "(default: False)" not in text
    assert "one micro-batch each under OUTPUT/batch=N, then exit" in text
    assert "a batch run replaces the results of an earlier run there" in text


def test_refusals_are_one_line_and_exit_2_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", game_messages(1, 1))
    base = ["run", "--input", path, "--output", str(tmp_path / "out")]
    cases = {
        "--partitions must be >= 1, got 0": [*base, "--partitions", "0"],
        "--concurrency must be >= 1, got 0": [*base, "--concurrency", "0"],
        "--table 'no_such-name' is not a valid table name": [*base, "--table", "no_such-name"],
        f"--input '{tmp_path}/missing' does not exist": [
            "run", "--input", str(tmp_path / "missing"), "--output", "o"
        ],
        "--stream needs --checkpoint": [*base, "--stream"],
        "--max-files-per-trigger needs --stream": [*base, "--max-files-per-trigger", "1"],
        "--max-files-per-trigger must be >= 1, got 0": [
            *base, "--stream", "--checkpoint", "c", "--max-files-per-trigger", "0"
        ],
        "is neither a built-in": [*base, "--handler", "nothing"],
        "unrecognized arguments: --bogus": [*base, "--bogus"],
        "--spark-log-level: invalid choice: 'LOUD'": [*base, "--spark-log-level", "LOUD"],
        "--keep-last must be >= 0, got -1": [*base, "--keep-last", "-1"],
        "--retain-at-least must be >= 1, got 0": [*base, "--retain-at-least", "0"],
        "--retain-at-least needs --keep-last or --retain-for": [
            *base, "--retain-at-least", "4"
        ],
        "--retain-for: duration '1w' is not like 7d, 36h, 1h30m or 90s": [
            *base, "--retain-for", "1w"
        ],
        "--compression: invalid choice: 'gzip'": [*base, "--compression", "gzip"],
    }  # fmt: skip
    for expected, args in cases.items():
        code, err = run_cli(args, capsys)
        assert (code, err.count("\n")) == (2, 1), (args, err)
        assert expected in err
        assert "Traceback" not in err

    for name in ("STREAMSTONE_CONNECTION_STRING", "STREAMSTONE_ACCOUNT_URL"):
        monkeypatch.delenv(name, raising=False)
    code, err = run_cli(base, capsys)
    assert (code, err.count("\n")) == (2, 1)
    assert err.startswith("python -m spark_driver: error: no storage account configured")
    with pytest.raises(ValueError, match="spark_log_level must be one of ERROR, WARN, INFO, "
                       "DEBUG, got 'warning'"):  # fmt: skip
        session(spark_log_level="warning")


def test_a_missing_table_is_created_or_refused(
    spark: SparkSession,
    tmp_path: Path,
    table_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", game_messages(1, 1))
    base = ["run", "--input", path, "--output", str(tmp_path / "out"), "--table", table_name]

    code, err = run_cli([*base, "--no-create-table"], capsys)
    assert (code, err) == (2, f"python -m spark_driver: error: table {table_name!r} "
                              "does not exist (--no-create-table)\n")  # fmt: skip

    # What the command does next without --no-create-table (called alone, so that
    # the command does not go on to stop the shared Spark session of these tests).
    check_table(table_name, create=True)
    assert capsys.readouterr().err == f"created table {table_name!r}\n"
    check_table(table_name, create=False)  # there now
    assert capsys.readouterr().err == ""


def test_exit_status_3_when_messages_are_left_for_redelivery_and_no_sas_in_debug_logs(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    # One run of the command line (a JVM each), streaming two files as two
    # micro-batches: credentials from a SAS token, every logger at DEBUG, and a
    # handler that leaves a message for redelivery in the first batch.
    connection_string = os.environ["STREAMSTONE_CONNECTION_STRING"]
    sas = valid_sas(connection_string)
    signature = re.search(r"sig=([^&]+)", sas)
    assert signature is not None
    env = {k: v for k, v in os.environ.items() if k != "STREAMSTONE_CONNECTION_STRING"}
    env["STREAMSTONE_ACCOUNT_URL"] = connection_string.split("TableEndpoint=")[1].split(";")[0]
    env["STREAMSTONE_SAS_TOKEN"] = sas
    rows = [
        {"message_id": f"k-{n}", "key": "k", "type": "FireAt", "body": json.dumps({"position": p})}
        for n, p in enumerate([1, 99, 2])
    ]
    inbox = tmp_path / "inbox"
    for n, part in enumerate([rows[:2], rows[2:]]):
        path = write_jsonl(inbox / f"part-{n}.jsonl", part)
        os.utime(path, (1_800_000_000 + n, 1_800_000_000 + n))  # the file source's order
    command = [sys.executable, "-m", "spark_driver", "run", "--input", str(inbox),
               "--output", str(tmp_path / "out"), "--table", table_name,
               "--stream", "--checkpoint", str(tmp_path / "checkpoint"),
               "--max-files-per-trigger", "1",
               "--handler", "tests.spark.flaky:refuses_far_shots", "--partitions", "1",
               "--log-level", "DEBUG", "--keep-last", "1", "--retain-for", "7d",
               "--compression", "zlib"]  # fmt: skip

    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)

    assert done.returncode == 3, done.stderr[-2000:]
    assert f"created table {table_name!r}" in done.stderr
    assert "spark master: local[2]\n" in done.stderr  # no launcher chose one
    first, second = done.stdout.split("micro-batch 0:\n")[1].split("micro-batch 1:\n")
    assert re.search(r"processed \(new version stored\)\s+1\n", first), done.stdout
    assert re.search(r"abandoned \(handler error\)\s+1\n", first), done.stdout
    assert re.search(r"processed \(new version stored\)\s+1\n", second), done.stdout
    assert re.search(r"abandoned \(handler error\)\s+0\n", second), done.stdout
    assert re.search(r"versions removed \(retention\)\s+0\n", second), done.stdout
    assert "Traceback" not in done.stderr
    # Spark's JVM logs at ERROR from its first line: none of its start-up warnings.
    assert "log4j profile" not in done.stderr
    assert "Setting default log level" not in done.stderr
    assert not re.search(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d WARN ", done.stderr, re.M)
    logged = done.stdout + done.stderr
    assert "urllib3.connectionpool" in logged  # every logger was on, request lines too
    assert "sig=***" in logged
    assert signature.group(1) not in logged


# --- rows from other producers -----------------------------------------------------


def test_a_number_out_of_msgpack_range_is_dead_lettered_not_a_crash(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    good = game_messages(1, 2)
    huge = {"message_id": "huge", "key": "game-000", "type": "FireAt",
            "body": '{"position": 100000000000000000000}'}  # fmt: skip
    path = write_jsonl(tmp_path / "in.jsonl", [*good, huge])

    summary = run_batch(
        spark, path, str(tmp_path / "out"), JobSettings(table=table_name, handler="shooting_range")
    )

    letters = spark.read.parquet(str(tmp_path / "out" / "dead_letters")).collect()
    assert [r["message_id"] for r in letters] == ["huge"]
    assert "outside msgpack's range" in letters[0]["reason"]
    assert (summary.processed, summary.dead_lettered) == (len(good), 1)


def test_parquet_with_integer_ids_and_struct_bodies(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    client(table_name + "c")
    rows = [(1000 + n, 7, "FireAt", (n * 11 % 100, f"p{n}")) for n in range(1, 5)]
    frame = spark.createDataFrame(
        rows, "message_id long, key long, type string, body struct<position:int,player:string>"
    )
    frame.write.parquet(str(tmp_path / "in.parquet"))
    settings = JobSettings(table=table_name, handler="shooting_range")

    summary = run_batch(
        spark, str(tmp_path / "in.parquet"), str(tmp_path / "out"), settings,
        input_format="parquet", partitions=1,
    )  # fmt: skip

    assert (summary.processed, summary.dead_lettered) == (4, 0)
    same_as_text = [
        {
            "message_id": str(i),
            "key": "7",
            "type": t,
            "body": json.dumps({"position": p, "player": q}),
        }
        for i, _, t, (p, q) in rows
    ]
    path = write_jsonl(tmp_path / "text.jsonl", same_as_text)
    clean = JobSettings(table=table_name + "c", handler="shooting_range")
    run_batch(spark, path, str(tmp_path / "clean"), clean, partitions=1)
    assert outputs(spark, str(tmp_path / "out")) == outputs(spark, str(tmp_path / "clean"))
    bodies = [json.loads(r[3]) for r in outputs(spark, str(tmp_path / "out"))]
    assert sorted(b["position"] for b in bodies) == sorted(p for *_, (p, _) in rows)


def test_dead_letters_keep_their_raw_input_to_fix_and_send_again(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    good = game_messages(1, 2)
    no_key = {"message_id": "no-key", "key": None, "type": "FireAt", "body": '{"position": 4}'}
    path = tmp_path / "in.jsonl"
    lines = [json.dumps(r) for r in [*good, no_key]] + ["this is not json", '["an", "array"]']
    path.write_text("\n".join(lines) + "\n")
    settings = JobSettings(table=table_name, handler="shooting_range")

    summary = run_batch(spark, str(path), str(tmp_path / "out"), settings, partitions=1)

    letters = sorted(
        (r["message_id"] or "", r["reason"], r["raw"])
        for r in spark.read.parquet(str(tmp_path / "out" / "dead_letters")).collect()
    )
    raw_no_key = json.dumps(no_key, sort_keys=True)
    unparseable = (
        "unparseable line: not a JSON object, or one nested too deep for Spark's JSON reader"
    )
    assert letters == [
        ("", unparseable, '["an", "array"]'),
        ("", unparseable, "this is not json"),
        ("no-key", "missing key", raw_no_key),
    ]
    assert (summary.processed, summary.dead_lettered) == (len(good), 3)

    # The fixed row, sent again, is processed like any other.
    fixed = {**json.loads(raw_no_key), "key": good[0]["key"]}
    again = write_jsonl(tmp_path / "again.jsonl", [fixed])
    resent = run_batch(spark, again, str(tmp_path / "out2"), settings, partitions=1)
    assert (resent.processed, resent.dead_lettered) == (1, 0)


def test_a_batch_run_says_when_it_replaces_earlier_results(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    note_replaced_output(str(out), stream=False)  # nothing there yet
    (out / "outcomes").mkdir(parents=True)
    note_replaced_output(str(out), stream=True)  # a stream writes new batch=N directories
    assert capsys.readouterr().err == ""

    note_replaced_output(str(out), stream=False)

    assert capsys.readouterr().err == (
        f"--output {str(out)!r} holds an earlier run: its results are replaced\n"
    )
