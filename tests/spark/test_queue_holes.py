"""The Spark queue source and sink against hostile texts, failing neighbours
and a storage outage: a text that cannot become a message is poisoned alone
and the stream goes on; a key's messages are never poisoned with a failing
one; bodies, due times and first-produced times travel exactly; the closing
advice fits the input."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from azurite.launcher import AzuriteTable
from handlers import (
    MAX_QUEUE_MESSAGE_BYTES,
    InMemoryPublisher,
    Message,
    PoisonEntry,
    Processor,
    decode_envelope,
)
from handlers.examples import shooting_range
from spark_driver import JobSettings
from spark_driver.__main__ import main
from spark_driver._queues._sink import OutputRoute
from tests.helpers import drain
from tests.hostile_texts import b64, draw_mix, envelope, stored_exactly, valid_text
from tests.queueing import Seen, seen
from tests.spark.test_pipeline import client
from tests.spark.test_queue_source import _command, needs_pyspark_4, queues, send

__all__ = ["queues"]  # the fixture, shared with the queue source's tests


def poisoned(queue: QueueClient) -> dict[str, PoisonEntry]:
    poison = QueueClient.from_queue_url(f"{queue.url}-poison", credential=queue.credential)
    return {e.content: e for e in map(PoisonEntry.decode, drain(poison))}


@needs_pyspark_4
def test_hostile_texts_are_poisoned_alone_and_bodies_due_and_produced_travel_exactly(
    spark: SparkSession, tmp_path: Path, table_name: str, queues: Callable[[str], QueueClient]
) -> None:
    from spark_driver import run_queue

    key = f"k-{uuid.uuid4().hex[:6]}"
    inbox, out = queues("inbox"), queues("saw")
    past, first = datetime(2020, 1, 1, tzinfo=UTC), datetime(2021, 6, 1, 12, tzinfo=UTC)
    valid = [
        Message("v-1", key, "Keep", {"$base64": "aGk="}, produced=first),
        Message("v-2", key, "Keep", b"\x00hi", due=past, produced=first),
        Message("v-3", key, "Keep", [{"$object": 1}, {"$base64": b"\xff"}], produced=past),
    ]
    hostile = {
        envelope(id="h-1", key=key, type="Keep", due="9999-12-31T23:00:00-05:00"): (
            "not a message envelope: due '9999-12-31T23:00:00-05:00' is out of the range of "
            "times in UTC"
        ),
        envelope(id="\udfff", key=key, type="Keep"): (
            "not a message envelope: message id '\\udfff' is not UTF-8 text (surrogates not "
            "allowed)"
        ),
        envelope(id="h-3", key=key, type="Keep", body={"$base64": "not base64!"}): (
            "not a message envelope: '$base64' holds 'not base64!', which is not base64"
        ),
        envelope(id="h-4", key="k/bad", type="Keep"): (
            "key cannot be stored: key 'k/bad' contains '/'; Azure Tables keys may not contain "
            "'/', '\\', '#', '?' or control characters"
        ),
    }
    send(inbox, [valid_text(valid[0]), *hostile, valid_text(valid[1]), valid_text(valid[2])])
    client(table_name)
    settings = JobSettings(table=table_name, handler="tests.queueing:seen", sent_at="produced")

    [(_, summary)] = run_queue(
        spark, inbox.queue_name, str(tmp_path / "out"), str(tmp_path / "cp"), settings,
        partitions=2, output_queues=OutputRoute.parse([out.queue_name]),
    )  # fmt: skip

    assert (summary.messages_in, summary.processed, summary.exit_status) == (3, 3, 0)
    processor = Processor(seen, client(table_name), InMemoryPublisher())
    state: Seen = processor.current_state(key).state
    assert sorted(zip(state.ids, state.dues, state.sent, strict=True)) == [
        ("v-1", None, first.isoformat()),
        ("v-2", past.isoformat(), first.isoformat()),
        ("v-3", None, past.isoformat()),
    ]  # fmt: skip: each its due, and its first production as its sent time
    by_id = dict(zip(state.ids, state.bodies, strict=True))
    assert {m.id: Message("m", "k", "T", by_id[m.id]).encode() for m in valid} == {
        m.id: Message("m", "k", "T", m.body).encode() for m in valid
    }
    entries = poisoned(inbox)
    assert {text: e.reason for text, e in entries.items()} == hostile
    assert {e.dequeue_count for e in entries.values()} == {1}
    # Each output carries its body exactly, and when its source was first processed.
    processed_at = {v.message_id: v.now for v in processor.history(key)}
    sent = [decode_envelope(base64.b64decode(t).decode()) for t in drain(out)]
    arrived = sorted(((m.produced, json.dumps(m.body, default=repr)) for m in sent), key=str)
    assert arrived == sorted(
        ((processed_at[m.id], json.dumps({"body": m.body}, default=repr)) for m in valid), key=str
    )


@needs_pyspark_4
def test_a_failing_message_is_poisoned_alone_and_its_key_mates_are_processed_at_once(
    spark: SparkSession, tmp_path: Path, table_name: str, queues: Callable[[str], QueueClient]
) -> None:
    from spark_driver import Delivery, run_queue

    game = f"g-{uuid.uuid4().hex[:6]}"
    broken = Message(f"{game}-2", game, "FireAt", {"aim": 3})  # no position: KeyError
    others = [
        Message(f"{game}-1", game, "StartNewRound"),
        Message(f"{game}-3", game, "FireAt", {"position": 3}),
        Message(f"{game}-4", game, "FireAt", {"position": 4}),
    ]
    inbox = queues("inbox")
    send(inbox, [valid_text(m) for m in [others[0], broken, *others[1:]]])
    client(table_name)
    settings = JobSettings(table=table_name, handler="shooting_range")
    deliveries: list[Delivery] = []

    def run() -> Any:
        return run_queue(
            spark, inbox.queue_name, str(tmp_path / "out"), str(tmp_path / "cp"), settings,
            partitions=2, max_dequeue_count=2, retry_backoff=2,
            on_delivery=lambda batch_id, delivery: deliveries.append(delivery),
        )  # fmt: skip

    [(_, first)] = run()

    assert (first.messages_in, first.processed, first.abandoned) == (4, 3, 1)
    assert (deliveries[0].deleted, deliveries[0].released, deliveries[0].poisoned) == (3, 1, 0)
    processor = Processor(shooting_range, client(table_name), InMemoryPublisher())
    assert [v.message_id for v in processor.history(game)] == [m.id for m in others]
    assert (
        first.table("out", (inbox.queue_name, 2)).count(
            f"exit status 3; queue {inbox.queue_name!r} delivers each again by itself after its "
            "backoff, and poisons one still failing on receive 2: fix the handler before then"
        )
        == 1
    )
    assert first.advice() == "exit status 3: fix the handler, then deliver the input again"
    deadline = time.monotonic() + 30
    while not list(inbox.peek_messages()):
        assert time.monotonic() < deadline, "the failing message never came again"
        time.sleep(0.2)

    [(_, second)] = run()  # its last allowed receive

    assert (second.messages_in, second.abandoned, deliveries[1].poisoned) == (1, 1, 1)
    [entry] = poisoned(inbox).values()
    assert (entry.content, entry.dequeue_count) == (valid_text(broken), 2)
    assert [v.message_id for v in processor.history(game)] == [m.id for m in others]
    assert inbox.get_queue_properties().approximate_message_count == 0


@needs_pyspark_4
def test_the_source_poisons_a_text_of_any_size_with_its_reason(
    connection_string: str, queues: Callable[[str], QueueClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark_driver._queues._source import QueueOptions, QueueStreamReader

    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    inbox = queues("big")
    late = b64(envelope(id="big", key="k", type="Keep", due="9999-12-31T23:00:00-05:00",
                        body={"pad": "x" * 44_000}))  # fmt: skip
    largest = "{" + "x" * (MAX_QUEUE_MESSAGE_BYTES - 1)  # the most a queue message holds
    send(inbox, [late, largest])

    QueueStreamReader(QueueOptions(inbox.queue_name)).latestOffset()

    assert inbox.get_queue_properties().approximate_message_count == 0
    entries = sorted(poisoned(inbox).values(), key=lambda e: e.content_length or 0)
    assert [(e.content_length, e.dequeue_count) for e in entries] == [
        (None, 1), (MAX_QUEUE_MESSAGE_BYTES, 1),
    ]  # fmt: skip
    assert (entries[0].content, entries[0].reason) == (late, (
        "not a message envelope: due '9999-12-31T23:00:00-05:00' is out of the range of times "
        "in UTC"
    ))  # fmt: skip
    assert largest.startswith(entries[1].content)
    assert len(entries[1].encode()) == MAX_QUEUE_MESSAGE_BYTES  # as much of it as fits


def test_a_queue_whose_poison_queue_name_would_be_too_long_is_refused_up_front() -> None:
    from spark_driver._queues._options import QueueOptions  # no data source API needed

    QueueOptions("q" * 56)
    with pytest.raises(ValueError, match="over the 63 a queue name may have") as refused:
        QueueOptions("q" * 57)
    assert str(refused.value) == (
        f"queue {'q' * 57!r} has 57 characters: its poison queue '{'q' * 57}-poison' would "
        "have 64, over the 63 a queue name may have; name the queue in at most 56 characters"
    )


def test_a_task_waits_out_a_table_outage_and_leaves_nothing_faulted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from spark_driver._tasks._executor import OUTCOME, RESULT_SCHEMA, process_partition

    game = "outage-game"
    messages = [Message(f"{game}-0", game, "StartNewRound")] + [
        Message(f"{game}-{n}", game, "FireAt", {"position": n}) for n in range(1, 4)
    ]
    rows = [{"message_id": m.id, "key": m.key, "type": m.type, "body": None,
             "_queue_text": valid_text(m)} for m in messages]  # fmt: skip
    with AzuriteTable(location=tmp_path / "data") as azurite:
        monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", azurite.connection_string)
        client("outage")
        settings = JobSettings(table="outage", handler="shooting_range", source="queue")
        found: list[tuple[Any, ...]] = []
        azurite.stop("table")
        task = threading.Thread(target=lambda: found.extend(process_partition(rows, settings)))
        with caplog.at_level(logging.WARNING, logger="spark_driver"):
            task.start()
            time.sleep(8)
            azurite.start("table")
            task.join(120)
        names = RESULT_SCHEMA.fieldNames()
        outcomes = [dict(zip(names, row, strict=True)) for row in found if row[0] == OUTCOME]
        assert [(o["message_id"], o["status"], o["version"]) for o in outcomes] == [
            (m.id, "completed", n) for n, m in enumerate(messages, 1)
        ]
        lines = [r.getMessage() for r in caplog.records]
        opened = [line for line in lines if line.startswith("storage unavailable: ")]
        closed = [line for line in lines if line.startswith("storage answers again after ")]
        assert (len(opened), len(closed)) == (1, 1), lines


@needs_pyspark_4
@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_hostile_texts_never_stop_the_stream_nor_take_a_valid_message_along(
    spark: SparkSession, tmp_path: Path, table_name: str, data: st.DataObject
) -> None:
    from spark_driver import run_queue

    tag = uuid.uuid4().hex[:8]
    mix = draw_mix(data, tag, least_valid=1, most=4)
    inbox = QueueClient.from_connection_string(os.environ["STREAMSTONE_CONNECTION_STRING"],
                                               f"prop-{tag}")  # fmt: skip
    send(inbox, mix.texts)
    client(table_name)
    settings_ = JobSettings(table=table_name, handler="tests.queueing:seen")
    try:
        summaries = run_queue(
            spark, inbox.queue_name, str(tmp_path / tag / "out"), str(tmp_path / tag / "cp"),
            settings_, partitions=2,
        )  # fmt: skip

        entries = poisoned(inbox)
        assert all(entries[text].reason for text in mix.hostile), mix.forms
        assert not any(valid_text(m) in entries or valid_text(m, True) in entries
                       for m in mix.valid)  # fmt: skip
        stored_exactly(Processor(seen, client(table_name), InMemoryPublisher()), mix)
        # Every text is stored, dead-lettered or poisoned; the queue is empty.
        settled = sum(s.processed + s.duplicates + s.dead_lettered for _, s in summaries)
        assert settled + len(entries) == len(mix.texts)
        assert inbox.get_queue_properties().approximate_message_count == 0
    finally:
        for name in (inbox.queue_name, f"{inbox.queue_name}-poison"):
            with contextlib.suppress(ResourceNotFoundError):
                QueueClient.from_connection_string(
                    os.environ["STREAMSTONE_CONNECTION_STRING"], name
                ).delete_queue()


@needs_pyspark_4
def test_the_command_on_a_queue_says_the_queue_redelivers_and_when_it_poisons(
    tmp_path: Path, table_name: str, connection_string: str,
    queues: Callable[[str], QueueClient], capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    inbox = queues("inbox")
    send(inbox, [valid_text(Message("g-1", "g", "FireAt", {"aim": 3}))])  # no position
    client(table_name)
    args = ["run", "--input", f"queue:{inbox.queue_name}", "--output", str(tmp_path / "out"),
            "--checkpoint", str(tmp_path / "cp"), "--table", table_name,
            "--max-dequeue-count", "3"]  # fmt: skip
    with pytest.raises(SystemExit) as refused:  # first, a name with no room for "-poison"
        main([*args[:2], f"queue:{'q' * 57}", *args[3:]])
    assert refused.value.code == 2
    assert "has 57 characters: its poison queue" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main([*args[:-1], "0"])
    assert refused.value.code == 2
    assert "--max-dequeue-count must be between 1 and any, got 0" in capsys.readouterr().err

    done = subprocess.run(
        [sys.executable, "-m", "spark_driver", *args], env=_command(connection_string),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    assert done.returncode == 3, done.stderr[-3000:]
    assert (
        f"  the one abandoned or faulted message (exit status 3; queue {inbox.queue_name!r} "
        "delivers each again by itself after its backoff, and poisons one still failing on "
        "receive 3: fix the handler before then):"
    ) in done.stdout.splitlines()
