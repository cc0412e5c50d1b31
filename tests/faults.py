"""Fault injection around the real transport: the request reaches Azurite or it does not.

A :class:`FaultPlan` is a queue of faults, each for the next request that
matches it:

- ``"before"``: the connection fails before anything is sent (nothing applied).
- ``"lost"``: the answer is lost, but the request was never sent (nothing
  applied, yet the client cannot know that).
- ``"after"``: the request reaches Azurite and is applied, then the answer is
  lost (an ambiguous commit).
- ``"pass"``: no fault; it only lets a matching request through, to aim the
  next fault at a later one.

``meanwhile`` runs at the moment of the fault, to let a rival writer act
while the faulted client does not know the outcome.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from azure.core.exceptions import ServiceRequestError, ServiceResponseError
from azure.core.pipeline.transport import (
    AioHttpTransport,
    AsyncHttpTransport,
    HttpTransport,
    RequestsTransport,
)

from streamstone_py import RetryPolicy

#: Retries of the faulted partitions: quick, and few enough to run out of.
FAST = RetryPolicy(attempts=4, initial_delay=0.005, max_delay=0.02, total_time=10)
#: How a transaction travels: the plan's faults aim at it by these.
BATCH = ("POST", "$batch")


@dataclass
class Fault:
    kind: str
    method: str | None = None
    url_part: str | None = None
    meanwhile: Callable[[], None] | None = None

    def matches(self, request: Any) -> bool:
        return (self.method is None or request.method == self.method) and (
            self.url_part is None or self.url_part in request.url
        )


@dataclass
class FaultPlan:
    faults: list[Fault] = field(default_factory=list)
    injected: list[str] = field(default_factory=list)
    requests: int = 0

    def add(self, kind: str, method: str | None = None, url_part: str | None = None, *,
            times: int = 1, meanwhile: Callable[[], None] | None = None) -> FaultPlan:  # fmt: skip
        self.faults += [Fault(kind, method, url_part, meanwhile) for _ in range(times)]
        return self

    def take(self, request: Any) -> Fault | None:
        self.requests += 1
        for i, fault in enumerate(self.faults):
            if fault.matches(request):
                del self.faults[i]
                self.injected.append(f"{fault.kind} {request.method}")
                return fault
        return None

    @staticmethod
    def fail(fault: Fault) -> None:
        if fault.meanwhile is not None:
            fault.meanwhile()
        if fault.kind == "before":
            # As a transport reports a refused connection: the cause proves nothing was sent.
            raise ServiceRequestError(
                "injected fault: connection failed before sending",
                error=ConnectionRefusedError(111, "Connection refused"),
            )
        raise ServiceResponseError("injected fault: the response was lost")


class DelegatingTransport(HttpTransport[Any, Any]):
    """The SDK's real transport behind a ``send`` that subclasses wrap."""

    def __init__(self) -> None:
        self.inner = RequestsTransport()

    def __enter__(self) -> DelegatingTransport:
        self.inner.__enter__()
        return self

    def __exit__(self, *args: Any) -> None:
        self.inner.__exit__(*args)

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def send(self, request: Any, **kwargs: Any) -> Any:
        return self.inner.send(request, **kwargs)


class FaultyTransport(DelegatingTransport):
    def __init__(self, plan: FaultPlan) -> None:
        super().__init__()
        self.plan = plan

    def send(self, request: Any, **kwargs: Any) -> Any:
        fault = self.plan.take(request)
        if fault is not None and fault.kind in ("before", "lost"):
            self.plan.fail(fault)
        response = self.inner.send(request, **kwargs)
        if fault is not None and fault.kind == "after":
            # Azurite has sent its answer, so the request was applied.
            response.internal_response.close()
            self.plan.fail(fault)
        return response


class AsyncFaultyTransport(AsyncHttpTransport[Any, Any]):
    def __init__(self, plan: FaultPlan) -> None:
        self.inner = AioHttpTransport()
        self.plan = plan

    async def __aenter__(self) -> AsyncFaultyTransport:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, *args: Any) -> None:
        await self.inner.__aexit__(*args)

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def send(self, request: Any, **kwargs: Any) -> Any:
        fault = self.plan.take(request)
        if fault is not None and fault.kind in ("before", "lost"):
            self.plan.fail(fault)
        response = await self.inner.send(request, **kwargs)
        if fault is not None and fault.kind == "after":
            # Azurite has sent its answer, so the request was applied.
            response.internal_response.close()
            self.plan.fail(fault)
        return response


class Crash(BaseException):
    """The worker died here: nothing in the code under test may catch it."""


class CrashingTransport(DelegatingTransport):
    """The real transport; the worker dies at one chosen request.

    ``at`` counts the requests that match ``method``/``url_part`` (1 = the
    first). ``when="before"`` dies before sending it; ``"after"`` lets Azurite
    apply it and dies before the answer is read. ``armed`` turns counting on.
    """

    def __init__(
        self,
        at: int,
        when: str = "before",
        method: str | None = None,
        url_part: str | None = None,
    ) -> None:
        super().__init__()
        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', got {when!r}")
        self.at, self.when = at, when
        self.fault = Fault("crash", method, url_part)
        self.seen = 0
        self.armed = True
        self.crashed = False

    def send(self, request: Any, **kwargs: Any) -> Any:
        hit = False
        if self.armed and not self.crashed and self.fault.matches(request):
            self.seen += 1
            hit = self.seen == self.at
        if hit and self.when == "before":
            self.crashed = True
            raise Crash(f"crash before request {self.at} ({request.method})")
        response = self.inner.send(request, **kwargs)
        if hit:
            self.crashed = True
            response.internal_response.close()
            raise Crash(f"crash after request {self.at} ({request.method})")
        return response
