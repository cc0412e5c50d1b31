"""The job's dead letters fed back once fixed, with their original ids, and a
poison queue read as a DataFrame."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from azure.storage.queue import QueueClient
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from handlers import InMemoryPublisher, Message, PoisonEntry, PoisonQueue, Processor
from handlers.examples import shooting_range
from spark_driver import (
    DEAD_LETTER_SCHEMA,
    POISON_SCHEMA,
    JobSettings,
    read_dead_letters,
    read_poison,
    run_batch,
    write_dead_letters,
)
from spark_driver._dead_letters import fed_back
from spark_driver._tasks._rows import UNPARSEABLE_LINE, body_json
from tests.spark.conftest import game_messages
from tests.spark.test_pipeline import client, states
from tests.spark.test_queue_source import b64, queues

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
__all__ = ["queues"]  # the fixture, for the queue tests here

TRUNCATED = '{"message_id": "game-000-shot-3", "key": "game-000", "type": "FireAt", "body": {"position": 40}'  # noqa: E501
NOT_JSON = {
    "message_id": "game-001-shot-1",
    "key": "game-001",
    "type": "FireAt",
    "body": "{position: 5}",
}


def _messages(spark: SparkSession, path: str) -> list[tuple[Any, ...]]:
    return sorted((r.key, r.message_id, r.status) for r in outcomes_of(spark, path))


def outcomes_of(spark: SparkSession, path: str) -> list[Any]:
    return spark.read.parquet(f"{path}/outcomes").collect()


def _outputs(spark: SparkSession, *paths: str) -> set[tuple[Any, ...]]:
    rows = [r for p in paths for r in spark.read.parquet(f"{p}/outputs").collect()]
    return {(r.message_id, r.key, r.type, r.body, r.source_message_id) for r in rows}


def _reference(table: str, batches: dict[str, list[Message]]) -> set[tuple[Any, ...]]:
    """The outputs of the runtime alone, each key's messages once in order."""
    processor = Processor(shooting_range, client(table), InMemoryPublisher())
    return {
        (out.id, out.key, out.type, body_json(out.body), outcome.message_id)
        for key, messages in batches.items()
        for outcome in processor.process_batch(key, messages)
        for out in outcome.outputs
    }


