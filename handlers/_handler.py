"""Declaring handlers, and encoding their states."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar, cast, overload

from ._context import HandlerContext
from ._messages._codec import pack, unpack
from ._messages._message import Message

__all__ = ["Handler", "handler"]

S = TypeVar("S")


class Handler(Generic[S]):
    """A message handler for one kind of state.

    Subclass it (set ``name``, ``state_type`` and override :meth:`handle`), or
    decorate a function with :func:`handler`. The state is a dataclass (or a
    dict when ``state_type`` is None). A handler changes the state in place or
    returns a new one, and publishes outputs through the context. It must be
    deterministic: take time, randomness and ids from the context only.

    States evolve: a field added with a default loads from older snapshots;
    a field that snapshots have but the class no longer has is ignored.
    """

    name: str = ""
    state_type: type[S] | None = None
    #: The message types this handler accepts (``None``: every type).
    message_types: frozenset[str] | None = None

    def handle(self, state: S, message: Message, context: HandlerContext) -> S | None:
        raise NotImplementedError

    def accepts(self, message_type: str) -> bool:
        return self.message_types is None or message_type in self.message_types

    def initial_state(self) -> S:
        if self.state_type is None:
            return cast(S, {})
        return self.state_type()

    def apply(self, state: S, message: Message, context: HandlerContext) -> S:
        result = self.handle(state, message, context)
        return state if result is None else result

    def encode_state(self, state: S) -> bytes:
        if self.state_type is None:
            if not isinstance(state, Mapping):
                raise TypeError(f"state of {self.name!r} must be a mapping, got {state!r}")
            return pack(dict(state), f"state of {self.name!r}")
        if not isinstance(state, self.state_type):
            raise TypeError(
                f"handler {self.name!r} returned a {type(state).__name__}, "
                f"not a {self.state_type.__name__}"
            )
        values = {f.name: getattr(state, f.name) for f in dataclasses.fields(state)}  # type: ignore[arg-type]
        return pack(values, f"state of {self.name!r}")

    def decode_state(self, data: bytes) -> S:
        values = unpack(data)
        if self.state_type is None:
            return cast(S, values)
        known = {f.name: f for f in dataclasses.fields(self.state_type)}  # type: ignore[arg-type]
        missing = [
            name
            for name, f in known.items()
            if name not in values
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(
                f"a stored state of {self.name!r} lacks {missing}, which have no default: "
                "give new fields a default so older snapshots still load"
            )
        return self.state_type(**{k: v for k, v in values.items() if k in known})

    def __repr__(self) -> str:
        return f"<Handler {self.name!r}>"


class _FunctionHandler(Handler[S]):
    def __init__(
        self,
        fn: Callable[[S, Message, HandlerContext], S | None],
        name: str,
        state_type: type[S] | None,
        message_types: frozenset[str] | None,
    ) -> None:
        self._fn = fn
        self.name = name
        self.state_type = state_type
        self.message_types = message_types

    def handle(self, state: S, message: Message, context: HandlerContext) -> S | None:
        return self._fn(state, message, context)


#: The state of a handler declared without a state class.
Dict = dict[str, Any]


@overload
def handler(
    name: str, state: type[S], *, types: Iterable[str] | None = None
) -> Callable[[Callable[[S, Message, HandlerContext], S | None]], Handler[S]]: ...


@overload
def handler(
    name: str, state: None = None, *, types: Iterable[str] | None = None
) -> Callable[[Callable[[Dict, Message, HandlerContext], Dict | None]], Handler[Dict]]: ...


def handler(
    name: str, state: type[Any] | None = None, *, types: Iterable[str] | None = None
) -> Callable[[Callable[[Any, Message, HandlerContext], Any]], Handler[Any]]:
    """Declare a function ``(state, message, context) -> state | None`` as a handler.

    ``name`` identifies the handler's streams in storage: keep it stable.
    ``state`` is the state's dataclass (``None`` for a dict); ``types`` the
    message types it accepts (others are refused before it runs).
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"handler name {name!r} must be an identifier")
    if state is not None and not dataclasses.is_dataclass(state):
        raise TypeError(f"state type {state!r} must be a dataclass (or None for a dict)")
    accepted = frozenset(types) if types is not None else None

    def wrap(fn: Callable[[Any, Message, HandlerContext], Any]) -> Handler[Any]:
        return _FunctionHandler(fn, name, state, accepted)

    return wrap
