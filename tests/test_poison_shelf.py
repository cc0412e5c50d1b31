"""Poisoned messages seen and sent back: a deep poison queue read whole and
left as it was, and entries sent back once their cause is fixed, applied once."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import (
    InMemoryPublisher,
    PoisonEntry,
    PoisonFilter,
    PoisonSummary,
    Processor,
    QueueConsumer,
    purge_poison,
    read_poison,
    send_back,
)
from tests.queueing import Tally, add, fixed_tally, poison_of, queue_text, send, states, tally


def _poison(queues: QueueServiceClient, queue: QueueClient) -> QueueClient:
    poison = queues.get_queue_client(f"{queue.queue_name}-poison")
    poison.create_queue()
    return poison


def test_a_deep_poison_queue_is_listed_whole_grouped_and_left_as_it_was(
    queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = _poison(queues, queue)
    for n in range(40):  # more than a peek shows
        key, kind = ("k-a", "Add") if n < 25 else ("k-b", "Refund")
        reason = (
            f"failed on receive 5 of 5: handler 'Tally' failed on message 'm-{n}': "
            "RuntimeError: boom"
            if kind == "Add"
            else "unknown type 'Refund'"
        )
        entry = PoisonEntry(reason, queue_text(add(n, key, n, kind)), queue.queue_name, f"q-{n}", 5)
        poison.send_message(entry.encode())
    poison.send_message("not an entry")

    listed = read_poison(poison)
    again = read_poison(poison)

    assert sorted(s.id for s in listed) == sorted(s.id for s in again)
    assert len(listed) == 41
    summary = PoisonSummary.of(listed)
    assert summary.total == 41
    assert summary.by_reason == {
        "failed on receive N of M: handler 'Tally' failed on message '...': RuntimeError: boom": 25,
        "unknown type 'Refund'": 15,
    }
    assert summary.by_key == {"k-a": 25, "k-b": 15}
    assert summary.by_age == {"< 1 hour": 41}
    assert summary.oldest is not None
    assert summary.oldest.message == add(0, "k-a", 0)
    assert summary.newest is not None
    assert summary.newest.text == "not an entry"
    [bad] = summary.undecodable
    assert bad.error == "not a poison entry: Only base64 data is allowed"

    dry = send_back(poison, PoisonFilter(types=frozenset({"Refund"})), dry_run=True)
    assert sorted(s.message.id for s, _ in dry.sent if s.message) == sorted(
        f"m-{n}" for n in range(25, 40)
    )
    assert {q for _, q in dry.sent} == {queue.queue_name}
    assert queue.peek_messages() == []
    assert len(read_poison(poison)) == 41  # a dry run sends and deletes nothing


def test_messages_poisoned_while_their_handler_failed_are_applied_once_when_sent_back(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    for message in (add(1, key, 1), add(2, key, 10, "Broken"), add(3, key, 100)):
        send(queue, message)
    broken = Processor(tally, table, InMemoryPublisher())
    stats = QueueConsumer(broken, queue, max_dequeue_count=1, backoff=timedelta(0)).run(
        until_empty=True
    )
    assert (stats.completed, stats.poisoned) == (2, 1)
    poison = queues.get_queue_client(f"{queue.queue_name}-poison")

    report = send_back(poison, PoisonFilter(keys=frozenset({key})))
    outputs = InMemoryPublisher()
    fixed = Processor(fixed_tally, table, outputs)
    again = QueueConsumer(fixed, queue, backoff=timedelta(0)).run(until_empty=True)

    assert [(s.message.id, q) for s, q in report.sent if s.message] == [("m-2", queue.queue_name)]
    assert (again.received, again.completed, again.duplicates) == (1, 1, 0)
    [(version, state)] = states(fixed, key).values()
    assert state.total == 111
    assert sorted(state.seen) == ["m-1", "m-2", "m-3"]
    assert version == 3
    assert [(m.type, m.body["by"]) for m in outputs.deliveries] == [("Added", "m-2")]
    assert poison_of(queues, queue) == []


def test_a_message_poisoned_after_its_state_was_stored_is_a_duplicate_when_sent_back(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    first = InMemoryPublisher()
    Processor(tally, table, first).process_batch(key, [add(1, key, 7)])
    # Its state stored, then its queue message poisoned (as a storage fault after the write does).
    entry = PoisonEntry("failed on receive 5 of 5: storage", queue_text(add(1, key, 7)),
                        queue.queue_name, "q-1", 5)  # fmt: skip
    poison = _poison(queues, queue)
    poison.send_message(entry.encode())

    send_back(poison)
    second = InMemoryPublisher()
    processor = Processor(tally, table, second)
    stats = QueueConsumer(processor, queue).run(until_empty=True)

    assert (stats.received, stats.completed, stats.duplicates) == (1, 0, 1)
    assert queue.peek_messages() == []
    assert states(processor, key) == {key: (1, Tally(7, ["m-1"]))}
    assert second.deliveries == first.deliveries
    assert len(second.deliveries) == 1
    assert read_poison(poison) == []


def test_an_envelope_without_id_goes_back_with_the_id_its_first_receive_gave_it(
    table: TableClient, queues: QueueServiceClient, queue: QueueClient
) -> None:
    key = f"k-{uuid.uuid4().hex[:8]}"
    sent = queue.send_message(f'{{"key": "{key}", "type": "Broken", "body": {{"n": 4}}}}')
    broken = Processor(tally, table, InMemoryPublisher())
    QueueConsumer(broken, queue, max_dequeue_count=1, backoff=timedelta(0)).run(until_empty=True)

    send_back(queues.get_queue_client(f"{queue.queue_name}-poison"))
    fixed = Processor(fixed_tally, table, InMemoryPublisher())
    QueueConsumer(fixed, queue).run(until_empty=True)

    assert states(fixed, key) == {key: (1, Tally(4, [sent.id]))}


_REASONS = {
    "a": "failed on receive 5 of 5: handler 'Tally' failed on message 'x': KeyError: 'n' "
    "(at tally.py:3 in tally)",
    "b": "unknown type 'Refund'",
}


_GROUP_A = "failed on receive N of M: handler 'Tally' failed: KeyError (at tally.py:3 in tally)"


@pytest.mark.parametrize(
    ("where", "chosen"),
    [
        (PoisonFilter(), ["m-0", "m-1", "m-2"]),
        (PoisonFilter(reasons=frozenset({"unknown type 'Refund'"})), ["m-1", "m-2"]),
        (PoisonFilter(reasons=frozenset({_GROUP_A})), ["m-0"]),
        (PoisonFilter(keys=frozenset({"k-a"})), ["m-0", "m-2"]),
        (PoisonFilter(types=frozenset({"Refund"})), ["m-1", "m-2"]),
        (PoisonFilter(ids=frozenset({"m-1", "m-9"})), ["m-1"]),
        (PoisonFilter(keys=frozenset({"k-a"}), types=frozenset({"Refund"})), ["m-2"]),
        (PoisonFilter(older_than=timedelta(hours=1)), []),
        (PoisonFilter(older_than=timedelta(0)), ["m-0", "m-1", "m-2"]),
    ],
)
def test_filters_take_exactly_the_matching_entries_and_a_dry_run_sends_nothing(
    queues: QueueServiceClient, queue: QueueClient, where: PoisonFilter, chosen: list[str]
) -> None:
    poison = _poison(queues, queue)
    for n, (key, kind, reason) in enumerate((("k-a", "Add", "a"), ("k-b", "Refund", "b"),
                                             ("k-a", "Refund", "b"))):  # fmt: skip
        entry = PoisonEntry(_REASONS[reason], queue_text(add(n, key, n, kind)), queue.queue_name,
                            f"q-{n}", 5)  # fmt: skip
        poison.send_message(entry.encode())
    poison.send_message("not an entry")

    report = send_back(poison, where, dry_run=True)

    assert sorted(s.message.id for s, _ in report.sent if s.message) == chosen
    assert len(report.left) == 4 - len(chosen)
    assert queue.peek_messages() == []
    assert len(read_poison(poison)) == 4


def test_an_entry_that_does_not_read_stays_until_purged_by_its_id_alone(
    queues: QueueServiceClient, queue: QueueClient
) -> None:
    poison = _poison(queues, queue)
    poison.send_message("not an entry")
    entry = PoisonEntry("unknown type 'Refund'", queue_text(add(0, "k", 0, "Refund")),
                        queue.queue_name, "q-0", 5)  # fmt: skip
    poison.send_message(entry.encode())
    [bad] = [s for s in read_poison(poison) if s.message is None]

    back = send_back(poison)
    kept = purge_poison(poison, PoisonFilter(ids=frozenset({bad.id}), types=frozenset({"Add"})))
    declined = purge_poison(poison, PoisonFilter(ids=frozenset({bad.id})), confirm=lambda e: False)
    purged = purge_poison(poison, PoisonFilter(ids=frozenset({bad.id})), confirm=lambda e: True)

    assert [s.message.id for s, _ in back.sent if s.message] == ["m-0"]
    assert [s.id for s in back.left] == [bad.id]
    assert (kept.purged, declined.purged) == ((), ())
    assert [s.text for s in purged.purged] == ["not an entry"]
    assert read_poison(poison) == []
