"""A client span per storage request, the same on the four clients (the
wire's and the SDK's, sync and async), with nothing secret in it for any
credential the engine takes."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from azure.core.credentials import AzureSasCredential
from azure.data.tables import TableClient
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from azurite.launcher import AzuriteTable
from streamstone_py import ConcurrencyConflictError, EventData, Partition, Stream, WireTableClient
from tests.helpers import S, azurite_port
from tests.oauth import bearer_client
from tests.test_wire_credentials import _endpoint, _key, _sas
from tests.tracing import texts_of


def _where(connection_string: str, table: str) -> dict[str, Any]:
    return {
        "db.system.name": "azure.tables",
        "db.collection.name": table,
        "db.namespace": "devstoreaccount1",
        "server.address": "127.0.0.1",
        "server.port": azurite_port(connection_string),
    }


def test_each_request_is_a_client_span_with_its_operation_status_and_request_id(
    partition: Partition, connection_string: str, spans: InMemorySpanExporter
) -> None:
    S.write(partition, EventData(id="a"), expected_version=0)
    with pytest.raises(ConcurrencyConflictError):
        S.write(partition, EventData(id="b"), expected_version=0)

    made = spans.get_finished_spans()
    table = partition.table_name
    assert [(s.name, s.kind) for s in made] == [
        (f"submit_transaction {table}", SpanKind.CLIENT),
        (f"submit_transaction {table}", SpanKind.CLIENT),
        (f"get_entity {table}", SpanKind.CLIENT),  # the conflict's header, read to tell it
    ]
    ok, refused, header = made
    request_ids = [s.attributes["az.service_request_id"] for s in made if s.attributes]
    assert all(isinstance(r, str) and len(r) == 36 for r in request_ids), request_ids
    where = _where(connection_string, table)

    def answered(operation: str, status: int, request_id: object) -> dict[str, Any]:
        return {
            **where,
            "db.operation.name": operation,
            "http.response.status_code": status,
            "db.response.status_code": str(status),
            "az.service_request_id": request_id,
        }

    three = {"db.operation.batch.size": 3}  # the header, the event and its id
    assert dict(ok.attributes or {}) == {
        **answered("submit_transaction", 202, request_ids[0]),
        **three,
    }
    assert ok.status.status_code == StatusCode.UNSET
    assert dict(refused.attributes or {}) == {
        **answered("submit_transaction", 409, request_ids[1]),
        **three,
        "error.type": "EntityAlreadyExists",
    }
    assert refused.status.status_code == StatusCode.ERROR
    assert dict(header.attributes or {}) == answered("get_entity", 200, request_ids[2])


def test_requests_sent_side_by_side_are_children_of_the_callers_span(
    table: TableClient, spans: InMemorySpanExporter
) -> None:
    partition = Partition(table, "p-" + uuid.uuid4().hex)
    Stream.write(Stream(partition), EventData(id="a"), EventData(id="b"))
    spans.clear()
    with trace.get_tracer("tests").start_as_current_span("caller") as caller:
        Stream.read(partition, start_version=2)  # the header beside the events' query

    made = spans.get_finished_spans()
    names = sorted(s.name for s in made)
    assert names == [
        "caller",
        f"get_entity {table.table_name}",
        f"query_entities {table.table_name}",
    ]
    parent = caller.get_span_context().span_id
    assert [s.parent.span_id for s in made if s.name != "caller" and s.parent] == [parent] * 2


def test_a_try_sent_again_counts_its_resends(
    faulty: tuple[Partition, Any, Partition], spans: InMemorySpanExporter
) -> None:
    partition, plan, clean = faulty
    Stream.write(Stream(clean), EventData(id="a"))
    spans.clear()
    plan.add("before", "GET")
    assert [e.id for e in S.read(partition).events] == ["a"]

    # The header's read beside the events' query: the header's first try is the one cut.
    keys = ("error.type", "http.request.resend_count", "http.response.status_code")
    tries = sorted(
        (s.name.split()[0], *(str((s.attributes or {}).get(k)) for k in keys))
        for s in spans.get_finished_spans()
    )
    assert tries == [
        ("get_entity", "None", "1", "200"),
        ("get_entity", "azure.core.exceptions.ServiceRequestError", "None", "None"),
        ("query_entities", "None", "None", "200"),
    ]


# --- no secret in any span, whatever the credential -------------------------------------


def _spans_of_a_roundtrip(client: Any, spans: InMemorySpanExporter) -> list[str]:
    with client:
        partition = Partition(client, "k-" + uuid.uuid4().hex[:8])
        Stream.write(Stream(partition), EventData(id="a"))
        assert [e.id for e in Stream.read(partition).events] == ["a"]
        assert partition.partition_key in list(Stream.scan_keys(client))
    made = spans.get_finished_spans()
    operations = {s.name.split()[0] for s in made}
    assert operations == {"submit_transaction", "get_entity", "query_entities"}, operations
    spans.clear()
    return texts_of(made)


@pytest.mark.parametrize("kind", [TableClient, WireTableClient], ids=["sdk", "wire"])
def test_no_account_key_in_any_span(
    kind: type[TableClient], connection_string: str, table: TableClient, spans: InMemorySpanExporter
) -> None:
    client = kind.from_connection_string(connection_string, table.table_name)
    texts = _spans_of_a_roundtrip(client, spans)
    key = _key(connection_string)
    assert [t for t in texts if key in t or key[:12] in t or "AccountKey" in t] == []


@pytest.mark.parametrize("kind", [TableClient, WireTableClient], ids=["sdk", "wire"])
def test_no_sas_token_in_any_span(
    kind: type[TableClient], connection_string: str, table: TableClient, spans: InMemorySpanExporter
) -> None:
    token = _sas(connection_string, read=True, list=True, add=True, update=True, delete=True)
    signature = token.split("sig=")[1].split("&")[0]
    endpoint = _endpoint(connection_string)
    texts = _spans_of_a_roundtrip(
        kind(endpoint, table.table_name, credential=AzureSasCredential(token)), spans
    )
    if kind is WireTableClient:  # the SDK's client takes a SAS as its credential only
        texts += _spans_of_a_roundtrip(kind(f"{endpoint}?{token}", table.table_name), spans)
    assert [t for t in texts if signature in t or "sig=" in t or "?" in t] == []


@pytest.mark.parametrize("kind", [TableClient, WireTableClient], ids=["sdk", "wire"])
def test_no_bearer_token_in_any_span(
    kind: type[TableClient],
    oauth_azurite: AzuriteTable,
    oauth_table: str,
    spans: InMemorySpanExporter,
) -> None:
    issuer, client = bearer_client(kind, oauth_azurite, oauth_table)
    texts = _spans_of_a_roundtrip(client, spans)
    assert issuer.issued
    leaked = [t for t in texts if any(token in t or token[:20] in t for token in issuer.issued)]
    assert leaked == []
    assert [t for t in texts if "Bearer" in t] == []
