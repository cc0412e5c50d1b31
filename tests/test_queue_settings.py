"""A queue consumer's settings: each refusal names the bad value, the bounds
are taken, and the defaults are the documented ones."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from azure.data.tables import TableClient
from azure.storage.queue import QueueClient

from handlers import InMemoryPublisher, Processor, QueueConsumer
from tests.queueing import tally


def test_invalid_settings_name_the_bad_value(table: TableClient, queue: QueueClient) -> None:
    processor = Processor(tally, table, InMemoryPublisher())
    minute, week = timedelta(minutes=1), 7 * 24 * 3600
    refusals: list[tuple[dict[str, Any], str]] = [
        ({"page_size": 33}, "page_size must be at most 32, got 33"),
        ({"visibility_timeout": 0}, "visibility_timeout must be an int >= 1, got 0"),
        ({"visibility_timeout": week + 1}, f"visibility_timeout must be at most {week}, got "
                                           f"{week + 1}"),
        ({"max_dequeue_count": 0}, "max_dequeue_count must be an int >= 1, got 0"),
        ({"workers": True}, "workers must be an int >= 1, got True"),
        ({"backoff": -minute}, "need 0 <= backoff <= max_backoff, got -1 day, 23:59:00 and "
                               "0:01:00"),
        ({"backoff": 2 * minute}, "need 0 <= backoff <= max_backoff, got 0:02:00 and 0:01:00"),
        ({"sent_at": "sent"}, "sent_at must be 'produced', 'inserted_on' or None, got 'sent'"),
    ]  # fmt: skip
    for settings, refusal in refusals:
        with pytest.raises(ValueError, match=f"^{re.escape(refusal)}$"):
            QueueConsumer(processor, queue, **settings)
    # The bounds themselves are taken, and the defaults are the documented ones.
    QueueConsumer(processor, queue, max_dequeue_count=1, workers=1, backoff=minute,
                  visibility_timeout=week, sent_at="inserted_on")  # fmt: skip
    default = QueueConsumer(processor, queue)
    assert (default.visibility_timeout, default.max_dequeue_count, default.page_size,
            default.workers) == (30, 5, 32, 8)  # fmt: skip
