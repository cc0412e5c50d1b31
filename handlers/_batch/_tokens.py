"""Tokens: a message that a handler sends to a key of its own (an output of a
type the handler takes) is processed only while its token exists, and the
transaction that stores the receiver's new version deletes the token. A copy
that comes after that, however late and whatever retention removed since,
finds no token: a duplicate, dropped. Nothing has to be remembered after the
fact, so no time window bounds the guarantee.

The sender, once its state is stored (:meth:`Tokens.before_dispatch`, then
the publisher, then :meth:`Tokens.after_dispatch`):

1. register: a row per attempt in its own partition, naming the attempt's
   fresh token ids, before any exists, so that a cleanup finds them all;
2. create: the tokens, in each receiving key's partition;
3. checkpoint: a row per message recording the ids, inserted once and only
   while the message's version is stored; a racing copy whose insert fails
   reads the winner's ids and uses them;
4. dispatch: each output carries its token in the ``ss-token`` header
   (``{handler}:{token id}``: another handler that takes the same type reads
   it as a message from outside);
5. finish: the tokens of attempts that lost are deleted (no output carries
   them), the attempt's registration too, and the checkpoint is marked
   dispatched; retention removes what other attempts registered, then the
   version, and the checkpoint last (a copy finds one or the other).

A retry before the checkpoint makes new ids (the old ones are garbage, found
through their registration); after it, the recorded ids go out again and no
token is ever made again: so a token, once consumed, never comes back. An
output goes out with the same header on every delivery, since a duplicate
takes its ids from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from streamstone_py import Include, Partition

from .._messages._message import Message
from .._outcome import Plan, Step
from .._store import TOKEN_HEADER, StoredVersion
from ._token_records import Attempt, Checkpoint, Registration, Retained, Target
from ._token_rows import TokenRows

__all__ = ["PLACEHOLDER", "Sending", "Tokens"]

_log = logging.getLogger(__name__)

#: A token id as it travels (fresh ids are 32 hex digits), to measure outputs by.
PLACEHOLDER: Final = "0" * 32


@dataclass(slots=True)
class Sending:
    """A chunk's tokens between its dispatch and its finish."""

    partition: Partition
    checkpoints: dict[str, Checkpoint]
    #: The attempts this call registered.
    own: list[Attempt]
    #: Whether an earlier delivery may have registered attempts (a duplicate).
    earlier: bool


