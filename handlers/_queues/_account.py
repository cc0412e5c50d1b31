"""Where an account's Queue service is and how to sign in, from the
environment the table's configuration reads, and the rule for queue names."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import urlsplit

from azure.storage.queue import QueueClient, QueueServiceClient

from streamstone_py import TableConfig

__all__ = ["QUEUE_NAME", "QueueConfig", "check_queue_name", "queue_beside"]

#: Azure's rule for queue names: 3 to 63 lowercase letters, digits and single
#: hyphens, starting and ending with a letter or digit.
QUEUE_NAME: Final = re.compile(r"(?=.{3,63}$)[a-z0-9]+(-[a-z0-9]+)*")


def check_queue_name(name: str, what: str = "queue") -> str:
    """``name`` if Azure takes it as a queue name, else ``ValueError`` naming it."""
    if not QUEUE_NAME.fullmatch(name):
        raise ValueError(
            f"{what} {name!r} is not a valid queue name: 3 to 63 lowercase letters, digits "
            "and single hyphens, starting and ending with a letter or digit"
        )
    return name


def queue_beside(queue: QueueClient, name: str) -> QueueClient:
    """The queue ``name`` in ``queue``'s account, with its credential (a SAS
    in the URL's query stays on it)."""
    url, _, query = queue.url.partition("?")
    url = f"{url.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")
    return QueueClient.from_queue_url(url, credential=queue.credential)


@dataclass(frozen=True)
class QueueConfig:
    """Where the queues are and how to authenticate, from the variables the
    table's configuration reads (``TableConfig.from_env``): the connection
    string (it must name the queue endpoint when it names any endpoint), or
    ``STREAMSTONE_ACCOUNT_URL``'s account, whose queue endpoint is its table
    endpoint's (``ACCOUNT.table.SUFFIX`` becomes ``ACCOUNT.queue.SUFFIX``)
    unless ``STREAMSTONE_QUEUE_ACCOUNT_URL`` names it, with the same SAS token
    or Azure identity. Secrets stay out of ``repr`` and of every error."""

    connection_string: str | None = field(default=None, repr=False)
    account_url: str | None = None
    sas_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> QueueConfig:
        env = os.environ if environ is None else environ
        table = TableConfig.from_env(env, table_name="queues")  # its checks and its wording
        if table.connection_string:
            parts = [p.split("=", 1)[0].strip() for p in table.connection_string.split(";")]
            endpoints = [p for p in parts if p.lower().endswith("endpoint")]
            if endpoints and "queueendpoint" not in {p.lower() for p in endpoints}:
                raise ValueError(
                    f"STREAMSTONE_CONNECTION_STRING names no QueueEndpoint (it names "
                    f"{', '.join(endpoints)}): add the queue service's QueueEndpoint=..."
                )
            return cls(connection_string=table.connection_string)
        url = env.get("STREAMSTONE_QUEUE_ACCOUNT_URL") or None
        if url is None:
            assert table.account_url is not None
            parts_ = urlsplit(table.account_url)
            host = parts_.hostname or ""
            if ".table." not in host:
                raise ValueError(
                    f"STREAMSTONE_ACCOUNT_URL's host {host!r} is not ACCOUNT.table.SUFFIX, so "
                    "the queue endpoint cannot be told from it: set STREAMSTONE_QUEUE_ACCOUNT_URL"
                )
            netloc = host.replace(".table.", ".queue.", 1)
            url = f"{parts_.scheme}://{netloc}" + (f":{parts_.port}" if parts_.port else "")
        elif urlsplit(url).scheme not in ("http", "https") or urlsplit(url).query:
            raise ValueError(
                "STREAMSTONE_QUEUE_ACCOUNT_URL must be an http(s) URL without a query string "
                "(the SAS token goes in STREAMSTONE_SAS_TOKEN)"
            )
        return cls(account_url=url, sas_token=table.sas_token)

    def service(self) -> QueueServiceClient:
        """A new client for this account's Queue service."""
        if self.connection_string:
            return QueueServiceClient.from_connection_string(self.connection_string)
        assert self.account_url is not None
        if self.sas_token:
            from azure.core.credentials import AzureSasCredential

            credential = AzureSasCredential(self.sas_token)
            return QueueServiceClient(self.account_url, credential=credential)
        from azure.identity import DefaultAzureCredential

        return QueueServiceClient(self.account_url, credential=DefaultAzureCredential())
