"""Where messages leave the runtime: a published output may never replace a row
of any stream, every field a publisher stores is checked before the state is,
and the strategies accept the same message ids. Then the nesting limit of
bodies, checked before anything recurses."""

from __future__ import annotations

import re
from typing import Any

import pytest
from azure.data.tables import TableClient
from hypothesis import given, settings
from hypothesis import strategies as st

from handlers import (
    MAX_NESTING,
    HandlerContext,
    InMemoryPublisher,
    Message,
    Processor,
    TablePublisher,
    handler,
)
from handlers._outcome import StrategyName
from handlers.examples import shooting_range
from spark_driver._tasks._rows import json_nests_deeper, parse_row
from streamstone_py import Include, Partition, Stream, is_stream_row_key
from tests.helpers import rows
from tests.test_handlers_holes import adds, tally


@handler("Relay", None, types=["Relay"])
def relay(state: dict[str, Any], message: Message, ctx: HandlerContext) -> None:
    """Publishes what the message asks: a key, an id, a type of its choosing."""
    state["n"] = state.get("n", 0) + 1
    body = message.body
    ctx.publish(body.get("type", "Note"), {"n": state["n"]}, key=body["to"], id=body.get("ref"))


# --- 6. an output cannot replace another key's rows -------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        "ShootingRange|SS-HEAD",
        "ShootingRange|SS-SE-0000000001",
        "SS-HEAD",
        "Relay|OB-m-1",
        "Relay|OI-0c2ba1",
        "Relay|TK-0c2ba1",
        "Relay|TC-m-1",
        "Relay|TR-0c2ba1-1",
    ],
)
def test_an_output_never_replaces_a_row_of_another_keys_stream(
    table: TableClient, strategy: StrategyName, game: str, ref: str
) -> None:
    victim = game + "-victim"
    Processor(shooting_range, table, InMemoryPublisher()).process(
        Message("v-1", victim, "StartNewRound")
    )
    before = rows(Partition(table, victim))
    # The publisher writes into the very table that holds the states.
    p = Processor(relay, table, TablePublisher(table), strategy=strategy)
    body = {"to": victim, "ref": ref}
    bad, good = Message("r-1", game, "Relay", body), Message("r-2", game, "Relay", {"to": game})

    outcomes = p.process_batch(game, [bad, good])

    assert [(o.status, o.version) for o in outcomes] == [("abandoned", None), ("completed", 1)]
    assert str(outcomes[0].reason).endswith(
        f"cannot be stored: output id {ref!r} is the row key of a stream's, an outbox's, "
        "an output id record's or a token's row: publishing it could replace another key's state"
    ), outcomes[0].reason
    assert rows(Partition(table, victim)) == before
    assert Processor(shooting_range, table, InMemoryPublisher()).current_state(victim).version == 1


def test_the_stream_row_rule_refuses_exactly_what_could_collide() -> None:
    for key in ["SS-HEAD", "SS-x", "orders|SS-SE-0000000001|x", "a|SS-"]:
        assert is_stream_row_key(key), key
        with pytest.raises(ValueError, match="is reserved for stream rows"):
            Include.insert({"RowKey": key})
    for key in ["ShootingRange|OB-order|SS-7", "a|b|SS-HEAD", "xSS-HEAD", "a|xSS-", "OB-1"]:
        assert not is_stream_row_key(key), key
        assert Include.insert({"RowKey": key}).row_key == key


# --- 7. every field a publisher stores is checked first ---------------------------------


