"""streamstone_py: event streams on Azure Table Storage.

A Python port of Streamstone. A stream is one table partition: a header row
that carries the stream's version, one row per event, and one row per event id
for duplicate detection. Every write is an entity-group transaction that is
conditional on the header's ETag, so concurrent writers never interleave and
an event id is never stored twice.

    >>> from streamstone_py import Partition, Stream, EventData
    >>> partition = Partition(table_client, "order-42")          # doctest: +SKIP
    >>> stream = Stream.provision(partition)                      # doctest: +SKIP
    >>> event = EventData(id="m-1", properties={"Amount": 5})
    >>> result = Stream.write(stream, event)                      # doctest: +SKIP

Errors are documented together in :mod:`streamstone_py._errors`; they all
derive from :class:`StreamstoneError`.
"""

from ._codec._binary import join_binary, split_binary
from ._codec._values import PropertyValue
from ._config import RedactSecrets, TableConfig, Transport, guard_url_logs, redact
from ._errors import (
    ConcurrencyConflictError,
    DuplicateEventError,
    IncludedOperationConflictError,
    PartialWriteError,
    StreamBeingDeletedError,
    StreamNotFoundError,
    StreamstoneError,
)
from ._model import (
    EventData,
    Include,
    RecordedEvent,
    StreamSlice,
    WriteResult,
    check_row,
    is_stream_row_key,
)
from ._partition import Partition, check_key, id_row_key, key_order
from ._scan import ScannedStream
from ._shard import Shard
from ._stream import Stream
from ._tables import query_rows, read_row, submit
from ._trace_logs import TraceIds
from ._transport._protocol import Row, TableOperation
from ._transport._retry import RetryPolicy, is_transient
from ._transport._wire._client import WireTableClient

__all__ = [
    "ConcurrencyConflictError",
    "DuplicateEventError",
    "EventData",
    "Include",
    "IncludedOperationConflictError",
    "PartialWriteError",
    "Partition",
    "PropertyValue",
    "RecordedEvent",
    "RedactSecrets",
    "RetryPolicy",
    "Row",
    "ScannedStream",
    "Shard",
    "Stream",
    "StreamBeingDeletedError",
    "StreamNotFoundError",
    "StreamSlice",
    "StreamstoneError",
    "TableConfig",
    "TableOperation",
    "TraceIds",
    "Transport",
    "WireTableClient",
    "WriteResult",
    "check_key",
    "check_row",
    "id_row_key",
    "is_stream_row_key",
    "is_transient",
    "join_binary",
    "key_order",
    "query_rows",
    "read_row",
    "redact",
    "split_binary",
    "submit",
]

__version__ = "0.1.0"

guard_url_logs()
