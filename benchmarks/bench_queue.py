"""The queue consumer beside a bare receive-and-delete loop on the same queue.

- ``queue.consumer``: messages/s of ``QueueConsumer(processor, queue,
  workers=W, page_size=32).run(until_empty=True)`` over N messages, each on a
  key of its own (a counter handler that publishes one output to an
  ``InMemoryPublisher``), beside a bare loop with the same SDK
  (``QueueClient.receive_messages``, 32 a page, the same visibility timeout)
  that deletes each page's messages over W threads, one task per message as
  the consumer spreads one task per key (target: at least 0.5x). The
  processor runs on the wire runner's client (``TableConfig``'s default),
  with the ``HeaderCache`` the consumer gives a processor that has none
  (its default: a new key, one table request). Every side drains the
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
- ``queue.consumer.no_header_cache``: the same, the consumer's
  ``HeaderCache`` taken away (a new key: two requests to the table), and
  ``queue.consumer.sdk_table``: its processor on the SDK's ``TableClient``
  (as ``TableClient.from_connection_string`` builds it) instead of the wire
  runner's client, each beside the same bare loop's runs. The four sides run
  in turn, each repeat starting with the next one, so drift hits all alike.
- ``queue.split.*`` (``.no_header_cache``, ``.sdk_table``): where each side's
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
  runner's client, the consumer's defaults): the client's CPU by package,
  and its top functions.

The consumer's and split's figures are drawn here; the sides and their checks
are in ``_queue_sides.py``, the timers and meters in ``_queue_meter.py``, and
the profile's figures in ``_queue_profile.py``.

Run: ``python benchmarks/bench_queue.py [--quick]`` (or ``python -m
benchmarks.bench_queue``). It needs Azurite's Queue service: a connection
string in ``STREAMSTONE_CONNECTION_STRING`` must name a ``QueueEndpoint``.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any, cast

if __package__:  # python -m benchmarks.bench_queue: the scripts import each other by name
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import account, check, emit, log, quick
from _queue_meter import Run
from _queue_profile import bench_profile
from _queue_sides import PAGE, Bench, TableKind, texts_for

#: The consumer's records: its processor's table client, and the name's suffix.
VARIANTS: tuple[tuple[TableKind, str], ...] = (
    ("wire", ""),
    ("nocache", ".no_header_cache"),
    ("sdk", ".sdk_table"),
)


def bench_consumer(bench: Bench, repeats: int) -> None:
    """The consumer on each processor and the bare loop, in turn, each repeat
    starting with the next side (drift hits all of them alike)."""
    runs: dict[str, list[Run]] = {"wire": [], "bare": [], "nocache": [], "sdk": []}

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
