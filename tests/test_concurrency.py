"""Several writers on one stream: one wins each version, the rest conflict, no gaps."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from streamstone_py import ConcurrencyConflictError, EventData, Partition
from tests.helpers import S, rows

WRITERS = 4


def test_racing_writers_from_the_same_header_one_wins_each_round(partition: Partition) -> None:
    S.provision(partition)
    rounds = 5
    barrier = threading.Barrier(WRITERS)
    outcomes: list[list[str]] = [[] for _ in range(rounds)]
    lock = threading.Lock()

    def writer(name: str) -> None:
        for r in range(rounds):
            header = S.open(partition)
            # Everyone has read the same version before anyone writes.
            barrier.wait()
            try:
                S.write(header, EventData(id=f"{name}-r{r}", properties={"Writer": name}))
                outcome = f"won:{name}"
            except ConcurrencyConflictError:
                outcome = "conflict"
            with lock:
                outcomes[r].append(outcome)
            barrier.wait()

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(writer, [f"w{i}" for i in range(WRITERS)]))

    winners = []
    for r in range(rounds):
        won = [o for o in outcomes[r] if o.startswith("won:")]
        assert len(won) == 1, outcomes[r]
        assert outcomes[r].count("conflict") == WRITERS - 1
        winners.append(won[0][4:])
    events = S.read(partition).events
    assert [e.version for e in events] == list(range(1, rounds + 1))
    assert [e.id for e in events] == [f"{w}-r{r}" for r, w in enumerate(winners)]
    assert len(rows(partition)) == 1 + 2 * rounds


def test_retrying_writers_store_every_event_once_without_gaps(partition: Partition) -> None:
    S.provision(partition)
    per_writer = 6
    conflicts = [0] * WRITERS

    def writer(index: int) -> None:
        header = S.open(partition)
        written = 0
        while written < per_writer:
            try:
                header = S.write(
                    header, EventData(id=f"w{index}-{written}", properties={"Writer": index})
                ).stream
                written += 1
            except ConcurrencyConflictError:
                conflicts[index] += 1
                header = S.open(partition)

    with ThreadPoolExecutor(WRITERS) as pool:
        list(pool.map(writer, range(WRITERS)))

    events = S.read(partition).events
    total = WRITERS * per_writer
    assert [e.version for e in events] == list(range(1, total + 1))
    assert sorted(e.id or "" for e in events) == sorted(
        f"w{i}-{n}" for i in range(WRITERS) for n in range(per_writer)
    )
    for i in range(WRITERS):
        # Each writer's own events appear in the order it wrote them.
        mine = [e.id for e in events if e.properties["Writer"] == i]
        assert mine == [f"w{i}-{n}" for n in range(per_writer)]
    assert S.open(partition).version == total
    assert sum(conflicts) > 0
