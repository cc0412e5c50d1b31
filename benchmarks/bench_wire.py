"""The wire runner beside the SDK, and the task body beside Azurite's ceiling.

- ``client.cpu_per_batch.wire``: client CPU milliseconds per key-batch (one
  new message on a key whose header is cached: one 3-entity ``$batch``),
  through the wire runner's client, beside a ``TableClient`` as
  ``TableClient.from_connection_string`` builds it (target: at most 0.2).
- ``client.cpu_per_read.wire``: client CPU milliseconds of reading 1,000
  events with ``Stream.read`` through the wire runner, beside the SDK's own
  range query over the same 1,000 rows (target: at most 0.3).
- ``client.cpu_per_batch.engine``: the same key-batch through the SDK runner
  (the engine on a default-built ``TableClient``), beside the SDK's own
  ``submit_transaction`` of the same three rows: what the engine adds.
- ``task.keys.ceiling``: the task body (``process_partition``, 8 keys in
  flight, the header cache, the wire runner) over 10,000 keys x 1 message,
  beside Azurite's ceiling: a minimal client that sends the same 3-entity
  ``$batch`` per key, hand-built, on 8 threads (target: at least 0.5).

Run: ``python benchmarks/bench_wire.py [--quick]``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from email.utils import formatdate
from typing import Any

import urllib3
from _common import account, check, emit, log, paired, quick
from azure.data.tables import TableClient, TableServiceClient
from bench_keys import rows_for

import spark_driver._tasks._executor as executor
import spark_driver._tasks._worker as worker
from handlers import HeaderCache, InMemoryPublisher, Message, Processor
from handlers.examples import shooting_range
from spark_driver import JobSettings
from streamstone_py import EventData, Partition, Stream, TableConfig, WireTableClient


def _cpu_per_message(table: TableClient, keys: int) -> float:
    """CPU ms per new message on a cached key: one ``$batch`` each."""
    p = Processor(shooting_range, table, InMemoryPublisher(), cache=HeaderCache())
    tag = uuid.uuid4().hex[:6]
    for n in range(keys):  # every key stored once, its header cached
        p.process(Message(f"{tag}-{n}-r", f"{tag}-{n}", "StartNewRound"))
    start = time.process_time()
    for n in range(keys):
        p.process(Message(f"{tag}-{n}-s", f"{tag}-{n}", "FireAt", {"position": n % 100}))
    spent = time.process_time() - start
    check(p.stats.completed == 2 * keys, f"cpu: {p.stats.completed} of {2 * keys}")
    check(p.cache is not None and p.cache.stale == 0, "cpu: a cached header was stale")
    return spent * 1000 / keys


def bench_batch_cpu(connection_string: str, keys: int, repeats: int) -> None:
    service = TableServiceClient.from_connection_string(connection_string)

    def measure(make: Any) -> float:
        name = "benchwire" + uuid.uuid4().hex[:8]
        service.create_table(name)
        with make(name) as table:
            spent = _cpu_per_message(table, keys)
        service.delete_table(name)
        return spent

    def wire(_: int) -> float:
        return measure(lambda name: WireTableClient.from_connection_string(connection_string, name))

    def sdk(_: int) -> float:
        return measure(lambda name: TableClient.from_connection_string(connection_string, name))

    values, peers = paired(wire, sdk, repeats)
    emit("client.cpu_per_batch.wire", "ms CPU/batch", "lower", values,
         "TableClient.from_connection_string", peers, {"batches": keys, "entities": 3})  # fmt: skip


def bench_engine_overhead(connection_string: str, keys: int, repeats: int) -> None:
    """The SDK runner's key-batch beside the SDK's own transaction of the same rows."""
    service = TableServiceClient.from_connection_string(connection_string)

    def engine(_: int) -> float:
        name = "benchsdk" + uuid.uuid4().hex[:8]
        service.create_table(name)
        with TableClient.from_connection_string(connection_string, name) as table:
            spent = _cpu_per_message(table, keys)
        service.delete_table(name)
        return spent

    def raw(_: int) -> float:
        name = "benchraw" + uuid.uuid4().hex[:8]
        service.create_table(name)
        with TableClient.from_connection_string(connection_string, name) as table:
            start = time.process_time()
            for n in range(keys):
                table.submit_transaction(
                    [
                        ("upsert", {"PartitionKey": f"k{n}", "RowKey": "H|SS-HEAD", "Version": 1}),
                        ("create", {"PartitionKey": f"k{n}", "RowKey": "H|SS-SE-0000000001"}),
                        ("create", {"PartitionKey": f"k{n}", "RowKey": "H|SS-UID-m"}),
                    ]
                )
            spent = time.process_time() - start
        service.delete_table(name)
        return spent * 1000 / keys

    values, peers = paired(engine, raw, repeats)
    emit("client.cpu_per_batch.engine", "ms CPU/batch", "lower", values,
         "raw azure-data-tables submit_transaction", peers,
         {"batches": keys, "entities": 3})  # fmt: skip


def bench_read_cpu(connection_string: str, events: int, repeats: int) -> None:
    service = TableServiceClient.from_connection_string(connection_string)
    name = "benchread" + uuid.uuid4().hex[:8]
    service.create_table(name)
    sdk = TableClient.from_connection_string(connection_string, name)
    wire = WireTableClient.from_connection_string(connection_string, name)
    partition = Partition(wire, "reader")
    batch = [EventData(id=f"e{n}", properties={"N": n, "Text": "x" * 40}) for n in range(events)]
    Stream.write(Stream(partition), *batch)

    def engine_on_wire(_: int) -> float:
        start = time.process_time()
        page = Stream.read(partition, 1, events)
        spent = time.process_time() - start
        check(len(page.events) == events, f"read: {len(page.events)} of {events}")
        return spent * 1000

    def sdk_query(_: int) -> float:
        start = time.process_time()
        found = list(
            sdk.query_entities(
                "PartitionKey eq @pk and RowKey ge @low and RowKey lt @high",
                parameters={"pk": "reader", "low": "SS-SE-", "high": "SS-SF"},
                results_per_page=1000,
            )
        )
        spent = time.process_time() - start
        check(len(found) == events, f"query: {len(found)} of {events}")
        return spent * 1000

    engine_on_wire(0)
    sdk_query(0)  # connections open, modules warm
    values, peers = paired(engine_on_wire, sdk_query, repeats)
    emit("client.cpu_per_read.wire", "ms CPU/read", "lower", values,
         "azure-data-tables query_entities of the same rows", peers,
         {"events": events})  # fmt: skip
    sdk.close()
    wire.close()
    service.delete_table(name)


class _Ceiling:
    """A minimal client: the 3-entity ``$batch`` of a new key, built by hand,
    signed with SharedKey, sent with urllib3; what Azurite takes at most."""

    def __init__(self, connection_string: str, table: str) -> None:
        parts = dict(p.split("=", 1) for p in connection_string.split(";") if p)
        self.account, self.key = parts["AccountName"], base64.b64decode(parts["AccountKey"])
        self.endpoint = parts["TableEndpoint"].rstrip("/")
        self.path = "/" + self.endpoint.split("/", 3)[3]
        self.table = table
        self.http = urllib3.PoolManager(maxsize=16)

    def send(self, key: str) -> None:
        boundary, change = uuid.uuid4().hex, uuid.uuid4().hex
        rows = [("H|SS-HEAD", {"Version": 1}), ("H|SS-SE-0000000001", {"Version": 1}),
                ("H|SS-UID-m", {"Version": 1})]  # fmt: skip
        parts = [f"--batch_{boundary}\r\nContent-Type: multipart/mixed; boundary=cs_{change}\r\n"]
        for n, (row, props) in enumerate(rows):
            body = json.dumps({"PartitionKey": key, "RowKey": row, **props})
            parts.append(
                f"--cs_{change}\r\nContent-Type: application/http\r\n"
                f"Content-Transfer-Encoding: binary\r\nContent-ID: {n}\r\n\r\n"
                f"POST {self.endpoint}/{self.table} HTTP/1.1\r\nContent-Type: application/json\r\n"
                f"Accept: application/json;odata=minimalmetadata\r\n"
                f"Prefer: return-no-content\r\nDataServiceVersion: 3.0\r\n\r\n{body}"
            )
        parts.append(f"--cs_{change}--\r\n--batch_{boundary}--\r\n")
        date = formatdate(usegmt=True)
        content_type = f"multipart/mixed; boundary=batch_{boundary}"
        text = f"POST\n\n{content_type}\n{date}\n/{self.account}{self.path}/$batch"
        signature = base64.b64encode(
            hmac.new(self.key, text.encode(), hashlib.sha256).digest()
        ).decode()
        answer = self.http.request(
            "POST",
            f"{self.endpoint}/$batch",
            body="\r\n".join(parts).encode(),
            headers={
                "x-ms-date": date, "x-ms-version": "2019-02-02", "DataServiceVersion": "3.0",
                "Content-Type": content_type, "Accept": "application/json",
                "Authorization": f"SharedKey {self.account}:{signature}",
            },
        )  # fmt: skip
        check(answer.status == 202 and b" 204 " in answer.data, f"ceiling: {answer.status}")


def ceiling_rate(connection_string: str, keys: int, threads: int) -> float:
    name = "benchceil" + uuid.uuid4().hex[:8]
    TableServiceClient.from_connection_string(connection_string).create_table(name)
    client = _Ceiling(connection_string, name)
    tag = uuid.uuid4().hex[:6]
    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(client.send, (f"{tag}-{n}" for n in range(keys))))
    elapsed = time.perf_counter() - start
    TableServiceClient.from_connection_string(connection_string).delete_table(name)
    return keys / elapsed


def task_rate(connection_string: str, keys: int) -> float:
    """Messages/s of the task body over ``keys`` new keys with one message each."""
    name = "benchtask" + uuid.uuid4().hex[:8]
    TableServiceClient.from_connection_string(connection_string).create_table(name)
    os.environ["STREAMSTONE_CONNECTION_STRING"] = connection_string
    worker.header_cache = HeaderCache()  # a fresh worker's
    settings = JobSettings(table=name, handler="shooting_range")
    rows = rows_for(keys, 1, uuid.uuid4().hex[:6])
    start = time.perf_counter()
    out = list(executor.process_partition(iter(rows), settings))
    elapsed = time.perf_counter() - start
    done = sum(1 for r in out if r[0] == "outcome" and r[4] == "completed")
    check(done == len(rows), f"task: {done} of {len(rows)} completed")
    worker._clients.pop(TableConfig.from_env(table_name=name)).close()
    TableServiceClient.from_connection_string(connection_string).delete_table(name)
    return len(rows) / elapsed


def bench_ceiling(connection_string: str, keys: int, repeats: int) -> None:
    values, peers = paired(
        lambda _: task_rate(connection_string, keys),
        lambda _: ceiling_rate(connection_string, keys, 8),
        repeats,
    )
    emit("task.keys.ceiling", "messages/s", "higher", values,
         "a hand-built 3-entity $batch per key, 8 threads", peers,
         {"keys": keys, "messages": keys, "threads": 8})  # fmt: skip


def main() -> int:
    small = quick(__doc__)
    with account() as connection_string:
        log("client CPU per key-batch: wire against the SDK")
        bench_batch_cpu(connection_string, 200 if small else 1_000, 3)
        log("client CPU per key-batch: the SDK runner against raw transactions")
        bench_engine_overhead(connection_string, 200 if small else 1_000, 3)
        log("client CPU of a 1,000-event read: wire against the SDK's query")
        bench_read_cpu(connection_string, 1_000, 3 if small else 7)
        log("the task body against Azurite's ceiling")
        bench_ceiling(connection_string, 1_000 if small else 10_000, 1 if small else 3)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
