"""Every interleaving of two workers, stopped before each storage call.

Worker A handles message 1 then message 2 of one key; worker B handles copies
of both (state strategy) or of message 1 (outbox strategy, whose extra
storage calls multiply the interleavings). Whenever both wait at a storage
call, a choice decides who goes. The test walks the whole tree of choices,
so every distinct interleaving runs exactly once, against
Azurite: a complete enumeration, which covers every 2**10-bit schedule (each
follows one path of the tree). Each must end with one state change per
message and identical outputs from every copy.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import HeaderCache, InMemoryPublisher, Message, Processor, StateStore
from handlers._outcome import StrategyName
from handlers.examples import shooting_range
from streamstone_py import RetryPolicy, Stream

FAST = RetryPolicy(initial_delay=0.0005, max_delay=0.001)
DEPTH = 10


class Turnstile:
    """Lets exactly one worker run between storage calls, in the schedule's order."""

    def __init__(self, workers: int, choices: Iterator[int]) -> None:
        self.workers = workers
        self.choices = choices
        self.condition = threading.Condition()
        self.waiting: set[int] = set()
        self.finished: set[int] = set()
        self.running: int | None = None
        self.trace: list[int] = []
        #: The pick at each point where both workers were waiting.
        self.decisions: list[int] = []

    def gate(self, worker: int) -> None:
        with self.condition:
            self.waiting.add(worker)
            self.running = None
            self.condition.notify_all()
            self.condition.wait_for(lambda: self.running == worker)
            self.waiting.discard(worker)

    def finish(self, worker: int) -> None:
        with self.condition:
            self.finished.add(worker)
            self.running = None
            self.condition.notify_all()

    def drive(self) -> None:
        while True:
            with self.condition:
                self.condition.wait_for(
                    lambda: (
                        self.running is None
                        and len(self.waiting) + len(self.finished) == self.workers
                    )
                )
                if len(self.finished) == self.workers:
                    return
                candidates = sorted(self.waiting)
                if len(candidates) > 1:
                    choice = next(self.choices, 0)
                    self.decisions.append(choice)
                    pick = candidates[choice]
                else:
                    pick = candidates[0]
                self.trace.append(pick)
                self.running = pick
                self.condition.notify_all()


class GatedStore(StateStore):
    def __init__(self, table: TableClient, gate: Callable[[], None]) -> None:
        super().__init__(table, shooting_range.name, FAST)
        self._gate = gate

    def open(self, partition: Any) -> Any:
        self._gate()
        return super().open(partition)

    def find(self, partition: Any, message_id: str) -> Any:
        self._gate()
        return super().find(partition, message_id)

    def read(self, partition: Any, start: int, count: int) -> Any:
        self._gate()
        return super().read(partition, start, count)

    def write(self, stream: Any, events: Any) -> Any:
        self._gate()
        return super().write(stream, events)

    def outbox(self, partition: Any, message_id: str) -> Any:
        self._gate()
        return super().outbox(partition, message_id)

    def mark_dispatched(
        self, partition: Any, message_ids: Any, *, keep_outputs: bool = False
    ) -> None:
        self._gate()
        super().mark_dispatched(partition, message_ids, keep_outputs=keep_outputs)


def run_threads(
    turnstile: Turnstile,
    threads: list[threading.Thread],
    errors: list[BaseException],
    bits: tuple[int, ...],
) -> None:
    """Start the workers, let the turnstile schedule them, and surface what they raised."""
    for t in threads:
        t.start()
    turnstile.drive()
    for t in threads:
        t.join()
    assert not errors, (bits, errors)


