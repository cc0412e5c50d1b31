"""Tokens in the Spark job (``--tokens``): the transfers of the accounts
example run by the job, their output files (the credits, with their
``ss-token`` in the ``headers`` column) fed back as input, and fed back again
after retention removed the credits' versions: with tokens the copy is
consumed, without it is applied again. Real Spark (``local[2,4]``), real
Azurite tables; states, token rows and output rows asserted exactly."""

from __future__ import annotations

import base64
import dataclasses
import json
import uuid
from pathlib import Path
from typing import Any, Final

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient
from pyspark import TaskContext
from pyspark.sql import SparkSession

from handlers import (
    HandlerContext,
    InMemoryPublisher,
    Message,
    Processor,
    decode_envelope,
    encode_envelope,
    handler,
)
from handlers._outcome import CONSUMED
from handlers.examples import Account, accounts
from spark_driver import JobSettings, run_batch
from spark_driver.__main__ import main
from spark_driver._queues._sink import OutputRoute
from tests.helpers import register_raw
from tests.spark.conftest import write_jsonl
from tests.spark.test_pipeline import client as created
from tests.spark.test_queue_source import needs_pyspark_4
from tests.tokening import H, expected_stream, stream_rows, token_rows

#: The job's output files (Parquet) read as its input.
PARQUET: Final[dict[str, Any]] = {"input_format": "parquet", "partitions": 2}


NO_SLASH: Final = "Azure Tables keys may not contain '/', '\\', '#', '?' or control characters"


class TaskDied(BaseException):
    """The task's Python worker died here (no outcome can hold it)."""


@handler(H, Account, types=["Deposit", "Transfer", "Credit"])
def dies_once(state: Account, message: Message, ctx: HandlerContext) -> Any:
    """The accounts handler, dying in the first attempt of its task at a
    message ``die-*``: the keys before it are stored, tokens checkpointed,
    and the attempt's output rows lost."""
    task = TaskContext.get()
    if message.id.startswith("die-") and task is not None and task.attemptNumber() == 0:
        raise TaskDied(f"attempt 0 dies at {message.id}")
    return accounts.handle(state, message, ctx)


def client(name: str) -> TableClient:
    table = created(name)
    register_raw(table)  # the token helpers read the rows through it
    return table


def rows_of(spark: SparkSession, path: str) -> list[dict[str, Any]]:
    found = [r.asDict() for r in spark.read.parquet(path).collect()]
    return sorted(found, key=lambda r: (r["key"], r["message_id"], r.get("status") or ""))


def balance(table: str, key: str) -> int:
    processor = Processor(accounts, client(table), InMemoryPublisher())
    return int(processor.current_state(key).state.balance)


def transfer(n: int, a: str, b: str, amount: int) -> dict[str, Any]:
    body = json.dumps({"to": b, "amount": amount})
    return {"message_id": f"t-{n}", "key": a, "type": "Transfer", "body": body}


