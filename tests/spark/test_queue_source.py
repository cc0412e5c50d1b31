"""The pipeline on Azure Storage Queues, against Azurite's Queue service: the
queue source (PySpark 4), outputs sent to queues, a micro-batch that fails
before its messages are completed, ``--trigger`` stopped by SIGTERM, and the
command's refusals. Each run is compared with the handlers runtime run alone
over the same messages: same states, same outputs."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyspark
import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueServiceClient
from pyspark.sql import SparkSession

from handlers import (
    InMemoryPublisher,
    Message,
    PoisonEntry,
    Processor,
    decode_envelope,
    encode_envelope,
    scan_states,
)
from handlers.examples import shooting_range
from spark_driver import JobSettings
from spark_driver.__main__ import main
from spark_driver._queues._sink import OutputRoute
from tests.helpers import drain
from tests.spark.conftest import ROOT, write_jsonl
from tests.spark.test_pipeline import client

PYSPARK_4 = not pyspark.__version__.startswith("3.")
needs_pyspark_4 = pytest.mark.skipif(
    not PYSPARK_4, reason="the queue source is PySpark 4's Python data source API"
)


@pytest.fixture
def queues(connection_string: str) -> Iterator[Callable[[str], QueueClient]]:
    """Fresh queues by role, deleted after the test (with their poison queues)."""
    service = QueueServiceClient.from_connection_string(connection_string)
    made: list[str] = []
    suffix = uuid.uuid4().hex[:10]

    def queue(role: str) -> QueueClient:
        name = f"{role}-{suffix}"
        made.extend([name, f"{name}-poison"])
        return service.get_queue_client(name)

    yield queue
    for name in made:
        with contextlib.suppress(ResourceNotFoundError):
            service.delete_queue(name)


def send(queue: QueueClient, texts: list[str]) -> None:
    queue.create_queue()
    for text in texts:
        queue.send_message(text)


def b64(message: Message) -> str:
    """A queue message as QueuePublisher and Azure Functions send it."""
    return base64.b64encode(encode_envelope(message).encode()).decode()


def outputs_on(queue: QueueClient) -> Counter[tuple[str, str, str, str]]:
    """The envelopes on an output queue, each as (id, key, type, body JSON)."""
    found = [decode_envelope(base64.b64decode(text).decode()) for text in drain(queue)]
    return Counter((m.id, m.key, m.type, json.dumps(m.body, sort_keys=True)) for m in found)


def reference(table: str, batches: dict[str, list[Message]]) -> tuple[dict[str, Any], list[Any]]:
    """States and outputs of the runtime alone, each key's messages once in order."""
    processor = Processor(shooting_range, client(table), InMemoryPublisher())
    outputs: list[Message] = []
    for key, messages in batches.items():
        for outcome in processor.process_batch(key, messages):
            outputs.extend(outcome.outputs)
    states = {s.key: (s.version, s.state) for s in scan_states(shooting_range, client(table))}
    sent = [(m.id, m.key, m.type, json.dumps(m.body, sort_keys=True)) for m in outputs]
    return states, sent


def table_states(table: str) -> dict[str, Any]:
    return {s.key: (s.version, s.state) for s in scan_states(shooting_range, client(table))}


def shots(key: str, positions: list[int]) -> list[Message]:
    # No StartNewRound and at most two shots a key: the target stays at 0, so a
    # key's outputs and state do not depend on the order the queue hands them in.
    return [Message(f"{key}-shot-{p}", key, "FireAt", {"position": p}) for p in positions]


