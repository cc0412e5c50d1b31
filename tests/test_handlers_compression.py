"""Compressed states and outbox outputs: stored smaller, read back transparently,
and mixed freely with versions stored before compression was turned on."""

from __future__ import annotations

from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import HandlerContext, InMemoryPublisher, Message, Processor, handler
from handlers._compression import MARK, pack_stored, unpack_stored
from handlers._messages._codec import pack
from handlers._outcome import StrategyName
from handlers.testing import replay_load
from streamstone_py import Partition, Stream, join_binary


@handler("Ledger")
def ledger(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    """A state that grows by a realistic, repetitive entry per message."""
    entries = state.setdefault("entries", [])
    entries.append({"id": message.id, "account": "acc-0001", "amount": message.body["amount"],
                    "currency": "EUR", "note": "monthly settlement " * 4})  # fmt: skip
    ctx.publish("Booked", {"entry": message.id, "total": len(entries), "note": "booked " * 30})


def messages(key: str, first: int, count: int) -> list[Message]:
    return [Message(f"m-{n}", key, "Book", {"amount": n}) for n in range(first, first + count)]


def stored_header_state(table: TableClient, key: str) -> bytes:
    stream = Stream.open(Partition(table, key, "Ledger"))
    return join_binary("State", stream.properties)


def test_states_are_stored_compressed_and_read_back_unchanged(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    plain = Processor(ledger, table, InMemoryPublisher(), strategy=strategy)
    packed = Processor(ledger, table, InMemoryPublisher(), strategy=strategy, compression="zlib")
    plain.process_batch(game + "-p", messages(game + "-p", 1, 30))
    packed.process_batch(game + "-z", messages(game + "-z", 1, 30))

    raw = stored_header_state(table, game + "-p")
    small = stored_header_state(table, game + "-z")
    assert raw[:1] != MARK
    assert small[:2] == MARK + b"\x01"
    assert len(small) * 2 <= len(raw)
    assert unpack_stored(small) == raw
    # Every read gives the same states, whichever way they were stored.
    assert packed.current_state(game + "-z").state == plain.current_state(game + "-p").state
    assert [v.state for v in packed.history(game + "-z")] == [
        v.state for v in plain.history(game + "-p")
    ]
    assert replay_load(packed, game + "-z", "m-7") == replay_load(plain, game + "-p", "m-7")


def test_a_table_mixes_both_forms_and_duplicates_of_either_replay(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    """Compression turned on between deploys, then off again: every version stays
    readable, and a duplicate of an old uncompressed version still replays."""
    publisher = InMemoryPublisher()
    before = Processor(ledger, table, publisher, strategy=strategy, dispatch="by_caller")
    after = Processor(ledger, table, publisher, strategy=strategy, dispatch="by_caller",
                      compression="zlib")  # fmt: skip
    first = before.process_batch(game, messages(game, 1, 5))
    second = after.process_batch(game, messages(game, 6, 5))

    assert stored_header_state(table, game)[:1] == MARK
    again = after.process_batch(game, messages(game, 1, 10))
    assert [o.status for o in again] == ["duplicate"] * 10
    assert [o.outputs for o in again] == [o.outputs for o in first + second]
    # Turned off again: the compressed versions read back, and new ones are plain.
    back = before.process_batch(game, [*messages(game, 8, 1), *messages(game, 11, 1)])
    assert [(o.status, o.outputs) for o in back[:1]] == [("duplicate", second[2].outputs)]
    assert back[1].status == "completed"
    assert stored_header_state(table, game)[:1] != MARK
    history = list(before.history(game))
    assert [v.message_id for v in history] == [f"m-{n}" for n in range(1, 12)]
    assert [len(v.state["entries"]) for v in history] == list(range(1, 12))


def test_small_values_stay_as_they_are_and_bad_settings_are_refused(
    table: TableClient, game: str
) -> None:
    tiny = pack({"n": 1})
    assert pack_stored(tiny, "zlib") == tiny
    assert pack_stored(b"\x80" * 1000, None) == b"\x80" * 1000
    with pytest.raises(ValueError, match="compression must be None or 'zlib', got 'gzip'"):
        Processor(ledger, table, InMemoryPublisher(), compression="gzip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"unknown codec b'\\x07'"):
        unpack_stored(MARK + b"\x07" + b"data")
