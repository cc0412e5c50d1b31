"""Where a handler's versions live: one stream per key, written through streamstone_py.

Layout of the stream ``{key}|{handler}`` (a virtual partition of PartitionKey
``key``), one event per processed message, its id the message id:

- event properties: ``MessageType``, ``Now`` (captured at first processing,
  in UTC), ``Captures`` (msgpack, when the handler captured anything),
  ``Digest`` (SHA-256 of the outputs), ``IdScheme`` (how output ids were
  derived), and the state after the message, split over ``State_00``... by
  :func:`streamstone_py.split_binary`;
- header properties: the state after the newest stored version (the same
  split; every transaction of a split write stores the state as of its own
  last event), and once retention removed versions ``Watermark`` (the newest
  ``Now`` it removed) and ``RetainCut`` (the version it removes below,
  stored before anything is removed, so a later call finishes it);
- outbox strategy: one include row ``{handler}|OB-{message id}`` per message,
  holding its encoded outputs until they are dispatched;
- one include row ``{handler}|OI-{SHA-256 of the id}`` per output id a
  handler gave (see ``_records``), written by the first message that published
  it: ``MessageId`` and ``Digest`` (SHA-256 of the output); that version's
  ``OutputIds`` (msgpack) lists the digests of the ids it recorded, so
  retention removes the rows with it;
- with tokens (``_batch/_tokens``): ``{handler}|TK-{token}`` in a receiving
  key's partition, removed by the transaction that stores the message
  carrying it; ``{handler}|TR-{SHA-256 of a message id}-{attempt}`` (an
  attempt's registration) and ``{handler}|TC-{message id}`` (the checkpoint)
  in the sending key's; a version whose outputs carry tokens holds their
  number in ``TokenOutputs``.

All storage calls of the processor go through :class:`StateStore`, so tests
can wrap it to inject crashes between any two of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal

from azure.data.tables import TableClient, TableTransactionError

from streamstone_py import (
    EventData,
    Include,
    Partition,
    RecordedEvent,
    RetryPolicy,
    Stream,
    StreamSlice,
    TableOperation,
    WriteResult,
    join_binary,
    query_rows,
    read_row,
    submit,
)

from ._compression import Compression, check_compression, unpack_stored
from ._errors import UnreadableStateError
from ._messages._codec import unpack

__all__ = ["OutboxRecord", "OutputRecord", "StateStore", "StoredVersion"]

STATE: Final = "State"
WATERMARK: Final = "Watermark"
#: The header property holding the cut retention is removing below (see ``retain``).
RETAIN_CUT: Final = "RetainCut"
#: The event property naming how its output ids were derived (absent: scheme 1).
ID_SCHEME: Final = "IdScheme"
OUTBOX_PREFIX: Final = "OB-"
RECORD_PREFIX: Final = "OI-"
#: The event property listing the output id records a version wrote.
RECORDS: Final = "OutputIds"
TOKEN_PREFIX: Final = "TK-"
CHECKPOINT_PREFIX: Final = "TC-"
REGISTRATION_PREFIX: Final = "TR-"
#: The event property counting a version's outputs that carry tokens.
TOKEN_OUTPUTS: Final = "TokenOutputs"
#: The header an output carries its token id in.
TOKEN_HEADER: Final = "ss-token"
#: The event property of a version that consumed a token and has outputs
#: (none carrying one): its checkpoint, written with it, holds retention
#: until they went out, since a copy of its message finds no token.
AWAITS_DISPATCH: Final = "AwaitsDispatch"


#: How an outbox row is changed after it was written.
_OutboxWrite = Literal["update_merge", "update_replace", "delete"]


@dataclass(frozen=True, slots=True)
class StoredVersion:
    """What a processed message left in its event: enough to handle it again."""

    version: int
    message_id: str
    now: datetime
    captures: dict[str, Any]
    digest: str
    state: bytes
    id_scheme: int = 1
    #: The output id records this version wrote (the SHA-256 of each id).
    records: tuple[str, ...] = ()
    #: How many of its outputs carry tokens (their checkpoint outlives nothing).
    tokens: int = 0
    #: It consumed a token and its outputs (carrying none) have a checkpoint.
    awaits: bool = False

    @classmethod
    def from_event(cls, event: RecordedEvent) -> StoredVersion:
        """The stored version an event holds; ``ValueError`` if it cannot be read."""
        props = event.properties
        now = props.get("Now")
        digest = props.get("Digest")
        captures = props.get("Captures")
        id_scheme = props.get(ID_SCHEME, 1)
        records = props.get(RECORDS)
        tokens = props.get(TOKEN_OUTPUTS, 0)
        if not isinstance(now, datetime) or not isinstance(digest, str):
            raise ValueError(f"version {event.version} lacks a Now time or a Digest")
        if not isinstance(id_scheme, int) or isinstance(id_scheme, bool):
            raise ValueError(f"version {event.version} has an {ID_SCHEME} of {id_scheme!r}")
        return cls(
            version=event.version,
            message_id=event.id or "",
            now=now,
            captures=unpack(captures) if isinstance(captures, bytes) else {},
            digest=digest,
            state=unpack_stored(join_binary(STATE, props)),
            id_scheme=id_scheme,
            records=tuple(unpack(records)) if isinstance(records, bytes) else (),
            tokens=tokens if isinstance(tokens, int) else 0,
            awaits=props.get(AWAITS_DISPATCH) is True,
        )


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """An output id's record: the message that first published it, and what."""

    message_id: str
    #: SHA-256 of the output's canonical bytes (``Message.encode``).
    digest: str


@dataclass(frozen=True, slots=True)
class OutboxRecord:
    """An outbox row: the outputs of one message, until they are dispatched."""

    outputs: bytes | None
    dispatched: bool
    #: When the outputs were first produced (None: a row written before it was kept).
    produced: datetime | None = None