@needs_pyspark_4
def test_a_queue_is_processed_with_outputs_routed_to_queues_and_the_bad_message_poisoned(
    spark: SparkSession, tmp_path: Path, table_name: str, queues: Callable[[str], QueueClient]
) -> None:
    from spark_driver import run_queue

    a, b = shots("game-a", [0, 5]), shots("game-b", [7, 0])
    inbox, hits, misses = queues("inbox"), queues("hits"), queues("misses")
    no_id = json.dumps({"key": "game-c", "type": "FireAt", "body": {"position": 3}})
    unknown = Message("game-d-1", "game-d", "Reload")
    send(inbox, [b64(a[0]), b64(a[1]), b64(a[0]), encode_envelope(b[0]), b64(b[1]), b64(b[0]),
                 no_id, "not a message", b64(unknown)])  # fmt: skip
    client(table_name)
    settings = JobSettings(table=table_name, handler="shooting_range")
    route = OutputRoute.parse([f"Hit={hits.queue_name}", misses.queue_name])

    batches = run_queue(
        spark, inbox.queue_name, str(tmp_path / "out"), str(tmp_path / "cp"), settings,
        partitions=2, output_queues=route,
    )  # fmt: skip

    [(batch_id, summary)] = batches
    figures = (summary.messages_in, summary.processed, summary.duplicates, summary.dead_lettered)
    assert (batch_id, figures, summary.exit_status) == (0, (8, 5, 2, 1), 0)
    # The envelope without an id took its queue message's id.
    outcomes = spark.read.parquet(str(tmp_path / "out/batch=0/outcomes")).collect()
    [c_id] = {r.message_id for r in outcomes if r.key == "game-c"}
    c = Message(c_id, "game-c", "FireAt", {"position": 3})
    assert sorted((r.message_id, r.status) for r in outcomes) == sorted(
        [(m.id, "completed") for m in [*a, *b, c]]
        + [(a[0].id, "duplicate"), (b[0].id, "duplicate"), (unknown.id, "dead_lettered")]
    )
    [dead] = [r for r in outcomes if r.status == "dead_lettered"]
    assert (dead.reason, dead.raw) == ("unknown type 'Reload'", b64(unknown))

    states, sent = reference(table_name + "ref", {"game-a": a, "game-b": b, "game-c": [c]})
    assert table_states(table_name) == states
    assert outputs_on(hits) == Counter(o for o in sent if o[2] == "Hit")
    assert outputs_on(misses) == Counter(o for o in sent if o[2] == "Missed")
    assert {o[2] for o in sent} == {"Hit", "Missed"}
    # Every queue message completed, or poisoned with its reason and text.
    assert inbox.get_queue_properties().approximate_message_count == 0
    poison = QueueClient.from_queue_url(f"{inbox.url}-poison", credential=inbox.credential)
    [poisoned] = [PoisonEntry.decode(t) for t in drain(poison)]
    assert (poisoned.content, poisoned.queue, poisoned.dequeue_count) == (
        "not a message",
        inbox.queue_name,
        1,
    )
    assert poisoned.reason.startswith("queue message text is neither base64 of a JSON envelope")


@needs_pyspark_4
def test_a_batch_that_fails_after_processing_completes_no_message_and_its_redelivery_does(
    spark: SparkSession,
    tmp_path: Path,
    table_name: str,
    queues: Callable[[str], QueueClient],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from spark_driver import _stream, run_queue
    from spark_driver._queues import _sink

    a, b = shots("game-a", [0, 4]), shots("game-b", [9])
    inbox, outbox = queues("inbox"), queues("outbox")
    send(inbox, [b64(m) for m in [*a, *b, a[1]]])
    client(table_name)
    settings = JobSettings(table=table_name, handler="shooting_range")
    real = _sink.settle_messages
    calls: list[int] = []

    def failing_once(*args: Any) -> Any:
        calls.append(len(calls))
        if len(calls) == 1:  # written and its outputs sent; nothing completed yet
            raise RuntimeError("injected: the driver dies before completing the messages")
        return real(*args)

    monkeypatch.setattr(_stream, "settle_messages", failing_once)
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "cp")

    def run(lock: int) -> list[Any]:
        return run_queue(
            spark, inbox.queue_name, out, checkpoint, settings, partitions=2,
            output_queues=OutputRoute.parse([outbox.queue_name]), visibility_timeout=lock,
        )  # fmt: skip

    with pytest.raises(Exception, match="injected"):
        run(lock=3)  # a short lock, to be redelivered soon
    first = outputs_on(outbox)
    states, sent = reference(table_name + "ref", {"game-a": a, "game-b": b})
    assert first == Counter(sent)
    assert table_states(table_name) == states
    # Nothing was deleted: the 4 messages come again once their lock runs out.
    assert inbox.get_queue_properties().approximate_message_count == 4
    deadline = time.monotonic() + 30
    while len(list(inbox.peek_messages(max_messages=32))) < 4:
        assert time.monotonic() < deadline, "the lock never ran out"
        time.sleep(0.2)

    [(batch_id, summary)] = run(lock=300)  # Spark replays batch 0 first: empty, and skipped

    assert (batch_id, summary.messages_in, summary.processed, summary.duplicates) == (1, 4, 0, 4)
    assert (summary.new_outputs, summary.reemitted_outputs) == (0, len(sent))
    assert outputs_on(outbox) == first  # the same outputs, sent again
    assert table_states(table_name) == states
    assert inbox.get_queue_properties().approximate_message_count == 0
    replayed = spark.read.parquet(f"{out}/batch=0/outcomes").collect()
    assert sorted(r.status for r in replayed) == ["completed"] * 3 + ["duplicate"]


