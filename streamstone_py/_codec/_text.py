"""Text as the table takes it, for keys, ids, property names and values alike:
exactly a ``str`` (a subclass travels as its characters in a URL but as its
``str()`` in a JSON body, so the two would disagree), Unicode (no lone
surrogate), and measured in UTF-16, the unit of the service's limits."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from typing import Final

__all__ = [
    "EMULATOR_ACCOUNT",
    "emulator_drop",
    "exact_str",
    "lone_surrogate",
    "type_name",
    "utf16_size",
]

_SURROGATE: Final = re.compile("[\ud800-\udfff]")

#: The account name of Azure's storage emulator (Azurite's, by default).
EMULATOR_ACCOUNT: Final = "devstoreaccount1"
#: Property names Azurite drops from a row without a word: the members of
#: JavaScript's Object.prototype (hasOwnProperty it answers with a 500, after
#: storing part of the transaction). Exact names: ``Constructor`` is stored.
_EMULATOR_DROPS: Final = frozenset(
    {
        "constructor", "__proto__", "__defineGetter__", "__defineSetter__",
        "__lookupGetter__", "__lookupSetter__", "hasOwnProperty", "isPrototypeOf",
        "propertyIsEnumerable", "toString", "toLocaleString", "valueOf",
    }
)  # fmt: skip


def emulator_drop(names: Iterable[str]) -> str | None:
    """One of ``names`` that Azurite would drop (the first in sort order), if any."""
    return min(_EMULATOR_DROPS.intersection(names), default=None)


def utf16_size(text: str) -> int:
    """Bytes of ``text`` in UTF-16, the unit of Azure's string limits."""
    return len(text.encode("utf-16-le", "surrogatepass"))


def lone_surrogate(text: str) -> re.Match[str] | None:
    """The first lone surrogate of ``text`` (no Unicode text holds one), if any."""
    return None if text.isascii() else _SURROGATE.search(text)


def type_name(value: object) -> str:
    """The type of ``value`` as an error names it: ``int``, ``mymodule.Status``."""
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def exact_str(what: str, value: object) -> str:
    """``value`` if it is exactly a ``str``; else a ``TypeError`` that names
    ``what`` it is and what to store instead."""
    if type(value) is str:
        return value
    kind = type_name(value)
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {kind}: {value!r}")
    characters = str.__str__(value)
    if isinstance(value, enum.Enum) and type(value.value) is str:
        instead = f"its .value ({value.value!r})"
    else:
        instead = f"str.__str__(value) ({characters!r}), which keeps its characters"
    shown = str(value)
    why = (
        f"it would travel as {characters!r} in a request's URL but as {shown!r} in its body"
        if shown != characters
        else "it would read back as a plain str"
    )
    raise TypeError(f"{what} {value!r} is a {kind}, not exactly a str ({why}): store {instead}")
