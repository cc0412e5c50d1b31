"""Build table clients from configuration, without ever showing a secret."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

from azure.core.credentials import AzureSasCredential
from azure.data.tables import TableClient
from azure.data.tables.aio import TableClient as AsyncTableClient

from ._transport._wire._client import WireTableClient, environment_once
from ._transport._wire._client_aio import AsyncWireTableClient

__all__ = ["TableConfig", "Transport"]

#: How the engine's requests travel: spoken by the engine, or through the SDK.
Transport = Literal["wire", "sdk"]

_Client = TypeVar("_Client", TableClient, AsyncTableClient)

_SECRET_SETTINGS = re.compile(r"(AccountKey|SharedAccessSignature)=[^;]*", re.IGNORECASE)


def _redact_connection_string(text: str) -> str:
    return _SECRET_SETTINGS.sub(lambda m: f"{m.group(1)}=***", text)


#: Secrets as they appear in log lines: a SAS token's signature in a URL, an
#: account key or SAS in a connection string, a shared-key Authorization value.
_SECRETS_IN_TEXT = re.compile(
    r"(?P<name>\bsig=|AccountKey=|SharedAccessSignature=|SharedKey(?:Lite)? [^:\s]+:)"
    r"(?P<secret>[^&;\s'\"]+)",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with every SAS signature, account key and shared-key signature masked."""
    return _SECRETS_IN_TEXT.sub(lambda m: f"{m.group('name')}***", text)


class RedactSecrets(logging.Filter):
    """A logging filter that masks secrets in every record it passes.

    Attach it to a handler (``handler.addFilter(RedactSecrets())``), not to a
    logger: a handler's filters see the records of every logger below it,
    urllib3's request lines included, which carry a SAS token's ``sig=``.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        return True


#: Loggers that write a request's URL, a SAS token's signature with it, on
#: their own: urllib3 logs each request line at DEBUG, for the SDK's clients
#: and the wire runner's alike.
_URL_LOGGERS: Final = ("urllib3.connectionpool",)


def guard_url_logs() -> None:
    """Mask secrets in the records of the loggers that write request URLs, at
    the logger itself, so that no handler (``logging.basicConfig(level=DEBUG)``
    included) ever gets a SAS signature. A record is only made, and so only
    filtered, when its logger is enabled for its level."""
    for name in _URL_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactSecrets) for f in logger.filters):
            logger.addFilter(RedactSecrets())


def _public_url(url: str) -> str:
    """The URL without query string or user info, where a SAS token could hide."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


_PARAMETER_ENV: Final = {
    "connection_string": "STREAMSTONE_CONNECTION_STRING",
    "connection string": "STREAMSTONE_CONNECTION_STRING",
    "account_url": "STREAMSTONE_ACCOUNT_URL",
    "sas_token": "STREAMSTONE_SAS_TOKEN",
    "transport": "STREAMSTONE_TRANSPORT",
}


def _for_environment(message: str) -> str:
    """A configuration error with the environment's names for its parameters."""
    if message.startswith("give connection_string, or account_url"):
        return (
            "no storage account configured: set STREAMSTONE_CONNECTION_STRING, or "
            "STREAMSTONE_ACCOUNT_URL (with STREAMSTONE_SAS_TOKEN, or without it to sign in as an "
            "Azure identity: a managed identity, or az login)"
        )
    invalid = re.match(r"connection string for table '[^']*' is not valid: (.*)", message, re.S)
    if invalid:
        return f"STREAMSTONE_CONNECTION_STRING is not a valid connection string: {invalid[1]}"
    message = re.sub(
        r"\b(connection_string|connection string|account_url|sas_token|transport)\b",
        lambda m: _PARAMETER_ENV[m.group(1)],
        message,
    )
    return message.replace("give either ", "set either ")