@pytest.mark.parametrize("tokens", [True, False], ids=["tokens", "no-tokens"])
def test_credits_fed_back_after_retention_are_consumed_with_tokens_applied_again_without(
    spark: SparkSession, tmp_path: Path, table_name: str, tokens: bool
) -> None:
    table = client(table_name)
    settings = JobSettings(table=table_name, handler="handlers.examples:accounts", tokens=tokens)
    a, b = "acct-a", "acct-b"
    first = write_jsonl(tmp_path / "in.jsonl", [transfer(1, a, b, 30)])
    run_batch(spark, first, str(tmp_path / "out1"), settings, partitions=2)
    credits = str(tmp_path / "out1" / "outputs")  # the job's own output files, as input
    by_type = {r["type"]: r for r in rows_of(spark, credits)}
    credit, notice = by_type["Credit"], by_type["Transferred"]
    token = token_rows(table, a).get(f"{H}|TC-t-1", {}).get("Tokens", [""])[0]
    assert (credit["type"], credit["key"], credit["headers"]) == (
        "Credit", b, {"ss-token": f"{H}:{token}"} if tokens else {}
    )  # fmt: skip
    assert (notice["type"], notice["headers"]) == ("Transferred", {})
    if tokens:  # marked by the driver once the outputs were committed
        assert token_rows(table, a) == {f"{H}|TC-t-1": {"Tokens": [token], "Dispatched": True}}
        assert list(token_rows(table, b)) == [f"{H}|TK-{token}"]

    fed = run_batch(spark, credits, str(tmp_path / "out2"), settings, **PARQUET)
    assert (fed.processed, fed.dead_lettered) == (1, 1)  # Transferred: not the handler's type
    assert balance(table_name, b) == 30
    assert token_rows(table, b) == {}  # consumed in the credit's own transaction

    processor = Processor(accounts, table, InMemoryPublisher())
    for n in (1, 2):
        processor.process(Message(f"d-{n}", b, "Deposit", {"amount": 1}))
    assert processor.retain(b, keep_last=1) == 1  # the credit's version goes
    assert stream_rows(table, b) == expected_stream(table, b, [(2, "d-1"), (3, "d-2")])

    again = run_batch(spark, credits, str(tmp_path / "out3"), settings, **PARQUET)
    outcomes = [r for r in rows_of(spark, str(tmp_path / "out3" / "outcomes")) if r["key"] == b]
    got = [(r["message_id"], r["status"], r["reason"]) for r in outcomes]
    if tokens:  # the outcome files' reason tells the kind, consumed
        assert got == [(credit["message_id"], "duplicate", CONSUMED)]
        assert (again.processed, again.duplicates, balance(table_name, b)) == (0, 1, 32)
    else:
        assert got == [(credit["message_id"], "completed", None)]
        assert (again.processed, balance(table_name, b)) == (1, 62)  # 30 out of nothing
    assert balance(table_name, a) == -30


