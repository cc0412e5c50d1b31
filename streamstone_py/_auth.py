"""How the wire runners authenticate a request: every credential the SDK's
table clients take, signed or attached as the Table service documents.

- an account key (``AzureNamedKeyCredential``, or a connection string's
  ``AccountKey``): the ``SharedKey`` scheme, as azure-data-tables signs;
- a SAS token (``AzureSasCredential``, a connection string's
  ``SharedAccessSignature``, or the query of the endpoint URL): appended to
  every request's query;
- a ``TokenCredential`` (azure-identity): a bearer token for
  ``https://storage.azure.com/.default``, kept until shortly before it
  expires, sent over HTTPS only.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import threading
import time
from typing import Any, Final

from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential

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

    def header(self, method: str, resource: str, content_type: str, date: str) -> str | None:
        """The ``Authorization`` value for a request (None: the query authenticates)."""
        return None

    async def header_async(
        self, method: str, resource: str, content_type: str, date: str
    ) -> str | None:
        return self.header(method, resource, content_type, date)


class SharedKey(Auth):
    """``SharedKey`` for the Table service: the verb, Content-MD5 (empty),
    Content-Type, ``x-ms-date`` and the canonicalized resource, HMAC-SHA256."""

    def __init__(self, account: str, key: str) -> None:
        self.account = account
        self._key = base64.b64decode(key)

    def header(self, method: str, resource: str, content_type: str, date: str) -> str:
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


class Bearer(Auth):
    """A bearer token from a ``TokenCredential`` (sync or async), cached."""

    def __init__(self, credential: Any) -> None:
        self.credential = credential
        self._token: str | None = None
        self._expires = 0.0
        self._lock = threading.Lock()
        self._alock: asyncio.Lock | None = None

    def _fresh(self) -> bool:
        return self._token is not None and time.time() < self._expires - _RENEW_BEFORE

    def header(self, method: str, resource: str, content_type: str, date: str) -> str:
        with self._lock:
            if not self._fresh():
                token = self.credential.get_token(SCOPE)
                self._token, self._expires = token.token, float(token.expires_on)
            return f"Bearer {self._token}"

    async def header_async(self, method: str, resource: str, content_type: str, date: str) -> str:
        if self._alock is None:
            self._alock = asyncio.Lock()
        async with self._alock:
            if not self._fresh():
                token = self.credential.get_token(SCOPE)
                if asyncio.iscoroutine(token):
                    token = await token
                self._token, self._expires = token.token, float(token.expires_on)
            return f"Bearer {self._token}"

    def __repr__(self) -> str:
        return f"Bearer({type(self.credential).__name__})"


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
