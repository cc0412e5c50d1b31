"""The Azurite launcher: loopback only, telemetry off, and data that survives a restart on disk."""

from __future__ import annotations

from pathlib import Path

import pytest
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import TableServiceClient

from azurite.launcher import AzuriteTable


def _write_then_restart(azurite: AzuriteTable) -> TableServiceClient:
    service = TableServiceClient.from_connection_string(azurite.connection_string)
    service.create_table("kept").create_entity({"PartitionKey": "p", "RowKey": "r", "N": 1})
    # At once: Azurite autosaves its database every 5 s, so only a graceful stop keeps this.
    azurite.restart()
    return TableServiceClient.from_connection_string(azurite.connection_string)


def test_a_restart_on_disk_keeps_a_write_made_just_before(tmp_path: Path) -> None:
    with AzuriteTable(location=tmp_path / "data") as azurite:
        port = azurite.port
        service = _write_then_restart(azurite)
        assert azurite.port == port
        row = service.get_table_client("kept").get_entity("p", "r")
        assert (row["PartitionKey"], row["RowKey"], row["N"]) == ("p", "r", 1)


def test_a_restart_in_memory_starts_empty() -> None:
    with AzuriteTable() as azurite:
        service = _write_then_restart(azurite)
        with pytest.raises(ResourceNotFoundError):
            service.get_table_client("kept").get_entity("p", "r")


def test_azurite_listens_on_loopback_with_telemetry_off() -> None:
    with AzuriteTable() as azurite:
        assert azurite.endpoint.startswith("http://127.0.0.1:")
        assert azurite._process is not None
        args = Path(f"/proc/{azurite._process.pid}/cmdline").read_bytes().split(b"\0")
        assert args[args.index(b"--tableHost") + 1] == b"127.0.0.1"
        assert b"--disableTelemetry" in args
        assert b"--inMemoryPersistence" in args
