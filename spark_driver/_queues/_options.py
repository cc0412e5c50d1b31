"""The queue source's options (``spark.readStream.format("azure-queue")``),
each checked, in a module that needs no PySpark 4 to be imported."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from ._config import MAX_HIDDEN, check_input_queue

__all__ = ["NAME", "QueueOptions"]

#: The format name: ``spark.readStream.format("azure-queue").option("queue", ...)``.
NAME: Final = "azure-queue"

#: Each ``readStream`` option, and the :class:`QueueOptions` field it sets.
_OPTIONS: Final = {
    "queue": "queue",
    "maxMessagesPerBatch": "max_messages",
    "visibilityTimeout": "visibility_timeout",
    "maxDequeueCount": "max_dequeue_count",
    "numPartitions": "partitions",
    "table": "table",
    "handler": "handler",
    "transport": "transport",
}
_TEXTS: Final = ("queue", "table", "handler", "transport")


@dataclass(frozen=True)
class QueueOptions:
    """The source's options; each also a ``readStream`` option (camel case)."""

    queue: str
    #: At most this many messages per micro-batch, received 32 at a time.
    max_messages: int = 1000
    #: Seconds each message stays hidden once received: the lock, which
    #: must outlast a micro-batch (or the message comes again meanwhile).
    visibility_timeout: int = 300
    #: A message received more often than this without being completed is
    #: poisoned, unless the job's table (``table`` and ``handler``) holds it.
    max_dequeue_count: int = 5
    #: How many partitions each batch's messages are cut into (in their order).
    partitions: int = 4
    #: The job's table and its handler's name (``Handler.name``), where a
    #: message received too often is looked up: one stored is processed (a
    #: duplicate: completed) rather than poisoned. ``run_queue`` sets them.
    table: str | None = None
    handler: str | None = None
    #: How the look-up reaches the table: ``"wire"`` or ``"sdk"`` (as ``JobSettings``).
    transport: Literal["wire", "sdk"] = "wire"

    def __post_init__(self) -> None:
        check_input_queue(self.queue)
        for name, low, high in (
            ("max_messages", 1, None),
            ("visibility_timeout", 1, MAX_HIDDEN),
            ("max_dequeue_count", 1, None),
            ("partitions", 1, None),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
            if high is not None and value > high:
                raise ValueError(f"{name} must be at most {high}, got {value}")
        if (self.table is None) != (self.handler is None):
            raise ValueError(
                f"options table and handler go together, got table={self.table!r} and "
                f"handler={self.handler!r}"
            )
        if self.transport not in ("wire", "sdk"):
            raise ValueError(f"transport must be 'wire' or 'sdk', got {self.transport!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> QueueOptions:
        """From a reader's string options, their names in any case."""
        known = {option.lower(): name for option, name in _OPTIONS.items()}
        given = {str(k).lower(): v for k, v in options.items()}
        unknown = sorted(set(given) - set(known) - {"path"})
        if unknown:
            raise ValueError(f"unknown {NAME} options {unknown}; it takes {list(_OPTIONS)}")
        if "queue" not in given:
            raise ValueError(f'the {NAME} source needs .option("queue", NAME)')
        values: dict[str, Any] = {}
        for option, name in known.items():
            if option not in given:
                continue
            if name in _TEXTS:
                values[name] = given[option]
                continue
            try:
                values[name] = int(given[option])
            except ValueError:
                raise ValueError(
                    f"option {option} must be an integer, got {given[option]!r}"
                ) from None
        return cls(**values)

    def options(self) -> dict[str, str]:
        """The ``readStream`` options that give these."""
        return {
            option: str(getattr(self, name))
            for option, name in _OPTIONS.items()
            if getattr(self, name) is not None
        }
