"""How the queue benchmark measures a run: timers around each kind of work
(on every thread that does it), the Azurite processes' CPU, the rounds of a
run each started on idle servers, and cProfile on every thread."""

from __future__ import annotations

import contextlib
import cProfile
import os
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from _common import log
from azure.core.pipeline.transport import RequestsTransport
from azure.storage.queue import QueueClient, QueueMessage

from handlers import Message, Outcome, Processor
from streamstone_py import WireTableClient

S = TypeVar("S")


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


class TimedProcessor(Processor[S]):
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
