"""Transient faults: retried when safe, resolved (never guessed) when ambiguous.

Every test runs with the sync and the async client. The fault transport lets a
request reach Azurite and drops the answer ("after"), drops the answer of a
request never sent ("lost"), or fails the connection before sending ("before").
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from azure.core.exceptions import (
    HttpResponseError,
    IncompleteReadError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.data.tables import TableClient

from streamstone_py import (
    ConcurrencyConflictError,
    EventData,
    Include,
    Partition,
    RetryPolicy,
    Stream,
    StreamBeingDeletedError,
    _maintenance,
)
from streamstone_py._transport._retry import is_ambiguous, is_transient
from tests.faults import BATCH, FAST
from tests.helpers import S, perform, rows


def update(partition: Partition) -> tuple[str, ...]:
    """How a header update travels: a PUT with the sync client; the async runner
    sends it as a one-operation transaction, which aiohttp never re-sends."""
    return ("PUT",) if isinstance(partition.table, TableClient) else BATCH


def events(*ids: str) -> list[EventData]:
    return [EventData(id=i, properties={"Body": f"body of {i}"}) for i in ids]


def event_rows(partition: Partition) -> list[tuple[str, str | None]]:
    stored = rows(partition)
    return [(k, stored[k].get("SS_Id")) for k in sorted(stored) if k.startswith("SS-SE-")]


def test_write_whose_answer_is_lost_after_commit_succeeds_once(faulty: Any) -> None:
    partition, plan, clean = faulty
    plan.add("after", *BATCH)

    result = S.write(Stream(partition), *events("a", "b"))

    assert plan.injected == ["after POST"]
    assert [(e.version, e.id) for e in result.events] == [(1, "a"), (2, "b")]
    assert result.stream == Stream.open(clean)
    assert event_rows(clean) == [("SS-SE-0000000001", "a"), ("SS-SE-0000000002", "b")]
    assert len(rows(clean)) == 5


def test_write_that_failed_before_sending_is_retried(faulty: Any) -> None:
    partition, plan, clean = faulty
    stream = S.write(Stream(partition), *events("a")).stream
    plan.add("before", *BATCH, times=2)

    result = S.write(stream, *events("b"))

    assert plan.injected == ["before POST", "before POST"]
    assert result.stream.version == 2
    assert event_rows(clean) == [("SS-SE-0000000001", "a"), ("SS-SE-0000000002", "b")]


def test_ambiguous_write_that_did_not_apply_is_sent_again(faulty: Any) -> None:
    partition, plan, clean = faulty
    stream = S.write(Stream(partition), *events("a")).stream
    plan.add("lost", *BATCH)

    result = S.write(stream, *events("b"))

    assert result.stream == Stream.open(clean)
    assert event_rows(clean) == [("SS-SE-0000000001", "a"), ("SS-SE-0000000002", "b")]


# The rival's write ends where ours would (other events there), or before it.
@pytest.mark.parametrize("ours", [["b"], ["b", "c"]], ids=["as-long", "longer"])
def test_ambiguous_write_beaten_by_a_rival_is_a_conflict(faulty: Any, ours: list[str]) -> None:
    partition, plan, clean = faulty
    stream = S.write(Stream(partition), *events("a")).stream

    def rival() -> None:
        Stream.write(Stream.open(clean), *events("rival"))

    plan.add("lost", *BATCH, meanwhile=rival)
    with pytest.raises(ConcurrencyConflictError) as caught:
        S.write(stream, *events(*ours))

    assert type(caught.value) is ConcurrencyConflictError
    assert caught.value.reason == "the stream changed while the outcome of a write was unknown"
    assert (caught.value.current, caught.value.committed) == (Stream.open(clean), None)
    assert event_rows(clean) == [("SS-SE-0000000001", "a"), ("SS-SE-0000000002", "rival")]


def test_committed_write_followed_by_a_rival_is_still_reported_committed(faulty: Any) -> None:
    partition, plan, clean = faulty
    stream = S.write(Stream(partition), *events("a")).stream

    def rival_appends_after_ours() -> None:
        Stream.write(Stream.open(clean), *events("rival"))

    # The rival acts after our commit reached Azurite and before we learn of it.
    plan.add("after", *BATCH, meanwhile=rival_appends_after_ours)

    result = S.write(stream, *events("b"))

    assert [(e.version, e.id) for e in result.events] == [(2, "b")]
    # The header as our write left it, not the rival's: the caller has not seen
    # version 3, so a write on top of this header must conflict.
    assert (result.stream.version, dict(result.stream.properties)) == (2, {})
    assert result.stream.etag != Stream.open(clean).etag
    before = rows(clean)
    with pytest.raises(ConcurrencyConflictError, match="header has changed"):
        S.write(result.stream, *events("c"))
    with pytest.raises(ConcurrencyConflictError, match="header has changed"):
        S.set_properties(result.stream, {"Owner": "me"})
    with pytest.raises(ConcurrencyConflictError, match="header has changed"):
        S.delete(result.stream)
    assert rows(clean) == before
    assert event_rows(clean) == [
        ("SS-SE-0000000001", "a"),
        ("SS-SE-0000000002", "b"),
        ("SS-SE-0000000003", "rival"),
    ]
    assert before["SS-HEAD"] == {"Version": 3}


def test_committed_write_whose_header_a_rival_changed_returns_a_header_that_conflicts(
    faulty: Any,
) -> None:
    partition, plan, clean = faulty
    stream = S.write(Stream(partition, {"Owner": "me"}), *events("a")).stream

    def rival_sets_properties() -> None:
        Stream.set_properties(Stream.open(clean), {"Owner": "rival"})

    plan.add("after", *BATCH, meanwhile=rival_sets_properties)

    result = S.write(stream, *events("b"))

    assert (result.stream.version, dict(result.stream.properties)) == (2, {"Owner": "me"})
    with pytest.raises(ConcurrencyConflictError, match="header has changed"):
        S.write(result.stream, *events("c"))
    assert rows(clean)["SS-HEAD"] == {"Version": 2, "Owner": "rival"}
    assert [i for _, i in event_rows(clean)] == ["a", "b"]


def test_lost_answer_of_a_later_transaction_of_a_split_write(faulty: Any) -> None:
    partition, plan, clean = faulty
    ids = [f"m{i}" for i in range(120)]  # 240 rows: three transactions
    plan.add("pass", *BATCH).add("after", *BATCH)

    result = S.write(Stream(partition), *events(*ids))

    assert plan.injected == ["pass POST", "after POST"]
    assert result.stream.version == 120
    assert [e.id for e in result.events] == ids
    assert [i for _, i in event_rows(clean)] == ids
    assert len(rows(clean)) == 241


def test_rival_between_transactions_of_a_split_write_stops_it(faulty: Any) -> None:
    partition, plan, clean = faulty
    ids = [f"m{i}" for i in range(60)]  # 120 rows: two transactions

    def rival() -> None:
        Stream.write(Stream.open(clean), *events("rival"))

    plan.add("after", *BATCH, meanwhile=rival)

    with pytest.raises(ConcurrencyConflictError) as caught:
        S.write(Stream(partition), *events(*ids))

    assert caught.value.reason == "the stream changed between the transactions of this write"
    committed = caught.value.committed
    assert committed is not None
    assert [e.id for e in committed.events] == ids[:49]
    assert [i for _, i in event_rows(clean)] == [*ids[:49], "rival"]


def test_includes_of_an_ambiguous_commit_come_back_with_their_etags(faulty: Any) -> None:
    partition, plan, clean = faulty
    clean.table.create_entity({"PartitionKey": clean.partition_key, "RowKey": "old", "N": 0})
    plan.add("after", *BATCH)
    includes = [Include.insert({"RowKey": "proj", "N": 1}), Include.delete({"RowKey": "old"}, "*")]

    result = S.write(Stream(partition), EventData(id="a", includes=includes))

    inserted, deleted = result.includes
    assert inserted.etag == clean.table.get_entity(clean.partition_key, "proj").metadata["etag"]
    assert (deleted.operation, deleted.etag) == ("delete", None)
    # The transaction, then the reads that settle it: the header, the events,
    # and the included row that is still there (a deleted one has no ETag to read).
    assert plan.requests == 4


def test_reads_and_expected_version_writes_ride_out_faults(faulty: Any) -> None:
    partition, plan, clean = faulty
    S.write(Stream(partition), *events("a", "b"))
    plan.add("after", "GET").add("before", "GET").add("after", "GET")

    assert S.read(partition).stream == Stream.open(clean)
    result = S.write(partition, *events("c"), expected_version=2)

    assert result.stream == Stream.open(clean)
    assert result.stream.version == 3
    assert plan.faults == []


def test_provision_and_set_properties_with_lost_answers(faulty: Any) -> None:
    partition, plan, clean = faulty
    plan.add("after", "POST")
    stream = S.provision(partition, {"Owner": "me"})
    assert stream == Stream.open(clean)

    plan.add("after", *update(partition))
    updated = S.set_properties(stream, {"Owner": "you"})
    assert updated == Stream.open(clean)
    assert dict(updated.properties) == {"Owner": "you"}
    assert plan.injected == ["after POST", f"after {update(partition)[0]}"]


def test_truncate_and_delete_with_lost_answers(faulty: Any) -> None:
    partition, plan, clean = faulty
    stream = S.write(Stream(partition), *events(*[f"e{i}" for i in range(12)])).stream
    plan.add("after", *update(partition)).add("after", *BATCH)

    truncated = S.truncate(stream, 9, batch_size=4)

    assert truncated == Stream.open(clean)
    assert [e.version for e in Stream.read(clean).events] == [9, 10, 11, 12]
    assert plan.faults == []
    plan.add("after", *update(partition)).add("after", *BATCH).add("after", *BATCH)
    S.delete(truncated, batch_size=4)
    assert rows(clean) == {}
    assert plan.faults == []


def test_persistent_faults_give_up_after_the_policy_and_write_nothing(faulty: Any) -> None:
    partition, plan, clean = faulty
    plan.add("before", *BATCH, times=FAST.attempts)

    with pytest.raises(ServiceRequestError):
        S.write(Stream(partition), *events("a"))

    assert rows(clean) == {}
    assert len(plan.injected) == FAST.attempts


def _status_error(status: int) -> HttpResponseError:
    error = HttpResponseError(message=f"status {status}")
    error.status_code = status
    return error


@pytest.mark.parametrize(
    ("error", "transient", "ambiguous"),
    [
        (ServiceRequestError("refused", error=ConnectionRefusedError(111, "refused")), True, False),
        # aiohttp reports a connection the server dropped after applying the request so:
        (ServiceRequestError("server disconnected"), True, True),
        (ServiceResponseError("reset"), True, True),
        (IncompleteReadError("cut after the headers"), True, True),
        (_status_error(408), True, True),
        (_status_error(429), True, False),
        (_status_error(500), True, True),
        (_status_error(503), True, True),
        (_status_error(404), False, False),
        (_status_error(412), False, False),
        (ValueError("x"), False, False),
    ],
)
def test_fault_classification(error: Exception, transient: bool, ambiguous: bool) -> None:
    assert is_transient(error) is transient
    assert is_ambiguous(error) is ambiguous


#: Settings a policy refuses: out of range, not numbers, and never ending.
BAD_SETTINGS: list[dict[str, Any]] = [
    {"attempts": 0},
    {"initial_delay": -1},
    {"max_delay": "x"},
    {"total_time": -0.5},
    {"total_time": float("inf")},
    {"max_delay": float("nan")},
    {"total_time": True},
]


@pytest.mark.parametrize("kwargs", BAD_SETTINGS)
def test_retry_policy_refuses_bad_settings(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        RetryPolicy(**kwargs)


def test_retry_policy_delays_grow_and_stay_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    # Full jitter: each pause is drawn from [0, window], the window doubling from
    # initial_delay up to max_delay. The draw is pinned to each end of its window.
    policy = RetryPolicy(initial_delay=0.1, max_delay=1.0)
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    assert [policy.delay(attempt) for attempt in range(1, 8)] == [
        0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0,
    ]  # fmt: skip
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    assert [policy.delay(attempt) for attempt in range(1, 8)] == [0.0] * 7


@pytest.mark.parametrize("kind", ["before", "lost", "after"])
@pytest.mark.parametrize("transaction", [0, 1, 2])
def test_a_fault_at_each_transaction_of_a_split_write(
    faulty: Any, kind: str, transaction: int
) -> None:
    partition, plan, clean = faulty
    stream = S.write(Stream(partition), *events("first")).stream
    ids = [f"m{i}" for i in range(120)]  # 240 rows: three transactions
    for _ in range(transaction):
        plan.add("pass", *BATCH)
    plan.add(kind, *BATCH)

    result = S.write(stream, *events(*ids))

    assert plan.injected[-1] == f"{kind} POST"
    assert result.stream == Stream.open(clean)
    assert [e.id for e in result.events] == ids
    assert [i for _, i in event_rows(clean)] == ["first", *ids]
    assert len(rows(clean)) == 1 + 2 * 121


def test_committed_writes_with_nan_properties_are_recognised_as_committed(faulty: Any) -> None:
    partition, plan, clean = faulty
    nan = float("nan")
    plan.add("after", "POST")
    stream = S.provision(partition, {"Ratio": nan})
    plan.add("after", *BATCH)
    result = S.write(stream, EventData(id="a", properties={"X": nan, "N": 1}))
    plan.add("after", *update(partition))
    updated = S.set_properties(result.stream, {"Ratio": nan, "Owner": "me"})

    assert plan.injected == ["after POST", "after POST", f"after {update(partition)[0]}"]
    assert [(e.version, e.id) for e in result.events] == [(1, "a")]
    assert updated == Stream.open(clean)
    stored = rows(clean)
    assert sorted(stored) == ["SS-HEAD", "SS-SE-0000000001", "SS-UID-a"]
    assert (stored["SS-HEAD"]["Version"], stored["SS-HEAD"]["Owner"]) == (1, "me")
    assert math.isnan(stored["SS-HEAD"]["Ratio"])
    assert math.isnan(stored["SS-SE-0000000001"].pop("X"))
    assert stored["SS-SE-0000000001"] == {"Version": 1, "SS_Id": "a", "N": 1}


@pytest.mark.parametrize("by_partition", [False, True])
def test_delete_whose_tombstone_was_never_sent_sends_it_again(
    faulty: Any, by_partition: bool
) -> None:
    partition, plan, clean = faulty
    stream = S.write(Stream(partition), *events("a", "b")).stream
    plan.add("lost", *update(partition))  # no answer, nothing applied: the header is unchanged

    S.delete(partition if by_partition else stream, batch_size=2)

    assert plan.injected == [f"lost {update(partition)[0]}"]
    assert rows(clean) == {}


def test_write_without_answer_that_meets_a_tombstone_says_how_to_finish_the_delete(
    faulty: Any,
) -> None:
    partition, plan, clean = faulty
    stream = S.write(Stream(partition), *events("a")).stream

    def another_process_starts_a_delete_and_dies() -> None:
        steps = _maintenance.delete(Stream.open(clean), 100, Stream)
        perform(clean.table, next(steps))  # only the tombstone
        steps.close()

    plan.add("lost", *BATCH, meanwhile=another_process_starts_a_delete_and_dies)
    with pytest.raises(StreamBeingDeletedError, match=r"Stream\.delete\(partition\)"):
        S.write(stream, *events("b"))

    assert rows(clean)["SS-HEAD"] == {"Version": 1, "SS_Deleted": True}
    assert [i for _, i in event_rows(clean)] == ["a"]
