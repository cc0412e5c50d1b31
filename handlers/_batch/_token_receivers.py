"""The other handlers a processor's outputs carry tokens to, and the
checks of a processor's token options."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from azure.data.tables import TableClient

from .._handler import Handler
from .._store import StateStore
from ._token_rows import TokenRows
from ._tokens import Tokens

__all__ = ["TokenReceiver", "tokens_of"]


@dataclass(frozen=True, slots=True)
class TokenReceiver:
    """Another handler, in its own states table, that takes a type of this
    handler's outputs (``Processor(token_receivers={type: TokenReceiver(...)})``):
    their tokens are made in ``table``, in the receiving key's partition,
    under ``handler``'s name, and the receiver's processor consumes them."""

    handler: str
    table: TableClient

    def __post_init__(self) -> None:
        if not isinstance(self.handler, str) or not self.handler.isidentifier():
            raise ValueError(
                f"a token receiver's handler must be an identifier, got {self.handler!r}"
            )


def tokens_of(
    handler: Handler[Any],
    store: StateStore,
    strategy: str,
    dispatch: str,
    tokens: bool,
    receivers: Mapping[str, TokenReceiver] | None,
) -> Tokens:
    """A processor's token steps, its options checked (``ValueError`` naming the bad one)."""
    if not isinstance(tokens, bool):
        raise ValueError(f"tokens must be True or False, got {tokens!r}")
    if tokens and strategy != "state":
        raise ValueError(f"tokens=True needs strategy='state', got strategy={strategy!r}")
    if tokens and handler.message_types is None:
        raise ValueError(
            f"tokens=True needs handler {handler.name!r} to name its types: an output of "
            "a type it takes is what carries a token"
        )
    receivers = dict(receivers or {})
    rows: dict[str, TokenRows] = {}
    for message_type, receiver in receivers.items():
        if not isinstance(receiver, TokenReceiver):
            raise ValueError(
                f"token_receivers[{message_type!r}] must be a TokenReceiver, got {receiver!r}"
            )
        if handler.accepts(message_type):
            raise ValueError(
                f"token_receivers names {message_type!r}, a type handler {handler.name!r} takes "
                "itself: its outputs of that type carry tokens for its own keys"
            )
        if (receiver.handler, receiver.table.table_name) == (handler.name, store.table.table_name):
            raise ValueError(f"token_receivers[{message_type!r}] is the handler itself")
        other = StateStore(receiver.table, receiver.handler, store.retry)
        rows[message_type] = TokenRows(other)
    # With "by_caller", the caller marks the checkpoints once its publication is final.
    return Tokens(TokenRows(store), handler.accepts, tokens, rows, dispatch == "after_publish")
