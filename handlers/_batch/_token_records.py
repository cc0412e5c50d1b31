"""What the token rows hold, as read and written: an attempt, its
registration and targets, a message's checkpoint (see ``_token_rows`` for
the rows themselves and their calls)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._messages._codec import pack, unpack

__all__ = [
    "RETAINED",
    "Attempt",
    "Checkpoint",
    "Registration",
    "Retained",
    "Target",
    "Targets",
    "packed_targets",
    "read_checkpoint",
    "read_targets",
]

#: A checkpoint's property: the cut of the retention removing its version.
RETAINED = "Retained"

#: Where an attempt's output carrying a token goes: the receiving key, the
#: token id, and the receiver: ``""`` for the sender's own handler and table,
#: else a :class:`~handlers.TokenReceiver`'s label, ``{handler}@{table}``.
Target = tuple[str, str, str]
Targets = tuple[Target, ...]


class Retained(RuntimeError):
    """A message's checkpoint and version were removed by retention while a
    copy was sending: its outputs went out long ago, under ids now lost."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt at sending a message's outputs: fresh token ids, its own."""

    message_id: str
    attempt: str
    targets: Targets
    #: The version that stored the message (a checkpoint stale at it is replaced).
    version: int = 0


@dataclass(frozen=True, slots=True)
class Registration:
    """An attempt's registration as stored."""

    row_key: str
    message_id: str
    targets: Targets


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """The token ids a message's outputs carry, on every delivery, for good."""

    message_id: str
    tokens: tuple[str, ...]
    dispatched: bool = False
    #: The cut of the retention that removes its version (None: none yet).
    retained: int | None = None
    etag: str = dataclasses.field(default="", compare=False)

    def stale(self, version: int) -> bool:
        """Whether it belongs to an earlier life of its message: retention
        cut above that version, and the message was stored again at
        ``version`` (a copy from outside, after the window)."""
        return self.retained is not None and self.retained <= version


def packed_targets(targets: Targets) -> bytes:
    """A registration's ``Targets``: [key, token], with the receiver after them when not own."""
    return pack(
        [[key, token, *([receiver] if receiver else [])] for key, token, receiver in targets]
    )


def _packed(row_key: str, name: str, value: Any) -> Any:
    """A packed list read back; ``ValueError`` for anything else, since a
    cleanup that misread which tokens are live could delete one."""
    if not isinstance(value, bytes):
        raise ValueError(f"row {row_key!r} has a {name} of {type(value).__name__}, not bytes")
    return unpack(value)


def read_targets(row_key: str, value: Any) -> Targets:
    return tuple(
        (str(target[0]), str(target[1]), str(target[2]) if len(target) > 2 else "")
        for target in _packed(row_key, "Targets", value)
    )


def read_checkpoint(message_id: str, properties: Mapping[str, Any], etag: str = "") -> Checkpoint:
    tokens = _packed(f"checkpoint of {message_id!r}", "Tokens", properties.get("Tokens"))
    retained = properties.get(RETAINED)
    if not isinstance(retained, int) or isinstance(retained, bool):
        retained = None
    return Checkpoint(
        message_id,
        tuple(str(t) for t in tokens),
        bool(properties.get("Dispatched")),
        retained,
        etag,
    )
