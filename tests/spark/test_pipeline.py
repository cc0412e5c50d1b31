"""The Spark pipeline against Azurite: whatever Spark repeats, the effect is once."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ResourceExistsError
from azure.data.tables import TableClient
from pyspark.sql import SparkSession

from handlers import InMemoryPublisher, Processor
from handlers.examples import shooting_range
from spark_driver import JobSettings, read_messages, run_batch, run_stream
from spark_driver._tasks._executor import process_partition
from tests.spark.conftest import game_messages, spread, write_jsonl
from tests.spark.flaky import die_marker

GAMES, SHOTS = 12, 9
#: Both strategies must give the clean run's outputs and states under every fault.
STRATEGIES = pytest.mark.parametrize("strategy", ["state", "outbox"])


def client(table: str) -> TableClient:
    connection_string = os.environ["STREAMSTONE_CONNECTION_STRING"]
    service_table = TableClient.from_connection_string(connection_string, table)
    with contextlib.suppress(ResourceExistsError):
        service_table.create_table()
    return service_table


def outputs(spark: SparkSession, path: str) -> list[tuple[Any, ...]]:
    """What a run's outputs are, without when they were produced nor their
    headers (transport metadata: the trace each run published them in)."""
    written = spark.read.parquet(f"{path}/outputs").drop("produced", "headers")
    return sorted(map(tuple, written.collect()))


def outcomes(spark: SparkSession, path: str) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in spark.read.parquet(f"{path}/outcomes").collect())


def states(table: str, keys: list[str]) -> dict[str, Any]:
    processor = Processor(shooting_range, client(table), InMemoryPublisher())
    loaded = {key: processor.load_state(key, "-") for key in keys}
    return {key: (s.version, s.state) for key, s in loaded.items()}


def keys_of(rows: list[dict[str, Any]]) -> list[str]:
    return sorted({r["key"] for r in rows})


@dataclass(frozen=True)
class Clean:
    """The reference: the games' messages run once each, in order, nothing
    repeated, in a table of its own that no test writes to."""

    rows: list[dict[str, Any]]
    outputs: list[Any]
    states: dict[str, Any]


@pytest.fixture(scope="module")
def clean(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Clean:
    # One reference run for the file: each test compares its own run with it
    # (the same rows, so the same outputs and states), never writes to it.
    tmp, table = tmp_path_factory.mktemp("clean"), "clean" + uuid.uuid4().hex[:12]
    rows = game_messages(GAMES, SHOTS)
    client(table)
    path = write_jsonl(tmp / "clean.jsonl", rows)
    settings = JobSettings(table=table, handler="shooting_range")
    run_batch(spark, path, str(tmp / "out"), settings, partitions=3)
    return Clean(rows, outputs(spark, str(tmp / "out")), states(table, keys_of(rows)))


def arrange(tmp: Path, table: str, clean: Clean) -> str:
    """The table of a test's run, and the clean run's messages as its input file."""
    client(table)
    return write_jsonl(tmp / "in.jsonl", clean.rows)


def assert_as_clean(spark: SparkSession, out: str, table: str, clean: Clean) -> None:
    assert outputs(spark, out) == clean.outputs
    assert states(table, keys_of(clean.rows)) == clean.states


def test_duplicated_input_changes_each_message_once(
    spark: SparkSession, tmp_path: Path, table_name: str, clean: Clean
) -> None:
    rows = clean.rows
    rng = random.Random(7)
    noisy = [copy for row in rows for copy in [row] * rng.randint(2, 5)]
    rng.shuffle(noisy)
    # Two input files, so copies also arrive in different input partitions.
    write_jsonl(tmp_path / "in" / "a.jsonl", noisy[: len(noisy) // 2])
    write_jsonl(tmp_path / "in" / "b.jsonl", noisy[len(noisy) // 2 :])
    client(table_name)
    order = {r["message_id"]: i for i, r in enumerate(rows)}
    ordered = tmp_path / "ordered"
    frame = read_messages(spark, str(tmp_path / "in"), "json")
    mapping = spark.createDataFrame(list(order.items()), ["message_id", "seq"])
    frame.join(mapping, "message_id").write.parquet(str(ordered))
    settings = JobSettings(table=table_name, handler="shooting_range")
    summary = run_batch(
        spark, str(ordered), str(tmp_path / "out"), settings,
        input_format="parquet", partitions=4, order_by="seq",
    )  # fmt: skip

    assert summary.messages_in == len(noisy)
    assert summary.processed == len(rows)
    assert summary.duplicates == len(noisy) - len(rows)
    assert_as_clean(spark, str(tmp_path / "out"), table_name, clean)


@STRATEGIES
def test_failed_task_attempts_are_retried_to_the_same_result(
    spark: SparkSession, tmp_path: Path, table_name: str, strategy: Any, clean: Clean
) -> None:
    path = arrange(tmp_path, table_name, clean)
    settings = JobSettings(
        table=table_name, handler="tests.spark.flaky:first_attempt_dies", strategy=strategy
    )

    group = f"retried-{table_name}"
    spark.sparkContext.setJobGroup(group, "task attempts that die")
    try:
        summary = run_batch(spark, path, str(tmp_path / "out"), settings, partitions=3)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]

    # Spark's own count: every one of the three tasks lost its first attempt.
    tracker = spark.sparkContext.statusTracker()
    stages = [
        tracker.getStageInfo(stage)
        for job in tracker.getJobIdsForGroup(group)
        for stage in tracker.getJobInfo(job).stageIds  # type: ignore[union-attr]
    ]
    assert sum(stage.numFailedTasks for stage in stages if stage is not None) == 3
    assert_as_clean(spark, str(tmp_path / "out"), table_name, clean)
    # Retried tasks found their first attempt's work stored: duplicates, not changes.
    statuses = [r[3] for r in outcomes(spark, str(tmp_path / "out"))]
    assert len(statuses) == summary.messages_in == len(clean.rows)
    assert set(statuses) == {"completed", "duplicate"}
    assert summary.duplicates == statuses.count("duplicate")


@STRATEGIES
def test_speculative_copies_of_a_task_give_the_same_result(
    spark: SparkSession, table_name: str, strategy: Any, clean: Clean
) -> None:
    # Local mode never speculates, so run what a speculative attempt is: the
    # same task body twice at once on the two cores, over the same rows.
    rows = sorted(clean.rows, key=lambda r: r["key"])  # each key's in its order
    expected = clean.outputs
    client(table_name)
    settings = JobSettings(table=table_name, handler="shooting_range", strategy=strategy)
    twins = spark.sparkContext.parallelize([rows, rows], 2)
    results = twins.flatMap(lambda part: list(process_partition(part, settings))).collect()

    produced = sorted(
        {(r[1], r[2], r[3], r[7], r[8], r[11], r[12]) for r in results if r[0] == "output"}
    )
    assert produced == expected
    # Each copy emitted every output: whichever copy Spark keeps, none is missing.
    for copy in (results[: len(results) // 2], results[len(results) // 2 :]):
        assert sorted(
            {(r[1], r[2], r[3], r[7], r[8], r[11], r[12]) for r in copy if r[0] == "output"}
        ) == (expected)
    statuses = sorted(r[4] for r in results if r[0] == "outcome")
    assert statuses.count("completed") == len(rows)
    assert statuses.count("duplicate") == len(rows)
    assert states(table_name, keys_of(rows)) == clean.states


@STRATEGIES
def test_a_job_killed_midway_and_rerun_gives_the_same_result(
    spark: SparkSession, tmp_path: Path, table_name: str, strategy: Any, clean: Clean
) -> None:
    path = arrange(tmp_path, table_name, clean)
    marker = die_marker(f"game-{GAMES // 2:03d}-shot-4")
    marker.touch()
    try:
        dying = JobSettings(
            table=table_name, handler="tests.spark.flaky:job_dies", strategy=strategy
        )
        with pytest.raises(Exception, match="TaskDied"):
            run_batch(spark, path, str(tmp_path / "out"), dying, partitions=3)
    finally:
        marker.unlink()
    assert not (tmp_path / "out" / "outputs").exists()  # the commit protocol left nothing

    settings = JobSettings(table=table_name, handler="shooting_range", strategy=strategy)
    run_batch(spark, path, str(tmp_path / "out"), settings, partitions=3)

    assert_as_clean(spark, str(tmp_path / "out"), table_name, clean)
    # A rerun into the same output (overwrite) writes every output again.
    again = run_batch(spark, path, str(tmp_path / "out"), settings, partitions=3)
    assert (again.processed, again.duplicates) == (0, len(clean.rows))
    assert_as_clean(spark, str(tmp_path / "out"), table_name, clean)


def test_a_rerun_of_the_whole_job_writes_the_same_outputs(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    rows = game_messages(GAMES, SHOTS)
    client(table_name)
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    settings = JobSettings(table=table_name, handler="shooting_range")
    first = run_batch(spark, path, str(tmp_path / "one"), settings, partitions=3)
    second = run_batch(
        spark, path, str(tmp_path / "two"), settings, partitions=3, output_format="parquet"
    )
    assert (first.processed, second.processed, second.duplicates) == (len(rows), 0, len(rows))
    assert outputs(spark, str(tmp_path / "one")) == outputs(spark, str(tmp_path / "two"))


def test_bad_rows_are_dead_lettered_and_the_rest_processed(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    good = game_messages(3, 4)
    bad: list[dict[str, Any]] = [
        {"message_id": None, "key": "game-000", "type": "FireAt", "body": "{}"},
        {"message_id": "no-key", "key": None, "type": "FireAt", "body": "{}"},
        {"message_id": "alien", "key": "game-001", "type": "Teleport", "body": "{}"},
        {"message_id": "garbled", "key": "game-002", "type": "FireAt", "body": "{not json"},
        {"message_id": "slashed", "key": "bad/key#1", "type": "FireAt", "body": "{}"},
        {"message_id": "piped", "key": "other|stream", "type": "FireAt", "body": "{}"},
    ]
    client(table_name)
    rows = good[:5] + bad + good[5:]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    summary = run_batch(
        spark,
        path,
        str(tmp_path / "out"),
        JobSettings(table=table_name, handler="shooting_range"),
        partitions=2,
    )

    letters = {
        r["message_id"]: r["reason"]
        for r in spark.read.parquet(str(tmp_path / "out" / "dead_letters")).collect()
    }
    assert letters == {
        None: "missing message_id",
        "no-key": "missing key",
        "alien": "unknown type 'Teleport'",
        "garbled": letters["garbled"],
        "slashed": letters["slashed"],
        "piped": letters["piped"],
    }
    assert letters["garbled"].startswith("unparseable body")
    assert "key cannot be stored" in letters["slashed"]
    assert "'/'" in letters["slashed"]
    assert "separator" in letters["piped"]
    assert summary.dead_lettered == len(bad)
    assert summary.processed == len(good)
    versions = {key: version for key, (version, _) in states(table_name, keys_of(good)).items()}
    assert versions == dict.fromkeys(keys_of(good), 1 + 4)


@STRATEGIES
def test_streaming_replay_of_the_last_batch_gives_the_same_files(
    spark: SparkSession, tmp_path: Path, table_name: str, strategy: Any
) -> None:
    rows = game_messages(6, 6)
    client(table_name)
    inbox = spread(tmp_path / "inbox", rows, 3)
    settings = JobSettings(table=table_name, handler="shooting_range", strategy=strategy)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    first = run_stream(
        spark, str(inbox), out, checkpoint, settings, partitions=2, max_files_per_trigger=1
    )
    assert [batch for batch, _ in first] == [0, 1, 2]
    before = {p.name: outputs(spark, str(p)) for p in sorted(Path(out).iterdir())}
    state_before = states(table_name, keys_of(rows))

    # The last batch's commit was never logged (a crash right after it ran): it replays.
    commits = Path(checkpoint) / "commits"
    for entry in (commits / "2", commits / ".2.crc"):
        entry.unlink(missing_ok=True)
    replay = run_stream(
        spark, str(inbox), out, checkpoint, settings, partitions=2, max_files_per_trigger=1
    )

    assert [batch for batch, _ in replay] == [2]
    assert replay[0][1].processed == 0
    assert replay[0][1].duplicates == first[2][1].processed
    assert {p.name: outputs(spark, str(p)) for p in sorted(Path(out).iterdir())} == before
    assert sorted(p.name for p in Path(out).iterdir()) == ["batch=0", "batch=1", "batch=2"]
    assert states(table_name, keys_of(rows)) == state_before


REUSE_OFF_JOB = """
import json, os, sys, tempfile
from spark_driver import JobSettings, run_batch, session
work = tempfile.mkdtemp()
with open(f"{work}/in.jsonl", "w") as out:
    for g in range(4):
        for n in range(5):
            row = {"message_id": f"g{g}-m{n}", "key": f"g{g}", "type": "FireAt",
                   "body": json.dumps({"position": n})}
            out.write(json.dumps(row) + "\\n")
