"""Helpers to look at the raw table, beside the engine."""

from __future__ import annotations

from typing import Any

from streamstone_py import Partition
from streamstone_py._values import from_table


def rows(partition: Partition) -> dict[str, dict[str, Any]]:
    """Every row of the partition's physical partition: RowKey -> plain properties."""
    found = partition.table.query_entities(
        "PartitionKey eq @pk", parameters={"pk": partition.partition_key}
    )
    return {
        e["RowKey"]: {k: from_table(v) for k, v in e.items() if k not in ("PartitionKey", "RowKey")}
        for e in found
    }


def snapshot(partition: Partition) -> dict[str, tuple[dict[str, Any], str]]:
    """Rows with their ETags, to prove a failed write changed nothing at all."""
    found = partition.table.query_entities(
        "PartitionKey eq @pk", parameters={"pk": partition.partition_key}
    )
    return {e["RowKey"]: (dict(e), e.metadata["etag"]) for e in found}
