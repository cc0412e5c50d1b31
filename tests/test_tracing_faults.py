"""Storage spans where real faults happen, on a real socket (the proxy): a
span per try with its resend count and error, none left open by a request
that raised or a task cancelled mid-request, and no SAS signature in the
spans of a request the service refused."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
import uuid
from typing import Any, cast

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.core.exceptions import HttpResponseError, ServiceResponseError
from azure.data.tables import (
    AccountSasPermissions,
    ResourceTypes,
    TableClient,
    generate_account_sas,
)
from azure.data.tables.aio import TableClient as AsyncTableClient
from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from azurite.proxy import Action, Proxy, Request
from streamstone_py import EventData, Partition, RetryPolicy, Stream, WireTableClient
from streamstone_py import aio as streams
from tests.helpers import S, wait
from tests.test_wire_credentials import ACCOUNT, _endpoint, _key
from tests.tracing import texts_of


class _Open(SpanProcessor):
    """The names of the spans started and not ended, by span id."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def on_start(self, span: Span, parent_context: context.Context | None = None) -> None:
        self.names[span.get_span_context().span_id] = span.name

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self.names.pop(span.context.span_id)


def _watch_open_spans() -> _Open:
    watch = _Open()
    cast(TracerProvider, trace.get_tracer_provider()).add_span_processor(watch)
    return watch


def _tries(spans: InMemorySpanExporter) -> list[tuple[Any, ...]]:
    """Each try's operation, status, error type and resend count; then forgotten."""
    keys = ("http.response.status_code", "error.type", "http.request.resend_count")
    made = spans.get_finished_spans()
    spans.clear()
    return [(s.name.split()[0], *[(s.attributes or {}).get(k) for k in keys]) for s in made]


def test_each_try_through_a_faulty_socket_is_a_span_and_none_is_left_open(
    proxied_client: Any, proxy: Proxy, spans: InMemorySpanExporter
) -> None:
    still_open = _watch_open_spans()
    proxy.retry_after = 0
    policy = RetryPolicy(attempts=3, initial_delay=0.001, max_delay=0.01, total_time=0.6)
    partition = Partition(proxied_client, "busy-" + uuid.uuid4().hex[:8], retry=policy)

    S.write(Stream(partition), EventData(id="e1"))
    spans.clear()
    throttled: list[Request] = []

    def header_throttled_once(request: Request) -> Action:
        if not throttled and b"SS-HEAD" in request.head:
            throttled.append(request)
            return "throttle"
        return "pass"

    proxy.plan(header_throttled_once)
    assert [e.id for e in S.read(partition).events] == ["e1"]  # 503 on the header's read
    assert sorted(_tries(spans), key=str) == [
        ("get_entity", 200, None, 1),
        ("get_entity", 503, "ServerBusy", None),
        ("query_entities", 200, None, None),
    ]

    proxy.plan(lambda request: "hang")
    with pytest.raises(ServiceResponseError):  # a timeout (the wire's, loaded: a broken read)
        S.read(partition)
    tries = _tries(spans)
    assert {(name, status) for name, status, _, _ in tries} <= {
        ("get_entity", None),
        ("query_entities", None),
    }
    assert {error for _, _, error, _ in tries} <= {
        "azure.core.exceptions.ServiceResponseTimeoutError",
        "azure.core.exceptions.ServiceResponseError",
    }

    if isinstance(proxied_client, AsyncTableClient):  # a task cancelled amid its request

        async def cancelled() -> None:
            task = asyncio.ensure_future(streams.Stream.read(partition))
            await asyncio.sleep(0.1)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        wait(cancelled())
        cut = {name for name, *_ in _tries(spans)}
        assert cut
        assert cut <= {"get_entity", "query_entities"}
    # A read sent beside the one that failed may still be waiting for its
    # answer when the verb raises: its span ends with it, by the call's deadline.
    ends = time.monotonic() + policy.total_time + 2
    while still_open.names and time.monotonic() < ends:
        time.sleep(0.05)
    assert still_open.names == {}


@pytest.mark.parametrize("kind", [TableClient, WireTableClient], ids=["sdk", "wire"])
def test_no_sas_signature_in_the_spans_of_a_request_refused(
    kind: type[TableClient], connection_string: str, table: TableClient, spans: InMemorySpanExporter
) -> None:
    expired = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    token = generate_account_sas(
        AzureNamedKeyCredential(ACCOUNT, _key(connection_string)),
        resource_types=ResourceTypes(service=True, container=True, object=True),
        permission=AccountSasPermissions(read=True, add=True, update=True, delete=True),
        expiry=expired,
    )
    signature = token.split("sig=")[1].split("&")[0]
    client = kind(
        _endpoint(connection_string), table.table_name, credential=AzureSasCredential(token)
    )
    with client, pytest.raises(HttpResponseError) as refused:
        Stream.write(Stream(Partition(client, "k-" + uuid.uuid4().hex[:8])), EventData(id="a"))

    assert refused.value.status_code == 403
    made = spans.get_finished_spans()
    assert [(s.name.split()[0], (s.attributes or {}).get("error.type")) for s in made] == [
        ("submit_transaction", "AuthorizationFailure")  # Azurite's code for an expired SAS
    ]
    assert [t for t in texts_of(made) if signature in t or "sig=" in t or "?" in t] == []
    assert [s.status.description for s in made] == [None]
