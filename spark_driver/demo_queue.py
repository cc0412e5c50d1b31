"""The queue demo: the ShootingRange workload through a queue, the Spark job
running with a continuous trigger, killed halfway and started again.

It sends 2,000 messages over 50 games (a StartNewRound and 39 FireAt per
game) to a queue as base64 envelopes, with 20% duplicates and three texts
that are not messages, and starts ``python -m spark_driver run --input
queue:NAME --trigger 2s`` with its outputs sent to a second queue. Once a
quarter of the messages are stored, the job's process is killed (SIGKILL:
no graceful stop) and the same command started again on the same
checkpoint; when the queue is empty it is stopped with SIGTERM. The check:
every distinct message changed state exactly once, the output queue holds
exactly the outputs the stored versions imply (every copy of an id
identical), and every queue message was completed or is in the poison queue
with its reason.

It ends with a failed message sent back: a handler deployed with a bug
poisons one of three messages; once the fixed handler is deployed,
``streamstone-poison send-back`` (a separate process, no Spark) sends it to
its queue and the queue consumer applies it, once: a second send-back finds
nothing, and a copy of the message sent again is a duplicate.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from azure.data.tables import TableServiceClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    HandlerContext,
    Message,
    PoisonEntry,
    Processor,
    QueueConsumer,
    encode_envelope,
    handler,
    read_poison,
)
from handlers import read_queue_text as read_text
from handlers.examples import shooting_range

from .demo import workload

GAMES = 50
PER_GAME = 40
GARBAGE = ("not a message", '{"key": "no type"}', "aGVsbG8=")
#: The queue lock of the demo's job: a killed batch's messages come back after it.
LOCK = 20


def _drain(queue: QueueClient) -> list[str]:
    texts: list[str] = []
    while page := list(queue.receive_messages(messages_per_page=32, visibility_timeout=60)):
        for received in page:
            texts.append(received.content)
            queue.delete_message(received)
    return texts


def _send(queue: QueueClient, texts: list[str]) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(queue.send_message, texts))


def _stored(processor: Processor[Any], games: list[str]) -> int:
    return sum(processor.current_state(game).version for game in games)


def _job(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)


def main() -> int:
    """Run the queue demo; 0 if its check passes."""
    connection = os.environ.get("STREAMSTONE_CONNECTION_STRING", "")
    if "QueueEndpoint=" not in connection:
        print("set STREAMSTONE_CONNECTION_STRING with a QueueEndpoint (make demo-queue starts "
              "Azurite with its Queue service and does)", file=sys.stderr)  # fmt: skip
        return 2
    tag = uuid.uuid4().hex[:8]
    table_name, in_name, out_name = "shootingrangequeue", f"demo-shots-{tag}", f"demo-hits-{tag}"
    table = TableServiceClient.from_connection_string(connection).create_table_if_not_exists(
        table_name
    )
    queues = QueueServiceClient.from_connection_string(connection)
    inbox = queues.create_queue(in_name)
    processor = Processor(shooting_range, table, _Discard())
    with tempfile.TemporaryDirectory(prefix="streamstone-demo-queue-") as work:
        root = Path(work)
        distinct, rows = workload(root / "messages.jsonl", GAMES, PER_GAME)
        sent: dict[str, Message] = {}
        texts = []
        for line in (root / "messages.jsonl").read_text().splitlines():
            row = json.loads(line)
            body = None if row["body"] is None else json.loads(row["body"])
            game = f"{row['key']}-{tag}"  # new keys each run: the check reads them alone
            message = Message(row["message_id"].replace(row["key"], game), game, row["type"], body)
            sent[message.id] = message
            texts.append(base64.b64encode(encode_envelope(message).encode()).decode())
        texts[len(texts) // 2 : len(texts) // 2] = list(GARBAGE)
        games = sorted({m.key for m in sent.values()})
        _send(inbox, texts)
        print(f"queue {in_name}: {len(texts):,} queue messages, {distinct:,} distinct over "
              f"{GAMES} games ({rows - distinct:,} duplicates, {len(GARBAGE)} not "
              "messages)")  # fmt: skip
        command = [
            sys.executable, "-m", "spark_driver", "run", "--input", f"queue:{in_name}",
            "--output", str(root / "results"), "--checkpoint", str(root / "checkpoint"),
            "--table", table_name, "--handler", "shooting_range", "--output-queue", out_name,
            "--trigger", "2s", "--queue-lock", str(LOCK), "--max-messages-per-trigger", "1000",
        ]  # fmt: skip
        log = root / "job.log"
        started = time.perf_counter()
        job = _job(command, log)
        progress = _Progress(started, inbox, distinct)
        while (stored := _stored(processor, games)) < distinct // 4:
            if job.poll() is not None:
                print(log.read_text(), file=sys.stderr)
                print(f"the job exited with {job.returncode} before it was killed", file=sys.stderr)
                return 1
            progress.tick(stored)
            time.sleep(0.5)
        job.send_signal(signal.SIGKILL)
        job.wait()
        print(f"killed the job (SIGKILL) at {time.perf_counter() - started:.1f} s, "
              f"{stored:,} messages stored; started it again on its checkpoint")  # fmt: skip
        restarted = time.time()
        job = _job(command, log)
        deadline = time.monotonic() + 600
        while (stored := _stored(processor, games)) < distinct or (
            inbox.get_queue_properties().approximate_message_count
        ):
            if job.poll() is not None or time.monotonic() > deadline:
                print(log.read_text(), file=sys.stderr)
                print("the restarted job stopped before the queue was empty", file=sys.stderr)
                return 1
            progress.tick(stored)
            time.sleep(1)
        job.send_signal(signal.SIGTERM)
        status = job.wait(timeout=120)
        seconds = time.perf_counter() - started
        print(f"queue empty after {seconds:.1f} s; SIGTERM: the job stopped with status {status}")
        poisoned = len(queues.get_queue_client(f"{in_name}-poison").peek_messages(max_messages=32))
        _print_totals(root / "results", restarted, poisoned)
    checks = _check(processor, queues, sent, games, in_name, out_name, status)
    checks += _failed_and_sent_back(table, queues, tag)
    print("\nexactly-once check:")
    for label, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {label}")
    for name in (in_name, out_name, f"{in_name}-poison"):
        queues.delete_queue(name)
    return 0 if all(ok for _, ok in checks) else 1


class _Progress:
    """A line at least every 10 s while the demo waits on the job."""

    def __init__(self, started: float, inbox: QueueClient, distinct: int) -> None:
        self.started, self.inbox, self.distinct = started, inbox, distinct
        self.last = started

    def tick(self, stored: int) -> None:
        now = time.perf_counter()
        if now - self.last >= 10:
            self.last = now
            depth = self.inbox.get_queue_properties().approximate_message_count or 0
            print(f"  {now - self.started:5.0f} s: {stored:,} of {self.distinct:,} messages "
                  f"stored; {depth:,} queue messages left (in hand included)",
                  flush=True)  # fmt: skip


def _print_totals(results: Path, since: float, poisoned: int) -> None:
    """The restarted job's figures, from the outcome and output rows of the
    micro-batches it wrote (``OUTPUT/batch=N``), and the poison queue's count."""
    import pyarrow.parquet as pq

    statuses: Counter[str] = Counter()
    batches = outputs = 0
    for folder in sorted(results.glob("batch=*")):
        parts = list((folder / "outcomes").glob("*.parquet"))
        if not parts or min(p.stat().st_mtime for p in parts) < since:
            continue  # written by the killed job
        batches += 1
        for part in parts:
            statuses.update(pq.read_table(part, columns=["status"]).column("status").to_pylist())
        outputs += sum(pq.read_metadata(p).num_rows for p in (folder / "outputs").glob("*.parquet"))
    rows = [
        ("messages in", sum(statuses.values()), ""),
        ("completed", statuses["completed"], "stored now"),
        ("duplicates", statuses["duplicate"],
         "sent twice, or stored by the killed job's last micro-batch"),
        ("dead-lettered", statuses["dead_lettered"], ""),
        ("abandoned or faulted", statuses["abandoned"] + statuses["faulted"], ""),
        ("output messages", outputs, "sent to the output queue too"),
        ("poisoned (both starts)", poisoned, "the texts that are not messages, with reasons"),
    ]  # fmt: skip
    print(f"\nthe restarted job's totals over its {batches} micro-batches:")
    for label, figure, note in rows:
        print(f"  {label:<24}{figure:>7,}" + (f"   {note}" if note else ""))