@needs_pyspark_4
def test_an_abandoned_message_comes_again_after_a_backoff_then_goes_to_the_poison_queue(
    spark: SparkSession, tmp_path: Path, table_name: str, queues: Callable[[str], QueueClient]
) -> None:
    from spark_driver import Delivery, run_queue

    broken = Message("game-e-1", "game-e", "FireAt", {"aim": 3})  # no position: KeyError
    inbox = queues("inbox")
    send(inbox, [b64(broken)])
    client(table_name)
    settings = JobSettings(table=table_name, handler="shooting_range")
    deliveries: list[Delivery] = []

    def run() -> list[Any]:
        return run_queue(
            spark, inbox.queue_name, str(tmp_path / "out"), str(tmp_path / "cp"), settings,
            partitions=2, max_dequeue_count=2, retry_backoff=3,
            on_delivery=lambda batch_id, delivery: deliveries.append(delivery),
        )  # fmt: skip

    [(_, first)] = run()
    assert (first.messages_in, first.abandoned, first.exit_status) == (1, 1, 3)
    assert (deliveries[0].released, deliveries[0].deleted) == (1, 0)
    assert inbox.get_queue_properties().approximate_message_count == 1  # hidden, not gone
    deadline = time.monotonic() + 30
    while not list(inbox.peek_messages()):
        assert time.monotonic() < deadline, "the released message never came again"
        time.sleep(0.2)

    [(_, second)] = run()  # its second receive, the last one allowed

    assert (second.abandoned, deliveries[1].poisoned, deliveries[1].released) == (1, 1, 0)
    assert inbox.get_queue_properties().approximate_message_count == 0
    poison = QueueClient.from_queue_url(f"{inbox.url}-poison", credential=inbox.credential)
    [entry] = [PoisonEntry.decode(t) for t in drain(poison)]
    assert (entry.content, entry.dequeue_count, entry.queue) == (b64(broken), 2, inbox.queue_name)
    assert entry.reason.startswith(
        "failed on receive 2 of 2: handler 'ShootingRange' failed on message 'game-e-1': "
        "KeyError: 'position'"
    ), entry.reason


