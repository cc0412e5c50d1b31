"""A worker of the queue chaos mode: a :class:`QueueConsumer` over the ledger,
its outputs on a queue. The coordinator kills it by its PID at any moment.

    python -m tests.chaos.queue_worker TABLE IN_QUEUE OUT_QUEUE SEED RENEW VISIBILITY

Some handler runs outlast the lock (``VISIBILITY`` seconds): with ``RENEW``
0 the lock is lost and another worker receives the message meanwhile.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import sys
import threading
import time
from datetime import timedelta

from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import Processor, QueueConsumer, QueueOutcome, QueuePublisher
from streamstone_py import WireTableClient

from . import ledger as ledger_module

#: Share of handler runs that sleep past the lock.
SLOW_SHARE = 0.03


def main() -> None:
    table_name, in_name, out_name, seed, renew, visibility = sys.argv[1:]
    lock = int(visibility)
    picks = random.Random(int(seed))
    picking = threading.Lock()

    def sometimes_slow() -> None:
        with picking:
            slow = picks.random() < SLOW_SHARE
            pause = picks.uniform(lock * 0.8, lock * 1.8)
        if slow:
            time.sleep(pause)

    ledger_module._in_handler = sometimes_slow  # the hook the ledger calls in its handler
    logging.basicConfig(level=logging.ERROR)
    connection = os.environ["STREAMSTONE_CONNECTION_STRING"]
    table = WireTableClient.from_connection_string(connection, table_name)
    service = QueueServiceClient.from_connection_string(connection)
    publisher = QueuePublisher(service, lambda m: out_name)
    processor = Processor(ledger_module.ledger, table, publisher)
    queue = QueueClient.from_connection_string(connection, in_name)
    told = open(os.environ["CHAOS_OUTCOMES"], "a", buffering=1)  # noqa: SIM115 (until killed)
    writing = threading.Lock()

    def tell(outcome: QueueOutcome) -> None:
        """Each message not completed, as it happens: a killed worker told it already."""
        if outcome.action in ("abandoned", "faulted", "poisoned"):
            line = {"action": outcome.action, "id": outcome.message_id,
                    "receive": outcome.dequeue_count, "reason": outcome.reason}  # fmt: skip
            with writing:
                told.write(json.dumps(line) + "\n")

    consumer = QueueConsumer(
        processor, queue, visibility_timeout=lock, renew_locks=renew == "1", workers=4,
        backoff=timedelta(seconds=1), max_backoff=timedelta(seconds=4), on_outcome=tell,
    )  # fmt: skip
    with consumer.stop_on_signals():
        stats = consumer.run(idle_wait=0.2)
    report = os.environ.get("CHAOS_STATS")
    if report:  # a worker that stops gracefully tells what it saw (a killed one cannot)
        with open(report, "a") as out:
            out.write(json.dumps(dataclasses.asdict(stats)) + "\n")


if __name__ == "__main__":
    main()
