"""The executor's task body without Spark: keys in flight together give the same
rows, in the same order, as one key at a time, with one writer per key."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest
from azure.data.tables import TableServiceClient

from handlers import HandlerContext, Message, handler
from handlers.examples import ShootingRange, shooting_range
from spark_driver import JobSettings
from spark_driver._tasks._executor import RESULT_SCHEMA, process_partition

_lock = threading.Lock()


class _Probe:
    """What the handler saw in one run: how many ran at once, and who handled what."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        #: (key, message id, thread) in the order the handler saw them.
        self.seen: list[tuple[str, str, int]] = []


_probe = _Probe()


@handler("ShootingRange", ShootingRange, types=["StartNewRound", "FireAt"])
def probe(state: ShootingRange, message: Message, ctx: HandlerContext) -> Any:
    """ShootingRange, recording who handled what and how many ran at once."""
    with _lock:
        _probe.running += 1
        _probe.peak = max(_probe.peak, _probe.running)
        _probe.seen.append((message.key, message.id, threading.get_ident()))
    try:
        time.sleep(0.005)  # long enough for the other threads to overlap
        if message.body and message.body.get("position") == -1:
            raise ValueError("position -1 is off the range")
        return shooting_range.handle(state, message, ctx)
    finally:
        with _lock:
            _probe.running -= 1


@pytest.fixture
def environment(connection_string: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMSTONE_CONNECTION_STRING", connection_string)


def table(connection_string: str) -> str:
    name = "exec" + uuid.uuid4().hex[:12]
    TableServiceClient.from_connection_string(connection_string).create_table(name)
    return name


def rows(keys: int, shots: int) -> list[dict[str, Any]]:
    """Grouped by key, as the job hands them over: a round, shots, a copy, a bad row."""
    out = []
    for k in range(keys):
        key = f"game-{k:02d}"
        out.append({"message_id": f"{key}-r", "key": key, "type": "StartNewRound", "body": "{}"})
        for s in range(shots):
            body = f'{{"position": {(k * 7 + s) % 100}}}'
            out.append({"message_id": f"{key}-s{s}", "key": key, "type": "FireAt", "body": body})
        out.append({**out[-1]})  # a copy of the last shot
        out.append({"message_id": f"{key}-x", "key": key, "type": "Teleport", "body": "{}"})
    return out


#: Where an output row holds when it was produced: a time, which two tables differ in.
PRODUCED = RESULT_SCHEMA.fieldNames().index("produced")


def run(
    name: str, concurrency: int, input_rows: list[dict[str, Any]]
) -> tuple[list[tuple[Any, ...]], _Probe]:
    """The rows of the run (without their production times), and its probe."""
    global _probe
    _probe = _Probe()
    settings = JobSettings(table=name, handler="tests.test_executor:probe", concurrency=concurrency)
    found = process_partition(iter(input_rows), settings)
    return [row[:PRODUCED] + row[PRODUCED + 1 :] for row in found], _probe


def test_keys_in_flight_together_give_the_rows_of_one_key_at_a_time(
    connection_string: str, environment: None
) -> None:
    # The same keys in two tables: the same output ids, statuses and bodies.
    one_at_a_time, serial = run(table(connection_string), 1, rows(24, 4))
    together, parallel = run(table(connection_string), 8, rows(24, 4))

    assert together == one_at_a_time
    statuses = [row[4] for row in together if row[0] == "outcome"]
    assert statuses.count("completed") == 24 * 5
    assert statuses.count("duplicate") == 24
    assert statuses.count("dead_lettered") == 24
    assert serial.peak == 1
    assert 1 < parallel.peak <= 8  # how many overlap in the handler depends on timing
    # One writer per key, its messages in order.
    for probed in (serial, parallel):
        by_key: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for key, message_id, thread in probed.seen:
            by_key[key].append((message_id, thread))
        assert len(by_key) == 24
        for key, handled in by_key.items():
            assert [m for m, _ in handled] == [f"{key}-r", *(f"{key}-s{s}" for s in range(4))]
            assert len({t for _, t in handled}) == 1


def test_fail_fast_stops_the_task_with_keys_in_flight(
    connection_string: str, environment: None
) -> None:
    name = table(connection_string)
    input_rows = rows(12, 2)
    bad = next(i for i, r in enumerate(input_rows) if r["message_id"].endswith("game-05-s1"))
    input_rows[bad] = {**input_rows[bad], "body": '{"position": -1}'}
    settings = JobSettings(
        table=name, handler="tests.test_executor:probe", concurrency=4, fail_fast=True
    )

    with pytest.raises(RuntimeError, match=r"message 'game-05-s1' of key 'game-05' abandoned"):
        list(process_partition(iter(input_rows), settings))


def test_concurrency_is_checked() -> None:
    with pytest.raises(ValueError, match="concurrency must be >= 1, got 0"):
        JobSettings(table="t", handler="shooting_range", concurrency=0)
    with pytest.raises(TypeError, match="concurrency must be an int, got '8'"):
        JobSettings(table="t", handler="shooting_range", concurrency="8")  # type: ignore[arg-type]
