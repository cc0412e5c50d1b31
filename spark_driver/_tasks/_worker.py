"""What a Python worker keeps across the tasks it runs: one table client per
account and table, the count of its storage requests, its header cache, and
its storage breaker."""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any, Literal

from azure.data.tables import TableClient

from handlers import Breaker, HeaderCache
from streamstone_py import TableConfig

__all__ = ["header_cache", "request_count", "storage", "table_client"]

_log = logging.getLogger(__name__)

_lock = threading.Lock()
#: Keyed by the whole configuration (account, credentials, table), not by the
#: table name alone: two accounts may hold tables of the same name.
_clients: dict[TableConfig, TableClient] = {}


class _RequestCount:
    """The HTTP requests this worker's table clients send, retries included."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def __call__(self, request: Any) -> None:
        with self._lock:
            self.value += 1


#: A Python worker runs one task at a time: a task's requests are the difference.
request_count = _RequestCount()
#: The headers this Python worker wrote or read, for every task it runs (a
#: reused worker keeps it warm across tasks and micro-batches).
header_cache = HeaderCache()
#: This worker's storage breaker (queue input): its keys pause together while
#: storage is away, and it says once when storage goes and once when it comes back.
storage = Breaker("storage", "the task's keys pause", log=logging.getLogger(__name__))


def table_client(
    table: str, transport: Literal["wire", "sdk"] = "wire", concurrency: int = 8
) -> TableClient:
    """This worker's client for ``table``, made once from the worker's
    environment; its connections sized for ``concurrency`` keys in flight."""
    config = TableConfig.from_env(table_name=table, transport=transport)
    with _lock:
        client = _clients.get(config)
        if client is None:
            # Each key in flight may read a header beside its events: two each,
            # and never fewer than the wire client's own default.
            pool = max(32, 2 * concurrency)
            client = config.table_client(raw_request_hook=request_count, connection_pool_size=pool)
            # Which build a worker runs, for an operator reading executor logs.
            _log.info("worker %d: %s table client for %r (spark_driver at %s, Python at %s)",
                      os.getpid(), transport, table, __file__, sys.prefix)  # fmt: skip
            _clients[config] = client
        return client