def test_a_retried_sender_task_sends_the_checkpoints_token_ids(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    """The first attempt stores the transfer and checkpoints its token, then
    dies on a later key, its output rows lost: the retry finds the transfer
    stored and sends the checkpoint's id, never a fresh one."""
    table = client(table_name)
    die = {"message_id": "die-1", "key": "acct-z", "type": "Deposit", "body": '{"amount": 1}'}
    first = write_jsonl(tmp_path / "in.jsonl", [transfer(1, "acct-a", "acct-b", 5), die])
    handler_spec = "tests.spark.test_job_tokens:dies_once"
    settings = JobSettings(table=table_name, handler=handler_spec, tokens=True, concurrency=1)
    summary = run_batch(spark, first, str(tmp_path / "out1"), settings, partitions=1)
    assert (summary.processed, summary.duplicates) == (1, 1)  # die-1 new; t-1 found stored
    written = rows_of(spark, str(tmp_path / "out1" / "outputs"))
    [credit] = [r for r in written if r["key"] == "acct-b"]
    [token] = token_rows(table, "acct-a")[f"{H}|TC-t-1"]["Tokens"]
    assert credit["headers"] == {"ss-token": f"{H}:{token}"}
    assert token_rows(table, "acct-b") == {
        f"{H}|TK-{token}": {"MessageId": "t-1", "From": "acct-a"}
    }  # one token: the retry made none, the first attempt's garbage none
    fed = run_batch(spark, str(tmp_path / "out1" / "outputs"), str(tmp_path / "out2"), settings,
                    input_format="parquet", partitions=1)  # fmt: skip
    assert (fed.processed, balance(table_name, "acct-b"), token_rows(table, "acct-b")) == (1, 5, {})


def test_headers_of_file_inputs_bad_ones_dead_lettered(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    """JSON lines with a ``headers`` object: a token naming another handler is
    a message from outside, applied; a malformed one, headers that are not an
    object of strings: dead letters with their reasons, the job goes on."""
    client(table_name)
    key = f"acct-{uuid.uuid4().hex[:6]}"

    def line(n: int, headers: Any = None) -> dict[str, Any]:
        row = {"message_id": f"c-{n}", "key": key, "type": "Credit", "body": '{"amount": 1}'}
        return row if headers is None else {**row, "headers": headers}

    lines = [line(1), line(2, {"ss-token": "Ledger:" + "a" * 32, "x": "y"}),
             line(3, {"ss-token": f"{H}:a/b"}), line(4, "not an object"),
             line(5, {"n": 1}), line(6, ["a"])]  # fmt: skip
    path = write_jsonl(tmp_path / "in.jsonl", lines)
    settings = JobSettings(table=table_name, handler="handlers.examples:accounts", tokens=True)
    summary = run_batch(spark, path, str(tmp_path / "out"), settings, partitions=1)
    assert (summary.processed, summary.dead_lettered, summary.exit_status) == (2, 4, 0)
    dead = rows_of(spark, str(tmp_path / "out" / "dead_letters"))
    assert [(r["message_id"], r["reason"]) for r in dead] == [
        (
            "c-3",
            f"message 'c-3' carries a token no row key can hold: included entity RowKey "
            f"'{H}|TK-a/b' contains '/'; {NO_SLASH}",
        ),
        ("c-4", "unparseable headers 'not an object': Expecting value: line 1 column 1 (char 0)"),
        ("c-5", "header 'n' is 1, not a string"),
        ("c-6", """headers '["a"]' are not a JSON object"""),
    ]
    assert json.loads(dead[2]["raw"]) == {**line(5), "headers": '{"n":1}'}
    assert balance(table_name, key) == 2


def test_the_flag_is_refused_without_the_state_strategy_or_named_types(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    base = ["run", "--input", str(tmp_path), "--output", str(tmp_path / "out"), "--tokens"]
    for extra, said in (
        (["--strategy", "outbox"], "--tokens needs --strategy state, got 'outbox'"),
        (["--handler", "tests.spark.test_job_tokens:untyped"],
         "--tokens needs handler 'tests.spark.test_job_tokens:untyped' to name its types"),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exited:
            main([*base, *extra])
        assert exited.value.code == 2
        assert said in capsys.readouterr().err


@handler("Untyped")
def untyped(state: dict[str, int], message: Message, ctx: HandlerContext) -> None:
    """Names no types: nothing tells which outputs are its own messages."""


@needs_pyspark_4
def test_a_credit_through_queues_keeps_its_token_and_a_late_copy_is_consumed(
    spark: SparkSession,
    tmp_path: Path,
    table_name: str,
    queue: QueueClient,
    queues: QueueServiceClient,
) -> None:
    """``--output-queue``: the credit's envelope carries its ``ss-token``; the
    job reading that queue applies it and consumes the token; the same text
    sent again after retention removed its version is a duplicate, dropped."""
    from spark_driver import run_queue

    table = client(table_name)
    inbox, credits = queue, queues.create_queue(f"{queue.queue_name}-out")  # both deleted after
    transfer = Message("t-1", "acct-a", "Transfer", {"to": "acct-b", "amount": 30})
    inbox.send_message(encode_envelope(transfer))
    settings = JobSettings(table=table_name, handler="handlers.examples:accounts", tokens=True)
    route = OutputRoute.parse([f"Credit={credits.queue_name}"])

    def run(source: QueueClient, n: int, **more: Any) -> Any:
        out, checkpoint = str(tmp_path / f"out{n}"), str(tmp_path / f"cp{n}")
        [(_, summary)] = run_queue(
            spark, source.queue_name, out, checkpoint, settings, partitions=2, **more
        )
        return summary

    run(inbox, 1, output_queues=route)
    [text] = [m.content for m in credits.peek_messages()]
    [token] = token_rows(table, "acct-a")[f"{H}|TC-t-1"]["Tokens"]
    assert decode_envelope(base64.b64decode(text).decode()).headers == {"ss-token": f"{H}:{token}"}
    assert run(credits, 2).processed == 1
    assert (balance(table_name, "acct-b"), token_rows(table, "acct-b")) == (30, {})

    processor = Processor(accounts, table, InMemoryPublisher())
    for n in (1, 2):
        processor.process(Message(f"d-{n}", "acct-b", "Deposit", {"amount": 1}))
    assert processor.retain("acct-b", keep_last=1) == 1
    credits.send_message(text)  # the queue delivers it again, long after
    late = run(credits, 3)
    assert (late.processed, late.duplicates, balance(table_name, "acct-b")) == (0, 1, 32)


def test_a_rerun_without_tokens_marks_the_checkpoints_it_sent_again(
    spark: SparkSession, tmp_path: Path, table_name: str
) -> None:
    """A run with tokens stored the transfer and checkpointed its token, and
    failed before its commit (the executor's processor, alone); the rerun,
    tokens off, re-sends the credit with the checkpoint's id, and its commit
    marks the checkpoint, so that retention can remove the version."""
    table = client(table_name)
    executor = Processor(accounts, table, InMemoryPublisher(), tokens=True, dispatch="by_caller")
    executor.process(Message("t-1", "acct-a", "Transfer", {"to": "acct-b", "amount": 5}))
    assert token_rows(table, "acct-a")[f"{H}|TC-t-1"]["Dispatched"] is False
    rerun = write_jsonl(tmp_path / "in.jsonl", [transfer(1, "acct-a", "acct-b", 5)])
    settings = JobSettings(table=table_name, handler="handlers.examples:accounts")
    summary = run_batch(spark, rerun, str(tmp_path / "out"), settings, partitions=1)
    assert summary.duplicates == 1
    [credit] = [
        r for r in rows_of(spark, str(tmp_path / "out" / "outputs")) if r["key"] == "acct-b"
    ]
    [token] = token_rows(table, "acct-a")[f"{H}|TC-t-1"]["Tokens"]
    assert credit["headers"] == {"ss-token": f"{H}:{token}"}
    assert token_rows(table, "acct-a")[f"{H}|TC-t-1"]["Dispatched"] is True
    executor.process(Message("d-1", "acct-a", "Deposit", {"amount": 5}))
    assert executor.retain("acct-a", keep_last=0) == 2
    assert token_rows(table, "acct-a") == {}


@handler(H, Account, types=["Deposit", "Transfer", "Credit"])
def notifying(state: Account, message: Message, ctx: HandlerContext) -> Any:
    """The accounts handler, with a notice out of the system for every credit."""
    accounts.handle(state, message, ctx)
    if message.type == "Credit":
        ctx.publish("Credited", {"amount": message.body["amount"], "balance": state.balance})


@pytest.mark.parametrize("rerun_tokens", [True, False], ids=["rerun-tokens", "rerun-no-tokens"])
def test_a_credit_whose_job_failed_before_its_commit_sends_its_notice_after_retention(
    spark: SparkSession, tmp_path: Path, table_name: str, rerun_tokens: bool
) -> None:
    """The receiver's version (its token consumed) awaits its own outputs:
    stored by a task whose job failed before the commit, retention keeps it
    until a rerun, replaying it, commits the notice; the driver then ends
    the wait (no row left) and retention may remove it."""
    table = client(table_name)
    spec = f"{__name__}:notifying"
    settings = JobSettings(table=table_name, handler=spec, tokens=True)
    a, b = "acct-a", "acct-b"
    run_batch(spark, write_jsonl(tmp_path / "in.jsonl", [transfer(1, a, b, 30)]),
              str(tmp_path / "out1"), settings, partitions=2)  # fmt: skip
    credits = str(tmp_path / "out1" / "outputs")
    [credit] = [r for r in rows_of(spark, credits) if r["type"] == "Credit"]
    message = Message(credit["message_id"], b, "Credit", json.loads(credit["body"]),
                      credit["headers"])  # fmt: skip
    # A task of a job that fails before its commit: stored, nothing committed.
    executor = Processor(notifying, table, InMemoryPublisher(), tokens=True, dispatch="by_caller")
    assert executor.process(message).status == "completed"
    assert token_rows(table, b) == {f"{H}|TC-{message.id}": {"Tokens": [], "Dispatched": False}}
    for n in (1, 2):
        executor.process(Message(f"d-{n}", b, "Deposit", {"amount": 1}))
    assert executor.retain(b, keep_last=1) == 0  # its notice was never committed
    again = dataclasses.replace(settings, tokens=rerun_tokens)  # a rerun may turn tokens off
    rerun = run_batch(spark, credits, str(tmp_path / "out2"), again, **PARQUET)
    notices = [r for r in rows_of(spark, str(tmp_path / "out2" / "outputs"))
               if r["type"] == "Credited"]  # fmt: skip
    assert [(r["source_message_id"], json.loads(r["body"])) for r in notices] == [
        (message.id, {"amount": 30, "balance": 30})
    ]
    assert rerun.duplicates == 1
    assert token_rows(table, b) == {}  # the driver ended the wait after the commit
    assert executor.retain(b, keep_last=1) == 1
    assert balance(table_name, b) == 32
