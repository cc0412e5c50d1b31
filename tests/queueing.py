"""What the queue tests share: the Tally handler, sending envelopes, and
reading a queue's poison entries and a processor's states."""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import HandlerContext, Message, PoisonEntry, Processor, encode_envelope, handler
from tests.helpers import drain

__all__ = [
    "Seen",
    "Tally",
    "add",
    "fixed_tally",
    "poison_of",
    "queue_text",
    "seen",
    "send",
    "states",
    "tally",
]


@dataclass
class Tally:
    total: int = 0
    seen: list[str] = field(default_factory=list)


@handler("Tally", Tally, types=["Add", "Slow", "Broken"])
def tally(state: Tally, message: Message, ctx: HandlerContext) -> None:
    body = message.body or {}
    if message.type == "Broken":
        raise RuntimeError(f"cannot add {body.get('n')!r}")
    if message.type == "Slow":
        time.sleep(body["seconds"])  # longer than the lock: no effect on the state
    state.total += body.get("n", 0)
    state.seen.append(message.id)
    ctx.publish("Added", {"total": state.total, "by": message.id})


@handler("Tally", Tally, types=["Add", "Slow", "Broken"])
def fixed_tally(state: Tally, message: Message, ctx: HandlerContext) -> None:
    """The Tally handler once fixed: a ``Broken`` message adds as ``Add`` does."""
    state.total += (message.body or {}).get("n", 0)
    state.seen.append(message.id)
    ctx.publish("Added", {"total": state.total, "by": message.id})


@dataclass
class Seen:
    ids: list[str] = field(default_factory=list)
    bodies: list[Any] = field(default_factory=list)
    dues: list[str | None] = field(default_factory=list)
    sent: list[str | None] = field(default_factory=list)


@handler("Seen", Seen, types=["Keep", "Added"])
def seen(state: Seen, message: Message, ctx: HandlerContext) -> None:
    """What a consumer received: each message's id, body, due and sent time, in order;
    its output ``Saw`` carries the body on."""
    state.ids.append(message.id)
    state.bodies.append(message.body)
    state.dues.append(None if message.due is None else message.due.isoformat())
    state.sent.append(message.headers.get("sent_at"))
    ctx.publish("Saw", {"body": message.body})


def queue_text(message: Message, *, plain: bool = False) -> str:
    """The envelope as a queue message's text, base64 as the SDK's default encodes it."""
    text = encode_envelope(message)
    return text if plain else base64.b64encode(text.encode()).decode()


def send(queue: QueueClient, message: Message, *, plain: bool = False) -> None:
    queue.send_message(queue_text(message, plain=plain))


def poison_of(queues: QueueServiceClient, queue: QueueClient) -> list[PoisonEntry]:
    try:
        return [
            PoisonEntry.decode(t)
            for t in drain(queues.get_queue_client(f"{queue.queue_name}-poison"))
        ]
    except ResourceNotFoundError:
        return []


def add(n: int, key: str, value: int, type: str = "Add", **body: object) -> Message:
    return Message(f"m-{n}", key, type, {"n": value, **body})


def states(processor: Processor[Tally], *keys: str) -> dict[str, tuple[int, Tally]]:
    found = {}
    for key in keys:
        current = processor.current_state(key)
        found[key] = (current.version, current.state)
    return found
