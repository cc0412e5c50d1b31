"""Shared fixtures: one Azurite for the whole run, a fresh partition per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from azure.data.tables import TableClient, TableServiceClient

from azurite.launcher import account
from streamstone_py import Partition


@pytest.fixture(scope="session")
def connection_string() -> Iterator[str]:
    """Azurite started by the launcher, or the account named in the environment."""
    with account() as given:
        yield given


@pytest.fixture(scope="session")
def service(connection_string: str) -> TableServiceClient:
    return TableServiceClient.from_connection_string(connection_string)


@pytest.fixture(scope="session")
def table(service: TableServiceClient) -> Iterator[TableClient]:
    name = "tests" + uuid.uuid4().hex[:12]
    client = service.create_table_if_not_exists(name)
    yield client
    service.delete_table(name)


@pytest.fixture
def partition(table: TableClient) -> Partition:
    return Partition(table, "p-" + uuid.uuid4().hex)