def test_an_output_type_too_long_for_a_row_abandons_that_message_alone(
    service: Any, table: TableClient, strategy: StrategyName, game: str
) -> None:
    outputs = service.create_table_if_not_exists(table.table_name + "out")
    p = Processor(relay, table, TablePublisher(outputs), strategy=strategy)
    long_type = Message("t-1", game, "Relay", {"to": game, "type": "T" * 40_000})
    neighbour = Message("t-2", game, "Relay", {"to": game, "type": "Note"})

    outcomes = p.process_batch(game, [long_type, neighbour])
    again = p.process_batch(game, [long_type, neighbour])

    assert [(o.status, o.version) for o in outcomes] == [("abandoned", None), ("completed", 1)]
    assert re.fullmatch(
        "message 't-1' cannot be stored: output '[0-9a-f-]{36}' cannot be a table row: "
        "property 'Type' is a string of 80000 bytes in UTF-16; the limit is 65536",
        str(outcomes[0].reason),
    ), outcomes[0].reason
    stored = 1 if strategy == "state" else None  # the outbox replays without a version
    assert [(o.status, o.version) for o in again] == [("abandoned", None), ("duplicate", stored)]
    assert [v.message_id for v in p.history(game)] == ["t-2"]
    published = list(outputs.query_entities("PartitionKey eq @k", parameters={"k": game}))
    assert [(e["Type"], e["RowKey"]) for e in published] == [("Note", outcomes[1].outputs[0].id)]
    service.delete_table(outputs.table_name)


# --- 8. the strategies accept the same ids ----------------------------------------------


@pytest.mark.parametrize("message_id", ["order|SS-7", "x|SS-HEAD", "SS-UID-1", "a|OB-b"])
def test_both_strategies_store_ids_that_hold_engine_prefixes(
    table: TableClient, strategy: StrategyName, game: str, message_id: str
) -> None:
    p = Processor(tally, table, InMemoryPublisher(), strategy=strategy)

    first = p.process_batch(game, adds(game, [message_id, "next"]))
    again = p.process_batch(game, adds(game, [message_id]))

    assert [(o.status, o.version) for o in first] == [("completed", 1), ("completed", 2)]
    assert [o.status for o in again] == ["duplicate"]
    assert Stream.open(Partition(table, game, "Tally")).version == 2


# --- the nesting limit, checked before anything recurses --------------------------------


@settings(max_examples=60, deadline=None)
@given(
    depth=st.integers(MAX_NESTING - 3, MAX_NESTING + 3) | st.integers(1, 20_000),
    shape=st.sampled_from(["list", "map", "mixed"]),
)
def test_bodies_nest_up_to_the_limit_and_are_refused_past_it(depth: int, shape: str) -> None:
    value: Any = 1
    for level in range(depth):
        wrap = "list" if shape == "list" or (shape == "mixed" and level % 2) else "map"
        value = [value] if wrap == "list" else {"k": value}
    text = _json(value)
    row = {"message_id": "m", "key": "k", "type": "Add", "body": text}

    message, reason = parse_row(row, lambda t: True)

    assert json_nests_deeper(text) == (depth > MAX_NESTING)
    if depth <= MAX_NESTING:
        assert message is not None
        assert message.body == value
    else:
        assert (message, reason) == (
            None,
            f"body nests arrays and objects deeper than {MAX_NESTING} levels",
        )
        with pytest.raises(ValueError, match=f"deeper than {MAX_NESTING} levels"):
            Message("m", "k", "Add", value)


def _json(value: Any) -> str:
    """JSON text of a value too deep for ``json.dumps`` (which recurses)."""
    parts: list[str] = []
    while isinstance(value, list | dict):
        parts.append("[" if isinstance(value, list) else '{"k":')
        value = value[0] if isinstance(value, list) else value["k"]
    closing = "".join("]" if p == "[" else "}" for p in reversed(parts))
    return "".join(parts) + str(value) + closing


def test_brackets_inside_strings_do_not_count() -> None:
    text = '{"a": "' + "[" * 5000 + '", "b": "\\"[[["}'
    assert not json_nests_deeper(text)
    message, reason = parse_row(
        {"message_id": "m", "key": "k", "type": "Add", "body": text}, lambda t: True
    )
    assert reason is None
    assert message is not None
