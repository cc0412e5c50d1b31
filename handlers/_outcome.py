"""What a processor hands back and keeps: outcomes, states read, counters, and
the per-message steps of a batch before they become outcomes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Generic, Literal, TypeVar, cast

from streamstone_py import EventData

from ._errors import HandlerError
from ._lifecycle import Receive, ReceiveState
from ._messages._message import Message
from ._store import StoredVersion

__all__ = [
    "CONSUMED",
    "Dispatch",
    "Found",
    "KeyState",
    "KeyVersion",
    "LateDuplicates",
    "LoadedState",
    "Outcome",
    "OutcomeKind",
    "Plan",
    "ProcessorStats",
    "Status",
    "Step",
    "StrategyName",
    "checked_now",
    "held",
    "outcome_of",
    "utcnow",
]

S = TypeVar("S")
StrategyName = Literal["state", "outbox"]
LateDuplicates = Literal["refuse", "process"]
Dispatch = Literal["after_publish", "by_caller"]
Status = Literal["completed", "duplicate", "abandoned", "faulted"]
#: Why a message ended as it did, as data (a status says only what became of it):
#:
#: - ``completed``, ``duplicate``: as the status;
#: - ``consumed`` (status ``duplicate``): its token is gone, so a copy of it was
#:   processed before, and retention has removed that version since: dropped,
#:   its outputs not sent again (they went out with the original);
#: - ``refused``: it can never be handled, for what it is (an unknown type, an
#:   id the table cannot store, a late duplicate retention forgot, an output
#:   id another message of the key published with other content): shelve it
#:   at once, alone;
#: - ``failed``: the handler failed on it, or made what cannot be stored or
#:   sent; a later delivery (or a fixed handler) may do better;
#: - ``stopped``: not tried, because an earlier message of its key failed;
#: - ``held``: not tried, because an earlier message of its key is in doubt;
#: - ``faulted``: storage or publishing failed: in doubt.
OutcomeKind = Literal[
    "completed", "duplicate", "consumed", "refused", "failed", "stopped", "held", "faulted"
]
#: Why a ``consumed`` message was dropped.
CONSUMED: Final = (
    "its token is gone: a copy of it was processed before, and its version has been "
    "removed by retention since; dropped, its outputs not sent again"
)
_KIND_OF: Final[dict[str, OutcomeKind]] = {
    "completed": "completed", "duplicate": "duplicate", "abandoned": "failed",
    "faulted": "faulted",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class LoadedState(Generic[S]):
    """The state a message is handled on: the newest one, or for a duplicate
    the one from just before its original was processed."""

    state: S
    version: int
    is_duplicate: bool
    original: StoredVersion | None = None


@dataclass(frozen=True, slots=True)
class KeyState(Generic[S]):
    """A key's newest state, and the version that stored it (0: never written)."""

    key: str
    version: int
    state: S
    #: When the key's header last changed (known to a scan; else None).
    updated: datetime | None = None


@dataclass(frozen=True, slots=True)
class KeyVersion(Generic[S]):
    """One stored version of a key: the message that made it, and the state after it."""

    version: int
    message_id: str
    message_type: str
    now: datetime
    state: S


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one message: its receive's final state, as a status."""

    message: Message
    status: Status
    version: int | None
    outputs: tuple[Message, ...] = ()
    reason: str | None = None
    error: BaseException | None = field(default=None, compare=False)
    #: The key's later messages must wait for this one: it is faulted (in
    #: doubt), or abandoned by a failing handler (or after one). A caller that
    #: hands a key's messages over in several batches stops the key there too.
    stops_key: bool = False
    #: Why, as data (see :data:`OutcomeKind`); when not given, the status's
    #: own (``abandoned``: ``failed``).
    kind: OutcomeKind = None  # type: ignore[assignment]  # set from status below

    def __post_init__(self) -> None:
        if cast("OutcomeKind | None", self.kind) is None:
            object.__setattr__(self, "kind", _KIND_OF[self.status])

    @property
    def message_id(self) -> str:
        return self.message.id


