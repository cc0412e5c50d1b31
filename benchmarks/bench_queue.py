"""The queue consumer beside a bare receive-and-delete loop on the same queue.

- ``queue.consumer``: messages/s of ``QueueConsumer(processor, queue,
  workers=W, page_size=32).run(until_empty=True)`` over N messages, each on a
  key of its own (a counter handler that publishes one output to an
  ``InMemoryPublisher``), beside a bare loop with the same SDK
  (``QueueClient.receive_messages``, 32 a page, the same visibility timeout)
  that deletes each page's messages over W threads, one task per message as
  the consumer spreads one task per key (target: at least 0.5x). The
  processor runs on the wire runner's client (``TableConfig``'s default),
  without a header cache (``Processor``'s default). Every side drains the
  same messages (base64 of ``encode_envelope``) from a fresh queue, filled
  before each round and not timed: the messages go in rounds of 500 (the
  queue never holds more; 300 in one round with ``--quick``), since Azurite's
  Queue service spends time on each request in proportion to the messages a
  queue holds, which would charge both sides a cost of the emulator's as the
  queue gets deeper. Each round starts once the Azurite processes are idle,
  and a run that met a sweep is run again: a minute after its last sweep, the
  Queue service sweeps its store of message texts, for seconds of CPU per
  thousand messages sent since (over a minute after a few thousand), during
  which its requests wait.
- ``queue.consumer.header_cache``: the same, its processor with a
  ``HeaderCache`` (a new key: one request to the table, not two), and
  ``queue.consumer.sdk_table``: its processor on the SDK's ``TableClient``
  (as ``TableClient.from_connection_string`` builds it) instead of the wire
  runner's client, each beside the same bare loop's runs. The four sides run
  in turn, each repeat starting with the next one, so drift hits all alike.
- ``queue.split.*`` (``.header_cache``, ``.sdk_table``): where each side's
  time goes, from timers in the same runs, in milliseconds per message:
  ``receive`` (HTTP time of the receives, one page at a time), ``delete``
  (around ``delete_message``), ``process`` (around ``process_batch``) and
  ``process.table`` (its requests to the table), elapsed time summed over the
  W threads, with ``delete.cpu`` and ``process.cpu`` the CPU those threads
  spent in them; ``cpu``, this process's CPU; ``server.table`` and
  ``server.queue``, the CPU of the Azurite processes, when they run on this
  machine. Each beside the bare loop's where it has one. On a machine with
  few cores, the CPU per message of client and servers together bounds both
  sides' rates.
- ``queue.profile.*``: one profiled consumer run over half as many messages
  (cProfile on every thread, timed by each thread's CPU clock; the wire
  runner's client, no cache): the client's CPU by package, and its top
  functions.

Run: ``python benchmarks/bench_queue.py [--quick]`` (or ``python -m
benchmarks.bench_queue``). It needs Azurite's Queue service: a connection
string in ``STREAMSTONE_CONNECTION_STRING`` must name a ``QueueEndpoint``.
"""

from __future__ import annotations

import base64
import contextlib
import cProfile
import os
import pstats
import re
import statistics
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

if __package__:  # python -m benchmarks.bench_queue: the scripts import each other by name
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, account, check, emit, log, quick
from azure.core.exceptions import ResourceNotFoundError
from azure.core.pipeline.transport import RequestsTransport
from azure.data.tables import TableClient, TableServiceClient
from azure.storage.queue import QueueClient, QueueMessage, QueueServiceClient

from handlers import (
    HandlerContext,
    HeaderCache,
    InMemoryPublisher,
    Message,
    Outcome,
    Processor,
    QueueConsumer,
    encode_envelope,
    handler,
)
from streamstone_py import WireTableClient

PAGE = 32
VISIBILITY = 30


@dataclass
class Count:
    n: int = 0


@handler("Count", Count, types=["Add"])
def count(state: Count, message: Message, ctx: HandlerContext) -> None:
    state.n += 1
    ctx.publish("Counted", {"n": state.n, "by": message.id})


