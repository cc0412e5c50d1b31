"""Queue texts that are not messages, and the valid ones beside them: what the
property tests (hypothesis) and the chaos harness (``random``) send.

Every form in :data:`HOSTILE` makes a text that no admission may take (it
must end in the poison queue, alone, with its reason): each names how it
breaks, and takes a random generator and the key it pretends to be for, so
that it lands among valid messages of the same keys.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from hypothesis import strategies as st

from handlers import Message, Processor, encode_envelope

__all__ = [
    "HOSTILE", "Mix", "b64", "bodies", "deep", "draw_mix", "envelope", "stored_exactly",
    "valid_text", "wild_text",
]  # fmt: skip


def envelope(**fields: Any) -> str:
    """Plain JSON text of ``fields`` (a lone surrogate written as its escape)."""
    return json.dumps(fields)


def b64(text: str | bytes) -> str:
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    return base64.b64encode(data).decode("ascii")


def valid_text(message: Message, plain: bool = False) -> str:
    """A message as a producer sends it: base64 of its envelope, or plain."""
    text = encode_envelope(message)
    return text if plain else b64(text)


def deep(levels: int) -> str:
    """A body nested ``levels`` deep, as JSON text."""
    return '{"a":' * levels + "1" + "}" * levels


def _id(rng: random.Random) -> str:
    return f"h-{rng.getrandbits(40):x}"


def _raw(rng: random.Random, key: str, body: str) -> str:
    """An envelope whose body is ``body`` as written (text JSON's grammar takes)."""
    fields = f'"id": {json.dumps(_id(rng))}, "key": {json.dumps(key)}, "type": "Keep"'
    return "{" + fields + ', "body": ' + body + "}"


Form = Callable[[random.Random, str], str]

#: How a text breaks, and how to make one (``rng``, ``key``).
HOSTILE: Final[dict[str, Form]] = {
    "not JSON": lambda r, k: f"not a message {r.random()}",
    "JSON, not an object": lambda r, k: json.dumps(r.choice([[1, 2], "text", 42, None, True])),
    "no key": lambda r, k: envelope(id=_id(r), type="Keep"),
    "no type": lambda r, k: b64(envelope(id=_id(r), key=k)),
    "a key that is a number": lambda r, k: envelope(id=_id(r), key=r.randint(0, 9), type="Keep"),
    "a type that is a list": lambda r, k: envelope(id=_id(r), key=k, type=["Keep"]),
    "headers that are a list": lambda r, k: envelope(id=_id(r), key=k, type="Keep", headers=[1]),
    "a header that is a number": lambda r, k: envelope(
        id=_id(r), key=k, type="Keep", headers={"h": 1}
    ),
    "a due out of the calendar in UTC": lambda r, k: envelope(
        id=_id(r),
        key=k,
        type="Keep",
        due=r.choice(["9999-12-31T23:00:00-05:00", "0001-01-01T00:30:00+05:00"]),
    ),
    "a due that is not a time": lambda r, k: envelope(id=_id(r), key=k, type="Keep", due="soon"),
    "a due without a zone": lambda r, k: envelope(
        id=_id(r), key=k, type="Keep", due="2030-01-01T00:00:00"
    ),
    "a lone surrogate in the id": lambda r, k: envelope(id="\udfff" + _id(r), key=k, type="Keep"),
    "a lone surrogate in the key": lambda r, k: envelope(id=_id(r), key=k + "\ud800", type="Keep"),
    "a lone surrogate in a header": lambda r, k: envelope(
        id=_id(r), key=k, type="Keep", headers={"h": "\udc00"}
    ),
    "a lone surrogate in the body": lambda r, k: b64(
        envelope(id=_id(r), key=k, type="Keep", body={"x": ["\ud83d"]})
    ),
    "an integer beyond 64 bits": lambda r, k: envelope(
        id=_id(r), key=k, type="Keep", body={"n": 2**64 + r.randint(0, 10**30)}
    ),
    "a number no float holds": lambda r, k: _raw(r, k, "1e999"),
    "an integer of 5,000 digits": lambda r, k: _raw(r, k, "7" * 5000),
    "NaN": lambda r, k: _raw(r, k, "NaN"),
    "a body nested 300 deep": lambda r, k: _raw(r, k, deep(300)),
    "a body nested 5,000 deep": lambda r, k: _raw(r, k, deep(5000)),
    "a $base64 marker that is not base64": lambda r, k: b64(
        envelope(id=_id(r), key=k, type="Keep", body={"$base64": "not base64!"})
    ),
    "a key the table cannot store": lambda r, k: envelope(
        id=_id(r), key=r.choice([k + "/x", k + "|x", k + "#", "x" * 1200, "\x00"]), type="Keep"
    ),
    "an id the table cannot store": lambda r, k: envelope(id="h/" + _id(r), key=k, type="Keep"),
    "base64 of bytes that are not UTF-8": lambda r, k: b64(b"\xff\xfe{" + r.randbytes(8)),
    "base64 of a JSON array": lambda r, k: b64("[1, 2, 3]"),
}


# --- for hypothesis --------------------------------------------------------------

#: Keys that make a body look like a marker, or hold one.
_MARKER_KEYS = st.sampled_from(["$base64", "$object", "a", ""]) | st.text(max_size=6)
#: Any body a handler may publish: msgpack data, markers' look-alikes included.
#: Text a ``$base64`` marker may hold: base64 of bytes, or text that is not.
_BASE64ISH = st.binary(max_size=6).map(lambda data: b64(data)) | st.sampled_from(["", "!"])
bodies = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.binary(max_size=12)
    | st.builds(lambda text: {"$base64": text}, _BASE64ISH),  # a body's own, not bytes
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(_MARKER_KEYS, children, max_size=3)
        | st.builds(lambda inner: {"$object": inner}, st.dictionaries(_MARKER_KEYS, children))
    ),
    max_leaves=12,
)
#: Any JSON value, and more than JSON should hold: what a producer may put in any field.
_wild_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | st.text(st.characters() | st.sampled_from("\ud800\udc00\udfff"), max_size=8)
    | st.sampled_from(["9999-12-31T23:00:00-05:00", "2030-01-01T00:00:00+00:00", "Keep"]),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(_MARKER_KEYS, children, max_size=3)
    ),
    max_leaves=8,
)


