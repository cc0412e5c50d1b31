"""The rows of tokens, and every storage call that touches them (one method
per request, or per 100 rows), so that tests can wrap :class:`TokenRows` to
crash between any two.

- ``{handler}|TK-{token}``: a token, in the receiving key's partition,
  beside that key's stream (in the receiver's table, under its handler's
  name): ``MessageId`` (the sending message) and ``From`` (its key). The
  receiver's transaction that stores the message carrying it deletes it; a
  sender's cleanup deletes those of attempts that lost.
- ``{handler}|TR-{SHA-256 of the message id}-{attempt}``: an attempt's
  registration, in the sending key's partition, written before its tokens:
  ``MessageId`` and ``Targets`` (msgpack: the receiving key and token id of
  each output, and its receiver when not the sender's own), so whatever an
  attempt created can be found and removed.
- ``{handler}|TC-{message id}``: the checkpoint, in the sending key's
  partition, inserted once: ``Tokens`` (msgpack: the token ids, in the order
  of the outputs that carry them) and ``Dispatched``, set once they went out;
  ``Retained``, the cut of the retention that removes its version: the row
  goes only after the version (a copy of the message finds one or the other).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from azure.data.tables import TableTransactionError

from streamstone_py import (
    Include,
    Partition,
    Row,
    TableOperation,
    check_row,
    query_rows,
    read_row,
    submit,
)

from .._messages._codec import pack
from .._publish import transactions
from .._store import CHECKPOINT_PREFIX, REGISTRATION_PREFIX, StateStore
from ._token_records import (
    RETAINED,
    Attempt,
    Checkpoint,
    Registration,
    Retained,
    packed_targets,
    read_checkpoint,
    read_targets,
)

__all__ = ["Attempt", "Checkpoint", "Registration", "Retained", "TokenRows"]

T = TypeVar("T")


class TokenRows:
    """The storage calls of tokens, on the processor's table and retry policy."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self.handler_name = store.handler_name

    @property
    def label(self) -> str:
        """How a registration names these rows when they are another handler's:
        ``{handler}@{table}``."""
        return f"{self.handler_name}@{self.store.table.table_name}"

    # --- row keys ---------------------------------------------------------------

    def checkpoint_row_key(self, message_id: str) -> str:
        return f"{self.handler_name}|{CHECKPOINT_PREFIX}{message_id}"

    def registration_row_key(self, message_id: str, attempt: str = "") -> str:
        # A digest, so that one message's registrations share a prefix no other
        # message id can extend.
        digest = hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{self.handler_name}|{REGISTRATION_PREFIX}{digest}-{attempt}"

    # --- the sender's calls -----------------------------------------------------------

    def checkpoint(self, partition: Partition, message_id: str) -> Checkpoint | None:
        row = read_row(
            self.store.table,
            partition.partition_key,
            self.checkpoint_row_key(message_id),
            retry=self.store.retry,
        )
        return None if row is None else read_checkpoint(message_id, row.properties, row.etag)

    def exists(self, key: str, token: str) -> bool:
        """Whether the token is still in ``key``'s partition (one point read)."""
        row_key = self.store.token_row_key(token)
        return read_row(self.store.table, key, row_key, retry=self.store.retry) is not None

    def awaiting(self, message_id: str) -> Include:
        """The checkpoint of a version that consumed a token and has outputs,
        written with it: no token ids, not dispatched (a stale one of an
        earlier life of the message is replaced)."""
        row_key = self.checkpoint_row_key(message_id)
        entity = {"RowKey": row_key, "Tokens": pack([]), "Dispatched": False}
        return Include.insert_or_replace(entity)

    def registration(self, partition_key: str, attempt: Attempt) -> dict[str, Any]:
        return {
            "PartitionKey": partition_key,
            "RowKey": self.registration_row_key(attempt.message_id, attempt.attempt),
            "MessageId": attempt.message_id,
            "Targets": packed_targets(attempt.targets),
        }

    def check(self, partition_key: str, attempt: Attempt) -> None:
        """``ValueError`` if the attempt's registration is more than a row holds
        (its targets over 64 KiB): checked before the state is stored."""
        check_row(self.registration(partition_key, attempt), "the registration of its tokens")

    def register(self, partition: Partition, attempts: Sequence[Attempt]) -> None:
        """Insert each attempt's registration (a retried insert that finds its
        own row, its ids being fresh, counts as done)."""
        pk = partition.partition_key
        self._submit([TableOperation("create", self.registration(pk, a)) for a in attempts], 409)

    def create(self, key: str, tokens: Sequence[tuple[str, str, str]]) -> None:
        """Insert tokens in ``key``'s partition: (token id, sending message id, its key)."""
        ops = [
            TableOperation("create", {
                "PartitionKey": key, "RowKey": self.store.token_row_key(token),
                "MessageId": message_id, "From": origin,
            })
            for token, message_id, origin in tokens
        ]  # fmt: skip
        self._submit(ops, skip=409)

    def record(self, partition: Partition, attempts: Sequence[Attempt]) -> dict[str, Checkpoint]:
        """Insert each attempt's checkpoint, once: where one is stored already
        (a racing copy's, or ours whose answer was lost), it is read and it
        stands. The checkpoint of each message, as stored.

        Each insert is conditional on its message's version still being stored
        (a merge of its id row in the same transaction): retention removes a
        checkpoint only after the version, so a copy that found no checkpoint
        because retention removed it cannot insert a new one, whose fresh ids
        the receivers would take for messages never applied. A checkpoint
        :meth:`Checkpoint.stale` at the attempt's version is replaced."""
        pk = partition.partition_key
        versions = {a.message_id: a.version for a in attempts}
        pending = [
            (a.message_id, TableOperation("create", {
                "PartitionKey": pk,
                "RowKey": self.checkpoint_row_key(a.message_id),
                "Tokens": pack([target[1] for target in a.targets]),
                "Dispatched": False,
            }), TableOperation("update_merge", {
                "PartitionKey": pk, "RowKey": partition.id_row_key(a.message_id)
            }, "*"))
            for a in attempts
        ]  # fmt: skip
        stored = {a.message_id: Checkpoint(a.message_id, tuple(t[1] for t in a.targets))
                  for a in attempts}  # fmt: skip
        for batch in _chunks(pending, lambda p: p[1], per_item=2):
            while batch:
                try:
                    ops = [op for _, insert, stored_ in batch for op in (insert, stored_)]
                    submit(self.store.table, ops, retry=self.store.retry)
                    break
                except TableTransactionError as exc:
                    if exc.index is None or exc.status_code not in (404, 409):
                        raise
                    message_id = batch[exc.index // 2][0]
                    winner = self.checkpoint(partition, message_id) if exc.index % 2 == 0 else None
                    if winner is not None and winner.stale(versions[message_id]):
                        self._replace(partition, winner)
                        continue
                    del batch[exc.index // 2]
                    if winner is None:  # removed by retention: its outputs went out long ago
                        raise Retained(
                            f"the token checkpoint of message {message_id!r} was removed with "
                            "its version by retention: its outputs were dispatched, and no "
                            "new token may be made for them"
                        ) from exc
                    stored[message_id] = winner
        return stored

    def _replace(self, partition: Partition, stale: Checkpoint) -> None:
        """Delete a stale checkpoint, unless a racing copy replaced (or
        deleted) it first: conditional on the ETag it was read with."""
        row_key = self.checkpoint_row_key(stale.message_id)
        delete = TableOperation("delete", {"PartitionKey": partition.partition_key,
                                           "RowKey": row_key}, stale.etag)  # fmt: skip
        try:
            submit(self.store.table, [delete], retry=self.store.retry)
        except TableTransactionError as exc:
            if exc.status_code not in (404, 412):
                raise

    def registrations(self, partition: Partition) -> list[Registration]:
        """The key's registrations still stored (one range query)."""
        prefix = f"{self.handler_name}|{REGISTRATION_PREFIX}"
        return [
            Registration(str(row.properties["RowKey"]), str(row.properties.get("MessageId")),
                         read_targets(str(row.properties["RowKey"]), row.properties.get("Targets")))
            for row in self._range(partition, prefix)
        ]  # fmt: skip

    def delete_tokens(self, key: str, tokens: Sequence[str]) -> None:
        """Delete tokens of ``key``'s partition; those already gone are skipped."""
        row_keys = [self.store.token_row_key(t) for t in dict.fromkeys(tokens)]
        self._submit([_delete(key, r) for r in row_keys], skip=404)

    def finish(
        self, partition: Partition, dispatched: Sequence[str], registrations: Sequence[str]
    ) -> None:
        """Mark these messages' checkpoints dispatched and delete these
        registrations (rows already gone are skipped): one transaction per 100."""
        pk = partition.partition_key
        ops = [
            TableOperation("update_merge", {"PartitionKey": pk, "RowKey":
                           self.checkpoint_row_key(m), "Dispatched": True}, "*")
            for m in dict.fromkeys(dispatched)
        ]  # fmt: skip
        ops += [_delete(pk, r) for r in dict.fromkeys(registrations)]
        self._submit(ops, skip=404)

    # --- retention's calls --------------------------------------------------------------

    def checkpoints(self, partition: Partition) -> dict[str, Checkpoint]:
        """The key's checkpoints (one range query), by message id."""
        prefix = f"{self.handler_name}|{CHECKPOINT_PREFIX}"
        found: dict[str, Checkpoint] = {}
        for row in self._range(partition, prefix):
            message_id = str(row.properties["RowKey"])[len(prefix) :]
            found[message_id] = read_checkpoint(message_id, row.properties)
        return found

    def forget(
        self, partition: Partition, message_ids: Sequence[str], leftovers: Sequence[str], cut: int
    ) -> None:
        """Mark these checkpoints as retained below ``cut`` (each stays until
        the version is removed) and delete these registrations, ``leftovers``
        (rows already gone are skipped)."""
        pk = partition.partition_key
        ops = [
            TableOperation("update_merge", {"PartitionKey": pk, "RowKey":
                           self.checkpoint_row_key(m), RETAINED: cut}, "*")
            for m in dict.fromkeys(message_ids)
        ]  # fmt: skip
        ops += [_delete(pk, r) for r in dict.fromkeys(leftovers)]
        self._submit(ops, skip=404)

    def sweep(self, partition: Partition, message_ids: Sequence[str]) -> None:
        """Delete these checkpoints, once their versions are removed."""
        rows = [self.checkpoint_row_key(m) for m in dict.fromkeys(message_ids)]
        self._submit([_delete(partition.partition_key, r) for r in rows], skip=404)

    # --- helpers ----------------------------------------------------------------------

    def _range(self, partition: Partition, prefix: str) -> list[Row]:
        # Whole rows (they are small): no projection to doubt how a packed list reads back.
        return query_rows(
            self.store.table,
            "PartitionKey eq @pk and RowKey ge @first and RowKey lt @end",
            {
                "pk": partition.partition_key,
                "first": prefix,
                "end": prefix[:-1] + chr(ord(prefix[-1]) + 1),
            },
            retry=self.store.retry,
        )

    def _submit(self, ops: list[TableOperation], skip: int) -> None:
        """Up to 100 operations and 4 MiB a transaction; an operation that fails with
        ``skip`` (404: already gone; 409: already there) is left out, and the
        rest sent again."""
        for batch in _chunks(ops, lambda op: op):
            while batch:
                try:
                    submit(self.store.table, batch, retry=self.store.retry)
                    break
                except TableTransactionError as exc:
                    if exc.status_code != skip or exc.index is None:
                        raise
                    del batch[exc.index]


def _chunks(
    items: Sequence[T], op: Callable[[T], TableOperation], per_item: int = 1
) -> list[list[T]]:
    """The items in transactions: at most 100 operations and about 4 MiB
    each, an item being ``per_item`` operations the size of ``op``'s."""
    if not items:
        return []
    chunks: list[list[T]] = []
    rest = list(items)
    for sized in transactions([dict(op(item).entity) for item in items]):
        for start in range(0, len(sized), 100 // per_item):
            chunks.append(rest[: min(len(sized) - start, 100 // per_item)])
            rest = rest[len(chunks[-1]) :]
    return chunks


def _delete(partition_key: str, row_key: str) -> TableOperation:
    return TableOperation("delete", {"PartitionKey": partition_key, "RowKey": row_key}, "*")
