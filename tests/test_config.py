"""TableConfig builds working clients and never shows a secret."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from azure.core.exceptions import HttpResponseError, ResourceNotFoundError

from azurite.proxy import Proxy
from streamstone_py import EventData, Partition, Stream, TableConfig
from streamstone_py._config import Transport
from streamstone_py._transport._wire._client import environment_once

SAS = "sv=2024-01-01&ss=t&srt=sco&sp=rwdlacu&se=2099-01-01T00:00:00Z&sig=TOPSECRETsignature%3D"
KEY = "c2VjcmV0LWtleS1ub3QtZm9yLWV5ZXM="
FAKE_CS = (
    "DefaultEndpointsProtocol=http;AccountName=acct;"
    f"AccountKey={KEY};TableEndpoint=http://127.0.0.1:9/acct;"
)


def _secrets_absent(text: str) -> None:
    for secret in (KEY, "TOPSECRETsignature", SAS):
        assert secret not in text


def test_connection_string_client_works_against_azurite(connection_string: str) -> None:
    config = TableConfig("cfg" + uuid.uuid4().hex[:8], connection_string=connection_string)
    client = config.table_client()
    client.create_table()
    written = Stream.write(Partition(client, "k"), EventData(id="m1"), expected_version=0)
    assert written.stream.version == 1
    _secrets_absent(repr(config))
    assert "AccountKey" not in repr(config)
    assert config.mode == "connection_string"


def test_reprs_and_strs_hide_secrets() -> None:
    for config in (
        TableConfig("orders", connection_string=FAKE_CS),
        TableConfig("orders", account_url="https://acct.table.core.windows.net", sas_token=SAS),
        TableConfig("orders", account_url="https://acct.table.core.windows.net"),
    ):
        _secrets_absent(repr(config))
        _secrets_absent(str(config))
    assert repr(TableConfig("orders", account_url="https://a.example", sas_token=SAS)) == (
        "TableConfig(table_name='orders', mode='sas', account_url='https://a.example', "
        "transport='wire')"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "give connection_string"),
        ({"connection_string": FAKE_CS, "account_url": "https://a.example"}, "not both"),
        ({"sas_token": SAS}, "sas_token needs account_url"),
        ({"account_url": f"https://a.example/?{SAS}"}, "carries a query string"),
        ({"account_url": "ftp://a.example"}, "not http"),
        ({"connection_string": FAKE_CS, "transport": "carrier-pigeon"}, "transport must be"),
    ],
)
def test_bad_configuration_errors_name_the_problem_not_the_secret(
    kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        TableConfig("orders", **kwargs)
    _secrets_absent(str(caught.value))


def test_malformed_connection_string_error_hides_the_key() -> None:
    config = TableConfig("orders", connection_string=f"AccountKey={KEY};Nonsense")
    with pytest.raises(ValueError, match="not valid") as caught:
        config.table_client()
    _secrets_absent(str(caught.value))
    _secrets_absent(repr(caught.value))


def test_from_env() -> None:
    config = TableConfig.from_env(
        {
            "STREAMSTONE_TABLE": "orders",
            "STREAMSTONE_ACCOUNT_URL": "https://a.example",
            "STREAMSTONE_SAS_TOKEN": SAS,
        }
    )
    assert (config.table_name, config.mode) == ("orders", "sas")
    with pytest.raises(ValueError, match="STREAMSTONE_TABLE"):
        TableConfig.from_env({})


@pytest.mark.parametrize("table_name", ["ab", "1abc", "has-dash", ""])
def test_bad_table_names(table_name: str) -> None:
    with pytest.raises(ValueError, match="table name"):
        TableConfig(table_name, connection_string=FAKE_CS)


@pytest.mark.parametrize("transport", ["sdk", "wire"])
def test_debug_logs_and_errors_of_a_sas_request_hide_the_token(
    connection_string: str, caplog: pytest.LogCaptureFixture, transport: Transport
) -> None:
    # Azurite refuses the forged signature: a real request whose logs and error we can read.
    endpoint = connection_string.split("TableEndpoint=")[1].split(";")[0]
    config = TableConfig("nosuchtable", account_url=endpoint, sas_token=SAS, transport=transport)
    client = config.table_client()
    with caplog.at_level(logging.DEBUG), pytest.raises(HttpResponseError) as caught:
        Stream.open(Partition(client, "k"))
    assert caplog.records, "nothing was logged; the check would prove nothing"
    _secrets_absent(caplog.text)
    _secrets_absent(str(caught.value))


@pytest.mark.parametrize("transport", ["sdk", "wire"])
def test_debug_logs_of_a_shared_key_request_hide_the_key(
    connection_string: str, caplog: pytest.LogCaptureFixture, transport: Transport
) -> None:
    account_key = connection_string.split("AccountKey=")[1].split(";")[0]
    config = TableConfig("nosuchtable", connection_string=connection_string, transport=transport)
    client = config.table_client()
    with (
        caplog.at_level(logging.DEBUG),
        pytest.raises(ResourceNotFoundError) as caught,
    ):
        Stream.try_open(Partition(client, "k"))
    assert "does not exist" in str(caught.value)  # a missing table is not a missing stream
    assert caplog.records
    assert account_key not in caplog.text


def valid_sas(connection_string: str) -> str:
    """A SAS token Azurite accepts, signed with its development key."""
    from datetime import UTC, datetime, timedelta

    from azure.core.credentials import AzureNamedKeyCredential
    from azure.data.tables import AccountSasPermissions, ResourceTypes, generate_account_sas

    settings = dict(p.split("=", 1) for p in connection_string.split(";") if "=" in p)
    return generate_account_sas(
        AzureNamedKeyCredential(settings["AccountName"], settings["AccountKey"]),
        resource_types=ResourceTypes(service=True, container=True, object=True),
        permission=AccountSasPermissions(
            read=True, write=True, delete=True, list=True, add=True, update=True
        ),
        expiry=datetime.now(UTC) + timedelta(hours=1),
    )


def test_every_logger_at_debug_behind_redact_secrets_shows_no_sas_signature(
    connection_string: str,
) -> None:
    import io
    import re

    from streamstone_py import RedactSecrets

    sas = valid_sas(connection_string)
    signature = re.search(r"sig=([^&]+)", sas)
    assert signature is not None
    endpoint = connection_string.split("TableEndpoint=")[1].split(";")[0]
    table = "sas" + uuid.uuid4().hex[:8]
    TableConfig(table, connection_string=connection_string).table_client().create_table()
    client = TableConfig(table, account_url=endpoint, sas_token=sas).table_client()

    sink = io.StringIO()
    handler = logging.StreamHandler(sink)
    handler.addFilter(RedactSecrets())
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        Stream.write(Stream(Partition(client, "k")), EventData(id="e1"))
    finally:
        root.removeHandler(handler)
        root.setLevel(level)

    logged = sink.getvalue()
    assert "urllib3.connectionpool" in logged or '"POST /' in logged, logged[:2000]
    assert "sig=***" in logged  # the request line was logged, masked
    assert signature.group(1) not in logged
    assert Stream.open(Partition(client, "k")).version == 1  # the token did work


def test_the_environment_s_proxy_is_read_once_when_the_client_is_built(
    connection_string: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real proxy on a real socket: the client must go through it when the
    # environment names it, and around it when NO_PROXY exempts the host.
    port = int(connection_string.split("TableEndpoint=http://127.0.0.1:")[1].split("/")[0])
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy",
                 "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    with Proxy(port) as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        name = "proxied" + uuid.uuid4().hex[:8]
        proxied = TableConfig(name, connection_string=connection_string).table_client()
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        direct = TableConfig(name, connection_string=connection_string).table_client()
        monkeypatch.delenv("NO_PROXY")

        proxied.create_table()  # read once: NO_PROXY, set since, does not apply
        assert [r.head.split(b"\r\n")[0] for r, _ in proxy.seen] == [
            f"POST http://127.0.0.1:{port}/devstoreaccount1/Tables HTTP/1.1".encode()
        ]
        Stream.provision(Partition(direct, "k"))  # the table the proxied call made
        assert Stream.open(Partition(direct, "k")).version == 0
        assert len(proxy.seen) == 1

    url = direct.url
    assert environment_once(url) == {"use_env_settings": False, "proxies": {
        "http": f"http://127.0.0.1:{proxy.port}"}}  # fmt: skip
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    assert environment_once(url) == {
        "use_env_settings": False,
        "connection_verify": "/etc/ssl/certs/ca-certificates.crt",
    }