class Tokens:
    """The token steps of one handler's processor (see the module's docstring)."""

    def __init__(
        self,
        rows: TokenRows,
        takes: Callable[[str], bool],
        sends: bool,
        receivers: Mapping[str, TokenRows] | None = None,
        marks: bool = True,
    ) -> None:
        self.rows = rows
        #: Whether an output of this type is a message to the handler's own keys.
        self.takes = takes
        #: The other handlers' token rows, by the output type they take.
        self.receivers = dict(receivers or {})
        #: The same, by label (what a registration names them by).
        self.labelled = {r.label: r for r in self.receivers.values()}
        #: Whether new outputs get tokens (``tokens=True``). Every processor
        #: consumes the tokens its messages carry, and finishes sending those
        #: a version stored with them promised: so tokens can be turned on,
        #: or off, one worker at a time.
        self.sends = sends
        #: Whether :meth:`after_dispatch` marks the checkpoints dispatched
        #: (``dispatch="after_publish"``); else the caller does, once its
        #: publication is final (:meth:`mark`), and retention waits for it.
        self.marks = marks

    def carries(self, message_type: str) -> bool:
        """Whether an output of this type carries a token: to the handler's
        own keys, or to a receiver's."""
        return message_type in self.receivers or self.takes(message_type)

    def header(self, message_type: str, token: str) -> str:
        """The ``ss-token`` header's value: the handler it is for, and the id."""
        return f"{self.receivers.get(message_type, self.rows).handler_name}:{token}"

    def target(self, output: Message, token: str) -> Target:
        receiver = self.receivers.get(output.type)
        return (output.key, token, "" if receiver is None else receiver.label)

    def rows_of(self, label: str) -> TokenRows | None:
        """The token rows a target's label names (None: a receiver no longer configured)."""
        return self.rows if not label else self.labelled.get(label)

    def token_in(self, message: Message) -> str | None:
        """The token id a message carries for this handler (another handler's
        token, or none: a message from outside, judged by its id)."""
        value = message.headers.get(TOKEN_HEADER)
        handler, _, token = (value or "").partition(":")
        return token if handler == self.rows.handler_name and token else None

    def count(self, outputs: Sequence[Message]) -> int:
        return sum(1 for o in outputs if self.carries(o.type))

    def check(self, message: Message, outputs: Sequence[Message]) -> None:
        """``ValueError``, before the state is stored, for outputs whose tokens
        could not be sent: a key no token row can have, or more than one
        registration row holds."""
        targets = tuple(self.target(o, PLACEHOLDER) for o in outputs if self.carries(o.type))
        for key, _, label in targets:
            rows = self.rows_of(label)
            assert rows is not None  # configured: it was just looked up by type
            rows.store.partition(key)
        self.rows.check(message.key, Attempt(message.id, PLACEHOLDER, targets))

    # --- the receiver -----------------------------------------------------------------

    def consumed(self, messages: Sequence[Message], row_key: str) -> Message | None:
        """The message whose token a refused write could not delete (already
        consumed), if that is what failed."""
        for message in messages:
            token = self.token_in(message)
            if token is not None and self.rows.store.token_row_key(token) == row_key:
                return message
        return None

    def consume(self, token: str) -> Include:
        """The token's removal, written in the transaction that stores the
        message carrying it (``ValueError`` for a header no row key can hold)."""
        return Include.delete({"RowKey": self.rows.store.token_row_key(token)}, etag="*")

    # --- the sender ---------------------------------------------------------------------

    def before_dispatch(self, partition: Partition, plan: Plan) -> Sending | None:
        """Register, create and checkpoint the tokens of the plan's outputs
        that need them (none already checkpointed), and put each id in its
        output's header; the steps' outputs are replaced."""
        if not self.sends and all(step.status != "duplicate" for step in plan.steps):
            return None  # nothing stored now gets a token, and no duplicate re-sends one
        groups: dict[str, list[Step]] = defaultdict(list)
        for step in plan.steps:
            if step.status in ("completed", "duplicate") and self.count(step.outputs):
                groups[step.message.id].append(step)
        # A copy in the batch follows its first: a replay of a version stored
        # before tokens were on re-sends what went out then, without.
        # Stored now: with tokens only if this processor sends them.
        groups = {
            m: steps
            for m, steps in groups.items()
            if steps[0].tokens and (self.sends or steps[0].status == "duplicate")
        }
        if not groups:
            return None
        first = {message_id: steps[0] for message_id, steps in groups.items()}
        # A message stored by this very call cannot have been checkpointed
        # before: its copies' attempts all came after, and insert their own.
        duplicates = [m for m, step in first.items() if step.status == "duplicate"]
        checkpoints: dict[str, Checkpoint] = {}
        if len(duplicates) > 4:  # a redelivered batch: one query for all
            stored = self.rows.checkpoints(partition)
            checkpoints = {m: stored[m] for m in duplicates if m in stored}
        for message_id in duplicates if len(duplicates) <= 4 else ():
            found = self.rows.checkpoint(partition, message_id)
            if found is not None:
                checkpoints[message_id] = found
        versions = {m: step.version or 0 for m, step in first.items()}
        checkpoints = {m: c for m, c in checkpoints.items() if not c.stale(versions[m])}
        attempts = [
            Attempt(message_id, uuid.uuid4().hex, tuple(
                self.target(o, uuid.uuid4().hex) for o in step.outputs if self.carries(o.type)
            ), versions[message_id])
            for message_id, step in first.items()
            if message_id not in checkpoints
        ]  # fmt: skip
        if attempts:
            self.rows.register(partition, attempts)
            by_key: dict[tuple[str, str], list[tuple[str, str, str]]] = defaultdict(list)
            for attempt in attempts:
                for key, token, label in attempt.targets:
                    by_key[label, key].append((token, attempt.message_id, partition.partition_key))
            for (label, key), tokens in by_key.items():
                rows = self.rows_of(label)
                assert rows is not None  # configured: these targets were made just now
                rows.create(key, tokens)
            try:
                checkpoints.update(self.rows.record(partition, attempts))
            except Retained:  # none of this attempt's tokens may ever be consumed
                own = self._own(attempts)
                self._delete_garbage(own.values(), {})
                self.rows.finish(partition, [], list(own))
                raise
        for message_id, steps in groups.items():
            for step in steps:
                step.outputs = self._carrying(step.outputs, checkpoints[message_id])
        return Sending(partition, checkpoints, attempts, bool(duplicates))

    def _carrying(
        self, outputs: tuple[Message, ...], checkpoint: Checkpoint
    ) -> tuple[Message, ...]:
        if self.count(outputs) != len(checkpoint.tokens):
            raise RuntimeError(
                f"message {checkpoint.message_id!r} has {self.count(outputs)} outputs that "
                f"carry tokens, and its checkpoint {len(checkpoint.tokens)} token ids"
            )
        tokens = iter(checkpoint.tokens)
        return tuple(
            dataclasses.replace(
                o, headers={**o.headers, TOKEN_HEADER: self.header(o.type, next(tokens))}
            )
            if self.carries(o.type)
            else o
            for o in outputs
        )

    def after_dispatch(self, sending: Sending) -> None:
        """The outputs went out: delete what attempts that lost created, this
        call's registrations, and mark the checkpoints dispatched (retention
        keeps the version until then).

        Another attempt's registration is left for its owner (or for
        retention, which removes it with the message's version): that attempt
        may still be creating its tokens, and its row is what finds them."""
        own = self._own(sending.own)
        found = self.rows.registrations(sending.partition) if sending.earlier else []
        others = [r for r in found if r.message_id in sending.checkpoints and r.row_key not in own]
        self._delete_garbage([*own.values(), *others], sending.checkpoints)
        undispatched = [m for m, c in sending.checkpoints.items() if not c.dispatched]
        if not self.marks:
            undispatched = []
        if undispatched or own:
            self.rows.finish(sending.partition, undispatched, list(own))

    def published(self, partition: Partition, plan: Plan, sending: Sending | None) -> None:
        """The outputs went out: the checkpoints of the versions that consumed
        a token and awaited the dispatch of their own outputs are deleted (one
        transaction per 100; those already gone skipped), so retention may
        remove those versions."""
        if not self.marks:
            return
        sent = sending.checkpoints if sending is not None else {}
        ids = [
            step.message.id
            for step in plan.steps
            if step.status in ("completed", "duplicate")
            and step.outputs
            and step.message.id not in sent
            and self.token_in(step.message) is not None
        ]
        if ids:
            self.rows.sweep(partition, ids)

    def mark(self, partition: Partition, message_ids: Sequence[str]) -> None:
        """The caller's publication of these messages' outputs is final: their
        checkpoints are marked dispatched (one query, then one transaction per
        100 not marked yet; ids without a checkpoint are skipped)."""
        stored = self.rows.checkpoints(partition)
        found = [m for m in message_ids if m in stored]
        # One without token ids awaited its version's own outputs: it goes.
        awaited = [m for m in found if not stored[m].tokens]
        undispatched = [m for m in found if stored[m].tokens and not stored[m].dispatched]
        if undispatched:
            self.rows.finish(partition, undispatched, [])
        if awaited:
            self.rows.sweep(partition, awaited)

    def _own(self, attempts: Iterable[Attempt]) -> dict[str, Registration]:
        """The registrations of these attempts, by row key."""
        return {
            self.rows.registration_row_key(a.message_id, a.attempt): Registration(
                self.rows.registration_row_key(a.message_id, a.attempt), a.message_id, a.targets
            )
            for a in attempts
        }

    def _delete_garbage(
        self, registrations: Iterable[Registration], checkpoints: dict[str, Checkpoint]
    ) -> None:
        garbage: dict[tuple[str, str], list[str]] = defaultdict(list)
        for registration in registrations:
            checkpoint = checkpoints.get(registration.message_id)
            live = set(checkpoint.tokens) if checkpoint is not None else set()
            for key, token, label in registration.targets:
                if token not in live:
                    garbage[label, key].append(token)
        for (label, key), tokens in garbage.items():
            rows = self.rows_of(label)
            if rows is None:  # the receiver was taken out of the configuration
                _log.warning(
                    "%d unused tokens of handler %r for key %r left in place: their receiver "
                    "%r is no longer among the processor's token receivers",
                    len(tokens), self.rows.handler_name, key, label,
                )  # fmt: skip
                continue
            rows.delete_tokens(key, tokens)

    # --- retention -------------------------------------------------------------------------

    def hold(self, partition: Partition, candidates: Sequence[StoredVersion], cut: int) -> int:
        """Retention's cut, lowered to keep each version whose outputs were
        not dispatched yet (those carrying tokens, or a token consumer's), and
        the one before it (a duplicate is handled again on it, and must find
        its checkpoint's ids). A sender's checkpoint is made after its
        version; a consumer's with it, and deleted once its outputs went out."""
        sending = [r for r in candidates if (r.tokens or r.awaits) and r.version < cut]
        if not sending:
            return cut
        checkpoints = self.rows.checkpoints(partition)
        held = [
            r.version
            for r in sending
            if (c := checkpoints.get(r.message_id)) is not None
            if r.awaits or not c.dispatched
        ] + [r.version for r in sending if r.tokens and r.message_id not in checkpoints]
        return min(cut, min(held) - 1) if held else cut

    def forget(self, partition: Partition, removed: Sequence[StoredVersion], cut: int) -> list[str]:
        """Before retention removes versions below ``cut``: what racing
        attempts of their messages left behind goes, and their checkpoints are
        marked. Returns the checkpoints to delete once the versions are gone
        (these, and any an interrupted call marked below ``cut``)."""
        ids = {r.message_id for r in removed if r.tokens}
        stored = self.rows.checkpoints(partition) if ids else {}
        if ids:
            checkpoints = {m: c for m, c in stored.items() if m in ids}
            leftovers = [r for r in self.rows.registrations(partition) if r.message_id in ids]
            self._delete_garbage(leftovers, checkpoints)
            self.rows.forget(partition, sorted(ids), [r.row_key for r in leftovers], cut)
        marked = [m for m, c in stored.items() if c.retained is not None and c.retained <= cut]
        return sorted(ids | set(marked))
