"""The graceful stop of a stream with ``--trigger``: fed faster than it can
process, SIGTERM lets the micro-batch in progress finish and be committed,
starts no other, and the command exits 0 within the bound the docs state; a
restart applies the rest, each message once. The command runs as a user
runs it, in its own process, against Azurite."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from handlers import HandlerContext, InMemoryPublisher, Message, Processor, handler
from spark_driver import JobSettings, Summary, run_stream
from tests.spark.conftest import ROOT
from tests.spark.test_pipeline import client
from tests.test_handlers_holes import Tally

#: In the command's run (its workers have this variable: "SECONDS,TRACE"),
#: each message takes SECONDS, and its id is added to the file TRACE as it
#: starts: a micro-batch of two files takes about 3 s there.
SLOW_VARIABLE = "STREAMSTONE_TEST_SLOW_HANDLER"
SLOW = 0.3
PER_FILE = 5
#: The docs' bound on the stop after the micro-batch in progress is written
#: (spark-pipeline.md, "--trigger").
STOP_BOUND = 30


@handler("SlowTally", Tally, types=["Add"])
def slow_tally(state: Tally, message: Message, ctx: HandlerContext) -> None:
    slow = os.environ.get(SLOW_VARIABLE)
    if slow is not None:
        seconds, trace = slow.split(",", 1)
        with open(trace, "a") as out:
            out.write(message.id + "\n")
        time.sleep(float(seconds))
    state.count += 1
    state.seen.append(message.id)


def _done(out: Path) -> list[int]:
    """The micro-batches whose results are whole (their summary written last)."""
    found = (int(p.parent.parent.name.split("=")[1]) for p in out.glob("batch=*/summary/_SUCCESS"))
    return sorted(found)


def _wait(until: Callable[[], bool], run: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 180
    while not until():
        if run.poll() is not None or time.monotonic() > deadline:
            run.kill()
            pytest.fail(f"exit {run.returncode}: {run.communicate()[1][-3000:]}")
        time.sleep(0.1)


class Feeder(threading.Thread):
    """Files of messages landing in ``inbox`` (written beside it, then renamed
    in), one every 0.25 s while fewer than three micro-batches' worth wait:
    faster than the stream takes them, and never far ahead."""

    def __init__(self, tmp: Path, out: Path) -> None:
        super().__init__()
        self.out = out
        self.inbox, self.staging = tmp / "inbox", tmp / "staging"
        self.inbox.mkdir()
        self.staging.mkdir()
        self.ids: list[str] = []
        self.halt = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.halt.wait(0.25):
            if n >= 2 * (len(_done(self.out)) + 3):
                continue
            ids = [f"m-{n:04d}-{i}" for i in range(PER_FILE)]
            at = datetime.now(UTC).isoformat()
            rows = [{"message_id": i, "key": "k", "type": "Add", "at": at} for i in ids]
            staged = self.staging / f"f-{n:04d}.jsonl"
            staged.write_text("".join(json.dumps(row) + "\n" for row in rows))
            staged.rename(self.inbox / staged.name)
            self.ids.extend(ids)
            n += 1


def test_sigterm_lets_the_batch_in_progress_finish_and_a_restart_applies_the_rest_once(
    spark: SparkSession, tmp_path: Path, table_name: str, connection_string: str
) -> None:
    client(table_name)
    out, checkpoint, trace = tmp_path / "out", tmp_path / "cp", tmp_path / "trace"
    trace.touch()
    feeder = Feeder(tmp_path, out)

    def started() -> list[str]:
        return trace.read_text().split()

    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env |= {"STREAMSTONE_CONNECTION_STRING": connection_string, "PYTHONPATH": str(ROOT),
            SLOW_VARIABLE: f"{SLOW},{trace}"}  # fmt: skip
    # --sent-at on an empty inbox: the stream starts without a file to read columns from.
    run = subprocess.Popen(
        [sys.executable, "-m", "spark_driver", "run", "--stream", "--input", str(feeder.inbox),
         "--output", str(out), "--checkpoint", str(checkpoint), "--table", table_name,
         "--handler", "tests.spark.test_stream_stop:slow_tally", "--partitions", "1",
         "--trigger", "1s", "--max-files-per-trigger", "2", "--sent-at", "at"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _wait(lambda: (checkpoint / "metadata").exists(), run)  # the query started, on nothing
        feeder.start()
        # Two micro-batches written, and the handlers of the next one at work.
        _wait(lambda: len(started()) > 2 * PER_FILE * max(2, len(_done(out))), run)
        before, at_signal = _done(out), started()
        run.send_signal(signal.SIGTERM)
        stdout, stderr = run.communicate(timeout=180)
        ended = time.time()
    finally:
        feeder.halt.set()
        if feeder.is_alive():
            feeder.join()
        if run.poll() is None:
            run.kill()

    assert run.returncode == 0, stderr[-3000:]
    assert "stopping: the micro-batch in progress finishes first" in stderr
    printed = [int(n) for n in re.findall(r"micro-batch (\d+):", stdout)]
    assert printed == _done(out) == list(range(len(printed))), stdout
    assert sorted(p.name for p in out.iterdir()) == [f"batch={n}" for n in printed]
    assert len(printed) > len(before)  # the batch in progress at the signal was written
    last = out / f"batch={printed[-1]}" / "summary" / "_SUCCESS"
    assert ended - last.stat().st_mtime < STOP_BOUND
    # Whole batches applied, nothing of another: the messages the handler had
    # started at the signal are among them, and the state holds exactly them.
    outcomes = spark.read.parquet(*(str(out / f"batch={n}" / "outcomes") for n in printed))
    written = {r.message_id for r in outcomes.collect() if r.status == "completed"}
    state = Processor(slow_tally, client(table_name), InMemoryPublisher()).current_state("k")
    assert sorted(state.state.seen) == sorted(written)
    assert set(at_signal) <= written

    # A restart takes the rest: every message once, in the order the files landed.
    settings = JobSettings(table=table_name, handler="tests.spark.test_stream_stop:slow_tally",
                           sent_at="at")  # fmt: skip
    rest = run_stream(spark, str(feeder.inbox), str(tmp_path / "out2"), str(checkpoint),
                      settings, partitions=2)  # fmt: skip
    assert rest
    assert [s.duplicates for _, s in rest] == [0] * len(rest)  # the stopped batch was committed
    state = Processor(slow_tally, client(table_name), InMemoryPublisher()).current_state("k")
    assert state.state.seen == feeder.ids


def test_a_batch_that_starts_once_told_to_stop_is_left_whole_for_the_next_start(
    spark: SparkSession, tmp_path: Path, table_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark_driver import _stream

    client(table_name)
    inbox = tmp_path / "inbox"
    ids = [f"m-{n}" for n in range(3)]
    for n, message_id in enumerate(ids):
        path = inbox / f"f-{n}.jsonl"
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"message_id": message_id, "key": "k", "type": "Add"}) + "\n")
        os.utime(path, (1_800_000_000 + n, 1_800_000_000 + n))
    settings = JobSettings(table=table_name, handler="tests.spark.test_stream_stop:slow_tally")
    stop = threading.Event()
    # The stop asked for as the first batch is written; the query is left to
    # run on, so that the next batch, which Spark starts at once, meets it.
    monkeypatch.setattr(_stream, "_stop_after_batch", lambda query, sink: False)

    def run(**options: Any) -> list[tuple[int, Summary]]:
        return run_stream(spark, str(inbox), str(tmp_path / "out"), str(tmp_path / "cp"),
                          settings, partitions=1, max_files_per_trigger=1, **options)  # fmt: skip

    first = run(trigger=timedelta(seconds=1), stop=stop, on_batch=lambda b, s: stop.set())
    rest = run()

    assert [b for b, _ in first] == [0]
    assert [(b, s.processed, s.duplicates) for b, s in rest] == [(1, 1, 0), (2, 1, 0)]
    state = Processor(slow_tally, client(table_name), InMemoryPublisher()).current_state("k")
    assert state.state.seen == ids
