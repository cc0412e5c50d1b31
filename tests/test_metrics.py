"""The metrics a team alerts on, read by the SDK's in-memory reader against
Azurite: the storage request duration by operation and status on the four
clients, a consumer's messages by outcome for a known workload (exactly),
its lock renewals and lost locks, its poison queue's depth and oldest age,
the processing duration by outcome; nothing secret in any attribute."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from azure.core.credentials import AzureSasCredential
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from azurite.launcher import AzuriteTable
from handlers import InMemoryPublisher, Processor, QueueConsumer
from streamstone_py import ConcurrencyConflictError, EventData, Partition, Stream, WireTableClient
from tests.helpers import S
from tests.metrics import points, texts_of_metrics
from tests.oauth import bearer_client
from tests.queueing import add, send, tally
from tests.test_wire_credentials import _endpoint, _key, _sas

DURATION = "db.client.operation.duration"


def test_each_storage_request_is_measured_by_operation_and_status(
    partition: Partition, meters: InMemoryMetricReader
) -> None:
    S.write(partition, EventData(id="a"), expected_version=0)
    with pytest.raises(ConcurrencyConflictError):
        S.write(partition, EventData(id="b"), expected_version=0)

    keys = ("db.operation.name", "db.response.status_code", "error.type", "db.collection.name")
    table = partition.table_name
    assert points(meters, DURATION, *keys, scope="streamstone_py") == {
        ("submit_transaction", "202", None, table): 1,
        ("submit_transaction", "409", "EntityAlreadyExists", table): 1,
        ("get_entity", "200", None, table): 1,  # the conflict's header, read to tell it
    }


def test_a_consumer_counts_each_message_by_its_outcome(
    table: TableClient, queue: QueueClient, meters: InMemoryMetricReader
) -> None:
    slow, done, broken = (f"k-{uuid.uuid4().hex[:8]}" for _ in range(3))
    send(queue, add(1, slow, 3, "Slow", seconds=2.5))
    # The first consumer's lock (1 s) runs out while its handler runs, and it does
    # not renew: the second receives the message, finds it stored, a duplicate.
    first = QueueConsumer(Processor(tally, table, InMemoryPublisher()), queue,
                          visibility_timeout=1, renew_locks=False)  # fmt: skip
    second = QueueConsumer(Processor(tally, table, InMemoryPublisher()), queue,
                           visibility_timeout=10, max_dequeue_count=2,
                           backoff=timedelta(0))  # fmt: skip
    worker = threading.Thread(target=first.run_once)
    worker.start()
    time.sleep(1.3)
    send(queue, add(2, done, 1))
    send(queue, add(3, broken, 1, "Broken"))  # abandoned, then poisoned on its 2nd receive
    queue.send_message("not a message")  # poisoned at once
    stats = second.run(until_empty=True)
    worker.join()

    on_the_queue = ("streamstone.outcome", "messaging.destination.name", "streamstone.handler")
    name = queue.queue_name
    assert points(meters, "streamstone.messages", *on_the_queue) == {
        ("completed", name, "Tally"): 1,
        ("duplicate", name, "Tally"): 1,
        ("faulted", name, "Tally"): 1,  # the first's: its lock lost before the delete
        ("abandoned", name, "Tally"): 1,
        ("poisoned", name, "Tally"): 2,
    }
    both = [first.stats, stats]
    assert (first.stats.faulted, first.stats.lost_locks) == (1, 1)
    assert sum(s.received for s in both) == 6  # the broken one twice
    assert points(meters, "messaging.client.consumed.messages", "messaging.destination.name") == {
        (name,): 6
    }
    assert points(meters, "streamstone.lock.lost", "messaging.destination.name") == {(name,): 1}
    renewed = points(meters, "streamstone.lock.renewals", "messaging.destination.name")
    assert sum(renewed.values()) == sum(s.renewed for s in both)
    assert points(meters, "messaging.process.duration", "streamstone.outcome") == {
        ("completed",): 2,  # the slow one by the first consumer, and the one done
        ("duplicate",): 1,
        ("failed",): 2,
    }
    # The gauges read every live consumer's poison queue (other tests' too, until
    # they are collected): this one's entries, and how long its oldest has waited.
    poison = (f"{name}-poison",)
    assert points(meters, "streamstone.poison.depth", "messaging.destination.name")[poison] == 2
    age = points(meters, "streamstone.poison.oldest_age", "messaging.destination.name")[poison]
    assert 0 <= age < 60


# --- no secret in any metric, whatever the credential --------------------------------


def _metrics_of_a_roundtrip(client: Any, meters: InMemoryMetricReader) -> list[str]:
    with client:
        partition = Partition(client, "k-" + uuid.uuid4().hex[:8])
        Stream.write(Stream(partition), EventData(id="a"))
        assert [e.id for e in Stream.read(partition).events] == ["a"]
    texts = texts_of_metrics(meters)
    assert DURATION in texts
    return texts


@pytest.mark.parametrize("kind", [TableClient, WireTableClient], ids=["sdk", "wire"])
def test_no_key_sas_or_token_in_any_metric(
    kind: type[TableClient],
    connection_string: str,
    table: TableClient,
    oauth_azurite: AzuriteTable,
    oauth_table: str,
    meters: InMemoryMetricReader,
) -> None:
    key = _key(connection_string)
    client = kind.from_connection_string(connection_string, table.table_name)
    texts = _metrics_of_a_roundtrip(client, meters)
    assert [t for t in texts if key in t or key[:12] in t or "AccountKey" in t] == []

    token = _sas(connection_string, read=True, list=True, add=True, update=True, delete=True)
    signature = token.split("sig=")[1].split("&")[0]
    endpoint = _endpoint(connection_string)
    credential = AzureSasCredential(token)
    texts = _metrics_of_a_roundtrip(kind(endpoint, table.table_name, credential=credential),
                                    meters)  # fmt: skip
    assert [t for t in texts if signature in t or "sig=" in t or "?" in t] == []

    issuer, bearer = bearer_client(kind, oauth_azurite, oauth_table)
    texts = _metrics_of_a_roundtrip(bearer, meters)
    assert issuer.issued
    leaked = [t for t in texts if any(token in t or token[:20] in t for token in issuer.issued)]
    assert leaked == []
    assert [t for t in texts if "Bearer" in t] == []
