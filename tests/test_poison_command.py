"""streamstone-poison as a team runs it: a separate process over real queues,
its listing, one entry shown, a send-back killed between a send and its
delete then run again, a purge confirmed or not, the depth to alert on."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    InMemoryPublisher,
    Message,
    PoisonEntry,
    Processor,
    QueueConsumer,
    encode_envelope,
    read_poison,
    send_back,
)
from tests.helpers import drain
from tests.queueing import Tally, add, fixed_tally, send, states, tally

COMMAND = str(Path(sys.executable).parent / "streamstone-poison")


# Where the test handler raises, as the reason names it: found, so that an
# edit above it in tests/queueing.py does not break this test.
RAISED = "        raise RuntimeError(f\"cannot add {body.get('n')!r}\")"
_LINES = Path(__file__).with_name("queueing.py").read_text().splitlines()
_RAISE = f"tests/queueing.py:{1 + _LINES.index(RAISED)}"


def _run(
    connection_string: str, *args: str, stdin: str = "", command: list[str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STREAMSTONE_CONNECTION_STRING": connection_string}
    return subprocess.run(
        [*(command or [COMMAND]), *args],
        env=env, input=stdin, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _poisoned_while_broken(queue: QueueClient, table: TableClient, key: str) -> None:
    """Three messages of ``key``: the handler fails on the ``Broken`` ones, poisoned at once."""
    for message in (add(1, key, 1), add(2, key, 10, "Broken"), add(3, key, 100, "Broken")):
        send(queue, message)
    consumer = QueueConsumer(Processor(tally, table, InMemoryPublisher()), queue,
                             max_dequeue_count=1, backoff=timedelta(0))  # fmt: skip
    assert consumer.run(until_empty=True).poisoned == 2


def test_the_command_lists_shows_and_sends_back_and_the_fixed_handler_applies_each_once(
    connection_string: str, table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    _poisoned_while_broken(queue, table, key)
    poison = f"{queue.queue_name}-poison"

    listed = _run(connection_string, "list", poison, "--json")
    shown = _run(connection_string, "show", poison, "m-2")
    dry = _run(connection_string, "send-back", poison, "--type", "Broken", "--dry-run")
    assert (listed.returncode, shown.returncode, dry.returncode) == (0, 0, 0), listed.stderr
    summary = json.loads(listed.stdout)
    assert (summary["total"], summary["by_key"], summary["undecodable"]) == (2, {key: 2}, [])
    # One bug, one group: the message's id and its values in the error's words go.
    assert summary["by_reason"] == {
        f"failed on receive N of M: handler 'Tally' failed: RuntimeError (at {_RAISE} in tally)": 2
    }
    assert summary["oldest"]["message"] == {
        "id": "m-2", "key": key, "type": "Broken", "due": None, "body": {"n": 10}
    }  # fmt: skip
    assert "reason            failed on receive 1 of 1: handler 'Tally' failed on message " \
           f"'m-2': RuntimeError: cannot add 10 (at {_RAISE} in tally)\n" \
           in shown.stdout  # fmt: skip
    assert "receives          1\n" in shown.stdout
    assert 'message body\n{\n  "n": 10\n}\n' in shown.stdout
    assert dry.stdout.splitlines()[-1] == f"2 would send; 0 left in {poison}"
    assert queue.peek_messages() == []

    back = _run(connection_string, "send-back", poison, "--key", key)
    outputs = InMemoryPublisher()
    fixed = Processor(fixed_tally, table, outputs)
    stats = QueueConsumer(fixed, queue, backoff=timedelta(0)).run(until_empty=True)

    assert back.returncode == 0, back.stderr
    assert back.stdout.splitlines()[-1] == f"2 sent; 0 left in {poison}"
    assert (stats.received, stats.completed, stats.duplicates) == (2, 2, 0)
    ((version, state),) = states(fixed, key).values()
    assert (version, state.total, sorted(state.seen)) == (3, 111, ["m-1", "m-2", "m-3"])
    assert sorted(m.body["by"] for m in outputs.deliveries) == ["m-2", "m-3"]
    assert read_poison(queues.get_queue_client(poison)) == []


#: The command, its Queue client made to die (SIGKILL) at its first send
#: back: ``KILL_AT=after`` once the message is on its queue (between the send
#: and the entry's delete), ``before`` as the send starts.
_KILLED = textwrap.dedent("""
    import os, signal, sys
    from azure.storage.queue import QueueClient
    real = QueueClient.send_message
    def send(self, *args, **kwargs):
        if os.environ["KILL_AT"] == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        answer = real(self, *args, **kwargs)
        os.kill(os.getpid(), signal.SIGKILL)
        return answer
    QueueClient.send_message = send
    from handlers._failed._command import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.parametrize("at", ["after", "before"])
