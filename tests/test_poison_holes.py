"""What an adversary found in taking failed messages off the shelf, each
with the test that failed first: one id on two keys, entries that expired,
a far due, a hold shorter than the reading, entries held by another reader,
hostile reasons, cut answers and a poison queue never made."""

from __future__ import annotations

import base64
import json
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from azurite.proxy import Proxy, Request
from handlers import (
    InMemoryPublisher,
    Message,
    PoisonEntry,
    PoisonQueue,
    Processor,
    QueueConsumer,
    read_poison,
    send_back,
)
from tests.helpers import azurite_port
from tests.queueing import Tally, add, fixed_tally, queue_text, send, states, tally
from tests.test_poison_command import _run


def _shelve(poison: QueueClient, queue: QueueClient, *messages: Message, reason: str = "boom"
            ) -> None:  # fmt: skip
    for n, message in enumerate(messages):
        PoisonQueue(poison).send(PoisonEntry(reason, queue_text(message), queue.queue_name,
                                             f"q-{n}-{uuid.uuid4().hex[:6]}", 5))  # fmt: skip


def _poison(queues: QueueServiceClient, queue: QueueClient) -> QueueClient:
    return queues.get_queue_client(f"{queue.queue_name}-poison")


def test_one_id_on_two_keys_is_two_messages_each_sent_back_and_applied(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    one, two = f"k-{uuid.uuid4().hex[:8]}", f"k-{uuid.uuid4().hex[:8]}"
    send(queue, add(1, one, 1, "Broken"))
    send(queue, add(1, two, 10, "Broken"))
    QueueConsumer(Processor(tally, table, InMemoryPublisher()), queue, max_dequeue_count=1,
                  backoff=timedelta(0)).run(until_empty=True)  # fmt: skip
    poison = _poison(queues, queue)

    report = send_back(poison)
    fixed = Processor(fixed_tally, table, InMemoryPublisher())
    QueueConsumer(fixed, queue).run(until_empty=True)

    assert sorted(s.message.key for s, _ in report.sent if s.message) == sorted([one, two])
    assert report.copies == ()
    assert states(fixed, one, two) == {one: (1, Tally(1, ["m-1"])), two: (1, Tally(10, ["m-1"]))}


def test_copies_of_one_entry_are_sent_once_and_reported_as_copies(
    queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = _poison(queues, queue)
    _shelve(poison, queue, add(1, "k", 1), add(1, "k", 1))

    report = send_back(poison)

    assert ([s.message.id for s, _ in report.sent if s.message], len(report.copies)) == (["m-1"], 1)
    assert len(queue.peek_messages(max_messages=32)) == 1
    assert read_poison(poison) == []


def test_poison_entries_and_messages_sent_back_never_expire(
    queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = _poison(queues, queue)
    _shelve(poison, queue, add(1, "k", 1))
    [entry] = poison.peek_messages()
    send_back(poison)
    [back] = queue.peek_messages()

    # The queue's word for "never": its largest time (a default message lives 7 days).
    assert entry.expires_on is not None
    assert back.expires_on is not None
    assert (entry.expires_on.year, back.expires_on.year) == (9999, 9999)


def test_a_message_due_beyond_a_week_goes_back_hidden_as_long_as_a_queue_allows(
    queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = _poison(queues, queue)
    later = datetime.now(UTC) + timedelta(days=30)
    far = Message("m-far", "k", "Add", {"n": 1}, due=later)
    _shelve(poison, queue, far, add(2, "k", 1))

    report = send_back(poison)

    assert sorted(s.message.id for s, _ in report.sent if s.message) == ["m-2", "m-far"]
    # The far one is hidden (a consumer hides it again until due); the other shows.
    assert [json.loads(base64.b64decode(m.content))["id"] for m in queue.peek_messages()] == ["m-2"]
    assert queue.get_queue_properties().approximate_message_count == 2


@pytest.mark.timeout(120)
def test_a_hold_shorter_than_the_reading_ends_the_reading_instead_of_going_round(
    connection_string: str, queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = _poison(queues, queue)
    _shelve(poison, queue, *(add(n, "k", n) for n in range(100)))
    with Proxy(azurite_port(connection_string, "Queue"), delay=0.25) as slow:
        slowly = QueueClient.from_connection_string(slow.endpoint_of(connection_string),
                                                    poison.queue_name)  # fmt: skip
        started = time.monotonic()
        read = read_poison(slowly, hold=timedelta(seconds=1))
        seconds = time.monotonic() - started

    # It ends (it went round and round before), each entry once; those whose
    # hold ran out are not made visible again one by one (they are).
    assert seconds < 10
    assert 0 < len(read) == len({s.id for s in read}) < 100


def test_the_command_says_how_many_entries_another_reader_holds(
    connection_string: str, queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = _poison(queues, queue)
    _shelve(poison, queue, *(add(n, "k", n) for n in range(5)))
    held = list(poison.receive_messages(messages_per_page=3, max_messages=3,
                                        visibility_timeout=60))  # fmt: skip

    listed = _run(connection_string, "list", poison.queue_name)
    listed_json = json.loads(_run(connection_string, "list", poison.queue_name, "--json").stdout)
    back = _run(connection_string, "send-back", poison.queue_name)
    depth = json.loads(_run(connection_string, "depth", poison.queue_name, "--json").stdout)

    assert len(held) == 3
    note = f"{poison.queue_name} counts 5 entries, 3 not seen: held by another reader"
    assert listed.stdout.startswith(f"{poison.queue_name}: 2 entries\n"), listed.stdout
    assert note in listed.stdout
    assert (listed_json["total"], listed_json["not_seen"]) == (2, 3)
    assert f"{poison.queue_name} counts 5 entries, 3 not seen" in back.stdout
    assert (depth["depth"], depth["hidden"]) == (3, 3)
    assert depth["oldest_age_seconds"] is None


def test_a_reason_with_a_lone_surrogate_is_listed_and_shown_escaped(
    connection_string: str, queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = _poison(queues, queue)
    _shelve(poison, queue, add(1, "k", 1), reason="bad \ud800 text")

    listed = _run(connection_string, "list", poison.queue_name)
    shown = _run(connection_string, "show", poison.queue_name, "m-1")

    assert (listed.returncode, shown.returncode) == (0, 0), listed.stderr + shown.stderr
    assert "1  bad \\ud800 text" in listed.stdout
    assert "reason            bad \\ud800 text\n" in shown.stdout


def test_a_cut_answer_to_a_send_is_a_storage_failure_said_in_one_line_after_what_went(
    connection_string: str, queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = _poison(queues, queue)
    _shelve(poison, queue, add(1, "k", 1), add(2, "k", 2))
    inbox = f"POST /devstoreaccount1/{queue.queue_name}/messages".encode()
    posts: list[Request] = []

    def plan(request: Request) -> str:
        if not request.head.startswith(inbox):
            return "pass"
        posts.append(request)
        return "behead" if len(posts) == 2 else "pass"

    with Proxy(azurite_port(connection_string, "Queue")) as cutting:
        cutting.plan(plan)  # type: ignore[arg-type]
        cut = _run(cutting.endpoint_of(connection_string), "--hold", "1s", "send-back",
                   poison.queue_name)  # fmt: skip

    assert cut.returncode == 1
    # What went before the failure is said; the failure is one line.
    assert cut.stdout.count("sent 'm-") == 1, cut.stdout
    [line] = cut.stderr.splitlines()
    assert line.startswith("streamstone-poison: the storage service failed:"), cut.stderr
    assert line.endswith("(run it again: it is safe)")
    # The second send was applied, its answer cut: its entry stays too, a copy on both sides.
    assert len(queue.peek_messages(max_messages=32)) == 2
    time.sleep(1.2)
    assert [s.message.id for s in read_poison(poison) if s.message] != []


def test_a_poison_queue_is_refused_as_the_queue_to_send_back_to(
    connection_string: str, queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = _poison(queues, queue)
    _shelve(poison, queue, add(1, "k", 1), add(1, "k", 1))

    refused = _run(connection_string, "send-back", poison.queue_name, "--to", poison.queue_name)
    dry = _run(connection_string, "send-back", poison.queue_name, "--dry-run")
    with pytest.raises(ValueError, match="a poison queue holds entries, not messages"):
        send_back(poison, to=poison)

    assert refused.returncode == 2
    assert "is a poison queue: it holds entries, not messages" in refused.stderr
    assert dry.stdout.splitlines()[-1] == (
        f"1 would send, 1 copies of those would be deleted; 0 left in {poison.queue_name}"
    )
    assert len(read_poison(poison)) == 2


def test_send_back_over_a_poison_queue_never_made_sends_nothing_and_says_so(
    connection_string: str, queue: QueueClient
) -> None:
    done = _run(connection_string, "send-back", f"{queue.queue_name}-poison")

    assert (done.returncode, done.stdout) == (0, f"0 sent; 0 left in {queue.queue_name}-poison\n")
