"""Many keys with few messages each, with and without network latency.

- ``keys.requests.new`` / ``keys.requests.revisited``: HTTP requests per
  message (counted at the transport) for one new message on each of many new
  keys, then one more on each key, with a ``HeaderCache``, beside the same
  processor without one (target: 1.0 for both).
- ``task.keys.scaling``: the Spark task body (``process_partition``, its
  defaults: 8 keys in flight, the header cache) over 10,000 messages as
  10,000 keys x 1 message, beside 10 keys x 1,000 messages (target: a ratio
  of at least 0.25). ``task.keys.scaling.serial`` is the same pair one key
  at a time without a cache, as the task body ran before.
- ``task.latency.concurrency``: the task body over 2,000 keys x 1 message
  through a proxy that adds 5 ms each way, beside the same body with one key
  at a time (target: at least 8x).
- ``client.cpu_per_request``: CPU milliseconds per request of the client
  ``TableConfig`` builds, beside the client as
  ``TableClient.from_connection_string`` builds it (target: at most 0.5).
- ``client.cpu.share.*``: one profiled pass of the tuned client: the shares
  of its time spent building the ``$batch`` multipart request, parsing the
  multipart response, and in the HTTP exchange itself.
- ``task.keys.throughput``: messages/s of the task body against the number of
  keys for the same messages, with and without the proxy (for the plot), each
  beside the first key count.

Run: ``python benchmarks/bench_keys.py [--quick]``.
"""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from _common import CountingTransport, account, check, emit, log, paired, quick
from azure.data.tables import TableClient, TableServiceClient

import spark_driver._tasks._executor as executor
import spark_driver._tasks._worker as worker
from azurite.proxy import Proxy
from handlers import HeaderCache, InMemoryPublisher, Message, Processor
from handlers.examples import shooting_range
from spark_driver import JobSettings
from streamstone_py import TableConfig


