"""Change tracking of includes: Streamstone's table, every cell, and the operation limits."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from streamstone_py import (
    EventData,
    Include,
    IncludedOperationConflictError,
    Partition,
    Stream,
)
from streamstone_py._model import fold_includes
from tests.helpers import S, raw, rows

KINDS = ["insert", "replace", "delete", "insert_or_merge", "insert_or_replace"]


def make(kind: str, **props: Any) -> Include:
    entity = {"RowKey": "row", **props}
    build: Callable[..., Include] = getattr(Include, kind)
    if kind in ("replace", "delete"):
        return build(entity, etag="*")
    return build(entity)


# (first, second) -> the folded operation and its properties, or None when nothing is left.
LEGAL: dict[tuple[str, str], tuple[str, dict[str, Any]] | None] = {
    ("insert", "replace"): ("insert", {"N": 2}),
    ("insert", "delete"): None,
    ("replace", "replace"): ("replace", {"N": 2}),
    ("replace", "delete"): ("delete", {"N": 2}),
    ("delete", "insert"): ("replace", {"N": 2}),
    ("insert_or_merge", "insert_or_merge"): ("insert_or_merge", {"N": 2, "First": 1}),
    ("insert_or_replace", "insert_or_replace"): ("insert_or_replace", {"N": 2}),
}


@pytest.mark.parametrize(("first", "second"), list(itertools.product(KINDS, KINDS)))
def test_every_pair_folds_or_is_refused(first: str, second: str) -> None:
    includes = [make(first, N=1, First=1), make(second, N=2)]
    if (first, second) not in LEGAL:
        with pytest.raises(ValueError, match=f"'{second}' of RowKey 'row' cannot follow '{first}'"):
            fold_includes(includes)
        return
    folded = fold_includes(includes)
    expected = LEGAL[(first, second)]
    if expected is None:
        assert folded == []
    else:
        (only,) = folded
        kind, props = expected
        assert only.operation == kind
        assert {k: v for k, v in only.entity.items() if k != "RowKey"} == props


@pytest.mark.parametrize("after", KINDS)
def test_after_insert_and_delete_only_an_insert_kind_may_follow(after: str) -> None:
    includes = [make("insert"), make("delete"), make(after, N=3)]
    if after in ("insert", "insert_or_merge", "insert_or_replace"):
        (only,) = fold_includes(includes)
        assert only.operation == after
    else:
        with pytest.raises(ValueError, match="cannot follow 'insert then delete'"):
            fold_includes(includes)


def test_replace_keeps_the_first_operations_etag() -> None:
    folded = fold_includes(
        [
            Include.replace({"RowKey": "r"}, etag="first"),
            Include.replace({"RowKey": "r"}, etag="second"),
        ]
    )
    assert folded[0].etag == "first"
    folded = fold_includes(
        [Include.delete({"RowKey": "r"}, etag="read"), Include.insert({"RowKey": "r"})]
    )
    assert (folded[0].operation, folded[0].etag) == ("replace", "read")


def test_different_rows_keep_first_seen_order() -> None:
    folded = fold_includes(
        [
            Include.insert({"RowKey": "b"}),
            Include.insert({"RowKey": "a"}),
            Include.replace({"RowKey": "b", "X": 1}, etag="*"),
        ]
    )
    assert [(i.row_key, i.operation) for i in folded] == [("b", "insert"), ("a", "insert")]


# Storage: the row before, the two includes, the row after (None: absent).
STORED = [
    (None, "insert", "replace", {"N": 2}),
    (None, "insert", "delete", None),
    ({"Old": 0}, "replace", "replace", {"N": 2}),
    ({"Old": 0}, "replace", "delete", None),
    ({"Old": 0}, "delete", "insert", {"N": 2}),
    ({"Old": 0}, "insert_or_merge", "insert_or_merge", {"Old": 0, "First": 1, "N": 2}),
    ({"Old": 0}, "insert_or_replace", "insert_or_replace", {"N": 2}),
]


@pytest.mark.parametrize(("before", "first", "second", "after"), STORED)
def test_folded_includes_leave_the_row_as_applied_in_order(
    partition: Partition,
    before: dict[str, Any] | None,
    first: str,
    second: str,
    after: dict[str, Any] | None,
) -> None:
    if before is not None:
        raw(partition).create_entity(
            {"PartitionKey": partition.partition_key, "RowKey": "row", **before}
        )
    event = EventData(id="e1", includes=[make(first, First=1), make(second, N=2)])

    result = S.write(Stream(partition), event)

    assert rows(partition).get("row") == after
    folded = LEGAL[(first, second)]
    assert [i.operation for i in result.includes] == ([folded[0]] if folded else [])
    for applied in result.includes:
        assert (applied.etag is None) == (applied.operation == "delete")


def test_tracking_across_events_of_one_transaction(partition: Partition) -> None:
    result = S.write(
        Stream(partition),
        EventData(id="e1", includes=[Include.insert({"RowKey": "proj", "Count": 1})]),
        EventData(id="e2", includes=[Include.replace({"RowKey": "proj", "Count": 2}, etag="*")]),
    )
    assert rows(partition)["proj"] == {"Count": 2}
    assert [i.operation for i in result.includes] == ["insert"]


def test_without_tracking_the_service_refuses_two_operations_on_one_row(
    partition: Partition,
) -> None:
    event = EventData(id="e1", includes=[make("insert", N=1), make("replace", N=2)])
    with pytest.raises(IncludedOperationConflictError) as caught:
        S.write(Stream(partition), event, track_changes=False)
    assert caught.value.code == "InvalidDuplicateRow"
    assert rows(partition) == {}


def test_one_event_needing_more_than_99_operations_is_refused_before_anything(
    partition: Partition,
) -> None:
    fits = EventData(id="e1", properties={"N": 1})
    # Event row + id row + 98 includes = 100 operations: one more than fits beside the header.
    too_big = EventData(id="e2", includes=[Include.insert({"RowKey": f"x{i}"}) for i in range(98)])
    with pytest.raises(ValueError, match="needs 100 operations"):
        S.write(Stream(partition), fits, too_big)
    assert rows(partition) == {}

    largest = EventData(id="e2", includes=[Include.insert({"RowKey": f"x{i}"}) for i in range(97)])
    result = S.write(Stream(partition), fits, largest)
    assert result.stream.version == 2
    assert len(rows(partition)) == 1 + 2 + 2 + 97


def test_includes_over_the_batch_limit_in_total_are_split_and_stored(partition: Partition) -> None:
    events = [
        EventData(
            id=f"e{n}", includes=[Include.insert({"RowKey": f"e{n}-x{i}"}) for i in range(30)]
        )
        for n in range(5)
    ]
    result = S.write(Stream(partition), *events)
    assert result.stream.version == 5
    assert len(result.includes) == 150
    assert all(i.etag for i in result.includes)
    assert len(rows(partition)) == 1 + 10 + 150


def test_includes_in_different_transactions_apply_in_turn(
    partition: Partition,
) -> None:
    # Tracking is per transaction, as in Streamstone: across chunks each include is applied in turn.
    filler = [EventData(id=f"f{i}") for i in range(48)]
    first = EventData(id="a", includes=[Include.insert({"RowKey": "proj", "V": 1})])
    second = EventData(id="b", includes=[Include.replace({"RowKey": "proj", "V": 2}, etag="*")])
    S.write(Stream(partition), first, *filler, second)
    assert rows(partition)["proj"] == {"V": 2}
