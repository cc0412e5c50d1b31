"""The file stream's intake: no file is skipped without a trace. A file with an
old modification time is taken; a stream starts on an empty folder with
every option; a file written under an in-progress name is read whole once
renamed; a file that cannot be read is dead-lettered by name and the stream
goes on; the input's schema stays what the checkpoint started with. Each
runs real streams against Azurite and asserts exact states and dead letters."""

from __future__ import annotations

import gzip
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from handlers import InMemoryPublisher, Processor
from spark_driver import JobSettings, Summary, run_stream
from spark_driver._checks import Refused, check_input
from tests.spark.conftest import write_jsonl
from tests.spark.test_pipeline import client
from tests.test_handlers_holes import tally

TALLY = "tests.test_handlers_holes:tally"


def add(message_id: str, key: str = "k", **extra: Any) -> dict[str, Any]:
    return {"message_id": message_id, "key": key, "type": "Add", "body": "{}", **extra}


def seen(table: str, key: str = "k") -> list[str]:
    """The ids the key's state has applied, in the order it applied them."""
    state = Processor(tally, client(table), InMemoryPublisher()).current_state(key)
    return list(state.state.seen)


def figures(batches: list[tuple[int, Summary]]) -> list[tuple[int, int, int, int]]:
    return [(b, s.messages_in, s.processed, s.dead_lettered) for b, s in batches]


def dead_letters(spark: SparkSession, out: Path) -> list[tuple[Any, ...]]:
    rows = spark.read.parquet(str(out / "dead_letters")).collect()
    return sorted((r.message_id, r.raw, r.reason) for r in rows)


class Streams:
    """``run_stream`` over one inbox, output and checkpoint, again and again."""

    def __init__(self, spark: SparkSession, tmp: Path, table: str, **options: Any) -> None:
        client(table)
        self.inbox, self.out = tmp / "inbox", tmp / "out"
        self.inbox.mkdir(exist_ok=True)
        self.spark, self.checkpoint = spark, str(tmp / "cp")
        self.settings = JobSettings(
            table=table, handler=TALLY, sent_at=options.pop("sent_at", None)
        )
        self.options = options

    def run(self, **more: Any) -> list[tuple[int, Summary]]:
        return run_stream(
            self.spark, str(self.inbox), str(self.out), self.checkpoint, self.settings,
            partitions=2, **self.options, **more,
        )  # fmt: skip


# --- 1. a new file whose modification time is old --------------------------------------


