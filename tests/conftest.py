"""Shared fixtures: one Azurite for the whole run, a fresh partition per test.

``partition`` is parametrised over four clients, the SDK's and the wire
runner's, each sync and async, so every test that takes it runs against all
of them (see ``tests/helpers.py``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableClient, TableServiceClient
from azure.data.tables.aio import TableClient as AsyncTableClient
from azure.storage.queue import QueueClient, QueueServiceClient
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from azurite.launcher import AzuriteTable, account
from azurite.proxy import Proxy
from handlers._outcome import StrategyName
from streamstone_py import Partition, WireTableClient
from streamstone_py.aio import AsyncWireTableClient
from tests.faults import FAST, AsyncFaultyTransport, FaultPlan, FaultyTransport
from tests.helpers import azurite_port, register_raw, wait
from tests.metrics import measuring
from tests.oauth import certificate
from tests.tracing import recording

# Every JVM the tests start (the shared session's, and those of the commands
# and docs blocks they run) compiles with C1 alone and collects serially: its
# jobs last seconds, and on two cores C2's and G1's threads took a third of
# the Spark tests' CPU. The JIT and the collector change how fast, never
# what; the benchmarks and the commands keep the JVM's defaults.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@pytest.fixture(scope="session")
def connection_string() -> Iterator[str]:
    """Azurite started by the launcher (its Table and Queue services), or the
    account named in the environment."""
    with account(queues=True) as given:
        yield given


@pytest.fixture(scope="session")
def service(connection_string: str) -> TableServiceClient:
    return TableServiceClient.from_connection_string(connection_string)


@pytest.fixture(scope="session")
def sdk_table(service: TableServiceClient) -> Iterator[TableClient]:
    """The session's table through the SDK's own client: the reference runner."""
    name = "tests" + uuid.uuid4().hex[:12]
    client = service.create_table_if_not_exists(name)
    register_raw(client)
    yield client
    service.delete_table(name)


@pytest.fixture(scope="session")
def table(connection_string: str, sdk_table: TableClient) -> Iterator[TableClient]:
    """The session's table through the default runner, the wire: a ``TableClient``
    whose engine requests the engine sends itself (its SDK methods stay the SDK's)."""
    client = WireTableClient.from_connection_string(connection_string, sdk_table.table_name)
    yield client
    client.close()


@pytest.fixture(scope="session")
def async_table(connection_string: str, table: TableClient) -> Iterator[AsyncTableClient]:
    client = AsyncTableClient.from_connection_string(connection_string, table.table_name)
    yield client
    wait(client.close())


@pytest.fixture(scope="session")
def async_wire_table(connection_string: str, table: TableClient) -> Iterator[AsyncWireTableClient]:
    client = AsyncWireTableClient.from_connection_string(connection_string, table.table_name)
    yield client
    wait(client.close())


#: The four clients every behavioural test runs on: the SDK's and the wire's, sync and async.
CLIENTS = {
    "sync": "sdk_table",
    "async": "async_table",
    "wire": "table",
    "wire-async": "async_wire_table",
}


@pytest.fixture(params=list(CLIENTS))
def client(request: pytest.FixtureRequest) -> TableClient | AsyncTableClient:
    return cast(TableClient | AsyncTableClient, request.getfixturevalue(CLIENTS[request.param]))


@pytest.fixture
def partition(client: TableClient | AsyncTableClient) -> Partition:
    return Partition(client, "p-" + uuid.uuid4().hex)


@pytest.fixture(params=["state", "outbox"])
def strategy(request: pytest.FixtureRequest) -> StrategyName:
    """Both consistent-messaging strategies pass the same scenarios."""
    return cast(StrategyName, request.param)


@pytest.fixture
def game() -> str:
    return "game-" + uuid.uuid4().hex[:12]


@pytest.fixture
def proxy(connection_string: str) -> Iterator[Proxy]:
    """A fault-injecting proxy on a real socket in front of Azurite's Table service."""
    with Proxy(azurite_port(connection_string)) as running:
        yield running


@pytest.fixture(params=["sync", "async"])
def faulty(
    request: pytest.FixtureRequest, connection_string: str, table: TableClient
) -> Iterator[tuple[Partition, FaultPlan, Partition]]:
    """A partition whose client injects the plan's faults (in the SDK's transport),
    and a clean view of the same stream."""
    plan = FaultPlan()
    key = "f-" + uuid.uuid4().hex
    client: Any
    if request.param == "async":
        client = AsyncTableClient.from_connection_string(
            connection_string, table.table_name, transport=AsyncFaultyTransport(plan)
        )
    else:
        client = TableClient.from_connection_string(
            connection_string, table.table_name, transport=FaultyTransport(plan)
        )
    yield Partition(client, key, retry=FAST), plan, Partition(table, key)
    if request.param == "async":
        wait(client.close())
    else:
        client.close()


#: The clients of the behavioural suite, by the class that builds them from a connection string.
CLIENT_CLASSES: dict[str, Any] = {
    "sync": TableClient,
    "async": AsyncTableClient,
    "wire": WireTableClient,
    "wire-async": AsyncWireTableClient,
}


@pytest.fixture(params=list(CLIENT_CLASSES))
def proxied_client(
    request: pytest.FixtureRequest,
    connection_string: str,
    service: TableServiceClient,
    proxy: Proxy,
) -> Iterator[Any]:
    """Each of the four clients, on a table of its own, talking to Azurite through the proxy."""
    name = "faults" + uuid.uuid4().hex[:8]
    register_raw(service.create_table(name))
    through = proxy.endpoint_of(connection_string)
    client: Any = CLIENT_CLASSES[request.param].from_connection_string(through, name)
    yield client
    if "async" in request.param:
        wait(client.close())
    else:
        client.close()


@pytest.fixture(scope="session")
def oauth_azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteTable]:
    """An Azurite that takes bearer tokens: HTTPS (its own certificate), ``--oauth basic``."""
    cert, key = certificate(tmp_path_factory.mktemp("tls"))
    with AzuriteTable(https=(cert, key), oauth=True) as azurite:
        yield azurite


@pytest.fixture
def oauth_table(oauth_azurite: AzuriteTable) -> str:
    """A new table of ``oauth_azurite``, made with its account key."""
    name = "oauth" + uuid.uuid4().hex[:10]
    assert oauth_azurite.https is not None
    verify = str(oauth_azurite.https[0])
    service = TableServiceClient.from_connection_string(
        oauth_azurite.connection_string, connection_verify=verify
    )
    service.create_table(name)  # by account key: it works beside bearer tokens
    return name


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The spans this test makes, recorded by the OpenTelemetry SDK."""
    with recording() as exporter:
        yield exporter


@pytest.fixture
def meters() -> Iterator[InMemoryMetricReader]:
    """The metrics this test records, read by the OpenTelemetry SDK."""
    gc.collect()  # the consumers of earlier tests gone: their poison queues no longer read
    with measuring() as reader:
        yield reader


@pytest.fixture(scope="session")
def queues(connection_string: str) -> QueueServiceClient:
    return QueueServiceClient.from_connection_string(connection_string)


@pytest.fixture
def queue(queues: QueueServiceClient) -> Iterator[QueueClient]:
    """A fresh input queue, deleted after the test with its poison queue and
    ``<name>-out``, the output queue a test may make."""
    name = f"in-{uuid.uuid4().hex[:12]}"
    client = queues.get_queue_client(name)
    client.create_queue()
    yield client
    for made in (name, f"{name}-poison", f"{name}-out"):
        with contextlib.suppress(ResourceNotFoundError):
            queues.delete_queue(made)
