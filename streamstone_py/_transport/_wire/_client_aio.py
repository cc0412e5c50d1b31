"""The async wire runner's client: an ``aio.TableClient`` whose streamstone
requests travel over HTTP/1.1 with aiohttp, spoken by the engine itself.

As its sync sibling, it is a full SDK client for everything else. Its
aiohttp session is its own, opened on first use in the running loop (and
again in a forked child). Each request must be over, answer read, by its
call's deadline (aiohttp's ``total``, where ``sock_read`` alone would let an
answer that trickles in hold a call). aiohttp sends an idempotent method
again by itself when a kept-alive connection drops, even after the server
applied it: that is switched off, and a conditional replace goes as a
one-operation ``$batch`` besides, since the engine must resolve such a
write by reading, never have it re-sent blind.
"""

from __future__ import annotations

import ssl
from typing import Any, Self, cast

import aiohttp
import yarl
from azure.core.exceptions import ServiceResponseTimeoutError
from azure.data.tables.aio import TableClient as AsyncTableClient

from .._protocol import Request, time_left
from .._retry import raise_as_storage_error
from .._tracing import answered
from ._client import DEFAULT_POOL_SIZE, WireSetup
from ._exchange import Answer, HttpCall, exchange, http_date
from ._fork import keep, renew_in_child

__all__ = ["AsyncWireTableClient"]


class AsyncWireTableClient(AsyncTableClient):
    """The async twin of :class:`streamstone_py.WireTableClient`, for
    :mod:`streamstone_py.aio`; built the same way, with the same options."""

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
        self._wire = setup = WireSetup.of(endpoint, table_name, credential, kwargs)
        self._pool_size = connection_pool_size
        self._ssl: ssl.SSLContext | bool = True
        if setup.verify is False:
            self._ssl = False
        elif isinstance(setup.verify, str):
            self._ssl = ssl.create_default_context(cafile=setup.verify)
        self._session: aiohttp.ClientSession | None = None
        renew_in_child(self)

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, ssl=self._ssl)
            session = aiohttp.ClientSession(
                connector=connector, auto_decompress=False, trust_env=False
            )
            if hasattr(session, "_retry_connection"):
                # Its re-send of an idempotent request on a dropped kept-alive
                # connection (aiohttp's own test client turns it off the same way).
                session._retry_connection = False
            self._session = session
        return self._session

    def _after_fork(self) -> None:
        """In a forked child: a session of its own, made in the child's loop
        on first use (see :mod:`._fork`)."""
        if self._session is not None:
            keep(self._session)
            self._session = None

    @classmethod
    def from_connection_string(cls, conn_str: str, table_name: str, **kwargs: Any) -> Self:
        """As ``TableClient.from_connection_string``: an account key or a SAS token."""
        return cast(Self, super().from_connection_string(conn_str, table_name, **kwargs))

    async def perform(self, request: Request, deadline: float | None = None) -> object:
        """Perform one of the engine's requests; see :mod:`streamstone_py._exchange`."""
        steps = exchange(self._wire.service, request, update_as_transaction=True)
        try:
            call = next(steps)
            while True:
                call = steps.send(await self._send(call, deadline))
        except StopIteration as stop:
            return stop.value
        except TimeoutError as exc:  # an answer that outlived its time: the request went out
            raise ServiceResponseTimeoutError(
                f"no complete answer in the call's time: {exc!r}", error=exc
            ) from exc
        except Exception as exc:
            raise_as_storage_error(exc)

    async def _send(self, call: HttpCall, deadline: float | None) -> Answer:
        setup = self._wire
        date = http_date()
        headers = call.headers
        headers["x-ms-date"] = date
        headers["User-Agent"] = setup.agent
        authorization = await setup.auth.header_async(
            call.method, call.resource, call.content_type, date, deadline
        )
        if authorization is not None:
            headers["Authorization"] = authorization
        if setup.hook is not None:
            setup.hook(call)
        left = time_left(deadline)
        # total: the whole request, answer read, with no rounding up to the second.
        timeout = aiohttp.ClientTimeout(
            total=left, sock_connect=left, sock_read=left, ceil_threshold=float("inf")
        )
        async with self._open().request(
            call.method,
            yarl.URL(call.url, encoded=True),  # as signed: not quoted again
            data=call.body,
            headers=headers,
            timeout=timeout,
            proxy=self._wire.proxy,
            allow_redirects=False,
        ) as response:
            data = await response.read()
            answered(response.status, response.headers)
            return Answer(response.status, response.reason or "", response.headers, data)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
        await super().close()

    async def __aexit__(self, *args: Any) -> None:
        if self._session is not None:
            await self._session.close()
        await super().__aexit__(*args)