def _check(
    processor: Processor[Any],
    queues: QueueServiceClient,
    sent: dict[str, Message],
    games: list[str],
    in_name: str,
    out_name: str,
    status: int,
) -> list[tuple[str, bool]]:
    expected: dict[str, Message] = {}
    once, states_match = True, True
    for game in games:
        history = list(processor.history(game))
        ids = [v.message_id for v in history]
        once &= sorted(ids) == sorted(m.id for m in sent.values() if m.key == game)
        state = shooting_range.initial_state()
        for version in history:  # the serial run of the stored order, with its clock
            message = sent[version.message_id]
            ctx = HandlerContext(message, handler=shooting_range.name, now=version.now)
            state = shooting_range.apply(state, message, ctx)
            states_match &= shooting_range.encode_state(state) == shooting_range.encode_state(
                version.state
            )
            expected.update((o.id, o) for o in ctx.outputs)
    copies: dict[str, set[str]] = defaultdict(set)
    for text in _drain(queues.get_queue_client(out_name)):
        copies[read_text(text).id].add(text)
    published = {i: read_text(next(iter(t))) for i, t in copies.items()}
    poison = [PoisonEntry.decode(t) for t in _drain(queues.get_queue_client(f"{in_name}-poison"))]
    left = _drain(queues.get_queue_client(in_name))
    return [
        ("every distinct message changed state exactly once", once),
        ("each stored state is the serial run of the stored messages", states_match),
        ("the output queue holds exactly the stored versions' outputs", published == expected),
        ("every copy of an output on the queue is identical",
         all(len(t) == 1 for t in copies.values())),
        ("every queue message completed or in the poison queue with a reason",
         not left and sorted(e.content for e in poison) == sorted(GARBAGE)
         and all(e.reason for e in poison)),
        ("the job stopped gracefully on SIGTERM (status 0)", status == 0),
    ]  # fmt: skip


