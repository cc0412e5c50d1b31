"""What the verbs need of a stream's header, below them all: its fields, and
how they make one.

The header class, :class:`streamstone_py.Stream`, carries the verbs as its
static methods, so it stands above them: each verb is handed that class
(``header_type``) and makes the headers it returns with it. The verbs, the
results that hold a header and the errors that carry one name this protocol
and its type variables, never the class.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Self

from typing_extensions import TypeVar

from ._codec._values import PropertyValue
from ._partition import Partition

__all__ = ["H", "H_co", "Header"]


class Header(Protocol):
    """A stream header as the verbs read and make it."""

    @property
    def partition(self) -> Partition: ...

    @property
    def etag(self) -> str | None: ...

    @property
    def version(self) -> int: ...

    @property
    def properties(self) -> Mapping[str, PropertyValue]: ...

    @property
    def first_version(self) -> int: ...

    def __init__(
        self, partition: Partition, properties: Mapping[str, PropertyValue] | None = None
    ) -> None: ...

    @classmethod
    def _stored(
        cls,
        partition: Partition,
        etag: str,
        version: int,
        properties: Mapping[str, Any] | None,
        first_version: int = 1,
    ) -> Self: ...


#: The header class a verb is handed, and so the class of the headers it returns.
H = TypeVar("H", bound=Header)
#: The header a result or an error holds: ``Stream.write`` gives a
#: ``WriteResult[Stream]``. Where no verb says which (a bare ``WriteResult`` in
#: a caller's annotation, an error caught), it is any header, so that code
#: written when these types named ``Stream`` reads them as before.
H_co = TypeVar("H_co", bound=Header, covariant=True, default=Any)
