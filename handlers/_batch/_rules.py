"""What a fold judges a message and its new version by, besides the handler:
the window of late messages, the token a message carries, the table's limits
and what the publisher can deliver."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from streamstone_py import EventData, Stream, split_binary

from .._compression import pack_stored
from .._context import HandlerContext
from .._errors import DuplicateOutsideWindowError
from .._messages._codec import pack
from .._messages._message import Message, outputs_digest
from .._outcome import LateDuplicates, Step
from .._store import (
    AWAITS_DISPATCH,
    ID_SCHEME,
    RECORDS,
    STATE,
    TOKEN_HEADER,
    TOKEN_OUTPUTS,
    OutputRecord,
)
from ._replay import Replayer
from ._strategy import Strategy
from ._tokens import PLACEHOLDER, Tokens

__all__ = ["Rules", "consumed"]


def consumed(message: Message) -> Step:
    """A message whose token is gone: a duplicate, dropped without outputs."""
    return Step(message, "duplicate", kind="consumed")


class Rules:
    """What a fold needs besides the batch: the strategy (and through it the
    handler's runner), the clock (UTC), the rules for late messages and
    outputs, and the tokens (None: messages carry none)."""

    def __init__(
        self,
        strategy: Strategy,
        now: Callable[[], datetime],
        late_duplicates: LateDuplicates,
        check_output: Callable[[Message], None] | None,
        tokens: Tokens | None = None,
    ) -> None:
        self.strategy = strategy
        self.tokens = tokens
        self.replayer: Replayer = strategy.replayer
        self.handler = self.replayer.handler
        self.now = now
        self.late_duplicates = late_duplicates
        self.check_output = check_output

    def token_of(self, message: Message) -> str | None:
        """The token a message carries, when this processor honours tokens."""
        return self.tokens.token_in(message) if self.tokens is not None else None

    def spent(self, key: str, message: Message) -> Step | None:
        """A message whose token is gone (one read), as ``consumed``; else None.

        Asked when the handler fails on it: a copy processed before, whose
        version retention removed, meets a state its original never saw."""
        token = self.token_of(message)
        if token is None or self.tokens is None or self.tokens.rows.exists(key, token):
            return None
        return consumed(message)

    def late(self, message: Message, watermark: Any) -> DuplicateOutsideWindowError | None:
        """The refusal of a message sent before retention's watermark, if it is one."""
        sent_at = message.headers.get("sent_at")
        if (
            self.late_duplicates != "refuse"
            or self.token_of(message) is not None
            or sent_at is None
            or not isinstance(watermark, datetime)
        ):
            return None
        try:
            sent = datetime.fromisoformat(sent_at)
        except ValueError:
            sent = None
        name = self.handler.name
        if sent is None or sent.tzinfo is None:
            reason = "its sent_at header is not a time with a zone, and retention removed versions"
            return DuplicateOutsideWindowError(
                name, message.id, reason, sent_at=sent_at, watermark=watermark
            )
        if sent <= watermark:
            reason = "it was sent before retention removed the versions of its time"
            return DuplicateOutsideWindowError(
                name, message.id, reason, sent_at=sent, watermark=watermark
            )
        return None

    def event(
        self,
        stream: Stream,
        message: Message,
        context: HandlerContext,
        state: bytes,
        header: dict[str, Any],
        records: Sequence[tuple[str, OutputRecord]] = (),
    ) -> EventData:
        """The stored version of a processed message, with the output id
        ``records`` it writes and the removal of the token it carries,
        checked against the table's limits and against what the publisher can
        deliver."""
        self._check_outputs(context.outputs)
        encoded_outputs = pack([o.encode() for o in context.outputs])
        stored = pack_stored(state, self.strategy.store.compression)
        properties: dict[str, Any] = {
            "MessageType": message.type,
            "Now": context.now(),
            # Of what the outputs are, not of the trace they went out under.
            "Digest": outputs_digest(context.outputs),
            ID_SCHEME: context.id_scheme,
            **split_binary(STATE, stored),
        }
        if context.captures:
            properties["Captures"] = pack(context.captures)
        if records:
            properties[RECORDS] = pack([d for d, _ in records])
        token = self.token_of(message)
        tokens = self.tokens
        if tokens is not None and tokens.sends and tokens.count(context.outputs):
            properties[TOKEN_OUTPUTS] = tokens.count(context.outputs)
            tokens.check(message, context.outputs)
        # A copy of a token message finds no token: only its kept version can
        # send its outputs again, so retention must wait until they went out
        # (the outbox keeps them in its rows; a sender's checkpoint does so).
        awaits = (
            tokens is not None
            and token is not None
            and bool(context.outputs)
            and TOKEN_OUTPUTS not in properties
            and self.strategy.name == "state"
        )
        if awaits:
            properties[AWAITS_DISPATCH] = True
        store = self.strategy.store
        event = EventData(
            id=message.id,
            properties=properties,
            includes=[
                *self.strategy.includes(message.id, encoded_outputs, context.now()),
                *(store.record_include(d, r) for d, r in records),
                *([tokens.consume(token)] if tokens is not None and token is not None else []),
                *([tokens.rows.awaiting(message.id)] if tokens is not None and awaits else []),
            ],
            stream_properties={**header, **split_binary(STATE, stored)},
        )
        Stream.check_write(stream, event)
        return event

    def _check_outputs(self, outputs: Sequence[Message]) -> None:
        tokens = self.tokens
        if self.check_output is not None:
            for output in outputs:
                if tokens is not None and tokens.sends and tokens.carries(output.type):
                    # Checked as it will go out: with its token header.
                    headers = {
                        **output.headers,
                        TOKEN_HEADER: tokens.header(output.type, PLACEHOLDER),
                    }
                    output = dataclasses.replace(output, headers=headers)
                self.check_output(output)
