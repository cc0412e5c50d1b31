"""The demo's clean reference: the handlers runtime alone, without Spark,
every distinct message once, each key's in the order the job applies them,
into a table of its own. Whatever Spark repeated, the job's stored states
and outputs must be these."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from azure.data.tables import TableClient

from handlers import InMemoryPublisher, Message, Processor
from handlers.examples import shooting_range

from .._tasks._rows import body_json

__all__ = ["OUTPUT", "clean_run", "output_rows", "read_rows", "stored_states"]

#: Keys are independent: this many at once, each key's messages in order on one thread.
_THREADS = 8

#: An output message as the check compares it: the columns the job writes
#: for it, but its produced time (when its source was first processed).
OUTPUT = ("message_id", "key", "type", "body", "source_message_id", "source_key", "due")


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The input's JSON lines, in file order."""
    with path.open() as lines:
        return [json.loads(line) for line in lines]


def output_rows(rows: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
    """Output rows (a job's, or a task's result rows of kind output) as sorted tuples."""
    return sorted(tuple(row[name] for name in OUTPUT) for row in rows)


def clean_run(
    rows: list[dict[str, Any]], table: TableClient, strategy: str
) -> list[tuple[Any, ...]]:
    """Process each distinct message of ``rows`` once, key by key, in the
    order of its first copy (the order the job applies a key's messages in);
    return the outputs as :func:`output_rows` gives them."""
    keys: dict[str, dict[str, Message]] = {}
    for row in rows:
        body = json.loads(row["body"]) if row["body"] is not None else None
        message = Message(row["message_id"], row["key"], row["type"], body)
        keys.setdefault(row["key"], {}).setdefault(message.id, message)
    local = threading.local()

    def process(key: str) -> list[dict[str, Any]]:
        if not hasattr(local, "processor"):
            local.processor = _processor(table, strategy)
        outputs = []
        for outcome in local.processor.process_batch(key, list(keys[key].values())):
            if outcome.status != "completed":
                raise RuntimeError(f"the clean run's {outcome.message_id!r}: {outcome.status}")
            outputs += [
                {"message_id": out.id, "key": out.key, "type": out.type,
                 "body": body_json(out.body), "source_message_id": outcome.message_id,
                 "source_key": key, "due": out.due}
                for out in outcome.outputs
            ]  # fmt: skip
        return outputs

    with ThreadPoolExecutor(_THREADS) as pool:
        return output_rows(row for outputs in pool.map(process, keys) for row in outputs)


def stored_states(table: TableClient, keys: Sequence[str], strategy: str) -> dict[str, Any]:
    """Each key's stored version and state."""
    reader = _processor(table, strategy)
    with ThreadPoolExecutor(_THREADS) as pool:
        return dict(zip(keys, pool.map(_state, [reader] * len(keys), keys), strict=True))


def _state(reader: Processor[Any], key: str) -> tuple[int, Any]:
    loaded = reader.current_state(key)
    return loaded.version, loaded.state


def _processor(table: TableClient, strategy: str) -> Processor[Any]:
    return Processor(shooting_range, table, InMemoryPublisher(), strategy=strategy)  # type: ignore[arg-type]