def texts_for(messages: int) -> list[str]:
    """The queue messages' texts: base64 envelopes, each message on a key of its own."""
    return [
        base64.b64encode(
            encode_envelope(Message(f"m-{n}", f"k-{n}", "Add", {"n": n})).encode()
        ).decode()
        for n in range(messages)
    ]


class Timers:
    """Seconds spent per kind of work, summed over the threads that did it:
    elapsed (``kind``) and the thread's CPU (``kind.cpu``)."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def timing(self, kind: str) -> Iterator[None]:
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
            with self._lock:
                self.seconds[kind] += elapsed
                self.seconds[f"{kind}.cpu"] += cpu


class TimedTransport(RequestsTransport):  # type: ignore[misc]
    """The SDK's own transport, timing each HTTP exchange by what ``kind`` names it."""

    def __init__(self, timers: Timers, kind: Callable[[Any], str]) -> None:
        super().__init__()
        self.timers = timers
        self.kind = kind

    def send(self, request: Any, **kwargs: Any) -> Any:
        with self.timers.timing(self.kind(request)):
            return super().send(request, **kwargs)


def queue_kind(request: Any) -> str:
    """A receive is timed at the transport: the consumer pages through it lazily."""
    return "receive" if request.method == "GET" else "queue.other"


class TimedQueue(QueueClient):
    """The SDK's queue client, timing each delete whole (the SDK's pipeline too)."""

    timers: Timers

    def delete_message(
        self, message: str | QueueMessage, pop_receipt: str | None = None, **kwargs: Any
    ) -> None:
        with self.timers.timing("delete"):
            super().delete_message(message, pop_receipt, **kwargs)


class TimedProcessor(Processor[Count]):
    """The processor, timing ``process_batch`` (on whichever thread runs it)."""

    timers: Timers

    def process_batch(self, key: str, messages: Sequence[Message]) -> list[Outcome]:
        with self.timers.timing("process"):
            return super().process_batch(key, messages)


class TimedWire(WireTableClient):
    """The wire runner's client (``TableConfig``'s default), timing each request."""

    timers: Timers

    def perform(self, request: Any, deadline: float | None = None) -> object:
        with self.timers.timing("process.table"):
            return super().perform(request, deadline)


#: The processor: on the wire runner's client (the default of ``TableConfig``),
#: the same with a ``HeaderCache`` (a new key takes one request, not two), or on
#: the SDK's ``TableClient`` as ``TableClient.from_connection_string`` builds it.
TableKind = Literal["wire", "cache", "sdk"]


class Servers:
    """CPU seconds of the Azurite processes behind the account's Table and Queue
    endpoints, when they run on this machine (found by their listening port in
    ``/proc``; elsewhere nothing is measured)."""

    def __init__(self, connection_string: str) -> None:
        self.pids: dict[str, int] = {}
        for service, endpoint in (("table", "TableEndpoint="), ("queue", "QueueEndpoint=")):
            found = re.search(
                re.escape(endpoint) + r"https?://127\.0\.0\.1:(\d+)", connection_string
            )
            pid = listener(int(found.group(1))) if found else None
            if pid is not None:
                self.pids[service] = pid

    def cpu(self) -> dict[str, float]:
        spent = {}
        for service, pid in self.pids.items():
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            spent[f"server.{service}"] = (int(fields[11]) + int(fields[12])) / TICK
        return spent

    def spent(self, before: dict[str, float]) -> dict[str, float]:
        return {k: v - before[k] for k, v in self.cpu().items()}

    def busy(self, seconds: float = 0.3) -> bool:
        """Whether the servers work while nothing is asked of them: Azurite's
        Queue service sweeps its store of message texts a minute after its
        last sweep, for seconds of CPU per thousand messages sent since."""
        if not self.pids:
            return False
        before = self.cpu()
        time.sleep(seconds)
        return sum(self.spent(before).values()) > 0.1 * seconds

    def settle(self, limit: float = 300.0) -> None:
        """Wait until the servers are idle (a sweep has run its course)."""
        deadline = time.monotonic() + limit
        while self.busy():
            if time.monotonic() > deadline:
                log(f"  Azurite still busy after {limit:.0f} s idle; going on")
                return


TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def listener(port: int) -> int | None:
    """The process listening on 127.0.0.1:``port``, if ``/proc`` tells."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":  # LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
    return None


@dataclass
class Run:
    rate: float  # messages/s
    wall: float
    #: Seconds per part of the split (``PARTS``).
    seconds: dict[str, float]
    #: Azurite swept its queue store during the run.
    disturbed: bool = False


class Meter:
    """Elapsed time, this process's CPU and the servers' CPU, summed over the
    timed parts of a run (its rounds), each started on idle servers. A sweep
    that starts during a part is disturbing: the Queue service's requests wait
    for it (it shares their thread), so the part ends with it, and the Queue
    service has spent over ``SWEPT`` CPU seconds per message of the part, or
    it is still sweeping at the end."""

    def __init__(self, servers: Servers) -> None:
        self.servers = servers
        self.wall = 0.0
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.disturbed = False

    @contextlib.contextmanager
    def timed(self, messages: int) -> Iterator[None]:
        self.servers.settle()
        before, cpu, start = self.servers.cpu(), time.process_time(), time.perf_counter()
        yield
        self.wall += time.perf_counter() - start
        self.seconds["cpu"] += time.process_time() - cpu
        spent = self.servers.spent(before)
        for part, seconds in spent.items():
            self.seconds[part] += seconds
        swept = spent.get("server.queue", 0.0) > SWEPT * messages
        self.disturbed = self.disturbed or swept or self.servers.busy()


#: The Queue service's CPU per message (a receive and a delete) past which a
#: sweep ran beside them: some 0.001 s without one, at this queue depth.
SWEPT = 0.004


class Bench:
    """Runs over ``texts`` in rounds of ``depth`` messages: Azurite's Queue
    service spends time per request in proportion to the messages a queue
    holds (a service's queue does not), so the queue is never deeper than that."""

    def __init__(self, connection_string: str, texts: list[str], workers: int, depth: int) -> None:
        self.connection_string = connection_string
        self.service = QueueServiceClient.from_connection_string(connection_string)
        self.tables = TableServiceClient.from_connection_string(connection_string)
        self.texts = texts
        self.workers = workers
        self.depth = depth
        self.rounds = [texts[i : i + depth] for i in range(0, len(texts), depth)]
        self.servers = Servers(connection_string)
        #: Deletes refused (404) per run at most: the SDK retries a delete whose
        #: answer was lost, and the retry finds the message gone.
        self.refused = max(2, len(texts) // 200)

    # --- not timed ------------------------------------------------------------------

    def queue(self) -> str:
        name = f"bench-{uuid.uuid4().hex[:12]}"
        self.service.create_queue(name)
        return name

    def fill(self, name: str, texts: list[str]) -> None:
        """Send ``texts`` to the empty queue. A send the SDK retried after it had
        gone through leaves a copy: then the queue is cleared and filled again."""
        queue = self.service.get_queue_client(name)
        for attempt in (1, 2, 3):
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(queue.send_message, texts))
            held = queue.get_queue_properties().approximate_message_count
            if held == len(texts) or attempt == 3:
                check(held == len(texts), f"queue {name} holds {held} of {len(texts)} sent")
                return
            log(f"queue {name} holds {held} messages of {len(texts)} sent; filling it again")
            queue.clear_messages()

    def emptied(self, name: str) -> None:
        """Check that the run left nothing on the queue (nor poisoned anything), then drop it."""
        queue = self.service.get_queue_client(name)
        left = queue.get_queue_properties().approximate_message_count
        check(left == 0, f"{left} messages left on {name}")
        queue.delete_queue()
        with contextlib.suppress(ResourceNotFoundError):
            poisoned = self.service.get_queue_client(f"{name}-poison")
            count = poisoned.get_queue_properties().approximate_message_count
            check(count == 0, f"{count} messages poisoned from {name}")
            poisoned.delete_queue()

    def client(self, name: str, timers: Timers) -> QueueClient:
        queue = TimedQueue.from_connection_string(
            self.connection_string, name, transport=TimedTransport(timers, queue_kind)
        )
        queue.timers = timers
        return queue

    def table(self, name: str, kind: TableKind, timers: Timers) -> TableClient:
        if kind in ("wire", "cache"):
            wire = TimedWire.from_connection_string(self.connection_string, name)
            wire.timers = timers
            return wire
        transport = TimedTransport(timers, lambda _: "process.table")
        return TableClient.from_connection_string(self.connection_string, name, transport=transport)

    # --- the sides ------------------------------------------------------------------

    def consumer(self, kind: TableKind, profile: list[cProfile.Profile] | None = None) -> Run:
        name = self.queue()
        table_name = "benchqueue" + uuid.uuid4().hex[:8]
        self.tables.create_table(table_name)
        timers = Timers()
        table = self.table(table_name, kind, timers)
        publisher = InMemoryPublisher()
        cache = HeaderCache() if kind == "cache" else None
        processor = TimedProcessor(count, table, publisher, cache=cache)
        processor.timers = timers
        consumer = QueueConsumer(
            processor, self.client(name, timers), workers=self.workers, page_size=PAGE,
            visibility_timeout=VISIBILITY,
        )  # fmt: skip
        meter = Meter(self.servers)
        for texts in self.rounds:
            self.fill(name, texts)
            with meter.timed(len(texts)), profiled(profile):
                stats = consumer.run(until_empty=True)  # its stats add up over the rounds
        n = len(self.texts)
        check(stats.received == n, f"consumer: received {stats.received} of {n}")
        # A delete refused as a lost lock is faulted; its message was deleted all the same.
        done = stats.completed + stats.lost_locks
        check(
            done == n, f"consumer: {stats.completed} completed and {stats.lost_locks} lost of {n}"
        )
        check(stats.faulted == stats.lost_locks <= self.refused, f"consumer: {stats}")
        trouble = ("abandoned", "poisoned", "deferred", "receive_errors")
        check(not any(getattr(stats, t) for t in trouble), f"consumer: {stats}")
        if stats.lost_locks:
            log(f"  consumer: {stats.lost_locks} deletes refused after a retry")
        check(len(publisher.messages) == n, f"consumer: {len(publisher.messages)} outputs of {n}")
        check(not publisher.divergent, "consumer: an output was published with two contents")
        for k in range(0, n, max(1, n // 20)):
            state = processor.current_state(f"k-{k}")
            check(state.version == 1 and state.state == Count(1), f"k-{k}: {state}")
        self.emptied(name)
        table.close()
        self.tables.delete_table(table_name)
        return Run(n / meter.wall, meter.wall, {**timers.seconds, **meter.seconds}, meter.disturbed)

    def bare(self) -> Run:
        name = self.queue()
        timers = Timers()
        queue = self.client(name, timers)
        seen: list[str] = []
        refused: list[str] = []

        def delete(message: Any) -> None:
            try:
                queue.delete_message(message.id, message.pop_receipt)
            except ResourceNotFoundError:  # as the consumer counts a lost lock
                refused.append(message.id)

        meter = Meter(self.servers)
        for texts in self.rounds:
            self.fill(name, texts)
            with meter.timed(len(texts)), ThreadPoolExecutor(self.workers, "bare-delete") as pool:
                while page := list(
                    queue.receive_messages(
                        messages_per_page=PAGE, max_messages=PAGE, visibility_timeout=VISIBILITY
                    )
                ):
                    seen += (m.content for m in page)
                    for future in [pool.submit(delete, m) for m in page]:
                        future.result()
        check(sorted(seen) == sorted(self.texts), f"bare: received {len(seen)} messages")
        check(len(refused) <= self.refused, f"bare: {len(refused)} deletes refused")
        if refused:
            log(f"  bare: {len(refused)} deletes refused after a retry")
        self.emptied(name)
        rate = len(seen) / meter.wall
        return Run(rate, meter.wall, {**timers.seconds, **meter.seconds}, meter.disturbed)


# --- a profile of every thread ---------------------------------------------------------


@contextlib.contextmanager
def profiled(profiles: list[cProfile.Profile] | None) -> Iterator[None]:
    """cProfile on this thread and on every thread started inside (each its
    own profiler: cProfile sees one thread), timed by the thread's CPU clock,
    so that threads waiting on each other or on Azurite count nothing;
    collected in ``profiles``."""
    if profiles is None:
        yield
        return

    def start(frame: Any, event: str, arg: Any) -> None:  # a new thread's first event
        profiler = cProfile.Profile(time.thread_time)
        profiles.append(profiler)
        profiler.enable()  # replaces this hook, on this thread only

    main = cProfile.Profile(time.thread_time)
    profiles.append(main)
    threading.setprofile(start)
    main.enable()
    try:
        yield
    finally:
        main.disable()
        threading.setprofile(None)


SITE = f"{os.sep}site-packages{os.sep}"


def group(filename: str, function: str) -> str | None:
    """The package a function belongs to, or what a builtin does (None: a
    thread waiting on another, or idle)."""
    if filename == "~":
        if any(lock in function for lock in ("_thread.lock", "_thread.RLock", "SimpleQueue")):
            return None
        if "socket" in function or "ssl" in function or "select" in function:
            return "socket calls"
        return "builtins"
    if f"{os.sep}email{os.sep}" in filename:
        return "stdlib email (http.client parsing response headers)"
    if f"{os.sep}http{os.sep}" in filename:
        return "stdlib http.client"
    if SITE in filename:
        return filename.split(SITE, 1)[1].split(os.sep)[0]
    if filename.startswith(str(ROOT)):
        return filename[len(str(ROOT)) + 1 :].split(os.sep)[0]
    return "stdlib " + Path(filename).stem.strip("<>").replace("frozen ", "")


def where(filename: str, line: int, function: str) -> str:
    if SITE in filename:
        filename = filename.split(SITE, 1)[1]
    elif filename.startswith(str(ROOT)):
        filename = filename[len(str(ROOT)) + 1 :]
    elif filename != "~":
        filename = "stdlib " + Path(filename).name  # no machine paths in the report
    return f"{filename}:{line}({function})"


def bench_profile(bench: Bench) -> None:
    profiles: list[cProfile.Profile] = []
    run = bench.consumer("wire", profile=profiles)
    stats = pstats.Stats(profiles[0])
    for more in profiles[1:]:
        stats.add(more)
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    groups: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for (filename, line, function), (_, _, tottime, _, _) in entries.items():
        kind = group(filename, function)
        if kind is not None:
            groups[kind] += tottime
            functions[where(filename, line, function)] += tottime
    total = sum(groups.values())
    # The profiler's own cost inflates CPU seconds several times; the shares are the figures.
    params = {
        "messages": len(bench.texts), "queue_depth": bench.depth, "workers": bench.workers,
        "threads": len(profiles),
        "profiled_seconds": round(run.wall, 3), "profiled_cpu_seconds": round(total, 3),
    }  # fmt: skip
    for rank, (name, seconds) in enumerate(groups.most_common(8), start=1):
        emit(f"queue.profile.group.{rank}", "share of client CPU", "lower", [seconds / total],
             None, None, {**params, "group": name, "seconds": round(seconds, 3)})  # fmt: skip
    for rank, (name, seconds) in enumerate(functions.most_common(10), start=1):
        emit(f"queue.profile.function.{rank}", "share of client CPU", "lower",
             [seconds / total], None, None,
             {**params, "function": name, "seconds": round(seconds, 3)})  # fmt: skip


# --- the figures ------------------------------------------------------------------------


#: The consumer's records: its processor's table client, and the name's suffix.
VARIANTS: tuple[tuple[TableKind, str], ...] = (
    ("wire", ""),
    ("cache", ".header_cache"),
    ("sdk", ".sdk_table"),
)


def bench_consumer(bench: Bench, repeats: int) -> None:
    """The consumer on each processor and the bare loop, in turn, each repeat
    starting with the next side (drift hits all of them alike)."""
    runs: dict[str, list[Run]] = {"wire": [], "bare": [], "cache": [], "sdk": []}

    def side(name: str) -> Run:
        for _ in range(3):  # a run that a sweep of Azurite's disturbed is run again
            run = bench.bare() if name == "bare" else bench.consumer(cast(TableKind, name))
            if not run.disturbed:
                return run
            log(f"  {name}: {run.rate:.1f} messages/s, but Azurite swept its queue store; again")
        return run

    order = list(runs)
    for i in range(repeats):
        for name in order[i % 4 :] + order[: i % 4]:
            runs[name].append(side(name))
            log(f"  {name}: {runs[name][-1].rate:.1f} messages/s")
    n, w = len(bench.texts), bench.workers
    params: dict[str, Any] = {
        "messages": n, "keys": n, "workers": w, "page_size": PAGE, "queue_depth": bench.depth,
    }  # fmt: skip
    bare = runs["bare"]
    peer = f"bare loop: receive, then delete over {w} threads, {PAGE} a page"
    for kind, suffix in VARIANTS:
        emit(f"queue.consumer{suffix}", "messages/s", "higher", [r.rate for r in runs[kind]],
             peer, [r.rate for r in bare], {**params, "processor": kind})  # fmt: skip
    for line in split_lines(runs, n):
        log(line)

    def ms(series: list[Run], kind: str) -> list[float]:
        return [1000 * r.seconds.get(kind, 0.0) / n for r in series]

    for kind, suffix in VARIANTS:
        named = {**params, "processor": kind}
        for part in PARTS:
            if not any(part in r.seconds for r in runs[kind]):
                continue  # an Azurite process not found on this machine
            cpu = part.endswith("cpu") or part in SERVERS
            unit = "ms CPU/message" if cpu else "ms/message"
            values, peers = ms(runs[kind], part), ms(bare, part)
            if part in ALONE:
                emit(f"queue.split.{part}{suffix}", unit, "lower", values, None, None, named)
            else:
                emit(f"queue.split.{part}{suffix}", unit, "lower", values, "the bare loop's",
                     peers, named)  # fmt: skip


#: The Azurite processes' CPU, when they run here.
SERVERS = ("server.table", "server.queue")
#: The split of a run: thread time per kind of work, this process's CPU, the servers' CPU.
PARTS = (
    "receive", "delete", "delete.cpu", "process", "process.cpu", "process.table", "cpu",
    *SERVERS,
)  # fmt: skip
#: The parts the bare loop has no counterpart of.
ALONE = ("process", "process.cpu", "process.table", "server.table")


def split_lines(runs: dict[str, list[Run]], n: int) -> list[str]:
    """Each side's medians in ms per message, for the log."""

    def med(values: list[float]) -> str:
        return f"{1000 * statistics.median(values) / n:.3f}"

    lines = []
    for side, series in runs.items():
        parts = ", ".join(
            f"{kind} {med([r.seconds.get(kind, 0.0) for r in series])}"
            for kind in PARTS
            if any(kind in r.seconds for r in series)
        )
        lines.append(f"{side}: wall {med([r.wall for r in series])}, {parts} (ms/message)")
    return lines


def main() -> int:
    small = quick(__doc__)
    # Quick stays under a minute, before Azurite's first sweep of its queue store.
    messages, repeats, workers = (300, 3, 8) if small else (1_000, 5, 8)
    depth = min(messages, 500)
    with account(queues=True) as connection_string:
        check(
            "QueueEndpoint=" in connection_string,
            "the account has no QueueEndpoint: give a connection string that names one",
        )
        log(f"warm-up: {messages // 5} messages each side")
        warm = Bench(connection_string, texts_for(messages // 5), workers, depth)
        for kind, _ in VARIANTS:
            warm.consumer(kind)
        warm.bare()
        bench = Bench(connection_string, texts_for(messages), workers, depth)
        log(
            f"consumer and bare loop: {messages:,} messages in rounds of {depth}, "
            f"{workers} workers, x{repeats}"
        )
        bench_consumer(bench, repeats)
        log("one profiled consumer run, half the messages (the wire runner's table client)")
        bench_profile(Bench(connection_string, texts_for(messages // 2), workers, depth))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