def test_the_queue_source_runs_on_pyspark_4_and_says_it_needs_it_on_3_5(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spark_driver import QueueSourceUnavailable, read_queue
    from spark_driver._queue_stream import queue_source_missing

    if PYSPARK_4:  # make test's PySpark: the source is there (make test-spark35 runs the rest)
        assert queue_source_missing() is None
        assert read_queue(spark, "orders").isStreaming
        return
    with pytest.raises(QueueSourceUnavailable) as refused:
        read_queue(spark, "orders")
    assert str(refused.value) == (
        "the queue source needs PySpark 4 (its Python data source API, pyspark.sql.datasource); "
        f"this is PySpark {pyspark.__version__}"
    )
    with pytest.raises(SystemExit) as done:
        main(["run", "--input", "queue:orders", "--output", str(tmp_path / "out"),
              "--checkpoint", str(tmp_path / "cp")])  # fmt: skip
    assert done.value.code == 2
    assert capsys.readouterr().err == (
        f"python -m spark_driver: error: --input queue:orders: {refused.value}\n"
    )
    assert not (tmp_path / "out").exists()


def _refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main(["run", *args])
    err = capsys.readouterr().err
    assert (done.value.code, err.count("\n")) == (2, 1), err
    return err.removeprefix("python -m spark_driver: error: ").rstrip("\n")


def test_the_command_refuses_bad_queue_names_and_an_account_without_queues(
    tmp_path: Path,
    table_name: str,
    connection_string: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = ["--output", str(tmp_path / "out"), "--table", table_name]
    cp = ["--checkpoint", str(tmp_path / "cp")]
    rule = (
        "is not a valid queue name: 3 to 63 lowercase letters, digits and single hyphens, "
        "starting and ending with a letter or digit (see --help)"
    )
    assert _refused(["--input", "queue:Orders_1", *out, *cp], capsys) == (
        f"--input 'queue:Orders_1': the queue 'Orders_1' {rule}"
    )
    assert _refused(["--input", "queue:orders", *out], capsys) == (
        "--input queue:orders (a stream) needs --checkpoint (see --help)"
    )
    inbox = write_jsonl(tmp_path / "in.jsonl", [])
    assert _refused(["--input", inbox, *out, "--output-queue", "Hit=hits--x"], capsys) == (
        f"--output-queue 'Hit=hits--x': the queue 'hits--x' {rule}"
    )
    two_defaults = ["--output-queue", "a-q", "--output-queue", "b-q"]
    assert _refused(["--input", inbox, *out, *two_defaults], capsys) == (
        "--output-queue names two default queues: 'a-q' and 'b-q' (route a type with "
        "TYPE=QUEUE) (see --help)"
    )
    assert _refused(["--input", inbox, *out, "--trigger", "10s"], capsys) == (
        "--trigger needs --stream or --input queue:NAME (see --help)"
    )
    assert _refused(["--input", inbox, *out, *cp, "--stream", "--trigger", "soon"], capsys) == (
        "--trigger: duration 'soon' is not like 7d, 36h, 1h30m or 90s (days, hours, minutes, "
        "seconds) (see --help)"
    )
    client(table_name)  # the table is there: the queue is what is refused
    tables_only = re.sub(r"QueueEndpoint=[^;]*;?", "", connection_string)
    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", tables_only)
    assert _refused(["--input", inbox, *out, "--output-queue", "outs"], capsys) == (
        "--output-queue: STREAMSTONE_CONNECTION_STRING names no QueueEndpoint (it names "
        "TableEndpoint): add the queue service's QueueEndpoint=..."
    )
    assert not (tmp_path / "out").exists()


def _command(connection_string: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["STREAMSTONE_CONNECTION_STRING"] = connection_string
    env["PYTHONPATH"] = str(ROOT)
    return env


def _written(out: Path) -> int:
    """Messages in the micro-batches written so far (each once its summary is)."""
    return sum(
        json.loads(next(f for f in (p.parent).glob("part-*.json")).read_text())["messages_in"]
        for p in out.glob("batch=*/summary/_SUCCESS")
    )


def _wait(until: Callable[[], bool], run: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 120
    while not until():
        if run.poll() is not None or time.monotonic() > deadline:
            run.kill()
            _, err = run.communicate()
            pytest.fail(f"{what}: exit {run.returncode}\n{err[-3000:]}")
        time.sleep(0.3)


def test_trigger_runs_a_file_stream_until_sigterm_which_lets_the_batch_finish(
    tmp_path: Path, table_name: str, connection_string: str, queues: Callable[[str], QueueClient]
) -> None:
    a, b = shots("game-a", [0, 6]), shots("game-b", [2])
    inbox, out, outbox = tmp_path / "inbox", tmp_path / "out", queues("outbox")
    inbox.mkdir()
    run = subprocess.Popen(
        [sys.executable, "-m", "spark_driver", "run", "--stream", "--input", str(inbox),
         "--output", str(out), "--checkpoint", str(tmp_path / "cp"), "--table", table_name,
         "--partitions", "2", "--trigger", "1s", "--output-queue", outbox.queue_name],
        env=_command(connection_string), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip

    def rows(messages: list[Message]) -> list[dict[str, Any]]:
        return [{"message_id": m.id, "key": m.key, "type": m.type, "body": json.dumps(m.body)}
                for m in messages]  # fmt: skip

    write_jsonl(tmp_path / "staging/part-0.jsonl", rows([a[0], b[0], a[0]]))
    (tmp_path / "staging/part-0.jsonl").rename(inbox / "part-0.jsonl")
    _wait(lambda: _written(out) == 3, run, "the first file's micro-batch")
    write_jsonl(tmp_path / "staging/part-1.jsonl", rows([a[1], b[0]]))
    (tmp_path / "staging/part-1.jsonl").rename(inbox / "part-1.jsonl")
    _wait(lambda: _written(out) == 5, run, "the second file's micro-batch")
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=120)

    assert run.returncode == 0, stderr[-3000:]
    assert "stopping: the micro-batch in progress finishes first" in stderr
    assert re.findall(r"micro-batch (\d+):", stdout) == ["0", "1"]
    assert stdout.count("outputs to queues: ") == 2
    states, sent = reference(table_name + "ref", {"game-a": a, "game-b": b})
    assert table_states(table_name) == states
    # The duplicate of b's shot in the second file re-sends its output.
    assert outputs_on(outbox) == Counter(sent) + Counter(o for o in sent if o[1] == "game-b")


@needs_pyspark_4
def test_a_triggered_queue_stream_runs_until_stopped_and_completes_what_it_processed(
    spark: SparkSession, tmp_path: Path, table_name: str, queues: Callable[[str], QueueClient]
) -> None:
    from spark_driver import Delivery, run_queue

    a = shots("game-a", [0, 8])
    inbox, outbox = queues("inbox"), queues("outbox")
    send(inbox, [b64(a[0])])
    client(table_name)
    settings = JobSettings(table=table_name, handler="shooting_range")
    stop, done = threading.Event(), threading.Event()
    completed: list[int] = []
    failed: list[BaseException] = []

    def completes(batch_id: int, delivery: Delivery) -> None:
        completed.append(delivery.deleted)

    def run() -> None:
        try:
            run_queue(
                spark, inbox.queue_name, str(tmp_path / "out"), str(tmp_path / "cp"), settings,
                partitions=2, output_queues=OutputRoute.parse([outbox.queue_name]),
                trigger=timedelta(seconds=1), stop=stop, on_delivery=completes,
            )  # fmt: skip
        except BaseException as exc:  # told to the test's thread below
            failed.append(exc)
        finally:
            done.set()

    def wait_for(messages: int) -> None:
        deadline = time.monotonic() + 60
        while sum(completed) < messages and not done.is_set():
            assert time.monotonic() < deadline, completed
            time.sleep(0.2)

    worker = threading.Thread(target=run)
    worker.start()
    try:
        wait_for(1)
        for message in [a[1], a[0]]:  # a new shot, and the first one again
            inbox.send_message(b64(message))
        wait_for(3)
    finally:
        stop.set()
        worker.join(120)
    assert failed == []
    assert not worker.is_alive()

    assert (completed[0], sum(completed)) == (1, 3)
    states, sent = reference(table_name + "ref", {"game-a": a})
    assert table_states(table_name) == states
    assert outputs_on(outbox) == Counter(sent) + Counter([sent[0]])  # a[0] came twice
    assert inbox.get_queue_properties().approximate_message_count == 0


def test_a_worker_keeps_one_client_per_account_and_one_publisher_per_account_and_routes(
    connection_string: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from spark_driver._queues import _sink
    from spark_driver._queues._config import QueueConfig, queue_service

    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    route = OutputRoute.parse(["Hit=h-q", "m-q"])
    first, service = _sink._publisher(route), queue_service()
    assert _sink._publisher(OutputRoute.parse(["m-q", "Hit=h-q"])) is first
    assert _sink._publisher(OutputRoute.parse(["m-q"])) is not first
    # Another account's queues may have the same names: never the same clients.
    other = re.sub(r"AccountKey=[^;]+", "AccountKey=" + "QUJD" * 22, connection_string)
    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", other)
    assert _sink._publisher(route) is not first
    assert queue_service() is not service
    assert "QUJD" not in repr(QueueConfig.from_env())
    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)
    assert _sink._publisher(route) is first
    assert queue_service() is service


def test_the_queue_endpoint_of_an_account_url_is_its_table_endpoints_unless_named() -> None:
    from spark_driver._queues._config import QueueConfig

    env = {"STREAMSTONE_ACCOUNT_URL": "https://acct.table.core.windows.net",
           "STREAMSTONE_SAS_TOKEN": "sv=2024-11-04&sig=secret"}  # fmt: skip
    config = QueueConfig.from_env(env)
    assert (config.account_url, config.sas_token) == (
        "https://acct.queue.core.windows.net",
        "sv=2024-11-04&sig=secret",
    )
    assert "secret" not in repr(config)
    named = {**env, "STREAMSTONE_QUEUE_ACCOUNT_URL": "https://queues.example.net"}
    assert QueueConfig.from_env(named).account_url == "https://queues.example.net"
    with pytest.raises(ValueError, match="set STREAMSTONE_QUEUE_ACCOUNT_URL") as refused:
        QueueConfig.from_env({**env, "STREAMSTONE_ACCOUNT_URL": "https://tables.example.net"})
    assert str(refused.value) == (
        "STREAMSTONE_ACCOUNT_URL's host 'tables.example.net' is not ACCOUNT.table.SUFFIX, so "
        "the queue endpoint cannot be told from it: set STREAMSTONE_QUEUE_ACCOUNT_URL"
    )
