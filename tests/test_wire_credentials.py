"""The wire runner with every credential the SDK runner takes: an account key
(the rest of the suite), a SAS token, and a ``TokenCredential`` against an
Azurite that takes bearer tokens (HTTPS, ``--oauth basic``). And no secret
in any log record, for a user who logs everything at DEBUG."""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from typing import Any

import pytest
from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.core.exceptions import ClientAuthenticationError, HttpResponseError
from azure.data.tables import (
    AccountSasPermissions,
    ResourceTypes,
    TableClient,
    generate_account_sas,
)

from azurite.launcher import AzuriteTable
from streamstone_py import EventData, Partition, Stream, WireTableClient
from streamstone_py import aio as streams
from streamstone_py.aio import AsyncWireTableClient
from tests.helpers import wait
from tests.oauth import Issuer

ACCOUNT = "devstoreaccount1"


def _key(connection_string: str) -> str:
    return connection_string.split("AccountKey=")[1].split(";")[0]


def _endpoint(connection_string: str) -> str:
    return connection_string.split("TableEndpoint=")[1].split(";")[0]


def _sas(connection_string: str, **permissions: bool) -> str:
    """An account SAS for the table service (Azurite refuses a table SAS on a
    ``$batch``; the service takes both)."""
    credential = AzureNamedKeyCredential(ACCOUNT, _key(connection_string))
    expiry = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    return generate_account_sas(
        credential,
        resource_types=ResourceTypes(service=True, container=True, object=True),
        permission=AccountSasPermissions(**permissions),
        expiry=expiry,
    )


def _roundtrip(client: Any) -> list[str | None]:
    partition = Partition(client, "k-" + uuid.uuid4().hex[:8])
    written = Stream.write(Stream(partition), EventData(id="a"), EventData(id="b"))
    Stream.set_properties(written.stream, {"Owner": "me"})
    assert partition.partition_key in list(Stream.scan_keys(client))
    return [e.id for e in Stream.read(partition).events]


# --- a SAS token --------------------------------------------------------------------


def test_a_sas_token_as_a_credential_or_in_the_endpoint(
    connection_string: str, table: TableClient
) -> None:
    token = _sas(connection_string, read=True, list=True, add=True, update=True, delete=True)
    endpoint = _endpoint(connection_string)

    with WireTableClient(
        endpoint, table.table_name, credential=AzureSasCredential(token)
    ) as by_credential:
        assert _roundtrip(by_credential) == ["a", "b"]
    with WireTableClient(f"{endpoint}?{token}", table.table_name) as in_the_url:
        assert _roundtrip(in_the_url) == ["a", "b"]


def test_a_sas_token_the_service_refuses_gives_its_request_id_status_and_code(
    connection_string: str, table: TableClient
) -> None:
    token = _sas(connection_string, read=True, list=True)
    signature = token.split("sig=")[1].split("&")[0]
    # Signed by nobody: a first character other than its own (one signature in
    # 64 starts with "A", and replacing it by "A" left the token valid).
    forged = token.replace(signature, ("B" if signature[0] == "A" else "A") + signature[1:])
    with (
        WireTableClient(
            _endpoint(connection_string), table.table_name, credential=AzureSasCredential(forged)
        ) as client,
        pytest.raises(HttpResponseError) as refused,
    ):
        Stream.provision(Partition(client, "k"))
    text = str(refused.value)
    assert refused.value.status_code == 403
    assert f"RequestId: {refused.value.request_id}" in text, text  # type: ignore[attr-defined]
    assert "ErrorCode: AuthorizationFailure" in text, text
    assert signature[1:] not in text


# --- a TokenCredential, against an Azurite that takes bearer tokens ------------------


def test_a_token_credential_gets_a_bearer_token_once_while_it_lasts(
    oauth_azurite: AzuriteTable, oauth_table: str
) -> None:
    assert oauth_azurite.https is not None
    issuer = Issuer(lifetime=3600)
    with WireTableClient(
        oauth_azurite.endpoint,
        oauth_table,
        credential=issuer,
        connection_verify=str(oauth_azurite.https[0]),
    ) as client:
        assert _roundtrip(client) == ["a", "b"]
    assert issuer.scopes == [("https://storage.azure.com/.default",)]


def test_a_token_close_to_its_expiry_is_renewed_before_each_request(
    oauth_azurite: AzuriteTable, oauth_table: str
) -> None:
    assert oauth_azurite.https is not None
    issuer = Issuer(lifetime=299)  # renewed when fewer than 300 s are left: always
    verify = str(oauth_azurite.https[0])

    async def roundtrip() -> int:
        async with AsyncWireTableClient(
            oauth_azurite.endpoint, oauth_table, credential=issuer, connection_verify=verify
        ) as client:
            partition = Partition(client, "k-" + uuid.uuid4().hex[:8])
            await streams.Stream.write(partition, EventData(id="a"), expected_version=0)
            return len((await streams.Stream.read(partition)).events)

    assert wait(roundtrip()) == 1
    # The write, and the read (its header and events, side by side, may share a fetch).
    assert len(issuer.scopes) >= 2


def test_an_expired_token_is_refused_by_the_service(
    oauth_azurite: AzuriteTable, oauth_table: str
) -> None:
    assert oauth_azurite.https is not None
    with (
        WireTableClient(
            oauth_azurite.endpoint,
            oauth_table,
            credential=Issuer(lifetime=-10),
            connection_verify=str(oauth_azurite.https[0]),
        ) as client,
        pytest.raises(ClientAuthenticationError) as refused,
    ):
        Stream.read(Partition(client, "k"))
    assert refused.value.status_code == 403


def test_a_bearer_token_is_never_sent_over_plain_http(connection_string: str) -> None:
    # The SDK's own client refuses it first; the wire's check stands behind it.
    with pytest.raises(ValueError, match="HTTPS"):
        WireTableClient(_endpoint(connection_string), "t", credential=Issuer(lifetime=3600))


# --- no secret in any log record -------------------------------------------------------


class _Everything(logging.Handler):
    """What ``logging.basicConfig(level=DEBUG)`` would print: every record, formatted."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_no_key_sig_or_token_reaches_a_log_record_at_debug(
    connection_string: str, table: TableClient, oauth_azurite: AzuriteTable, oauth_table: str
) -> None:
    assert oauth_azurite.https is not None
    root = logging.getLogger()
    handler, level = _Everything(), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    token = _sas(connection_string, read=True, list=True, add=True, update=True)
    issuer = Issuer(lifetime=3600)
    try:
        endpoint = _endpoint(connection_string)
        for client in (
            WireTableClient(f"{endpoint}?{token}", table.table_name),
            TableClient(endpoint, table.table_name, credential=AzureSasCredential(token)),
            WireTableClient.from_connection_string(connection_string, table.table_name),
            WireTableClient(
                oauth_azurite.endpoint,
                oauth_table,
                credential=issuer,
                connection_verify=str(oauth_azurite.https[0]),
            ),
        ):
            with client:
                partition = Partition(client, "log-" + uuid.uuid4().hex[:8])
                Stream.write(Stream(partition), EventData(id="a"))
                Stream.read(partition)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    text = "\n".join(handler.lines)
    assert "sig=" in text  # the SAS requests were logged, their signature masked
    assert issuer.issued
    for secret in [token.split("sig=")[1].split("&")[0], _key(connection_string), *issuer.issued]:
        assert secret not in text
