"""What the examples share: the table they run on, from the environment."""

from __future__ import annotations

import os
import sys

from azure.data.tables import TableClient, TableServiceClient


def example_table(name: str) -> TableClient | None:
    """The table ``name`` (made if missing) of the account that
    ``STREAMSTONE_CONNECTION_STRING`` names; None, with a hint, without one."""
    connection_string = os.environ.get("STREAMSTONE_CONNECTION_STRING")
    if not connection_string:
        print("set STREAMSTONE_CONNECTION_STRING (make azurite prints the line)", file=sys.stderr)
        return None
    service = TableServiceClient.from_connection_string(connection_string)
    return service.create_table_if_not_exists(name)
