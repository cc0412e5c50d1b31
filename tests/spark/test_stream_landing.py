"""Files Spark would leave out without a word, fail on, or die of: each is
told by name (a dead letter, a warning), once, and the other messages are
processed, in a stream and in a batch run. A Parquet stream takes its schema
from a file with the message columns; a restart may swap --order-by and
--sent-at; a damaged checkpoint record is refused naming it; a JVM that dies
ends the command with one line. Real files, real Spark, Azurite."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StructField, StructType

from spark_driver import run_batch
from spark_driver.__main__ import main
from spark_driver._input import MAX_LINE
from tests.spark.conftest import ROOT
from tests.spark.test_pipeline import client
from tests.spark.test_stream_intake import (
    TALLY,
    Streams,
    _parquet,
    add,
    dead_letters,
    figures,
    seen,
)


def _logged(caplog: pytest.LogCaptureFixture) -> list[str]:
    return sorted(r.getMessage() for r in caplog.records if r.name.startswith("spark_driver"))


def test_names_spark_cannot_list_or_open_and_a_line_too_long_are_dead_lettered_by_name(
    spark: SparkSession, tmp_path: Path, table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    streams = Streams(spark, tmp_path, table_name)
    inbox = streams.inbox
    # One line just over the bound (a body Spark would hold whole in memory), then another.
    long = json.dumps(add("big-1", body=json.dumps("x" * MAX_LINE)))
    files: dict[bytes, list[str]] = {
        b"a.jsonl": [json.dumps(add("a-1"))],
        b"b-\xff.jsonl": [json.dumps(add("b-1"))],  # a name that is not UTF-8
        b"t:10.jsonl": [json.dumps(add("t-1"))],  # as timestamps name files
        b"big.jsonl": [long, json.dumps(add("big-2"))],
        b"z.jsonl": [json.dumps(add("z-1"))],
    }
    start = int(time.time()) - 60
    for n, (name, lines) in enumerate(files.items()):
        path = os.fsencode(inbox) + b"/" + name
        with open(path, "w") as out:
            out.write("".join(line + "\n" for line in lines))
        os.utime(path, (start + n, start + n))

    reasons = {
        f"file:{inbox}/b-\\xff.jsonl": "Spark's listing of the folder leaves the file out: its "
        "name is not valid UTF-8, which Spark's JVM cannot represent (rename it)",
        f"file:{inbox}/big.jsonl": f"line 1 is {len(long)} bytes long, over the 8388608 bytes "
        "(8 MiB) a line may hold: it is left out, and the file's other lines are read",
        f"file:{inbox}/t:10.jsonl": "the file cannot be read as JSON lines: its name holds ':', "
        "and Hadoop's local file system names the file's checksum file after it, which such a "
        "name makes no valid path (rename it)",
    }

    def told(folder: Path) -> list[str]:
        return sorted(f"{raw.replace(str(inbox), str(folder))} is dead-lettered: {reason}"
                      for raw, reason in reasons.items())  # fmt: skip

    def letters(folder: Path) -> list[tuple[None, str, str]]:
        return [(None, raw.replace(str(inbox), str(folder)), reason)
                for raw, reason in sorted(reasons.items())]  # fmt: skip

    with caplog.at_level("WARNING", logger="spark_driver"):
        assert figures(streams.run()) == [(0, 6, 3, 3)]
    assert seen(table_name) == ["a-1", "big-2", "z-1"]
    assert dead_letters(spark, streams.out / "batch=0") == letters(inbox)
    assert _logged(caplog) == told(inbox)

    # Each is told once. A name Spark cannot list, alone, makes no micro-batch:
    # it is told as the stream stops, and dead-lettered by the next batch.
    with open(os.fsencode(inbox) + b"/d-\xfe.jsonl", "w") as out:
        out.write(json.dumps(add("d-1")) + "\n")
    caplog.clear()
    with caplog.at_level("WARNING", logger="spark_driver"):
        assert streams.run() == []
    unlisted = (
        "Spark's listing of the folder leaves the file out: its name is not valid UTF-8, "
        "which Spark's JVM cannot represent (rename it)"
    )
    assert _logged(caplog) == [
        f"file:{inbox}/d-\\xfe.jsonl is not read: {unlisted}; the next micro-batch dead-letters it"
    ]
    (inbox / "c.jsonl").write_text(json.dumps(add("c-1")) + "\n")
    caplog.clear()
    with caplog.at_level("WARNING", logger="spark_driver"):
        assert figures(streams.run()) == [(1, 2, 1, 1)]
    assert _logged(caplog) == [f"file:{inbox}/d-\\xfe.jsonl is dead-lettered: {unlisted}"]
    assert dead_letters(spark, streams.out / "batch=1") == [
        (None, f"file:{inbox}/d-\\xfe.jsonl", unlisted)
    ]
    assert seen(table_name) == ["a-1", "big-2", "z-1", "c-1"]

    # A batch run tells the same files, and takes the rest, from a folder
    # whose own name holds glob characters: a name, not a pattern.
    folder = inbox.rename(tmp_path / "in[1]")
    caplog.clear()
    (folder / os.fsdecode(b"d-\xfe.jsonl")).unlink()
    with caplog.at_level("WARNING", logger="spark_driver"):
        summary = run_batch(spark, str(folder), str(tmp_path / "batch"), streams.settings,
                            partitions=2)  # fmt: skip
    assert (summary.messages_in, summary.duplicates, summary.dead_lettered) == (7, 4, 3)
    assert dead_letters(spark, tmp_path / "batch") == letters(folder)
    assert _logged(caplog) == told(folder)
    # Spark's streaming file source reads such a folder's files twice or not at all.
    streams.inbox = folder
    with pytest.raises(ValueError, match="cannot read") as refused:
        streams.run()
    assert str(refused.value) == (
        f"input {str(folder)!r} holds a character Spark's streaming file source reads as a "
        "pattern (* ? [ ] { } \\): a stream cannot read that folder; rename it"
    )


def test_a_parquet_stream_takes_its_schema_from_a_file_with_the_columns_and_refuses_others(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    streams = Streams(spark, tmp_path, table_name, input_format="parquet", order_by="seq")
    # As an earlier version kept it: the schema of a file without the message columns.
    record = Path(streams.checkpoint) / "streamstone" / "input.json"
    record.parent.mkdir(parents=True)
    stray = StructType([StructField("x", LongType())])
    record.write_text(json.dumps({"format": "parquet", "schema": stray.jsonValue()}))
    inbox = streams.inbox
    start = int(time.time()) - 60
    metrics, no_seq = inbox / "0-metrics.parquet", inbox / "1-no-seq.parquet"
    pq.write_table(pa.table({"x": pa.array([1], pa.int64())}), metrics)
    pq.write_table(pa.table({name: [value] for name, value in add("n-1").items()}), no_seq)
    _parquet(inbox / "a.parquet", [add("a-2", seq=2), add("a-1", seq=1)])
    for n, path in enumerate([metrics, no_seq, inbox / "a.parquet"]):
        os.utime(path, (start + n, start + n))

    assert figures(streams.run()) == [(0, 4, 2, 2)]
    assert seen(table_name) == ["a-1", "a-2"]
    assert dead_letters(spark, streams.out / "batch=0") == [
        (None, f"file:{metrics}", "the file lacks the columns ['message_id', 'key', 'type', "
         "'body', 'seq'] (its columns: ['x'])"),
        (None, f"file:{no_seq}", "the file lacks the columns ['seq'] (its columns: "
         "['message_id', 'key', 'type', 'body'])"),
    ]  # fmt: skip
    kept = json.loads(record.read_text())["schema"]["fields"]
    assert [field["name"] for field in kept] == ["message_id", "key", "type", "body", "seq"]


def test_a_restart_may_swap_order_by_and_sent_at_and_a_damaged_record_is_refused_by_name(
    spark: SparkSession,
    tmp_path: Path,
    table_name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    at = datetime.now(UTC).isoformat()
    streams = Streams(spark, tmp_path, table_name, order_by="seq", sent_at="at")
    (streams.inbox / "a.jsonl").write_text(json.dumps(add("a-1", seq=at, at=at)) + "\n")
    assert figures(streams.run()) == [(0, 1, 1, 0)]
    swapped = Streams(spark, tmp_path, table_name, order_by="at", sent_at="seq")
    (streams.inbox / "b.jsonl").write_text(json.dumps(add("b-1", seq=at, at=at)) + "\n")
    assert figures(swapped.run()) == [(1, 1, 1, 0)]
    assert seen(table_name) == ["a-1", "b-1"]

    records = Path(streams.checkpoint) / "streamstone"
    entry = {"uri": "file:/x", "batch": 0, "reason": "r"}
    damaged = {
        "input.json": ('{"format": "json"}', "an object of format and schema (only) was expected"),
        "unreadable.json": (json.dumps([{**entry, "extra": 1}]),
                            f"entry {({**entry, 'extra': 1})!r} is not an object of uri (text), "
                            "batch (a whole number), reason (text) and, optionally, whole "
                            "(true or false)"),
        "written-after-taken.json": ("[1]", "a list of file names was expected"),
    }  # fmt: skip
    for name, (text, why) in damaged.items():
        kept = (records / name).read_text() if (records / name).exists() else None
        (records / name).write_text(text)
        with pytest.raises(ValueError, match="is damaged") as refused:
            swapped.run()
        assert str(refused.value) == (
            f"checkpoint record {str(records / name)!r} is damaged: {why} (the job's own "
            "record: put back what it held, or remove it and the stream records it afresh)"
        )
        if kept is None:
            (records / name).unlink()
        else:
            (records / name).write_text(kept)

    # The command: one line naming the record, exit status 2 (the shared
    # session is left running: the command would stop it as it ends).
    (records / "unreadable.json").write_text('[{"uri": "file:/x", "batch": 0}')
    monkeypatch.setattr(SparkSession, "stop", lambda self: None)
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(["run", "--stream", "--input", str(streams.inbox), "--output", str(streams.out),
              "--checkpoint", streams.checkpoint, "--table", table_name, "--handler", TALLY,
              "--order-by", "at", "--sent-at", "seq"])  # fmt: skip
    try:
        json.loads('[{"uri": "file:/x", "batch": 0}')
    except ValueError as exc:
        why = str(exc)
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"python -m spark_driver: error: checkpoint record {str(records / 'unreadable.json')!r} "
        f"is damaged: {why} (the job's own record: put back what it held, or remove it and the "
        "stream records it afresh)"
    )


def test_a_jvm_that_dies_ends_the_command_with_status_4_and_one_line(
    tmp_path: Path, table_name: str, connection_string: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    client(table_name)
    inbox, checkpoint = tmp_path / "inbox", tmp_path / "cp"
    inbox.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env |= {"STREAMSTONE_CONNECTION_STRING": connection_string, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen(
        [sys.executable, "-m", "spark_driver", "run", "--stream", "--input", str(inbox),
         "--output", str(tmp_path / "out"), "--checkpoint", str(checkpoint), "--table",
         table_name, "--handler", TALLY, "--trigger", "1s"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (checkpoint / "metadata").exists():  # the query runs
            assert run.poll() is None, run.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        # What an OutOfMemoryError does to Spark's JVM, told by its exit code instead.
        children = Path(f"/proc/{run.pid}/task/{run.pid}/children").read_text().split()
        (jvm,) = [int(pid) for pid in children]
        os.kill(jvm, signal.SIGKILL)
        _, stderr = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 4, stderr[-3000:]
    assert stderr.strip().splitlines()[-1] == (
        "python -m spark_driver: error: Spark's JVM ended (killed by signal 9); the run is "
        "safe to start again"
    ), stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
