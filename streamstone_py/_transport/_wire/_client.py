"""The sync wire runner's client: a ``TableClient`` whose streamstone requests
travel over HTTP/1.1 with urllib3, spoken by the engine itself.

Everything else a ``TableClient`` does (creating and deleting the table, the
SDK's own entity methods) stays the SDK's: it is one, so code and tests that
hold a ``TableClient`` keep working. Only the engine's requests, and the
handlers' and publishers' through the engine, take the wire.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Self, cast
from urllib.parse import urlsplit

import urllib3
from azure.core.exceptions import ServiceResponseTimeoutError
from azure.data.tables import TableClient

from .._protocol import Request, time_left
from .._retry import raise_as_storage_error
from .._tracing import answered
from ._auth import Auth, Bearer, auth_of
from ._deadline import POOL_CLASSES, watching
from ._exchange import Answer, HttpCall, Service, exchange, http_date
from ._fork import keep, renew_in_child

__all__ = ["DEFAULT_POOL_SIZE", "WireSetup", "WireTableClient", "environment_once", "user_agent"]

#: Connections kept per host: enough for a task's keys in flight, each with a
#: header read beside its events.
DEFAULT_POOL_SIZE: Final = 32


def user_agent() -> str:
    from ... import __version__

    return f"streamstone-py/{__version__} Python/{platform.python_version()} ({platform.system()})"


def environment_once(url: str) -> dict[str, Any]:
    """Client options that apply the environment's network settings for ``url``
    once, when the client is built.

    ``requests`` looks up ``HTTPS_PROXY``/``NO_PROXY`` (and the CA bundle) in the
    environment on every request, a measurable share of a request's CPU. These
    options turn that off (``use_env_settings=False``) and give the same
    settings explicitly: the proxy the environment names for this URL (none if
    ``NO_PROXY`` exempts it), and ``REQUESTS_CA_BUNDLE`` or ``CURL_CA_BUNDLE``.
    """
    import requests.utils

    options: dict[str, Any] = {"use_env_settings": False}
    proxies = requests.utils.get_environ_proxies(url)
    if proxies:
        options["proxies"] = dict(proxies)
    bundle = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if bundle:
        options["connection_verify"] = bundle
    return options


@dataclass(frozen=True, slots=True)
class WireSetup:
    """What a wire client (sync or async) takes from how it was built."""

    service: Service
    auth: Auth
    agent: str
    hook: Callable[[Any], None] | None
    proxy: str | None
    verify: bool | str

    @classmethod
    def of(
        cls, endpoint: str, table_name: str, credential: object, options: Mapping[str, Any]
    ) -> WireSetup:
        parts = urlsplit(endpoint)
        auth = auth_of(credential, parts.query)
        if isinstance(auth, Bearer) and parts.scheme != "https":
            raise ValueError(
                f"a bearer token is only sent over HTTPS; the endpoint is {parts.scheme}://"
                f"{parts.netloc}"
            )
        base = f"{parts.scheme}://{parts.netloc}{parts.path}".rstrip("/")
        if options.get("use_env_settings", True):
            # As the SDK's transport honours the environment, but read once, here.
            options = {**environment_once(base), **options}
        verify = options.get("connection_verify", True)
        return cls(
            Service(base, table_name, auth.query),
            auth,
            user_agent(),
            options.get("raw_request_hook"),
            (options.get("proxies") or {}).get(parts.scheme),
            verify if isinstance(verify, bool | str) else True,
        )


def _overdue(left: float, cause: Exception | None) -> ServiceResponseTimeoutError:
    """A request whose deadline came before its whole answer: a lost answer."""
    return ServiceResponseTimeoutError(
        f"no complete answer in {left:.1f} s, the call's time left", error=cause
    )


class WireTableClient(TableClient):
    """A table client whose streamstone requests travel on the wire.

    Build it as a ``TableClient``: ``WireTableClient(endpoint, table_name,
    credential=...)`` or ``WireTableClient.from_connection_string(...)``;
    ``TableConfig(..., transport="wire").table_client()`` builds one from the
    environment. Credentials: an account key, a SAS token, or a
    ``TokenCredential``. ``connection_pool_size`` bounds the connections kept
    to the account (size it for the keys in flight); ``proxies`` and
    ``connection_verify`` are the SDK's options of the same names, and
    ``raw_request_hook`` is called with each wire request too.
    """

    def __init__(
        self,
        endpoint: str,
        table_name: str,
        *,
        credential: Any = None,
        connection_pool_size: int = DEFAULT_POOL_SIZE,
        **kwargs: Any,
    ) -> None:
        super().__init__(endpoint, table_name, credential=credential, **kwargs)
        self._wire = WireSetup.of(endpoint, table_name, credential, kwargs)
        self._pool_size = connection_pool_size
        self._http = self._connections()
        renew_in_child(self)

    def _connections(self) -> urllib3.PoolManager:
        setup = self._wire
        options: dict[str, Any] = {"maxsize": self._pool_size, "block": False}
        if setup.verify is False:
            options["cert_reqs"] = "CERT_NONE"
        elif isinstance(setup.verify, str):
            options["ca_certs"] = setup.verify
        http = (
            urllib3.ProxyManager(setup.proxy, **options)
            if setup.proxy
            else urllib3.PoolManager(**options)
        )
        http.pool_classes_by_scheme = POOL_CLASSES  # each request ends by its deadline
        return http

    def _after_fork(self) -> None:
        """In a forked child: connections of its own (see :mod:`._fork`)."""
        keep(self._http)
        self._http = self._connections()

    @classmethod
    def from_connection_string(cls, conn_str: str, table_name: str, **kwargs: Any) -> Self:
        """As ``TableClient.from_connection_string``: an account key or a SAS token."""
        return cast(Self, super().from_connection_string(conn_str, table_name, **kwargs))

    def perform(self, request: Request, deadline: float | None = None) -> object:
        """Perform one of the engine's requests; see :mod:`streamstone_py._exchange`."""
        steps = exchange(self._wire.service, request, update_as_transaction=False)
        try:
            call = next(steps)
            while True:
                call = steps.send(self._send(call, deadline))
        except StopIteration as stop:
            return stop.value
        except Exception as exc:
            raise_as_storage_error(exc)

    def _send(self, call: HttpCall, deadline: float | None) -> Answer:
        setup = self._wire
        date = http_date()
        headers = call.headers
        headers["x-ms-date"] = date
        headers["User-Agent"] = setup.agent
        authorization = setup.auth.header(
            call.method, call.resource, call.content_type, date, deadline
        )
        if authorization is not None:
            headers["Authorization"] = authorization
        if setup.hook is not None:
            setup.hook(call)
        left = time_left(deadline)
        end = time.monotonic() + left
        with watching(end) as watch:
            try:
                response = self._http.request(
                    call.method,
                    call.url,
                    body=call.body,
                    headers=headers,
                    timeout=urllib3.Timeout(connect=left, read=left),
                    retries=False,
                    redirect=False,
                )
            except Exception as exc:
                # The socket's own timeout is the same deadline, and may come
                # before the watchdog's thread runs (a busy machine): either
                # way, the answer did not come in time.
                if watch.fired or time.monotonic() >= end:
                    raise _overdue(left, exc) from exc
                raise
        if watch.fired:
            # http.client takes the end of a socket shut amid the headers for
            # their end: what came is a piece of an answer, never the answer.
            raise _overdue(left, None)
        answered(response.status, response.headers)
        return Answer(response.status, response.reason or "", response.headers, response.data)

    def close(self) -> None:
        self._http.clear()
        super().close()

    def __exit__(self, *args: Any) -> None:
        self._http.clear()
        super().__exit__(*args)