@dataclass(slots=True)
class ProcessorStats:
    """Counters since the processor was made (it updates them under a lock)."""

    messages: int = 0
    completed: int = 0
    duplicates: int = 0
    abandoned: int = 0
    faulted: int = 0
    outputs: int = 0
    conflicts_retried: int = 0

    def count(self, outcome: Outcome) -> None:
        """Add one outcome (a faulted message's outputs are not counted)."""
        self.outputs += len(outcome.outputs) if outcome.status != "faulted" else 0
        if outcome.status == "completed":
            self.completed += 1
        elif outcome.status == "duplicate":
            self.duplicates += 1
        elif outcome.status == "abandoned":
            self.abandoned += 1
        else:
            self.faulted += 1


@dataclass(slots=True)
class Step:
    """One message of a batch as the fold decided it, before it is an outcome."""

    message: Message
    status: Status
    version: int | None = None
    outputs: tuple[Message, ...] = ()
    error: BaseException | None = None
    dispatch: bool = False  # outbox: outputs to mark dispatched after publishing
    stops_key: bool = False  # abandoned by a failing handler, or after one
    kind: OutcomeKind | None = None  # an abandoned step's (None: ``failed``)
    #: Its outputs may carry tokens: a message stored now (then only if the
    #: processor sends them), or a duplicate whose original was stored with
    #: them; False for every other, so that it re-sends what went out.
    tokens: bool = False


@dataclass(slots=True)
class Plan:
    """A batch folded over one header: a step per message, and the events to write."""

    steps: list[Step]
    events: list[EventData]


#: What a stored duplicate resolved to: its step, or why it cannot be replayed.
Found = Step | BaseException


def held(message: Message, stopped: Outcome) -> Step:
    """A message after ``stopped`` (a failure that stops its key) in a later
    chunk: abandoned, with the reason a message after it in one chunk gets."""
    key = stopped.message.key
    if stopped.kind in ("faulted", "held"):
        reason = (
            f"not processed: an earlier message {stopped.message_id!r} of key {key!r} "
            "is faulted (in doubt)"
            if stopped.kind == "faulted"
            else str(stopped.reason)
        )
        return Step(message, "abandoned", error=HandlerError(reason), stops_key=True, kind="held")
    if stopped.kind == "stopped":
        reason = str(stopped.reason)
    else:
        reason = f"an earlier message of key {key!r} failed: {stopped.reason}"
    return Step(message, "abandoned", error=HandlerError(reason), stops_key=True, kind="stopped")


def utcnow() -> datetime:
    return datetime.now(UTC)


def checked_now(clock: Callable[[], datetime]) -> datetime:
    """The clock in UTC: a replay compares what the first run stored, in UTC."""
    now = clock()
    if not isinstance(now, datetime) or now.utcoffset() is None:
        raise ValueError(
            f"the processor's clock returned a naive datetime {now!r}; "
            "give a clock with a time zone, such as lambda: datetime.now(UTC)"
        )
    return now.astimezone(UTC)


def outcome_of(step: Step, fault: BaseException | None) -> Outcome:
    """A step's outcome, through the receive state machine of its message."""
    receive = Receive(step.message.id)
    if fault is not None and step.status != "abandoned":
        receive.fault(f"{type(fault).__name__}: {fault}")
        outcome = Outcome(
            step.message, "faulted", step.version, step.outputs, receive.reason, fault, True
        )
    elif step.status == "abandoned":
        receive.abandon(str(step.error))
        outcome = Outcome(
            step.message, "abandoned", None, (), receive.reason, step.error, step.stops_key,
            step.kind or "failed",
        )  # fmt: skip
    else:
        receive.complete()
        reason = CONSUMED if step.kind == "consumed" else None
        outcome = Outcome(
            step.message, step.status, step.version, step.outputs, reason,
            kind=step.kind or _KIND_OF[step.status],
        )  # fmt: skip
    assert receive.state in (ReceiveState.COMPLETED, ReceiveState.ABANDONED, ReceiveState.FAULTED)
    return outcome