@dataclass
class Accuracy:
    """A player's hit rate in percent, game by game."""

    rates: list[int] = field(default_factory=list)


@handler("Accuracy", Accuracy, types=["Played"])
def accuracy_v1(state: Accuracy, message: Message, ctx: HandlerContext) -> None:
    """The first release: a game without a shot divides by zero."""
    body = message.body or {}
    state.rates.append(body["hits"] * 100 // body["shots"])


@handler("Accuracy", Accuracy, types=["Played"])
def accuracy(state: Accuracy, message: Message, ctx: HandlerContext) -> None:
    """The fix: a game without a shot is a rate of 0."""
    body = message.body or {}
    state.rates.append(body["hits"] * 100 // body["shots"] if body["shots"] else 0)


def _failed_and_sent_back(
    table: Any, queues: QueueServiceClient, tag: str
) -> list[tuple[str, bool]]:
    """A message poisoned by a broken handler, sent back by the command once the fix is deployed."""
    scores, player = queues.create_queue(f"demo-scores-{tag}"), f"player-{tag}"
    games = [Message(f"played-{tag}-{n}", player, "Played", {"hits": h, "shots": s})
             for n, (h, s) in enumerate(((3, 4), (0, 0), (1, 2)))]  # fmt: skip
    texts = [base64.b64encode(encode_envelope(m).encode()).decode() for m in games]
    _send(scores, texts)

    def consume(version: Any) -> Any:
        consumer = QueueConsumer(Processor(version, table, _Discard()), scores,
                                 max_dequeue_count=1, backoff=timedelta(0))  # fmt: skip
        return consumer.run(until_empty=True)

    consume(accuracy_v1)
    poison = queues.get_queue_client(f"{scores.queue_name}-poison")
    print(f"\nfailed messages: the first Accuracy handler poisoned "
          f"{len(read_poison(poison))} of 3; the fix deployed, then:")  # fmt: skip
    command = [str(Path(sys.executable).parent / "streamstone-poison"), "send-back",
               poison.queue_name]  # fmt: skip
    back = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    print(f"  $ streamstone-poison send-back {poison.queue_name}\n"
          + "".join(f"  {line}\n" for line in back.stdout.splitlines()))  # fmt: skip
    consume(accuracy)
    second = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
    scores.send_message(texts[1])  # the message once more: a duplicate
    stats = consume(accuracy)
    fixed = Processor(accuracy, table, _Discard())
    history = [v.message_id for v in fixed.history(player)]
    rates = fixed.current_state(player).state.rates
    for name in (scores.queue_name, poison.queue_name):
        queues.delete_queue(name)
    return [
        ("the failed message, sent back after the fix, was applied once",
         back.returncode == 0 and history == [games[0].id, games[2].id, games[1].id]
         and rates == [75, 50, 0]),
        ("a second send-back found nothing; a copy sent again was a duplicate",
         second.stdout.startswith("0 sent") and (stats.duplicates, stats.completed) == (1, 0)),
    ]  # fmt: skip


class _Discard:
    def publish(self, messages: object) -> None:
        """The check only reads states; it publishes nothing."""


if __name__ == "__main__":
    sys.exit(main())
