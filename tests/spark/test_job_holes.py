"""Regression tests for the holes a review found in the job's newest features:
late duplicates after retention (the sent-time column), outputs sent to
another key in the summary, and the summary of JSON outputs. Each runs the
real job against Azurite and asserts exact states, rows and figures."""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from handlers import HandlerContext, InMemoryPublisher, Message, Processor, handler
from spark_driver import JobSettings, run_batch, run_stream
from tests.spark.conftest import game_messages, write_jsonl
from tests.spark.test_pipeline import client


@handler("Stamp", None, types=["Note"])
def stamp(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    """Counts its messages and publishes the sent time it was given."""
    state["n"] = state.get("n", 0) + 1
    ctx.publish("Seen", {"n": state["n"], "sent_at": message.headers.get("sent_at")})


@handler("Relay", None, types=["Forward"])
def relay(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    """Feeds another key: each message publishes a note to the key its body names."""
    state["n"] = state.get("n", 0) + 1
    ctx.publish("Note", {"from": message.key, "n": state["n"]}, key=message.body["to"])


def rows_of(spark: SparkSession, path: str, fmt: str = "parquet") -> list[dict[str, Any]]:
    return sorted(
        (r.asDict() for r in spark.read.format(fmt).load(path).collect()),
        key=lambda r: json.dumps(r, sort_keys=True, default=str),
    )


def note(n: int, key: str, sent_at: Any) -> dict[str, Any]:
    return {"message_id": f"{key}-m{n}", "key": key, "type": "Note", "body": "{}", "at": sent_at}


# --- 4. late duplicates after retention -------------------------------------------


def test_a_late_duplicate_after_retention_is_dead_lettered_never_applied_again(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    key = "late-1"
    settings = JobSettings(
        table=table_name, handler="tests.spark.test_job_holes:stamp", keep_last=1, sent_at="at"
    )
    base = datetime.now(UTC) - timedelta(hours=1)
    sent = {n: (base + timedelta(seconds=n)).isoformat() for n in range(1, 6)}
    first = write_jsonl(tmp_path / "first.jsonl", [note(n, key, sent[n]) for n in (1, 2, 3)])
    second = write_jsonl(tmp_path / "second.jsonl", [note(n, key, sent[n]) for n in (4, 5)])
    run_batch(spark, first, str(tmp_path / "out1"), settings, partitions=1)
    removed = run_batch(spark, second, str(tmp_path / "out2"), settings, partitions=1)
    assert removed.versions_removed == 2  # 1 and 2: the batch's 4 and 5 stay, and 3 before them

    # m1 again, late: its version and id are gone, only its sent time tells;
    # m6 was sent after the versions retention removed were processed.
    sent[6] = datetime.now(UTC).isoformat()
    late = write_jsonl(tmp_path / "late.jsonl", [note(1, key, sent[1]), note(6, key, sent[6])])
    summary = run_batch(spark, late, str(tmp_path / "out3"), settings, partitions=1)

    assert (summary.processed, summary.dead_lettered, summary.exit_status) == (1, 1, 0)
    (dead,) = rows_of(spark, str(tmp_path / "out3" / "dead_letters"))
    assert (dead["message_id"], dead["status"]) == (f"{key}-m1", "dead_lettered")
    assert dead["reason"].startswith(
        f"message '{key}-m1' for handler 'Stamp' is outside the de-duplication window: it was "
        f"sent before retention removed the versions of its time (sent at {sent[1]}, before "
        "the retention watermark "
    ), dead["reason"]
    assert json.loads(dead["raw"]) == {
        "body": "{}", "key": key, "message_id": f"{key}-m1", "type": "Note"
    }  # fmt: skip
    state = Processor(stamp, client(table_name), InMemoryPublisher()).current_state(key)
    assert (state.version, state.state) == (6, {"n": 6})  # m1 counted once, m6 after m5

    # Without the column the job cannot tell: the same late message is applied again.
    blind = dataclasses.replace(settings, sent_at=None)
    again = write_jsonl(tmp_path / "again.jsonl", [note(1, key, None)])
    assert run_batch(spark, again, str(tmp_path / "out4"), blind, partitions=1).processed == 1
    state = Processor(stamp, client(table_name), InMemoryPublisher()).current_state(key)
    assert (state.version, state.state) == (7, {"n": 7})


def test_sent_times_from_text_and_timestamps_reach_the_handler_exactly(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    key = "stamp-1"
    instant = datetime(2026, 3, 1, 12, 34, 56, 123456, tzinfo=UTC)
    frame = spark.createDataFrame(
        [(f"{key}-m1", key, "Note", "{}", instant), (f"{key}-m2", key, "Note", "{}", None)],
        "message_id string, key string, type string, body string, at timestamp",
    )
    frame.write.parquet(str(tmp_path / "in.parquet"))
    text = write_jsonl(
        tmp_path / "in.jsonl",
        [
            note(3, key, "2026-03-01T13:34:56.123456+01:00"),
            note(4, key, "2026-03-01T12:34:56"),  # no zone
            note(5, key, "yesterday"),
        ],
    )
    settings = JobSettings(
        table=table_name, handler="tests.spark.test_job_holes:stamp", sent_at="at"
    )

    parquet = run_batch(
        spark, str(tmp_path / "in.parquet"), str(tmp_path / "p"), settings, input_format="parquet"
    )
    lines = run_batch(spark, text, str(tmp_path / "j"), settings)

    expected = "2026-03-01T12:34:56.123456+00:00"
    bodies = [
        json.loads(r["body"])
        for out in ("p", "j")
        for r in rows_of(spark, str(tmp_path / out / "outputs"))
    ]
    assert [b["sent_at"] for b in bodies] == [expected, expected]
    reasons = {
        r["message_id"]: r["reason"]
        for out in ("p", "j")
        for r in rows_of(spark, str(tmp_path / out / "dead_letters"))
    }
    assert reasons == {
        f"{key}-m2": "missing sent time (column 'at')",
        f"{key}-m4": "sent time '2026-03-01T12:34:56' (column 'at') has no time zone",
        f"{key}-m5": "sent time 'yesterday' (column 'at') is not an ISO-8601 time",
    }
    assert (parquet.processed, parquet.dead_lettered) == (1, 1)
    assert (lines.processed, lines.dead_lettered) == (1, 2)


def test_a_sent_at_column_that_is_missing_or_of_another_type_is_refused(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    path = write_jsonl(tmp_path / "in.jsonl", [note(1, "k", 5)])
    spark.read.json(path).write.parquet(str(tmp_path / "in.parquet"))  # ``at`` a bigint there
    for column, fmt, message in (
        ("nope", "json", "sent-at column 'nope' is not in the input"),
        ("nope", "parquet", "sent-at column 'nope' is not in the input"),
        ("at", "parquet", "sent-at column 'at' is of type bigint: give a timestamp"),
    ):
        settings = JobSettings(table=table_name, handler="shooting_range", sent_at=column)
        source = path if fmt == "json" else str(tmp_path / "in.parquet")
        with pytest.raises(ValueError, match=message):
            run_batch(spark, source, str(tmp_path / column), settings, input_format=fmt)
    # A JSON line's column is text, whatever its JSON type: a number is no time.
    settings = JobSettings(
        table=table_name, handler="tests.spark.test_job_holes:stamp", sent_at="at"
    )
    summary = run_batch(spark, path, str(tmp_path / "number"), settings)
    assert (summary.processed, summary.dead_lettered) == (0, 1)
    (dead,) = rows_of(spark, str(tmp_path / "number" / "dead_letters"))
    assert dead["reason"] == "sent time '5' (column 'at') is not an ISO-8601 time"


# --- 5. outputs sent to another key ----------------------------------------------


def test_outputs_to_another_key_count_as_new_then_as_re_emitted(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    rows = [
        {"message_id": f"src-m{n}", "key": "src-1", "type": "Forward", "body": '{"to": "dst-1"}'}
        for n in range(1, 4)
    ]
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    settings = JobSettings(table=table_name, handler="tests.spark.test_job_holes:relay")

    first = run_batch(spark, path, str(tmp_path / "out1"), settings)
    again = run_batch(spark, path, str(tmp_path / "out2"), settings)

    assert (first.processed, first.new_outputs, first.reemitted_outputs) == (3, 3, 0)
    assert (again.duplicates, again.new_outputs, again.reemitted_outputs) == (3, 0, 3)
    written = rows_of(spark, str(tmp_path / "out1" / "outputs"))
    assert [(r["key"], r["source_key"], r["source_message_id"]) for r in written] == [
        ("dst-1", "src-1", f"src-m{n}") for n in range(1, 4)
    ]
    assert rows_of(spark, str(tmp_path / "out2" / "outputs")) == written


# --- 8. JSON outputs of messages that publish nothing --------------------------------


def test_json_outputs_give_the_summary_of_parquet_outputs_when_nothing_is_published(
    spark: SparkSession, tmp_path: Path
) -> None:
    rows = game_messages(3, 0, prefix="quiet")  # StartNewRound publishes nothing
    path = write_jsonl(tmp_path / "in.jsonl", rows)
    summaries = {}
    for fmt in ("parquet", "json"):
        table = f"quiet{fmt}{uuid.uuid4().hex[:8]}"
        client(table)
        settings = JobSettings(table=table, handler="shooting_range")
        summaries[fmt] = run_batch(spark, path, str(tmp_path / fmt), settings, output_format=fmt)

    figures = {fmt: dataclasses.replace(s, requests=0) for fmt, s in summaries.items()}
    assert figures["json"] == figures["parquet"]
    assert (figures["json"].processed, figures["json"].outputs) == (3, 0)
    assert rows_of(spark, str(tmp_path / "json" / "outcomes"), "json") == [
        {"conflicts": 0, "key": f"quiet-{g:03d}", "message_id": f"quiet-{g:03d}-round",
         "status": "completed", "type": "StartNewRound", "version": 1}
        for g in range(3)
    ]  # fmt: skip


def test_a_stream_with_json_outputs_goes_on_past_a_batch_that_publishes_nothing(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    inbox = tmp_path / "inbox"
    write_jsonl(inbox / "part-0.jsonl", game_messages(2, 0, prefix="calm"))
    settings = JobSettings(table=table_name, handler="shooting_range")

    first = run_stream(
        spark, str(inbox), str(tmp_path / "out"), str(tmp_path / "cp"), settings,
        output_format="json",
    )  # fmt: skip
    write_jsonl(inbox / "part-1.jsonl", game_messages(2, 2, prefix="calm")[1:3])
    second = run_stream(
        spark, str(inbox), str(tmp_path / "out"), str(tmp_path / "cp"), settings,
        output_format="json",
    )  # fmt: skip

    assert [(s.processed, s.outputs) for _, s in first] == [(2, 0)]
    assert [(s.processed, s.outputs) for _, s in second] == [(2, 2)]