def test_a_send_back_killed_between_a_send_and_its_delete_run_again_applies_each_once(
    connection_string: str, table: TableClient, queues: QueueServiceClient, queue: QueueClient,
    monkeypatch: pytest.MonkeyPatch, at: str,
) -> None:  # fmt: skip
    key = f"k-{uuid.uuid4().hex[:8]}"
    _poisoned_while_broken(queue, table, key)
    poison = queues.get_queue_client(f"{queue.queue_name}-poison")

    monkeypatch.setenv("KILL_AT", at)
    killed = _run(connection_string, "--hold", "2s", "send-back", poison.queue_name,
                  command=[sys.executable, "-c", _KILLED])  # fmt: skip
    assert killed.returncode == -9
    # Sent, one message is on its queue and still on the shelf; both entries show again
    # after 2 s (held, never removed, by the process killed).
    assert len(queue.peek_messages()) == (1 if at == "after" else 0)
    deadline = time.monotonic() + 15
    while len(poison.peek_messages(max_messages=32)) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    again = _run(connection_string, "send-back", poison.queue_name)
    outputs = InMemoryPublisher()
    fixed = Processor(fixed_tally, table, outputs)
    stats = QueueConsumer(fixed, queue, backoff=timedelta(0)).run(until_empty=True)

    assert again.stdout.splitlines()[-1] == f"2 sent; 0 left in {poison.queue_name}", again.stderr
    # The copy sent twice is a duplicate: same outputs, no second version.
    twice = 1 if at == "after" else 0
    assert (stats.received, stats.completed, stats.duplicates) == (2 + twice, 2, twice)
    ((version, state),) = states(fixed, key).values()
    assert (version, state.total, sorted(state.seen)) == (3, 111, ["m-1", "m-2", "m-3"])
    by = [m.body["by"] for m in outputs.deliveries]
    assert sorted(set(by)) == ["m-2", "m-3"]
    assert len({m.encode() for m in outputs.deliveries if m.body["by"] == by[0]}) == 1
    assert read_poison(poison) == []
    assert drain(queue) == []


def test_a_message_poisoned_unprocessed_while_its_first_receive_stored_it_is_a_duplicate(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    """What still ends a stored message on the shelf: its first receive's lock
    ran out in the handler, and a second receive, the last one allowed, looked
    it up before the first stored it and poisoned it unprocessed."""
    key = f"k-{uuid.uuid4().hex[:8]}"
    first_outputs = InMemoryPublisher()
    send(queue, add(1, key, 3, "Slow", seconds=2.5))
    first = QueueConsumer(Processor(tally, table, first_outputs), queue, visibility_timeout=1,
                          renew_locks=False)  # fmt: skip
    second = QueueConsumer(Processor(tally, table, InMemoryPublisher()), queue,
                           visibility_timeout=30, max_dequeue_count=1)  # fmt: skip
    worker = threading.Thread(target=first.run_once)
    worker.start()
    time.sleep(1.3)  # the first lock has run out
    assert second.run_once() == 1
    worker.join()
    # The first stored it; its delete found it gone (the second deleted it): completed.
    assert (second.stats.poisoned, first.stats.completed) == (1, 1)
    poison = queues.get_queue_client(f"{queue.queue_name}-poison")
    assert [s.message.id for s in read_poison(poison) if s.message] == ["m-1"]

    send_back(poison)
    outputs = InMemoryPublisher()
    processor = Processor(tally, table, outputs)
    stats = QueueConsumer(processor, queue).run(until_empty=True)

    assert (stats.received, stats.completed, stats.duplicates) == (1, 0, 1)
    assert states(processor, key) == {key: (1, Tally(3, ["m-1"]))}
    assert outputs.deliveries == first_outputs.deliveries
    assert [m.body for m in outputs.deliveries] == [{"total": 3, "by": "m-1"}]
    assert read_poison(poison) == []


def test_a_purge_deletes_only_what_was_confirmed_and_counts_it(
    connection_string: str, queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = queues.get_queue_client(f"{queue.queue_name}-poison")
    poison.create_queue()
    for n, kind in enumerate(("Refund", "Refund", "Add")):
        text = base64.b64encode(encode_envelope(Message(f"m-{n}", "k", kind)).encode()).decode()
        poison.send_message(PoisonEntry(f"unknown type {kind!r}", text, queue.queue_name,
                                        f"q-{n}", 1).encode())  # fmt: skip

    declined = _run(connection_string, "purge", poison.queue_name, "--type", "Refund", stdin="n\n")
    accepted = _run(connection_string, "purge", poison.queue_name, "--type", "Refund", stdin="y\n")

    assert declined.stdout == (
        f"delete 2 entries of {poison.queue_name} for good? [y/N] "
        f"0 purged; 3 left in {poison.queue_name}\n"
    )
    assert accepted.stdout.endswith(f"2 purged; 1 left in {poison.queue_name}\n")
    assert [s.message.type for s in read_poison(poison) if s.message] == ["Add"]


def test_the_depth_to_alert_on_and_the_help_that_names_every_operation(
    connection_string: str, queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = queues.get_queue_client(f"{queue.queue_name}-poison")
    missing = _run(connection_string, "depth", poison.queue_name, "--json")
    poison.create_queue()
    poison.send_message("not an entry")
    poison.send_message("not one either")
    time.sleep(1.1)
    found = _run(connection_string, "depth", poison.queue_name, "--json")
    helped = _run(connection_string, "--help")
    live = _run(connection_string, "list", queue.queue_name)

    assert json.loads(missing.stdout) == {
        "queue": poison.queue_name, "depth": 0, "oldest_age_seconds": None, "hidden": 0
    }  # fmt: skip
    depth = json.loads(found.stdout)
    assert (depth["depth"], depth["oldest_age_seconds"] >= 1) == (2, True)
    for operation in ("list", "show", "send-back", "purge", "depth"):
        assert operation in helped.stdout
    assert live.returncode == 2
    assert "does not end in '-poison'" in live.stderr


def test_the_shared_options_go_before_or_after_the_operation_s_name() -> None:
    from handlers._failed._command import build_parser

    parser = build_parser()
    after = parser.parse_args(["list", "orders", "--any-name", "--hold", "90s"])
    before = parser.parse_args(["--any-name", "--hold", "90s", "list", "orders"])
    neither = parser.parse_args(["list", "orders-poison"])

    assert (after.hold, after.any_name) == (before.hold, before.any_name) == (
        timedelta(seconds=90), True
    )  # fmt: skip
    assert (neither.hold, neither.any_name) == (timedelta(minutes=5), False)