class StateStore:
    """The processor's storage calls, one method per round trip."""

    def __init__(
        self,
        table: TableClient,
        handler_name: str,
        retry: RetryPolicy,
        compression: Compression = None,
    ) -> None:
        check_compression(compression)
        self.table = table
        self.handler_name = handler_name
        self.retry = retry
        #: How new states and outbox outputs are stored (reads take any).
        self.compression: Compression = compression

    def partition(self, key: str) -> Partition:
        return Partition(self.table, key, self.handler_name, retry=self.retry)

    def stored_version(self, key: str, event: RecordedEvent) -> StoredVersion:
        """The stored version of ``key`` an event holds, or :class:`UnreadableStateError`."""
        try:
            return StoredVersion.from_event(event)
        except Exception as exc:  # any damage: msgpack, zlib, a missing property
            raise UnreadableStateError(self.handler_name, key, event.version, str(exc)) from exc

    def outbox_row_key(self, message_id: str) -> str:
        return f"{self.handler_name}|{OUTBOX_PREFIX}{message_id}"

    def record_row_key(self, id_digest: str) -> str:
        return f"{self.handler_name}|{RECORD_PREFIX}{id_digest}"

    def token_row_key(self, token: str) -> str:
        return f"{self.handler_name}|{TOKEN_PREFIX}{token}"

    def open(self, partition: Partition) -> Stream | None:
        return Stream.try_open(partition)

    def find(self, partition: Partition, message_id: str) -> int | None:
        return Stream.find(partition, message_id)

    def read(self, partition: Partition, start_version: int, count: int) -> StreamSlice:
        return Stream.read(partition, start_version=start_version, slice_size=count)

    def write(self, stream: Stream, events: Sequence[EventData]) -> WriteResult:
        return Stream.write(stream, *events)

    def _properties(self, partition: Partition, row_key: str) -> dict[str, Any] | None:
        row = read_row(self.table, partition.partition_key, row_key, retry=self.retry)
        return None if row is None else dict(row.properties)

    def outbox(self, partition: Partition, message_id: str) -> OutboxRecord | None:
        found = self._properties(partition, self.outbox_row_key(message_id))
        if found is None:
            return None
        outputs = unpack_stored(join_binary("Outputs", found)) if "Outputs_Parts" in found else None
        produced = found.get("Produced")
        return OutboxRecord(
            outputs,
            bool(found.get("Dispatched")),
            produced if isinstance(produced, datetime) else None,
        )

    def outbox_include(self, message_id: str, outputs: dict[str, Any]) -> Include:
        return Include.insert(
            {"RowKey": self.outbox_row_key(message_id), "Dispatched": False, **outputs}
        )

    def output_record(self, partition: Partition, id_digest: str) -> OutputRecord | None:
        found = self._properties(partition, self.record_row_key(id_digest))
        if found is None:
            return None
        return OutputRecord(str(found.get("MessageId")), str(found.get("Digest")))

    def record_include(self, id_digest: str, record: OutputRecord) -> Include:
        return Include.insert(
            {"RowKey": self.record_row_key(id_digest), "MessageId": record.message_id,
             "Digest": record.digest}
        )  # fmt: skip

    def delete_records(self, partition: Partition, id_digests: Sequence[str]) -> None:
        self._submit_each(partition, [self.record_row_key(d) for d in id_digests], "delete", {})

    def undispatched(self, partition: Partition) -> set[str]:
        """The message ids whose outbox rows still hold outputs (one range query)."""
        prefix = self.outbox_row_key("")
        found = query_rows(
            self.table,
            "PartitionKey eq @pk and RowKey ge @first and RowKey lt @end and Dispatched eq false",
            {
                "pk": partition.partition_key,
                "first": prefix,
                "end": prefix[:-1] + chr(ord(prefix[-1]) + 1),
            },
            select=["RowKey"],
            retry=self.retry,
        )
        return {str(row.properties["RowKey"])[len(prefix) :] for row in found}

    def mark_dispatched(
        self, partition: Partition, message_ids: Sequence[str], *, keep_outputs: bool = False
    ) -> None:
        """Replace outbox rows by a bare ``Dispatched`` flag (or set the flag and
        keep the outputs); rows already gone are skipped."""
        kind: _OutboxWrite = "update_merge" if keep_outputs else "update_replace"
        rows = [self.outbox_row_key(m) for m in message_ids]
        self._submit_each(partition, rows, kind, {"Dispatched": True})

    def delete_outbox(self, partition: Partition, message_ids: Sequence[str]) -> None:
        self._submit_each(partition, [self.outbox_row_key(m) for m in message_ids], "delete", {})

    def _submit_each(
        self,
        partition: Partition,
        row_keys: Sequence[str],
        kind: _OutboxWrite,
        values: dict[str, Any],
    ) -> None:
        """One unconditional operation per row, 100 to a transaction; rows
        already gone are skipped."""
        ops = [
            TableOperation(
                kind, {"PartitionKey": partition.partition_key, "RowKey": row, **values}, "*"
            )
            for row in dict.fromkeys(row_keys)
        ]
        for start in range(0, len(ops), 100):
            batch = ops[start : start + 100]
            while batch:
                try:
                    submit(self.table, batch, retry=self.retry)
                    break
                except TableTransactionError as exc:
                    if exc.status_code != 404 or exc.index is None:
                        raise
                    del batch[exc.index]  # removed by retention meanwhile

    def set_properties(self, stream: Stream, properties: dict[str, Any]) -> Stream:
        return Stream.set_properties(stream, properties)

    def truncate(self, stream: Stream, before_version: int) -> Stream:
        return Stream.truncate(stream, before_version)
