"""What a forked child makes again. ``os.fork`` copies every object of the
process but only the thread that forked: a client's kept-alive connections
would be shared with the parent's sockets, and a session's with the parent's
event-loop selector. Each wire client therefore gets connections of its own
in the child, and leaves the parent's untouched: closing them there could
take a lock some other thread held at the fork, or unregister a socket from
the selector the parent still uses. They are kept, never used, so that
collecting them never closes anything either. A bearer token's cache starts
afresh too: a fetch under way at the fork ran in a thread the child lacks.
"""

from __future__ import annotations

import os
import weakref
from typing import Final, Protocol

__all__ = ["keep", "renew_in_child"]


class _Renewable(Protocol):
    def _after_fork(self) -> None: ...


_RENEWED: Final[weakref.WeakSet[_Renewable]] = weakref.WeakSet()
_KEPT: Final[list[object]] = []


def renew_in_child(client: _Renewable) -> None:
    """Call ``client._after_fork()`` in every child this process forks."""
    _RENEWED.add(client)


def keep(inherited: object) -> None:
    """Hold what a child inherited from its parent for the child's lifetime."""
    _KEPT.append(inherited)


def _in_child() -> None:
    for client in list(_RENEWED):
        client._after_fork()


os.register_at_fork(after_in_child=_in_child)
