"""A queue worker the tests kill: it consumes a queue with the Tally handler,
publishes each output to a queue, then writes a marker file and hangs, as
a process would that dies after its state is stored and before its delete.

    python tests/queue_worker.py TABLE QUEUE OUTPUT_QUEUE MARKER
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from azure.storage.queue import QueueClient, QueueServiceClient

from handlers import Message, Processor, QueueConsumer, QueuePublisher
from streamstone_py import WireTableClient
from tests.queueing import tally


class HangAfterPublishing:
    def __init__(self, publisher: QueuePublisher, marker: Path) -> None:
        self.publisher, self.marker = publisher, marker

    def publish(self, messages: Sequence[Message]) -> None:
        self.publisher.publish(messages)
        self.marker.touch()
        time.sleep(3600)


def main() -> None:
    table_name, queue_name, out, marker = sys.argv[1:]
    connection = os.environ["STREAMSTONE_CONNECTION_STRING"]
    table = WireTableClient.from_connection_string(connection, table_name)
    publisher = QueuePublisher(QueueServiceClient.from_connection_string(connection), lambda m: out)
    processor = Processor(tally, table, HangAfterPublishing(publisher, Path(marker)))
    queue = QueueClient.from_connection_string(connection, queue_name)
    QueueConsumer(processor, queue, visibility_timeout=2).run()


if __name__ == "__main__":
    main()