def wild_text(keys: list[str]) -> st.SearchStrategy[str]:
    """An envelope whose every field may be any value (a key among ``keys`` or any)."""
    return st.fixed_dictionaries(
        {"key": st.sampled_from(keys) | _wild_values, "type": st.just("Keep") | _wild_values},
        optional=dict.fromkeys(("id", "body", "headers", "due"), _wild_values),
    ).map(lambda fields: envelope(**fields))


@dataclass(frozen=True)
class Mix:
    """Valid messages and hostile texts on the same keys, as one queue gets them."""

    keys: list[str]
    valid: list[Message]
    forms: list[str]
    hostile: list[str]
    #: Every text once, shuffled: the valid ones (some as plain JSON), the
    #: hostile ones, and envelopes of any values (each is stored or refused).
    texts: list[str]


def draw_mix(data: st.DataObject, tag: str, *, least_valid: int = 0, most: int = 5) -> Mix:
    keys = [f"p-{tag}-a", f"p-{tag}-b"]
    rng = data.draw(st.randoms(use_true_random=False))
    drawn = data.draw(st.lists(bodies, min_size=least_valid, max_size=most))
    valid = [
        Message(f"v-{n}-{tag}", data.draw(st.sampled_from(keys)), "Keep", body)
        for n, body in enumerate(drawn)
    ]
    forms = data.draw(st.lists(st.sampled_from(sorted(HOSTILE)), min_size=1, max_size=most))
    hostile = list(dict.fromkeys(HOSTILE[form](rng, rng.choice(keys)) for form in forms))
    wild = data.draw(st.lists(wild_text(keys), max_size=3))
    plain = [valid_text(m, plain=rng.random() < 0.3) for m in valid]
    texts = list(dict.fromkeys(plain + hostile + wild))
    rng.shuffle(texts)
    return Mix(keys, valid, forms, hostile, texts)


def stored_exactly(processor: Processor[Any], mix: Mix) -> None:
    """Each of ``mix``'s keys stored its messages once each (the ``Seen``
    handler's state), and each valid message with its body exactly."""
    stored: dict[str, Any] = {}
    for key in mix.keys:
        state = processor.current_state(key).state
        assert len(state.ids) == len(set(state.ids))  # each stored once
        stored.update(zip(state.ids, state.bodies, strict=True))
    for message in mix.valid:  # 1 stays 1 (not 1.0), bytes stay bytes
        assert Message("m", "k", "T", stored[message.id]).encode() == (
            Message("m", "k", "T", message.body).encode()
        )
