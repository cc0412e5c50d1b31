"""Azurite's own Queue service as a queue grows: the emulator's limits, apart
from the code's.

For each depth (100, 1,000 and 10,000 messages; 100, 1,000 and 3,000 with
``--quick``) a fresh queue is filled to that depth (not timed), then, in
rounds: one receive request of 32 messages (timed), a delete of each of
them one request at a time (each timed; one answered 404 MessageNotFound,
the message gone, is logged and timed as a delete: a full run met one at
10,000 deep), and 32 new messages sent (not
timed), so the queue holds the same number of messages throughout. Every
request is the SDK's (``QueueClient``), one at a time, so the figures are
the service's answer time plus the client's own per request, which does not
depend on the depth.

- ``azurite.queue.receive``: milliseconds per receive request of 32 at each
  depth, beside the same at 100 deep (the peer);
- ``azurite.queue.delete``: milliseconds per delete at each depth, beside
  the same at 100 deep.

Each depth starts once Azurite's processes are idle (a sweep of its queue
store, a minute after the last, costs seconds of CPU per thousand messages
sent since, and would be charged to whatever runs meanwhile). Run:
``python benchmarks/bench_azurite_queue.py [--quick]``.
"""

from __future__ import annotations

import base64
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from _common import account, check, emit, log, quick
from _queue_meter import Servers
from azure.core.exceptions import ResourceNotFoundError
from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import Message, encode_envelope

PAGE = 32


def texts(n: int, start: int = 0) -> list[str]:
    return [
        base64.b64encode(encode_envelope(Message(f"m-{i}", f"k-{i}", "Add")).encode()).decode()
        for i in range(start, start + n)
    ]


def fill(queue: QueueClient, items: list[str]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(queue.send_message, items))


def at_depth(
    service: QueueServiceClient, depth: int, rounds: int
) -> tuple[list[float], list[float]]:
    """Milliseconds of each receive request and of each delete, the queue
    holding ``depth`` messages throughout."""
    queue = service.create_queue(f"depth-{uuid.uuid4().hex[:10]}")
    fill(queue, texts(depth))
    held = queue.get_queue_properties().approximate_message_count
    check(held == depth, f"the queue holds {held} of {depth} messages")
    receives: list[float] = []
    deletes: list[float] = []
    sent = depth
    for _ in range(rounds):
        start = time.perf_counter()
        page = list(
            next(
                queue.receive_messages(
                    messages_per_page=PAGE, max_messages=PAGE, visibility_timeout=300
                ).by_page(),
                [],
            )
        )
        receives.append(1000 * (time.perf_counter() - start))  # fmt: skip
        check(len(page) == min(PAGE, depth), f"a receive at {depth} deep took {len(page)}")
        for message in page:
            start = time.perf_counter()
            try:
                queue.delete_message(message.id, message.pop_receipt)
            except ResourceNotFoundError:  # seen once at 10,000 deep, cause not established
                log(f"a delete at {depth:,} deep was answered 404 MessageNotFound: counted")
            deletes.append(1000 * (time.perf_counter() - start))
        fill(queue, texts(len(page), sent))  # as deep as before
        sent += len(page)
    held = queue.get_queue_properties().approximate_message_count
    check(held == depth, f"the queue holds {held} of {depth} messages after the rounds")
    queue.delete_queue()
    return receives, deletes


def main() -> int:
    small = quick(__doc__)
    depths, rounds = ((100, 1_000, 3_000), 8) if small else ((100, 1_000, 10_000), 20)
    with account(queues=True) as connection_string:
        service = QueueServiceClient.from_connection_string(connection_string)
        servers = Servers(connection_string)
        at_depth(service, 100, 2)  # warm-up
        measured: dict[int, tuple[list[float], list[float]]] = {}
        for depth in depths:
            servers.settle()
            measured[depth] = at_depth(service, depth, rounds)
            receives, deletes = measured[depth]
            log(f"{depth:,} deep: receive {statistics.median(receives):.1f} ms, "
                f"delete {statistics.median(deletes):.1f} ms (medians)")  # fmt: skip
    base_receives, base_deletes = measured[depths[0]]
    for depth in depths:
        receives, deletes = measured[depth]
        params = {"depth": depth, "page": PAGE, "rounds": rounds}
        emit("azurite.queue.receive", "ms/request", "lower", receives,
             f"the same at {depths[0]} deep", base_receives, params)  # fmt: skip
        emit("azurite.queue.delete", "ms/request", "lower", deletes,
             f"the same at {depths[0]} deep", base_deletes, params)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