def test_a_new_file_stamped_days_before_the_newest_taken_is_taken(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    streams = Streams(spark, tmp_path, table_name)
    write_jsonl(streams.inbox / "a.jsonl", [add("a-1")])
    assert figures(streams.run()) == [(0, 1, 1, 0)]

    # What mv, cp -p or a backlog gives: a file that lands now, stamped 8 days ago.
    late = Path(write_jsonl(streams.inbox / "b.jsonl", [add("b-1"), add("b-2")]))
    eight_days_ago = time.time() - 8 * 24 * 3600
    os.utime(late, (eight_days_ago, eight_days_ago))

    assert figures(streams.run()) == [(1, 2, 2, 0)]
    assert seen(table_name) == ["a-1", "b-1", "b-2"]


# --- 2. an empty folder, with --sent-at and --order-by --------------------------------


def test_a_stream_with_sent_at_and_order_by_starts_on_an_empty_folder(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    streams = Streams(spark, tmp_path, table_name, sent_at="at", order_by="seq")
    assert streams.run() == []  # nothing there yet: no micro-batch, and no failure

    at = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    # Numbers order by value (10 after 9), whatever their text or JSON type.
    write_jsonl(streams.inbox / "a.jsonl", [
        add("m-10", seq=10, at=at), add("m-9", seq=9, at=at), add("m-2.5", seq="2.5", at=at),
        add("m-none", at=at), add("m-late", seq=1, at="yesterday"),
    ])  # fmt: skip

    assert figures(streams.run()) == [(0, 5, 4, 1)]
    assert seen(table_name) == ["m-none", "m-2.5", "m-9", "m-10"]
    assert dead_letters(spark, streams.out / "batch=0") == [
        (
            "m-late",
            json.dumps(dict(sorted(add("m-late").items()))),
            "sent time 'yesterday' (column 'at') is not an ISO-8601 time",
        )
    ]
    # The checkpoint keeps those columns: a restart without --order-by is refused.
    changed = Streams(spark, tmp_path, table_name, sent_at="at")
    with pytest.raises(ValueError, match=r"options change them \(column 'seq' is gone\)"):
        changed.run()


def test_a_parquet_stream_on_an_empty_folder_waits_for_a_file_to_take_its_schema_from(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    streams = Streams(spark, tmp_path, table_name, input_format="parquet", order_by="seq")
    stop = threading.Event()
    thread, done = _running(streams, stop)
    try:
        time.sleep(2)  # started, on nothing
        (streams.inbox / "0-notes.txt").write_text("not Parquet\n")  # first, and no schema
        _parquet(streams.inbox / "a.parquet", [add("a-2", seq=2), add("a-1", seq=1)])
        _until(lambda: len(done) >= 1, "a micro-batch")
    finally:
        stop.set()
        thread.join(120)
    assert figures(done) == [(0, 3, 2, 1)]
    assert seen(table_name) == ["a-1", "a-2"]
    ((_, raw, _),) = dead_letters(spark, streams.out / "batch=0")
    assert raw == f"file:{streams.inbox / '0-notes.txt'}"


# --- 3. a file that lands in pieces -----------------------------------------------------


def test_files_written_in_pieces_under_in_progress_names_are_read_whole_once_renamed(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    streams = Streams(spark, tmp_path, table_name)
    names = {".a.jsonl": "a.jsonl", "_b.jsonl": "b.jsonl", "c.jsonl._COPYING_": "c.jsonl"}
    second = {name: json.dumps(add(f"{final[0]}-2")) for name, final in names.items()}
    for name, final in names.items():
        with (streams.inbox / name).open("w") as out:
            out.write(json.dumps(add(f"{final[0]}-1")) + "\n" + second[name][:20])
    assert streams.run() == []  # the stream looked while they were being written

    for name, final in names.items():
        with (streams.inbox / name).open("a") as out:
            out.write(second[name][20:] + "\n")
        (streams.inbox / name).rename(streams.inbox / final)

    assert figures(streams.run()) == [(0, 6, 6, 0)]
    assert seen(table_name) == ["a-1", "a-2", "b-1", "b-2", "c-1", "c-2"]


def test_a_file_written_to_after_the_stream_took_it_is_told_by_name_once(
    spark: SparkSession, tmp_path: Path, table_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    streams = Streams(spark, tmp_path, table_name)
    path = streams.inbox / "a.jsonl"
    path.write_text(json.dumps(add("a-1")) + "\n")  # under its final name: the writer is not done
    start = int(time.time()) - 60
    os.utime(path, (start, start))
    assert figures(streams.run()) == [(0, 1, 1, 0)]
    with path.open("a") as out:
        out.write(json.dumps(add("a-2")) + "\n")
    os.utime(path, (start + 5, start + 5))

    with caplog.at_level("WARNING", logger="spark_driver"):
        assert streams.run() == []  # nothing new: the line added is never read
    told = (
        f"file:{path} was written to 5 s after micro-batch 0 took it: what was written after "
        "is not read (write files elsewhere and rename them in: see How files must land)"
    )
    assert [r.getMessage() for r in caplog.records if r.name.startswith("spark_driver")] == [told]
    write_jsonl(streams.inbox / "b.jsonl", [add("b-1")])
    caplog.clear()
    with caplog.at_level("WARNING", logger="spark_driver"):
        [(batch, summary)] = streams.run()
    assert (batch, summary.notes) == (1, ())  # told once
    assert not [r for r in caplog.records if r.name.startswith("spark_driver")]
    assert seen(table_name) == ["a-1", "b-1"]


# --- 4. a file that cannot be read ------------------------------------------------------


def _parquet(path: Path, rows: list[dict[str, Any]], seq: str = "int64") -> None:
    columns = {n: pa.array([r[n] for r in rows], pa.string()) for n in ("message_id", "key")}
    columns |= {"type": pa.array(["Add"] * len(rows)), "body": pa.array(["{}"] * len(rows))}
    columns["seq"] = pa.array([r["seq"] for r in rows], seq)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_a_file_that_cannot_be_read_is_dead_lettered_by_name_and_the_stream_goes_on(
    spark: SparkSession, tmp_path: Path, table_name: str, fmt: str
) -> None:
    streams = Streams(spark, tmp_path, table_name, input_format=fmt)
    inbox = streams.inbox

    def good(name: str, ids: list[str]) -> None:
        rows = [add(i, seq=n) for n, i in enumerate(ids)]
        if fmt == "json":
            write_jsonl(inbox / f"{name}.jsonl", rows)
        else:
            _parquet(inbox / f"{name}.parquet", rows)

    good("a", ["a-1", "a-2"])
    assert figures(streams.run()) == [(0, 2, 2, 0)]
    if fmt == "json":  # a compressed file cut short, and one that is not compressed at all
        bad = {"b.jsonl.gz": gzip.compress(b'{"message_id": "b-1"}\n' * 50)[:-30],
               "c.jsonl.gz": b"not gzip\n"}  # fmt: skip
    else:  # README.md comes first in a listing, before any Parquet file
        bad = {"README.md": b"notes, not Parquet\n", "c.parquet": b"PAR1 cut short"}
    for name, data in bad.items():
        (inbox / name).write_bytes(data)
    good("d", ["d-1"])

    batches = streams.run()

    assert figures(batches) == [(1, 3, 1, 2)]

    def reason(name: str) -> str:
        if fmt == "json":
            cut = "EOFException: Unexpected end of input stream"
            return f"the file cannot be read as JSON lines: {cut}"
        return (
            f"the file cannot be read as Parquet of the stream's schema: RuntimeException: "
            f"file:{inbox / name} is not a Parquet file. Expected magic number at tail, but "
            f"found {list(bad[name][-4:])}"
        )

    assert dead_letters(spark, streams.out / "batch=1") == [
        (None, f"file:{inbox / name}", reason(name)) for name in sorted(bad)
    ]
    # The command checks the input's format before a first start, not at a restart.
    if fmt == "parquet":
        with pytest.raises(Refused, match=r"README\.md"):
            check_input(str(inbox), fmt)
    check_input(str(inbox), fmt, streams.checkpoint)
    good("e", ["e-1"])  # and the stream goes on, past them, at every restart
    assert figures(streams.run()) == [(2, 1, 1, 0)]
    assert seen(table_name) == ["a-1", "a-2", "d-1", "e-1"]


# --- 5. the input's schema for the life of the checkpoint -------------------------------


def test_a_parquet_file_whose_column_changed_type_is_dead_lettered_naming_the_column(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    streams = Streams(spark, tmp_path, table_name, input_format="parquet", order_by="seq")
    _parquet(streams.inbox / "b.parquet", [add("b-1", seq=1)])
    assert figures(streams.run()) == [(0, 1, 1, 0)]
    # Named to come first in a listing: a schema taken from the files again would be its own.
    _parquet(streams.inbox / "a.parquet", [add("a-1", seq="one")], seq="string")
    assert figures(streams.run()) == [(1, 1, 0, 1)]
    assert dead_letters(spark, streams.out / "batch=1") == [(
        None, f"file:{streams.inbox / 'a.parquet'}",
        "the file cannot be read as Parquet of the stream's schema: "
        "SchemaColumnConvertNotSupportedException: column: [seq], physicalType: BINARY, "
        "logicalType: bigint",
    )]  # fmt: skip
    _parquet(streams.inbox / "c.parquet", [add("c-1", seq=2)])
    assert figures(streams.run()) == [(2, 1, 1, 0)]
    assert seen(table_name) == ["b-1", "c-1"]


def _running(streams: Streams, stop: threading.Event) -> tuple[threading.Thread, list[Any]]:
    """A stream with a trigger, run in a thread until ``stop``: its batches and failure."""
    done: list[Any] = []

    def run() -> None:
        try:
            streams.run(
                trigger=timedelta(seconds=1), stop=stop, on_batch=lambda b, s: done.append((b, s))
            )
        except BaseException as exc:  # told to the test's thread
            done.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, done


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_a_json_stream_keeps_its_column_types_whatever_the_later_lines_hold(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    streams = Streams(spark, tmp_path, table_name, order_by="seq")
    write_jsonl(streams.inbox / "a.jsonl", [add("a-2", seq=2), add("a-1", seq=1)])
    stop = threading.Event()
    thread, done = _running(streams, stop)
    try:
        _until(lambda: len(done) >= 1, "the first micro-batch")
        # Later lines give the column another JSON type: a fraction, and text.
        write_jsonl(streams.inbox / "b.jsonl", [add("b-4", seq="4"), add("b-3", seq=3.5)])
        _until(lambda: len(done) >= 2, "the second micro-batch")
    finally:
        stop.set()
        thread.join(120)
    assert figures(done) == [(0, 2, 2, 0), (1, 2, 2, 0)]
    assert seen(table_name) == ["a-1", "a-2", "b-3", "b-4"]