@dataclass(frozen=True)
class TableConfig:
    """Where a table is and how to authenticate, in one of three forms.

    - ``TableConfig(table, connection_string=...)``: an account key or
      Azurite's development account.
    - ``TableConfig(table, account_url=..., sas_token=...)``: a SAS token.
    - ``TableConfig(table, account_url=...)``: ``DefaultAzureCredential``
      from azure-identity (managed identity, workload identity, the Azure CLI).

    The connection string and SAS token never appear in ``repr``, ``str`` or in
    the errors raised here. ``TableConfig.from_env()`` reads
    ``STREAMSTONE_TABLE``, ``STREAMSTONE_CONNECTION_STRING``,
    ``STREAMSTONE_ACCOUNT_URL`` and ``STREAMSTONE_SAS_TOKEN``.
    """

    table_name: str
    connection_string: str | None = field(default=None, repr=False)
    account_url: str | None = None
    sas_token: str | None = field(default=None, repr=False)
    #: How the engine's requests travel: ``"wire"`` (the default:
    #: :class:`WireTableClient`, HTTP spoken by the engine) or ``"sdk"``
    #: (azure-data-tables' own requests, the reference).
    transport: Transport = "wire"

    def __post_init__(self) -> None:
        if not isinstance(self.table_name, str) or not re.fullmatch(
            r"[A-Za-z][A-Za-z0-9]{2,62}", self.table_name
        ):
            raise ValueError(
                f"table name {self.table_name!r} is not valid: 3 to 63 letters and digits, "
                "starting with a letter"
            )
        if self.table_name.lower() == "tables":
            raise ValueError(
                f"table name {self.table_name!r} is reserved: Azure Tables lists its tables "
                "under it"
            )
        if self.transport not in ("wire", "sdk"):
            raise ValueError(f"transport must be 'wire' or 'sdk', got {self.transport!r}")
        if self.sas_token and not self.account_url:
            raise ValueError("sas_token needs account_url")
        if self.connection_string and self.account_url:
            raise ValueError("give either connection_string or account_url, not both")
        if not self.connection_string and not self.account_url:
            raise ValueError("give connection_string, or account_url (with sas_token or not)")
        if self.account_url:
            if urlsplit(self.account_url).query:
                raise ValueError(
                    f"account_url {_public_url(self.account_url)!r} carries a query string; "
                    "pass the SAS token as sas_token"
                )
            if urlsplit(self.account_url).scheme not in ("http", "https"):
                raise ValueError(f"account_url {_public_url(self.account_url)!r} is not http(s)")

    @property
    def mode(self) -> Literal["connection_string", "sas", "default_credential"]:
        if self.connection_string:
            return "connection_string"
        return "sas" if self.sas_token else "default_credential"

    def __repr__(self) -> str:
        where = f", account_url={_public_url(self.account_url)!r}" if self.account_url else ""
        return (
            f"TableConfig(table_name={self.table_name!r}, mode={self.mode!r}{where}, "
            f"transport={self.transport!r})"
        )

    __str__ = __repr__

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str] | None = None,
        *,
        table_name: str | None = None,
        transport: Transport | None = None,
    ) -> TableConfig:
        env = os.environ if environ is None else environ
        name = table_name or env.get("STREAMSTONE_TABLE")
        if not name:
            raise ValueError("set STREAMSTONE_TABLE or pass table_name")
        try:
            config = cls(
                name,
                connection_string=env.get("STREAMSTONE_CONNECTION_STRING") or None,
                account_url=env.get("STREAMSTONE_ACCOUNT_URL") or None,
                sas_token=env.get("STREAMSTONE_SAS_TOKEN") or None,
                transport=transport or env.get("STREAMSTONE_TRANSPORT") or "wire",  # type: ignore[arg-type]
            )
            if config.connection_string:
                config._from_connection_string(TableClient).close()
        except ValueError as exc:
            # Worded for whoever set the environment: the variables, not the parameters.
            raise ValueError(_for_environment(str(exc))) from None
        return config

    def _from_connection_string(self, client: type[_Client], **options: Any) -> _Client:
        assert self.connection_string is not None
        try:
            return client.from_connection_string(self.connection_string, self.table_name, **options)
        except ValueError as exc:
            # The SDK's message may quote the string; ours never does.
            raise ValueError(
                f"connection string for table {self.table_name!r} is not valid: "
                f"{_redact_connection_string(str(exc))}"
            ) from None

    def table_client(self, **client_options: Any) -> TableClient:
        """A sync client for this table (the table itself is not created): a
        :class:`WireTableClient` (``transport="wire"``), else the SDK's
        ``TableClient``; either is a ``TableClient``.

        Its transport reads the environment's proxy and CA bundle settings once,
        here, rather than on every request as ``requests`` does by default
        (see :func:`environment_once`). ``client_options`` go to the client as
        they are, e.g. ``raw_request_hook``, or ``connection_pool_size`` for
        the wire (size it for the keys in flight).
        """
        kind: type[TableClient] = WireTableClient if self.transport == "wire" else TableClient
        if self.transport == "sdk":
            client_options.pop("connection_pool_size", None)
        if self.connection_string:
            url = self._from_connection_string(TableClient).url
            options = {**environment_once(url), **client_options}
            return self._from_connection_string(kind, **options)
        assert self.account_url is not None
        options = {**environment_once(self.account_url), **client_options}
        if self.sas_token:
            credential = AzureSasCredential(self.sas_token)
            return kind(self.account_url, self.table_name, credential=credential, **options)
        from azure.identity import DefaultAzureCredential

        return kind(
            self.account_url, self.table_name, credential=DefaultAzureCredential(), **options
        )

    def async_table_client(self) -> AsyncTableClient:
        """An async client for :mod:`streamstone_py.aio`, of this configuration's transport."""
        kind: type[AsyncTableClient] = (
            AsyncWireTableClient if self.transport == "wire" else AsyncTableClient
        )
        if self.connection_string:
            return self._from_connection_string(kind)
        assert self.account_url is not None
        if self.sas_token:
            return kind(
                self.account_url, self.table_name, credential=AzureSasCredential(self.sas_token)
            )
        from azure.identity.aio import DefaultAzureCredential

        return kind(self.account_url, self.table_name, credential=DefaultAzureCredential())