def run_schedule(
    table: TableClient,
    strategy: StrategyName,
    key: str,
    bits: tuple[int, ...],
    both: bool = False,
    cached: bool = False,
) -> tuple[int, ...]:
    publisher = InMemoryPublisher()
    setup = Processor(shooting_range, table, publisher, strategy=strategy)
    setup.process(Message(f"{key}-round", key, "StartNewRound"))
    target = setup.load_state(key, "x").state.target_position
    first = Message(f"{key}-m1", key, "FireAt", {"position": target})
    second = Message(f"{key}-m2", key, "FireAt", {"position": (target + 1) % 100})
    turnstile = Turnstile(2, iter(bits))
    results: dict[int, list[Any]] = {0: [], 1: []}
    errors: list[BaseException] = []

    def worker(index: int, messages: list[Message]) -> None:
        store = GatedStore(table, lambda: turnstile.gate(index))
        # With a cache, each worker has its own, as separate Spark workers do.
        cache = HeaderCache() if cached else None
        p = Processor(shooting_range, table, publisher, strategy=strategy, retry=FAST,
                      store=store, cache=cache)  # fmt: skip
        try:
            for message in messages:
                results[index].append(p.process(message))
        except BaseException as exc:  # surfaced below, with the schedule
            errors.append(exc)
        finally:
            turnstile.finish(index)

    threads = [
        threading.Thread(target=worker, args=(0, [first, second])),
        threading.Thread(target=worker, args=(1, [first, second] if both else [first])),
    ]
    run_threads(turnstile, threads, errors, bits)
    events = Stream.read(setup.store.partition(key)).events
    assert [e.id for e in events] == [f"{key}-round", first.id, second.id], bits
    for message in [first, second] if both else [first]:
        copies = [o for o in results[0] + results[1] if o.message_id == message.id]
        assert sorted(o.status for o in copies) == ["completed", "duplicate"], bits
        if strategy == "state":  # both copies published the same output
            assert copies[0].outputs == copies[1].outputs, bits
    hits = [m for m in publisher.messages.values() if m.type == "Hit"]
    assert [h.body["attempt_of"] for h in hits] == [first.id], bits
    assert publisher.divergent == [], bits
    return tuple(turnstile.decisions)


def explore(
    table: TableClient,
    strategy: StrategyName,
    game: str,
    both: bool = False,
    cached: bool = False,
    parallel: int = 4,
) -> int:
    """Run every distinct interleaving once: every branch of the real choice points."""

    def run(key: str, prefix: tuple[int, ...]) -> tuple[int, ...]:
        return run_schedule(table, strategy, key, prefix, both, cached)

    return walk(run, f"{game}-{strategy[0]}", parallel)


def walk(
    run: Callable[[str, tuple[int, ...]], tuple[int, ...]], prefix_of_keys: str, parallel: int = 4
) -> int:
    """Walk the tree of choices: ``run(key, prefix)`` follows ``prefix``, then
    takes choice 0 wherever both wait, and returns every choice it made.

    Each run is on its own key, so runs go ``parallel`` at a time; within one
    run the turnstile alone decides the order.
    """
    names = itertools.count()
    runs = 0
    with ThreadPoolExecutor(parallel) as pool:

        def start(prefix: tuple[int, ...]) -> Future[tuple[int, ...]]:
            return pool.submit(run, f"{prefix_of_keys}{next(names)}", prefix)

        pending: dict[Future[tuple[int, ...]], tuple[int, ...]] = {start(()): ()}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                prefix = pending.pop(future)
                decisions = future.result()
                runs += 1
                assert decisions[: len(prefix)] == prefix
                # Past the prefix every choice defaulted to 0: branch to 1 at each of them.
                for i in range(len(prefix), len(decisions)):
                    branch = (*decisions[:i], 1)
                    pending[start(branch)] = branch
    return runs


@pytest.mark.parametrize(
    ("strategy", "both", "cached", "expected"),
    [
        ("state", True, False, 252),
        ("outbox", False, False, 411),
        ("state", True, True, 46),
        ("outbox", False, True, 207),
    ],
    ids=["state", "outbox", "state-cached", "outbox-cached"],
)
def test_every_interleaving_of_two_workers(
    table: TableClient, game: str, strategy: StrategyName, both: bool, cached: bool, expected: int
) -> None:
    # The count pins the size of the tree: a change to the processor's storage
    # calls changes it, and this test should then be looked at again. With a
    # header cache, each worker writes on its cached (or a new) header first.
    assert explore(table, strategy, game, both, cached) == expected
