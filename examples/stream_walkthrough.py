"""A walkthrough of the stream API: provision, write, a duplicate, a conflict, read back.

Run it beside Azurite with ``python -m azurite.launcher -- python
examples/stream_walkthrough.py``, after the export line ``make azurite``
prints, or beside any account with ``STREAMSTONE_CONNECTION_STRING=...``.
"""

from __future__ import annotations

import sys
import uuid

from _account import example_table

from streamstone_py import (
    ConcurrencyConflictError,
    DuplicateEventError,
    EventData,
    Partition,
    Stream,
)


def main() -> int:
    table = example_table("walkthrough")
    if table is None:
        return 2
    partition = Partition(table, f"order-{uuid.uuid4().hex[:8]}")

    print(f"1. provision stream {partition.key!r} in table {partition.table_name!r}")
    stream = Stream.provision(partition, {"Customer": "ACME"})
    print(f"   -> version {stream.version}, properties {dict(stream.properties)}")

    print("2. write two events, each with an id for duplicate detection")
    result = Stream.write(
        stream,
        EventData(id="msg-1", properties={"Type": "ItemAdded", "Sku": "A-1", "Qty": 2}),
        EventData(id="msg-2", properties={"Type": "ItemAdded", "Sku": "B-7", "Qty": 1}),
    )
    stream = result.stream
    print(f"   -> stream at version {stream.version}; events {[e.version for e in result.events]}")

    print("3. deliver msg-2 again (a broker redelivery)")
    try:
        Stream.write(stream, EventData(id="msg-2", properties={"Type": "ItemAdded"}))
    except DuplicateEventError as error:
        print(f"   -> duplicate detected: event id {error.id!r}; nothing was written")

    print("4. two writers hold the stream at version 2; the first writes msg-3")
    stale = stream
    stream = Stream.write(stream, EventData(id="msg-3", properties={"Type": "Checkout"})).stream
    print(f"   -> the first writer wrote msg-3: stream at version {stream.version}")
    print("   the second writes msg-4 from its header, now stale")
    try:
        Stream.write(stale, EventData(id="msg-4", properties={"Type": "ItemRemoved"}))
    except ConcurrencyConflictError as error:
        print(f"   -> conflict detected: {error.reason}; msg-4 was not written (re-open the "
              "stream and decide again)")  # fmt: skip

    print("5. read the stream back")
    page = Stream.read(partition)
    for event in page.events:
        print(f"   v{event.version} id={event.id} {dict(event.properties)}")
    print(f"   -> {len(page.events)} events, end of stream: {page.is_end_of_stream}")

    expected = [(1, "msg-1"), (2, "msg-2"), (3, "msg-3")]
    if [(e.version, e.id) for e in page.events] != expected:
        print(f"unexpected stream contents; expected {expected}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
