"""The seeded fault injector and the fault points it drives.

Every fault point asks :meth:`Injector.roll` whether to fail; the answers come
from one ``random.Random`` seeded per worker incarnation, so a seed fixes each
worker's fault schedule. Crashes are a ``BaseException`` (:class:`Crash`): no
code under test can catch them as an outcome, so they end the worker's work as
a killed process would. Storage faults are the ones a network gives: the
connection fails before the request is sent, or the request reaches Azurite
and is applied but its answer is lost.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar
from urllib.parse import urlsplit

import urllib3
from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.data.tables import TableClient

from handlers import Message, Publisher, StateStore
from streamstone_py import (
    EventData,
    Partition,
    RetryPolicy,
    Stream,
    StreamSlice,
    WireTableClient,
    WriteResult,
)
from streamstone_py._transport._wire._exchange import Answer, HttpCall

from ..faults import DelegatingTransport

P = ParamSpec("P")
R = TypeVar("R")

CRASH_BEFORE_CALL = "crash before a storage call"
CRASH_AFTER_CALL = "crash after a storage call"
CRASH_BEFORE_PUBLISH = "crash between store and publish"
CRASH_MID_PUBLISH = "crash halfway through publishing"
CRASH_IN_HANDLER = "crash inside the handler"
CRASH_IN_RETAIN = "crash during retention"
CONNECTION_ERROR = "connection error before sending"
RESPONSE_DROPPED = "response dropped after reaching Azurite"

KINDS = (
    CRASH_BEFORE_CALL,
    CRASH_AFTER_CALL,
    CRASH_BEFORE_PUBLISH,
    CRASH_MID_PUBLISH,
    CRASH_IN_HANDLER,
    CRASH_IN_RETAIN,
    CONNECTION_ERROR,
    RESPONSE_DROPPED,
)

#: Chance of each fault per opportunity, tuned so every kind fires often
#: without starving progress (a crash redelivers the rest of its chunk).
DEFAULT_RATES: dict[str, float] = {
    CRASH_BEFORE_CALL: 0.012,
    CRASH_AFTER_CALL: 0.012,
    CRASH_BEFORE_PUBLISH: 0.06,
    CRASH_MID_PUBLISH: 0.07,
    CRASH_IN_HANDLER: 0.025,
    # per request of a retain, so several requests into a truncation too
    CRASH_IN_RETAIN: 0.08,
    CONNECTION_ERROR: 0.02,
    RESPONSE_DROPPED: 0.02,
}


class Crash(BaseException):
    """The worker dies here."""

    def __init__(self, kind: str, where: str) -> None:
        super().__init__(f"{kind} ({where})")
        self.kind = kind


class Injector:
    """Seeded yes/no answers per fault point, and counts of what it injected.

    Each answer is a hash of the seed, the fault kind, the site (a store
    method, or a request's path and query) and how often that site was asked
    before, so it does not depend on the order in which threads ask. With one
    worker and no Azurite restart, a seed replays the same run.
    """

    def __init__(self, seed: int | str, rates: dict[str, float]) -> None:
        unknown = set(rates) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)!r}; known: {KINDS!r}")
        self.seed = str(seed)
        self.rates = rates
        self.counts: Counter[str] = Counter()
        #: Set while a retain runs: its requests may crash (CRASH_IN_RETAIN).
        self.retaining = False
        self._asked: Counter[tuple[str, str]] = Counter()
        # Parallel reads send from a thread pool.
        self._lock = threading.Lock()

    def roll(self, kind: str, site: str) -> bool:
        with self._lock:
            self._asked[kind, site] += 1
            n = self._asked[kind, site]
            token = f"{self.seed}\x00{kind}\x00{site}\x00{n}".encode()
            draw = int.from_bytes(hashlib.blake2b(token, digest_size=8).digest(), "big") / 2**64
            hit = draw < self.rates.get(kind, 0.0)
            if hit:
                self.counts[kind] += 1
            return hit

    def crash(self, kind: str, site: str) -> None:
        if self.roll(kind, site):
            raise Crash(kind, site)


class ChaosTransport(DelegatingTransport):
    """The real HTTP transport, failing before sending or losing answers."""

    def __init__(self, injector: Injector) -> None:
        super().__init__()
        self.injector = injector

    def send(self, request: Any, **kwargs: Any) -> Any:
        url = urlsplit(request.url)
        site = f"{request.method} {url.path}?{url.query}"  # not the port: it differs per run
        if self.injector.retaining:
            self.injector.crash(CRASH_IN_RETAIN, site)
        if self.injector.roll(CONNECTION_ERROR, site):
            raise ServiceRequestError("injected: connection failed before sending")
        response = self.inner.send(request, **kwargs)
        if self.injector.roll(RESPONSE_DROPPED, site):
            response.internal_response.close()  # Azurite answered, so it applied the request
            raise ServiceResponseError("injected: the response was lost")
        return response


class ChaosWireTableClient(WireTableClient):
    """The wire runner's client, failing as :class:`ChaosTransport` fails: its
    HTTP requests go out for real, and the same faults strike around them as
    the transports raise them (a connection reset; an answer lost after
    Azurite applied the request)."""

    def __init__(self, *args: Any, injector: Injector, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.injector = injector

    def _send(self, call: HttpCall, deadline: float | None) -> Answer:
        url = urlsplit(call.url)
        site = f"{call.method} {url.path}?{url.query}"  # not the port: it differs per run
        if self.injector.retaining:
            self.injector.crash(CRASH_IN_RETAIN, site)
        if self.injector.roll(CONNECTION_ERROR, site):
            raise ConnectionResetError(104, "injected: connection failed before sending")
        answer = super()._send(call, deadline)
        if self.injector.roll(RESPONSE_DROPPED, site):  # Azurite answered: it applied it
            raise urllib3.exceptions.ProtocolError("injected: the response was lost")
        return answer


#: The most rows one table transaction holds: a write of more is split.
MAX_TRANSACTION_ROWS = 99


class ChaosStore(StateStore):
    """The real store; the worker may die before or after any of its calls.

    It also counts the writes too large for one transaction (each event is an
    event row and an id row, plus its includes), since those are where a
    failure can leave part of a batch stored.
    """

    def __init__(
        self, table: TableClient, handler_name: str, retry: RetryPolicy, injector: Injector
    ) -> None:
        super().__init__(table, handler_name, retry)
        self.injector = injector
        self.splits = 0

    def _around(self, name: str, call: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        self.injector.crash(CRASH_BEFORE_CALL, name)
        result = call(*args, **kwargs)
        self.injector.crash(CRASH_AFTER_CALL, name)
        return result

    def open(self, partition: Partition) -> Stream | None:
        return self._around("open", super().open, partition)

    def find(self, partition: Partition, message_id: str) -> int | None:
        return self._around("find", super().find, partition, message_id)

    def read(self, partition: Partition, start_version: int, count: int) -> StreamSlice:
        return self._around("read", super().read, partition, start_version, count)

    def write(self, stream: Stream, events: Sequence[EventData]) -> WriteResult:
        rows = sum(2 + len(e.includes) for e in events)
        self.splits += rows > MAX_TRANSACTION_ROWS
        return self._around("write", super().write, stream, events)

    def outbox(self, partition: Partition, message_id: str) -> Any:
        return self._around("outbox", super().outbox, partition, message_id)

    def mark_dispatched(
        self, partition: Partition, message_ids: Sequence[str], **options: Any
    ) -> None:
        call = functools.partial(super().mark_dispatched, **options)
        self._around("mark_dispatched", call, partition, message_ids)

    def undispatched(self, partition: Partition) -> set[str]:
        return self._around("undispatched", super().undispatched, partition)

    def output_record(self, partition: Partition, id_digest: str) -> Any:
        return self._around("output_record", super().output_record, partition, id_digest)

    def delete_records(self, partition: Partition, id_digests: Sequence[str]) -> None:
        self._around("delete_records", super().delete_records, partition, id_digests)

    def delete_outbox(self, partition: Partition, message_ids: Sequence[str]) -> None:
        self._around("delete_outbox", super().delete_outbox, partition, message_ids)

    def set_properties(self, stream: Stream, properties: dict[str, Any]) -> Stream:
        return self._around("set_properties", super().set_properties, stream, properties)

    def truncate(self, stream: Stream, before_version: int) -> Stream:
        return self._around("truncate", super().truncate, stream, before_version)


class FilePublisher(Publisher):
    """Appends every published message to a file, one ``write`` per publication.

    A publication is out once ``publish`` returns (or dies halfway), as with a
    broker: the bytes are in the kernel even if the process is killed next.
    """

    def __init__(self, path: str, injector: Injector) -> None:
        self.path = path
        self.injector = injector

    def publish(self, messages: Sequence[Message]) -> None:
        self.injector.crash(CRASH_BEFORE_PUBLISH, "publish")
        if self.injector.roll(CRASH_MID_PUBLISH, "publish"):
            self._append(messages[: len(messages) // 2])
            raise Crash(CRASH_MID_PUBLISH, f"after {len(messages) // 2} of {len(messages)}")
        self._append(messages)

    def _append(self, messages: Sequence[Message]) -> None:
        if not messages:
            return
        lines = "".join(json.dumps(m.encode().hex()) + "\n" for m in messages)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