spark = session("local[2]", **{"spark.python.worker.reuse": "false"})
assert spark.conf.get("spark.python.worker.reuse") == "false"
settings = JobSettings(table=sys.argv[1], handler="shooting_range")
summary = run_batch(spark, f"{work}/in.jsonl", f"{work}/out", settings, partitions=4)
print(summary.processed, summary.duplicates, summary.outputs)
spark.stop()
"""


def test_works_with_python_worker_reuse_off(spark: SparkSession, table_name: str) -> None:
    # Another JVM, started in a subprocess with the environment the shared session set up.
    client(table_name)
    done = subprocess.run(
        [sys.executable, "-c", REUSE_OFF_JOB, table_name],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["20", "0", "20"]


def test_handler_errors_abandon_the_key_or_fail_the_job(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    rows = [
        {
            "message_id": f"k1-{n}",
            "key": "k1",
            "type": "FireAt",
            "body": json.dumps({"position": p}),
        }
        for n, p in enumerate([1, 99, 2])
    ] + [{"message_id": "k2-0", "key": "k2", "type": "FireAt", "body": json.dumps({"position": 5})}]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    handler = "tests.spark.flaky:refuses_far_shots"

    summary = run_batch(
        spark, path, str(tmp_path / "out"), JobSettings(table=table_name, handler=handler)
    )

    result = {r[0]: (r[3], r[5]) for r in outcomes(spark, str(tmp_path / "out"))}
    assert result["k1-0"] == ("completed", None)
    assert result["k1-1"][0] == "abandoned"
    assert "ValueError: position 99 is out of range" in result["k1-1"][1]
    assert result["k1-2"][0] == "abandoned"  # the key's later messages wait for redelivery
    assert result["k2-0"] == ("completed", None)
    assert (summary.processed, summary.abandoned) == (2, 2)

    strict = JobSettings(table=table_name + "x", handler=handler, fail_fast=True)
    client(table_name + "x")
    with pytest.raises(Exception, match="position 99 is out of range"):
        run_batch(spark, path, str(tmp_path / "strict"), strict)


def test_submit_sh_runs_against_azurite_on_a_local_master_with_no_secret_in_logs_or_outputs(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    # examples/cluster/submit.sh as written, configured by environment variables
    # only: a connection string (no account URL), a local master, no venv and
    # no spark-submit on PATH. spark-submit chooses the master; the job keeps it.
    account_key = os.environ["STREAMSTONE_CONNECTION_STRING"].split("AccountKey=")[1].split(";")[0]
    client(table_name)
    path = write_jsonl(tmp_path / "in.jsonl", game_messages(2, 3))
    script = Path(__file__).resolve().parents[2] / "examples" / "cluster" / "submit.sh"
    java = Path(shutil.which("java") or "/usr/bin/java")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "VIRTUAL_ENV"))}
    env.pop("STREAMSTONE_ACCOUNT_URL", None)
    env.update(
        PATH=os.pathsep.join(dict.fromkeys([str(java.parent), "/usr/bin", "/bin"])),
        SPARK_MASTER="local[1]",
        INPUT=path,
        INPUT_FORMAT="json",
        OUTPUT=str(tmp_path / "out"),
        TABLE=table_name,
        PARTITIONS="2",
        PYTHON=sys.executable,
        DIST=str(tmp_path / "dist"),
    )
    command = ["bash", str(script), "--output-format", "json", "--log-level", "DEBUG", "--explain"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    # The wheel, and the same bytes as the .zip that --py-files ships.
    dist = tmp_path / "dist"
    assert sorted(p.name for p in dist.iterdir()) == [
        "streamstone_py-0.1.0-py3-none-any.whl", "streamstone_py.zip"
    ]  # fmt: skip
    wheel = (dist / "streamstone_py-0.1.0-py3-none-any.whl").read_bytes()
    assert (dist / "streamstone_py.zip").read_bytes() == wheel
    # spark-submit merges the driver's stderr into its stdout.
    assert "spark master: local[1]\n" in done.stdout + done.stderr
    assert re.search(r"processed \(new version stored\)\s+8\n", done.stdout), done.stdout
    assert spark.read.json(str(tmp_path / "out" / "outputs")).count() == 6
    captured = done.stdout + done.stderr
    assert (
        "azure.core.pipeline.policies.http_logging_policy" in captured
    )  # the SDK did log requests
    assert "== Physical Plan ==" in captured  # and Spark printed its plan
    assert account_key not in captured
    written = "".join(p.read_text() for p in (tmp_path / "out").rglob("*.json"))
    assert written
    assert account_key not in written

    missing = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=60,
        env={k: v for k, v in env.items() if k != "INPUT"},
    )  # fmt: skip
    assert missing.returncode != 0
    assert "INPUT: set INPUT to the messages" in missing.stderr

    refused = subprocess.run(
        [sys.executable, "-m", "spark_driver", "run", "--input", path, "--output", "x",
         "--handler", "no.such:thing"], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "no.such" in refused.stderr