def bench_requests(connection_string: str, keys: int, repeats: int) -> None:
    service = TableServiceClient.from_connection_string(connection_string)
    new: dict[str, list[float]] = {"cache": [], "none": []}
    revisited: dict[str, list[float]] = {"cache": [], "none": []}
    for _ in range(repeats):
        for mode in ("cache", "none"):
            name = "benchreq" + uuid.uuid4().hex[:8]
            service.create_table(name)
            transport = CountingTransport()
            table = TableClient.from_connection_string(connection_string, name, transport=transport)
            cache = HeaderCache() if mode == "cache" else None
            p = Processor(shooting_range, table, InMemoryPublisher(), cache=cache)
            names = [f"k{n}" for n in range(keys)]
            before = transport.requests
            for key in names:
                p.process(Message(f"{key}-round", key, "StartNewRound"))
            new[mode].append((transport.requests - before) / keys)
            before = transport.requests
            for key in names:
                p.process(Message(f"{key}-shot", key, "FireAt", {"position": 1}))
            revisited[mode].append((transport.requests - before) / keys)
            check(p.stats.completed == 2 * keys, f"{mode}: {p.stats.completed} of {2 * keys}")
            check(
                all(p.current_state(k).version == 2 for k in names[:: max(1, keys // 50)]),
                f"{mode}: a key is not at version 2",
            )
            service.delete_table(name)
    params = {"keys": keys, "messages_per_key": 1}
    emit("keys.requests.new", "requests/message", "lower", new["cache"],
         "the same without a header cache", new["none"], params)  # fmt: skip
    emit("keys.requests.revisited", "requests/message", "lower", revisited["cache"],
         "the same without a header cache", revisited["none"], params)  # fmt: skip


def bench_cpu(connection_string: str, keys: int, repeats: int) -> None:
    """CPU per request: one new message per key with a warm header cache (one
    ``$batch`` each), through the client ``TableConfig`` builds and through
    the client as ``TableClient.from_connection_string`` builds it."""
    service = TableServiceClient.from_connection_string(connection_string)

    def cpu_ms(make: Any) -> float:
        name = "benchcpu" + uuid.uuid4().hex[:8]
        service.create_table(name)
        with make(name) as table:
            p = Processor(shooting_range, table, InMemoryPublisher(), cache=HeaderCache())
            work = [Message(f"k{n}-r", f"k{n}", "StartNewRound") for n in range(keys)]
            p.process(work[0])  # connections open, modules warm
            start = time.process_time()
            for message in work[1:]:
                p.process(message)
            spent = time.process_time() - start
            check(p.stats.completed == keys, f"cpu: {p.stats.completed} of {keys}")
            check(p.cache is not None and p.cache.stale == 0, "cpu: a guess was refused")
        service.delete_table(name)
        return spent * 1000 / (keys - 1)

    def tuned(_: int) -> float:
        # The SDK runner's client, as this record has always measured (the
        # wire runner has its own records, in bench_wire.py).
        return cpu_ms(
            lambda name: TableConfig(
                name, connection_string=connection_string, transport="sdk"
            ).table_client()
        )

    def default(_: int) -> float:
        return cpu_ms(lambda name: TableClient.from_connection_string(connection_string, name))

    values, peers = paired(tuned, default, repeats)
    emit("client.cpu_per_request", "ms CPU/request", "lower", values,
         "TableClient.from_connection_string", peers, {"requests": keys - 1})  # fmt: skip
    cpu_shares(connection_string, keys)


#: Where a ``$batch`` spends the client's time, by the SDK function that
#: does it (each share includes what that function calls).
COST_GROUPS: dict[str, tuple[str, str]] = {
    "request_multipart": ("_pipeline_transport_rest_shared.py", "_prepare_multipart_body_helper"),
    "response_multipart": ("_pipeline_transport_rest_shared.py", "_parts_helper"),
    # Includes waiting for Azurite's answer.
    "http_exchange": ("requests/adapters.py", "send"),
}


def cpu_shares(connection_string: str, keys: int) -> None:
    """Shares of one profiled pass of the tuned client (one ``$batch`` per
    message), for the options that would shrink each: the report weighs what
    a faster multipart parser could gain at most."""
    service = TableServiceClient.from_connection_string(connection_string)
    name = "benchprof" + uuid.uuid4().hex[:8]
    service.create_table(name)
    config = TableConfig(name, connection_string=connection_string, transport="sdk")
    with config.table_client() as table:
        p = Processor(shooting_range, table, InMemoryPublisher(), cache=HeaderCache())
        work = [Message(f"k{n}-r", f"k{n}", "StartNewRound") for n in range(keys)]
        p.process(work[0])
        profile = cProfile.Profile()
        profile.enable()
        for message in work[1:]:
            p.process(message)
        profile.disable()
        check(p.stats.completed == keys, f"profile: {p.stats.completed} of {keys}")
    service.delete_table(name)
    stats: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    total = sum(tottime for (_, _, tottime, _, _) in stats.values())
    for group, (file, function) in COST_GROUPS.items():
        # The outermost frames' cumulative time; recursion is counted once.
        spent = sum(
            cumtime
            for (path, _, name_), (_, _, _, cumtime, _) in stats.items()
            if path.endswith(file) and name_ == function
        )
        emit(f"client.cpu.share.{group}", "% of profiled time", "lower",
             [100 * spent / total], None, None, {"requests": keys - 1})  # fmt: skip


def rows_for(keys: int, per_key: int, tag: str) -> list[dict[str, Any]]:
    """Input rows as the job hands them to a task: grouped by key, in order."""
    out = []
    for k in range(keys):
        key = f"{tag}-{k}"
        out.append({"message_id": f"{key}-r", "key": key, "type": "StartNewRound", "body": "{}"})
        out += [
            {
                "message_id": f"{key}-s{n}",
                "key": key,
                "type": "FireAt",
                "body": json.dumps({"position": n % 100}),
            }
            for n in range(1, per_key)
        ]
    return out


@contextmanager
def latency(connection_string: str, delay: float) -> Iterator[str]:
    """A connection string through a proxy adding ``delay`` each way (none at 0)."""
    if not delay:
        yield connection_string
        return
    port = int(connection_string.split("TableEndpoint=http://127.0.0.1:")[1].split("/")[0])
    with Proxy(port, delay=delay) as proxy:
        yield proxy.endpoint_of(connection_string)


def task_rate(
    connection_string: str, keys: int, per_key: int, concurrency: int, cache: bool
) -> float:
    """Messages/s of the task body over fresh keys in a fresh table."""
    name = "benchtask" + uuid.uuid4().hex[:8]
    TableServiceClient.from_connection_string(connection_string).create_table(name)
    os.environ["STREAMSTONE_CONNECTION_STRING"] = connection_string
    worker.header_cache = HeaderCache()  # a fresh worker's
    settings = JobSettings(
        table=name, handler="shooting_range", concurrency=concurrency, header_cache=cache
    )
    rows = rows_for(keys, per_key, uuid.uuid4().hex[:6])
    start = time.perf_counter()
    out = list(executor.process_partition(iter(rows), settings))
    elapsed = time.perf_counter() - start
    completed = sum(1 for r in out if r[0] == "outcome" and r[4] == "completed")
    check(completed == len(rows), f"{keys} keys: {completed} of {len(rows)} completed")
    worker._clients.pop(TableConfig.from_env(table_name=name)).close()
    TableServiceClient.from_connection_string(connection_string).delete_table(name)
    return len(rows) / elapsed


def bench_scaling(connection_string: str, total: int, repeats: int) -> None:
    for suffix, concurrency, cache in (("", 8, True), (".serial", 1, False)):
        many: list[float] = []
        few: list[float] = []
        for i in range(repeats):
            pair = [(total, 1, many), (10, total // 10, few)]
            for keys, per_key, series in pair if i % 2 == 0 else reversed(pair):
                series.append(task_rate(connection_string, keys, per_key, concurrency, cache))
        emit(
            f"task.keys.scaling{suffix}", "messages/s", "higher", many,
            f"10 keys x {total // 10} messages", few,
            {"keys": total, "messages": total, "concurrency": concurrency, "cache": cache},
        )  # fmt: skip


def bench_latency(connection_string: str, keys: int, delay: float, repeats: int) -> None:
    with latency(connection_string, delay) as slow:
        together: list[float] = []
        alone: list[float] = []
        for i in range(repeats):
            runs = [(together, 8), (alone, 1)]
            for series, concurrency in runs if i % 2 == 0 else reversed(runs):
                series.append(task_rate(slow, keys, 1, concurrency, True))
    emit(
        "task.latency.concurrency", "messages/s", "higher", together,
        "the same task body, one key at a time", alone,
        {"keys": keys, "messages": keys, "delay_ms_each_way": delay * 1000, "concurrency": 8},
    )  # fmt: skip


def bench_throughput(connection_string: str, counts: list[int], total: int, delay: float) -> None:
    with latency(connection_string, delay) as endpoint:
        series = {count: [task_rate(endpoint, count, total // count, 8, True)] for count in counts}
    for count in counts:
        first = counts[0]
        emit(
            "task.keys.throughput", "messages/s", "higher", series[count],
            f"{first} keys" if count != first else None,
            series[first] if count != first else None,
            {"keys": count, "messages": total, "delay_ms_each_way": delay * 1000},
        )  # fmt: skip


def main() -> int:
    small = quick(__doc__)
    with account() as connection_string:
        log("requests per message over new and revisited keys")
        # Request counts do not vary between runs: one repeat of 1,000 keys shows them.
        bench_requests(connection_string, 200 if small else 1_000, 1)
        log("CPU per request, tuned client against the default")
        bench_cpu(connection_string, 300 if small else 1_000, 3)
        log("the task body: many keys against few")
        bench_scaling(connection_string, 1_000 if small else 10_000, 1)
        log("the task body through a 5 ms proxy")
        bench_latency(connection_string, 200 if small else 2_000, 0.005, 1 if small else 3)
        counts = [10, 100, 1_000] if small else [10, 100, 1_000, 10_000]
        for delay in (0.0, 0.005):
            log(f"throughput against keys, {delay * 1000:.0f} ms each way")
            bench_throughput(connection_string, counts, counts[-1], delay)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
