"""What the driver sends to executors: names and choices, never secrets."""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from handlers import Handler

__all__ = ["JobSettings", "parse_duration", "resolve_handler"]

#: The Spark master when neither the caller nor a launcher chose one.
LOCAL_MASTER = "local[2]"

#: Spark's (the JVM's) log levels, as ``SparkContext.setLogLevel`` names them.
SPARK_LOG_LEVELS = ("ERROR", "WARN", "INFO", "DEBUG")

#: Short names of the handlers that ship with the project.
BUILTIN_HANDLERS = {
    "shooting_range": "handlers.examples:shooting_range",
    "leader_board": "handlers.examples:leader_board",
    "orders": "handlers.examples:orders",
}


def resolve_handler(spec: str) -> Handler[Any]:
    """A handler from a short name or ``package.module:attribute``."""
    target = BUILTIN_HANDLERS.get(spec, spec)
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise ValueError(
            f"handler {spec!r} is neither a built-in ({', '.join(BUILTIN_HANDLERS)}) "
            "nor 'package.module:attribute'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"handler {spec!r}: cannot import {module_name!r} ({exc})") from None
    if not hasattr(module, attribute):
        handlers = sorted(n for n, v in vars(module).items() if isinstance(v, Handler))
        known = f"; its handlers: {', '.join(handlers)}" if handlers else ""
        raise ValueError(
            f"handler {spec!r}: module {module_name!r} has no attribute {attribute!r}{known}"
        )
    found = getattr(module, attribute)
    if not isinstance(found, Handler):
        raise ValueError(
            f"handler {spec!r}: {attribute!r} is a {type(found).__name__}, not a "
            "handlers.Handler (declare it with @handler or subclass Handler)"
        )
    return found


@dataclass(frozen=True, slots=True)
class JobSettings:
    """Pickled into every task. Credentials are not in it: each executor reads
    them from its own environment (``STREAMSTONE_CONNECTION_STRING``, or
    ``STREAMSTONE_ACCOUNT_URL`` with ``STREAMSTONE_SAS_TOKEN`` or a managed
    identity), so no secret travels in a closure, a plan or a log."""

    table: str
    handler: str
    strategy: Literal["state", "outbox"] = "state"
    fail_fast: bool = False
    #: Messages of one key folded and written together (``Processor(max_batch=...)``).
    batch_size: int = 500
    max_attempts: int = 10
    #: Python logging level in the workers (the Azure SDK logs requests at DEBUG).
    log_level: str | None = None
    #: Keys in flight at once inside one task, each on its own thread.
    concurrency: int = 8
    #: Keep each worker's stream headers between batches (see handlers.HeaderCache).
    header_cache: bool = True
    #: Retention right after each key's batch, in the same task (None: never):
    #: keep the last N versions, and/or those processed within this long. The
    #: versions the batch itself touched always stay until a later run.
    keep_last: int | None = None
    retain_for: timedelta | None = None
    #: Cut a key only once this many versions can go: fewer, larger cuts
    #: (retention's requests come once per cut, not once per batch).
    retain_at_least: int = 1
    #: How new states and outbox outputs are stored (see handlers.Processor).
    compression: Literal["zlib"] | None = None
    #: The input column with each message's sent time (a timestamp, or
    #: ISO-8601 text with a zone), such as a broker's enqueued time. With it, a
    #: message sent before what retention removed is refused as late and
    #: dead-lettered, never applied again; a row without a time is dead-lettered.
    sent_at: str | None = None
    #: How the executors' storage requests travel: ``"wire"`` (spoken by the
    #: engine, the default) or ``"sdk"`` (azure-data-tables' own, the reference).
    transport: Literal["wire", "sdk"] = "wire"
    #: Where the messages come from. ``"queue"`` (set by ``run_queue``): a
    #: queue keeps no order, so a key's messages that a failing one stopped
    #: are handled again at once without it, and a task waits out a storage
    #: outage (pausing, then trying again) instead of leaving messages faulted.
    source: Literal["files", "queue"] = "files"
    #: What an input's trace context is to its spans (``Processor(trace_context=...)``).
    trace_context: Literal["parent", "link"] = "parent"
    #: Outputs to the handler's own keys carry a token (``Processor(tokens=True)``;
    #: the state strategy, and a handler that names its types); marked
    #: dispatched by the driver once the outputs are committed.
    tokens: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int):
            raise TypeError(f"concurrency must be an int, got {self.concurrency!r}")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if (
            isinstance(self.batch_size, bool)
            or not isinstance(self.batch_size, int)
            or self.batch_size < 1
        ):
            raise ValueError(f"batch_size must be an int >= 1, got {self.batch_size!r}")
        if self.keep_last is not None and (
            isinstance(self.keep_last, bool)
            or not isinstance(self.keep_last, int)
            or self.keep_last < 0
        ):
            raise ValueError(f"keep_last must be an int >= 0, got {self.keep_last!r}")
        if self.retain_for is not None and (
            not isinstance(self.retain_for, timedelta) or self.retain_for < timedelta(0)
        ):
            raise ValueError(f"retain_for must be a timedelta >= 0, got {self.retain_for!r}")
        if (
            isinstance(self.retain_at_least, bool)
            or not isinstance(self.retain_at_least, int)
            or self.retain_at_least < 1
        ):
            raise ValueError(f"retain_at_least must be an int >= 1, got {self.retain_at_least!r}")
        if self.compression not in (None, "zlib"):
            raise ValueError(f"compression must be None or 'zlib', got {self.compression!r}")
        if self.transport not in ("wire", "sdk"):
            raise ValueError(f"transport must be 'wire' or 'sdk', got {self.transport!r}")
        if self.trace_context not in ("parent", "link"):
            given = self.trace_context
            raise ValueError(f"trace_context must be 'parent' or 'link', got {given!r}")
        if self.source not in ("files", "queue"):
            raise ValueError(f"source must be 'files' or 'queue', got {self.source!r}")
        if not isinstance(self.tokens, bool):
            raise ValueError(f"tokens must be True or False, got {self.tokens!r}")
        if self.tokens and self.strategy != "state":
            raise ValueError(f"tokens need the state strategy, got {self.strategy!r}")
        if self.sent_at is not None and (not isinstance(self.sent_at, str) or not self.sent_at):
            raise ValueError(f"sent_at must be a column name, got {self.sent_at!r}")

    @property
    def retains(self) -> bool:
        """Whether each key's batch is followed by retention."""
        return self.keep_last is not None or self.retain_for is not None


_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_duration(text: str) -> timedelta:
    """``"7d"``, ``"36h"``, ``"1h30m"``, ``"90s"``: days, hours, minutes, seconds."""
    found = _DURATION.fullmatch(text.strip())
    if not text.strip() or found is None:
        raise ValueError(
            f"duration {text!r} is not like 7d, 36h, 1h30m or 90s (days, hours, minutes, seconds)"
        )
    days, hours, minutes, seconds = (int(g) if g else 0 for g in found.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