def test_dead_letters_of_bad_lines_fixed_in_place_and_fed_back_are_processed_once_by_id(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    client(table_name)
    good = game_messages(1, 2)  # game-000: a round, shots 1 and 2
    # A copy of a message processed in the same run (shot 1), cut short.
    processed_cut = json.dumps(good[1])[:-1]
    inbox = tmp_path / "in"
    inbox.mkdir()
    lines = [json.dumps(r) for r in good] + [TRUNCATED, json.dumps(NOT_JSON), processed_cut]
    (inbox / "a.jsonl").write_text("\n".join(lines) + "\n")
    (inbox / "b:c.jsonl").write_text(json.dumps({**good[1], "message_id": "in-a-bad-file"}) + "\n")
    settings = JobSettings(table=table_name, handler="shooting_range")
    first = run_batch(spark, str(inbox), str(tmp_path / "out1"), settings, partitions=2)
    assert (first.processed, first.dead_lettered) == (3, 4)

    letters = read_dead_letters(spark, str(tmp_path / "out1"))

    assert letters.schema == DEAD_LETTER_SCHEMA
    bad_file = f"file:{inbox / 'b:c.jsonl'}"
    file_reason = (
        "the file cannot be read as JSON lines: its name holds ':', and Hadoop's local file "
        "system names the file's checksum file after it, which such a name makes no valid "
        "path (rename it)"
    )
    assert letters.collect() == [
        (None, None, None, file_reason, None, bad_file,
         f"the file as a whole ({file_reason}): fix or rename it and run the job over it "
         "again; its messages that were processed are duplicates"),
        (None, None, None, UNPARSEABLE_LINE, processed_cut, None, None),
        (None, None, None, UNPARSEABLE_LINE, TRUNCATED, None, None),
        ("game-001-shot-1", "game-001", "FireAt", "unparseable body: Expecting property name "
         "enclosed in double quotes: line 1 column 2 (char 1)",
         json.dumps(NOT_JSON, sort_keys=True), None, None),
    ]  # fmt: skip

    # Written as JSON lines, fixed in place by hand, and fed back to a batch run.
    fixes = tmp_path / "fixes"
    [left] = write_dead_letters(letters, str(fixes))
    assert left.file == bad_file
    written = fixes / "dead_letters.jsonl"
    assert written.read_text().splitlines() == [
        processed_cut, TRUNCATED, json.dumps(NOT_JSON, sort_keys=True),
    ]  # fmt: skip
    fixed = (
        written.read_text()
        .replace(TRUNCATED, TRUNCATED + "}")
        .replace(processed_cut, processed_cut + "}")
        .replace('"{position: 5}"', '"{\\"position\\": 5}"')
    )
    written.write_text(fixed)
    second = run_batch(spark, str(fixes), str(tmp_path / "out2"), settings, partitions=2)

    # Each applied once with its original id; the one processed before is a duplicate.
    assert (second.processed, second.duplicates, second.dead_lettered) == (2, 1, 0)
    assert _messages(spark, str(tmp_path / "out2")) == [
        ("game-000", "game-000-shot-1", "duplicate"),
        ("game-000", "game-000-shot-3", "completed"),
        ("game-001", "game-001-shot-1", "completed"),
    ]
    once = {
        "game-000": [
            *(Message(r["message_id"], r["key"], r["type"], r["body"] and json.loads(r["body"]))
              for r in good),
            Message("game-000-shot-3", "game-000", "FireAt", {"position": 40}),
        ],
        "game-001": [Message("game-001-shot-1", "game-001", "FireAt", {"position": 5})],
    }  # fmt: skip
    expected = _reference(table_name + "ref", once)
    assert _outputs(spark, str(tmp_path / "out1"), str(tmp_path / "out2")) == expected
    keys = ["game-000", "game-001"]
    after = states(table_name, keys)
    assert after == states(table_name + "ref", keys)
    assert {key: version for key, (version, _) in after.items()} == {"game-000": 4, "game-001": 1}

    # Fed back a second time: every line is a duplicate, nothing changes.
    third = run_batch(spark, str(fixes), str(tmp_path / "out3"), settings, partitions=2)
    assert (third.processed, third.duplicates, third.dead_lettered) == (0, 3, 0)
    assert states(table_name, keys) == after
    assert _outputs(spark, str(tmp_path / "out3")) <= expected


def test_a_queue_message_s_dead_letter_is_fed_back_with_the_id_the_job_gave_it() -> None:
    # The queue source's dead letter of an envelope without id: the job gave
    # the message its queue message's id (``admit_text``'s default id).
    text = b64_text({"key": "k-1", "type": "Reload", "body": "hello", "headers": {}})
    letter = {"message_id": "q-7", "key": "k-1", "type": "Reload", "reason": "unknown type "
              "'Reload'", "conflicts": 0, "raw": text}  # fmt: skip

    fed = fed_back(letter)

    line = '{"body": "\\"hello\\"", "key": "k-1", "message_id": "q-7", "type": "Reload"}'
    assert fed == ("q-7", "k-1", "Reload", "unknown type 'Reload'", line, None, None)
    with_bytes = b64_text(
        {"id": "m-2", "key": "k-1", "type": "Reload", "body": {"$base64": "AA=="}}
    )
    assert fed_back({**letter, "message_id": "m-2", "raw": with_bytes})[4:] == (
        None, None, "a queue message whose body holds bytes, which a JSON line cannot carry: "
        "send it back to its queue instead",
    )  # fmt: skip
    # A plain envelope with a field of its own named message_id is still the
    # message the job read: the line carries the envelope's id, not that field.
    plain = json.dumps({"id": "x-1", "key": "k", "type": "Refund", "body": {"n": 1},
                        "message_id": "other"})  # fmt: skip
    fed_plain = fed_back({**letter, "message_id": "x-1", "key": "k", "raw": plain})
    assert fed_plain[0] == "x-1"
    assert json.loads(fed_plain[4])["message_id"] == "x-1"


def _micros(at: datetime | None) -> int:
    """A time as Spark's ``unix_micros`` gives it."""
    assert at is not None
    return (at - EPOCH) // timedelta(microseconds=1)


def b64_text(envelope: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(envelope).encode()).decode()


def test_a_poison_queue_reads_as_a_dataframe_of_exact_rows(
    spark: SparkSession, queues: Callable[[str], QueueClient]
) -> None:
    inbox = queues("orders")  # its poison queue is deleted after the test too
    poison = QueueClient.from_queue_url(f"{inbox.url}-poison", credential=inbox.credential)
    shot = Message("m-1", "k-1", "FireAt", b"\x00raw", {"by": "test"})
    no_id = json.dumps({"key": "k-2", "type": "FireAt", "body": {"position": 3}})
    entries = [
        PoisonEntry("unknown type 'FireAt'", b64(shot), inbox.queue_name, "q-1", 1),
        PoisonEntry("failed on receive 5 of 5: boom", no_id, inbox.queue_name, "q-2", 5),
    ]
    for entry in entries:
        PoisonQueue(poison).send(entry)
    poison.send_message("not an entry")
    peeked = {m.content: m for m in poison.peek_messages(max_messages=32)}

    frame = read_poison(spark, poison.queue_name)

    assert frame.schema == POISON_SCHEMA
    rows = frame.withColumn("poisoned_at", F.unix_micros("poisoned_at")).collect()
    one, two = (peeked[e.encode()] for e in entries)
    bad = peeked["not an entry"]
    expected = [
        (one.id, one.inserted_on, "unknown type 'FireAt'", "unknown type 'FireAt'", 1,
         inbox.queue_name, "q-1", "m-1", "k-1", "FireAt", None, None, {"by": "test"},
         '{"$base64":"AHJhdw=="}', b64(shot), None, one.content),
        (two.id, two.inserted_on, "failed on receive 5 of 5: boom",
         "failed on receive N of M: boom", 5, inbox.queue_name, "q-2", "q-2", "k-2", "FireAt",
         None, None, {}, '{"position":3}', no_id, None, two.content),
        (bad.id, bad.inserted_on, *(None,) * 13,
         "not a poison entry: Only base64 data is allowed", "not an entry"),
    ]  # fmt: skip
    micros = [(i, _micros(at), *rest) for i, at, *rest in expected]
    assert sorted(tuple(r) for r in rows) == sorted(micros)
    assert [r.id for r in rows] == [
        m.id for m in sorted(peeked.values(), key=lambda m: _micros(m.inserted_on))
    ]
    # Left in the queue, as it was.
    assert sorted(m.content for m in poison.peek_messages(max_messages=32)) == sorted(peeked)
    # A poison queue not made yet (no message poisoned so far) holds no entry.
    assert read_poison(spark, f"{inbox.queue_name}-none-poison").count() == 0
