"""The fault and latency proxy itself: what it forwards, delays, drops and cuts."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core.exceptions import AzureError
from azure.data.tables import TableClient, TableServiceClient

from azurite.proxy import Action, Proxy
from tests.helpers import azurite_port


@pytest.fixture
def proxied(connection_string: str, service: TableServiceClient) -> Iterator[tuple[Proxy, str]]:
    name = "proxy" + uuid.uuid4().hex[:8]
    service.create_table(name)
    with Proxy(azurite_port(connection_string)) as proxy:
        yield proxy, name


def _client(connection_string: str, proxy: Proxy, table: str) -> TableClient:
    # No SDK retries: each fault is seen once, as it happened.
    return TableClient.from_connection_string(
        proxy.endpoint_of(connection_string), table, retry_total=0
    )


def test_requests_pass_through_unchanged(
    connection_string: str, proxied: tuple[Proxy, str]
) -> None:
    proxy, table = proxied
    client = _client(connection_string, proxy, table)
    client.create_entity({"PartitionKey": "p", "RowKey": "r", "N": 1})
    assert client.get_entity("p", "r")["N"] == 1
    assert [(r.method, a) for r, a in proxy.seen] == [("POST", "pass"), ("GET", "pass")]


def test_the_delay_is_added_each_way(connection_string: str, service: TableServiceClient) -> None:
    name = "proxy" + uuid.uuid4().hex[:8]
    service.create_table(name).create_entity({"PartitionKey": "p", "RowKey": "r"})

    def median_read(delay: float) -> float:
        with Proxy(azurite_port(connection_string), delay=delay) as proxy:
            client = _client(connection_string, proxy, name)
            client.get_entity("p", "r")  # connect first
            times = []
            for _ in range(9):
                started = time.perf_counter()
                client.get_entity("p", "r")
                times.append(time.perf_counter() - started)
            return sorted(times)[4]

    plain, delayed = median_read(0.0), median_read(0.02)
    assert delayed - plain >= 0.04 * 0.9  # 20 ms before the request and 20 ms before the answer
    assert delayed - plain < 0.04 + 0.1


def test_drop_applies_the_request_and_gives_no_answer(
    connection_string: str, proxied: tuple[Proxy, str]
) -> None:
    proxy, table = proxied
    client = _client(connection_string, proxy, table)
    proxy.plan(lambda request: "drop" if request.method == "POST" else "pass")
    with pytest.raises(AzureError):
        client.create_entity({"PartitionKey": "p", "RowKey": "dropped"})
    proxy.plan(lambda request: "pass")
    assert client.get_entity("p", "dropped")["RowKey"] == "dropped"  # it was applied


def test_behead_applies_the_request_and_ends_the_answer_amid_its_headers(
    connection_string: str, proxied: tuple[Proxy, str]
) -> None:
    proxy, table = proxied
    client = _client(connection_string, proxy, table)
    proxy.plan(lambda request: "behead" if request.method == "POST" else "pass")
    # What makes the fault hard to see: the SDK takes the end for the end of
    # the headers, and answers a success without the ETag.
    assert client.create_entity({"PartitionKey": "p", "RowKey": "cut"}).get("etag") is None
    assert client.get_entity("p", "cut")["RowKey"] == "cut"  # it was applied


# What the sync client raises for each fault: these are what the engine must map.
RAISED = {
    "refuse": "ServiceResponseError",
    "truncate": "IncompleteReadError",
    "hang": "ServiceResponseTimeoutError",
}


@pytest.mark.parametrize("action", sorted(RAISED))
def test_refuse_truncate_and_hang_fail_the_client(
    connection_string: str, proxied: tuple[Proxy, str], action: Action
) -> None:
    proxy, table = proxied
    client = TableClient.from_connection_string(
        proxy.endpoint_of(connection_string), table, retry_total=0, read_timeout=2
    )
    client.create_entity({"PartitionKey": "p", "RowKey": "r", "Blob": "x" * 5000})
    proxy.plan(lambda request: action)
    started = time.perf_counter()
    with pytest.raises(BaseException) as caught:  # noqa: PT011 - the type is the finding
        client.get_entity("p", "r")
    assert time.perf_counter() - started < 30
    assert type(caught.value).__name__ == RAISED[action], repr(caught.value)


def test_trickle_sends_the_answer_a_byte_at_a_time(
    connection_string: str, proxied: tuple[Proxy, str]
) -> None:
    proxy, table = proxied
    proxy.trickle = 0.01
    client = _client(connection_string, proxy, table)
    client.create_entity({"PartitionKey": "p", "RowKey": "r", "N": 1})
    proxy.plan(lambda request: "trickle")
    started = time.perf_counter()
    assert client.get_entity("p", "r")["N"] == 1
    # A few hundred bytes of head and body, 10 ms each.
    assert time.perf_counter() - started > 2.0


def test_throttle_and_a_body_over_the_limit_answer_as_the_service(
    connection_string: str, proxied: tuple[Proxy, str]
) -> None:
    proxy, table = proxied
    client = _client(connection_string, proxy, table)
    proxy.retry_after_date = True
    proxy.retry_after = 3
    proxy.plan(lambda request: "throttle")
    with pytest.raises(AzureError) as caught:
        client.get_entity("p", "r")
    response: Any = getattr(caught.value, "response", None)
    assert response.status_code == 503
    assert response.headers["Retry-After"].endswith(" GMT")  # an HTTP date
    proxy.plan(lambda request: "pass")
    proxy.max_body = 100
    with pytest.raises(AzureError) as caught:
        client.create_entity({"PartitionKey": "p", "RowKey": "r", "Text": "x" * 100})
    assert getattr(caught.value, "status_code", None) == 413
    assert proxy.connections >= 1
