"""How the wire runners authenticate a request: every credential the SDK's
table clients take, signed or attached as the Table service documents.

- an account key (``AzureNamedKeyCredential``, or a connection string's
  ``AccountKey``): the ``SharedKey`` scheme, as azure-data-tables signs;
- a SAS token (``AzureSasCredential``, a connection string's
  ``SharedAccessSignature``, or the query of the endpoint URL): appended to
  every request's query;
- a ``TokenCredential`` (azure-identity): a bearer token for
  ``https://storage.azure.com/.default``, kept until shortly before it
  expires, waited for no longer than the call's deadline, sent over HTTPS
  only.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import inspect
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Final

from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
from azure.core.exceptions import ServiceRequestError

from .._protocol import time_left
from ._fork import renew_in_child

__all__ = ["SCOPE", "Auth", "auth_of"]

#: The scope of a bearer token for Azure Storage.
SCOPE: Final = "https://storage.azure.com/.default"
#: A token is renewed this long before it expires, so a request never carries one that
#: expires on its way.
_RENEW_BEFORE: Final = 300.0


class Auth:
    """What a request carries to authenticate: a header, and/or a query."""

    #: The SAS token to append to every URL's query ("" for none).
    query: str = ""

    def header(
        self, method: str, resource: str, content_type: str, date: str, deadline: float | None
    ) -> str | None:
        """The ``Authorization`` value for a request (None: the query
        authenticates), by ``deadline``, the call's (``time.monotonic()`` clock)."""
        return None

    async def header_async(
        self, method: str, resource: str, content_type: str, date: str, deadline: float | None
    ) -> str | None:
        return self.header(method, resource, content_type, date, deadline)


class SharedKey(Auth):
    """``SharedKey`` for the Table service: the verb, Content-MD5 (empty),
    Content-Type, ``x-ms-date`` and the canonicalized resource, HMAC-SHA256."""

    def __init__(self, account: str, key: str) -> None:
        self.account = account
        self._key = base64.b64decode(key)

    def header(
        self, method: str, resource: str, content_type: str, date: str, deadline: float | None
    ) -> str:
        text = f"{method}\n\n{content_type}\n{date}\n/{self.account}{resource}"
        digest = hmac.new(self._key, text.encode("utf-8"), hashlib.sha256).digest()
        return f"SharedKey {self.account}:{base64.b64encode(digest).decode('ascii')}"

    def __repr__(self) -> str:
        return f"SharedKey(account={self.account!r}, key=***)"


class Sas(Auth):
    def __init__(self, token: str) -> None:
        self.query = token.lstrip("?")

    def __repr__(self) -> str:
        return "Sas(***)"


class TokenTimeoutError(TimeoutError):
    """No bearer token came within the call's time: the request was not sent."""


class Bearer(Auth):
    """A bearer token from a ``TokenCredential`` (sync or async), cached.

    A token is fetched in the background, one fetch at a time, and each
    request waits for it only until its call's deadline: a token endpoint
    that is slow or hangs ends the call in time, as a request that was not
    sent (``ServiceRequestError``), and the token that comes later serves the
    calls after it. No lock is held while fetching, and a forked child
    starts afresh (see :mod:`._fork`): the parent's fetch is not its own.
    """

    def __init__(self, credential: Any) -> None:
        self.credential = credential
        self._cached: tuple[str, float] | None = None  # the token, and when it expires
        self._start()
        renew_in_child(self)

    def _start(self) -> None:
        self._lock = threading.Lock()
        self._fetching: Future[str] | None = None  # a sync credential's fetch, in a thread
        self._task: asyncio.Task[str] | None = None  # an async credential's, in a loop

    def _after_fork(self) -> None:
        self._start()

    def _fresh(self) -> str | None:
        cached = self._cached
        return cached[0] if cached is not None and time.time() < cached[1] - _RENEW_BEFORE else None

    def _keep(self, token: Any) -> str:
        self._cached = (token.token, float(token.expires_on))
        return str(token.token)

    def _fetch(self) -> Future[str]:
        """The fetch under way, or a new one in a thread of its own."""
        with self._lock:
            fetching = self._fetching
            if fetching is None or fetching.done():
                fetching = self._fetching = Future()
                threading.Thread(
                    target=self._get, args=(fetching,), name="streamstone-token", daemon=True
                ).start()
            return fetching

    def _get(self, fetching: Future[str]) -> None:
        try:
            fetching.set_result(self._keep(self.credential.get_token(SCOPE)))
        except BaseException as exc:
            fetching.set_exception(exc)

    def header(
        self, method: str, resource: str, content_type: str, date: str, deadline: float | None
    ) -> str:
        token = self._fresh()
        if token is None:
            left = time_left(deadline)
            try:
                token = self._fetch().result(timeout=left)
            except FutureTimeout as exc:
                raise _late(left) from exc
        return f"Bearer {token}"

    async def header_async(
        self, method: str, resource: str, content_type: str, date: str, deadline: float | None
    ) -> str:
        token = self._fresh()
        if token is None:
            left = time_left(deadline)
            if inspect.iscoroutinefunction(self.credential.get_token):
                pending: asyncio.Future[str] = self._task_in(asyncio.get_running_loop())
            else:  # a sync credential: its fetch must not hold the event loop
                pending = asyncio.wrap_future(self._fetch())
            try:
                token = await asyncio.wait_for(asyncio.shield(pending), left)
            except TimeoutError as exc:
                raise _late(left) from exc
        return f"Bearer {token}"

    def _task_in(self, loop: asyncio.AbstractEventLoop) -> asyncio.Task[str]:
        """The async credential's fetch under way in ``loop``, or a new one."""
        task = self._task
        if task is None or task.done() or task.get_loop() is not loop:
            task = self._task = loop.create_task(self._get_async())
        return task

    async def _get_async(self) -> str:
        return self._keep(await self.credential.get_token(SCOPE))

    def __repr__(self) -> str:
        return f"Bearer({type(self.credential).__name__})"


def _late(left: float) -> ServiceRequestError:
    return ServiceRequestError(
        f"no bearer token in {left:.1f} s, the call's time left: the request was not sent",
        error=TokenTimeoutError(),
    )


def auth_of(credential: object, endpoint_query: str) -> Auth:
    """The authentication of a client built with ``credential`` on an endpoint
    whose URL had ``endpoint_query`` (a SAS there is a credential too)."""
    if isinstance(credential, AzureNamedKeyCredential):
        return SharedKey(credential.named_key.name, credential.named_key.key)
    if isinstance(credential, AzureSasCredential):
        return Sas(credential.signature)
    if credential is not None and hasattr(credential, "get_token"):
        return Bearer(credential)
    if credential is None and endpoint_query:
        return Sas(endpoint_query)
    raise TypeError(
        f"the wire runner takes an account key, a SAS token or a TokenCredential, "
        f"got {type(credential).__name__}"
    )
