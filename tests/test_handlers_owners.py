"""Regression tests for the holes a review found in the newest runtime features:
a shared header cache across accounts and clients, a stored state that
cannot be read, retention's cut with and without a cache (one section per
case). Each runs against Azurite and asserts exact states and outputs.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from azure.data.tables import TableClient, TableServiceClient, UpdateMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from azurite.launcher import AzuriteTable
from handlers import HandlerContext, HeaderCache, InMemoryPublisher, Message, Processor, handler
from handlers._outcome import StrategyName
from streamstone_py import Partition, Stream
from tests.test_handlers_holes import account, adds, history, tally

# --- 1. a shared header cache names its owner --------------------------------------


@pytest.fixture(scope="module")
def second_account() -> Iterator[str]:
    """Another Azurite: a second storage account with its own tables."""
    with AzuriteTable() as azurite:
        yield azurite.connection_string


def test_a_shared_cache_never_writes_through_another_accounts_client(
    connection_string: str, second_account: str, table: TableClient, strategy: StrategyName
) -> None:
    # The same table name in two accounts, one cache shared by their processors.
    other = TableServiceClient.from_connection_string(second_account)
    b_table = other.create_table_if_not_exists(table.table_name)
    cache = HeaderCache()
    a = Processor(tally, table, InMemoryPublisher(), strategy=strategy, cache=cache)
    b = Processor(tally, b_table, InMemoryPublisher(), strategy=strategy, cache=cache)
    key = "game-shared-" + strategy

    (first,) = a.process_batch(key, adds(key, ["a-1"]))
    (second,) = b.process_batch(key, adds(key, ["b-1"]))

    assert [(o.status, o.version) for o in (first, second)] == [("completed", 1), ("completed", 1)]
    assert history(a, key) == [(1, "a-1", {"count": 1, "seen": ["a-1"]})]
    assert history(b, key) == [(1, "b-1", {"count": 1, "seen": ["b-1"]})]
    # Each account's next batch still goes to its own table.
    (third,) = b.process_batch(key, adds(key, ["b-2"]))
    assert (third.status, third.version) == ("completed", 2)
    assert [m for _, m, _ in history(b, key)] == ["b-1", "b-2"]
    assert [m for _, m, _ in history(a, key)] == ["a-1"]
    assert len(cache) == 2


def test_a_cache_outlives_the_clients_that_filled_it(
    connection_string: str, table: TableClient, strategy: StrategyName, game: str
) -> None:
    # A worker keeps one cache and opens a client per unit of work.
    cache = HeaderCache()
    outcomes = []
    for unit in range(3):
        with TableClient.from_connection_string(connection_string, table.table_name) as client:
            p = Processor(tally, client, InMemoryPublisher(), strategy=strategy, cache=cache)
            outcomes += p.process_batch(game, adds(game, [f"u{unit}"]))

    assert [(o.status, o.version) for o in outcomes] == [("completed", v) for v in (1, 2, 3)]
    assert history(Processor(tally, table, InMemoryPublisher()), game) == [
        (1, "u0", {"count": 1, "seen": ["u0"]}),
        (2, "u1", {"count": 2, "seen": ["u0", "u1"]}),
        (3, "u2", {"count": 3, "seen": ["u0", "u1", "u2"]}),
    ]
    assert (cache.hits, cache.stale) == (2, 0)


def test_a_header_is_rebound_only_to_a_partition_of_its_own_stream(
    connection_string: str, second_account: str, table: TableClient, game: str
) -> None:
    stream = Stream.provision(Partition(table, game))
    with TableClient.from_connection_string(connection_string, table.table_name) as mine:
        rebound = stream.with_partition(Partition(mine, game))
        assert rebound.partition.table is mine
        assert (rebound.etag, rebound.version) == (stream.etag, stream.version)
    other = TableClient.from_connection_string(second_account, table.table_name)
    with pytest.raises(ValueError, match="is not the partition of this header"):
        stream.with_partition(Partition(other, game))
    with pytest.raises(ValueError, match="is not the partition of this header"):
        stream.with_partition(Partition(table, game + "-x"))
    assert Partition(other, game) != Partition(table, game)


def test_the_cache_counts_stale_headers_apart_from_wrong_guesses(
    table: TableClient, strategy: StrategyName, game: str
) -> None:
    # A key written before the cache existed: its first batch guesses "new", wrongly.
    Processor(tally, table, InMemoryPublisher(), strategy=strategy).process_batch(
        game, adds(game, ["x0"])
    )
    cache = HeaderCache()
    mine = Processor(tally, table, InMemoryPublisher(), strategy=strategy, cache=cache)
    rival = Processor(tally, table, InMemoryPublisher(), strategy=strategy)
    mine.process_batch(game, adds(game, ["m1"]))
    assert (cache.stale, cache.wrong_guesses) == (0, 1)
    rival.process_batch(game, adds(game, ["r1"]))
    (last,) = mine.process_batch(game, adds(game, ["m2"]))  # the cached header is stale
    assert (last.status, last.version) == ("completed", 4)
    assert (cache.stale, cache.wrong_guesses) == (1, 1)


# --- 2. how a key's messages are chunked does not change the result ----------------

_moves = st.lists(
    st.tuples(st.sampled_from(["Deposit", "Withdraw"]), st.integers(1, 30)), min_size=1, max_size=12
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(moves=_moves, max_batch=st.integers(1, 5))
def test_a_keys_result_is_the_same_in_one_chunk_or_in_many(
    table: TableClient, moves: list[tuple[str, int]], max_batch: int
) -> None:
    results = []
    for size in (max_batch, 500):
        key = f"chunks-{uuid.uuid4().hex[:10]}"
        messages = [Message(f"m{n}", key, t, {"amount": a}) for n, (t, a) in enumerate(moves)]
        p = Processor(account, table, InMemoryPublisher(), max_batch=size)
        outcomes = p.process_batch(key, messages)
        state = p.current_state(key)
        results.append(
            (
                [(o.status, o.version, str(o.reason).replace(key, "K")) for o in outcomes],
                [[(m.type, m.body) for m in o.outputs] for o in outcomes],
                (state.version, vars(state.state)),
            )
        )
    assert results[0] == results[1]


def test_max_batch_is_checked(table: TableClient) -> None:
    with pytest.raises(ValueError, match="max_batch must be an int >= 1, got 0"):
        Processor(account, table, InMemoryPublisher(), max_batch=0)


# --- 3. a stored state that cannot be read ----------------------------------------


def _corrupt(table: TableClient, key: str, row_key: str, value: bytes) -> None:
    """An outside write: the row's first state part replaced by ``value``."""
    table.update_entity(
        {"PartitionKey": key, "RowKey": row_key, "State_00": value}, mode=UpdateMode.MERGE
    )


BROKEN: dict[str, Callable[[bytes], bytes]] = {
    "cut zlib": lambda stored: stored[: len(stored) // 2],
    "unknown codec": lambda stored: b"\xc1\x07" + stored[2:],
    "not msgpack": lambda stored: b"\x91\xdc\xff",
}


@pytest.mark.parametrize("damage", sorted(BROKEN))
def test_an_unreadable_stored_state_abandons_that_key_alone(
    table: TableClient, strategy: StrategyName, game: str, damage: str
) -> None:
    p = Processor(tally, table, InMemoryPublisher(), strategy=strategy, compression="zlib")
    bad, good = game + "-bad", game + "-good"
    # A state long enough to be stored compressed.
    p.process_batch(bad, [Message(f"shot-{n:04d}", bad, "Add", {}) for n in range(30)])
    p.process_batch(good, adds(good, ["g0"]))
    header = table.get_entity(bad, "Tally|SS-HEAD")
    assert header["State_00"].startswith(b"\xc1\x01")
    _corrupt(table, bad, "Tally|SS-HEAD", BROKEN[damage](header["State_00"]))

    outcomes = p.process_batch(bad, adds(bad, ["n1", "n2"]))
    others = p.process_batch(good, adds(good, ["g1"]))

    assert [(o.status, o.version) for o in outcomes] == [("abandoned", None)] * 2
    assert outcomes[0].reason is not None
    assert outcomes[0].reason.startswith(
        f"the stored state of key {bad!r} (handler 'Tally') at version 30 cannot be read: "
    ), outcomes[0].reason
    assert "an earlier message" in (outcomes[1].reason or "")
    assert [(o.status, o.version) for o in others] == [("completed", 2)]
    assert p.load_state(good, "none").state.count == 2
    assert Stream.open(Partition(table, bad, "Tally")).version == 30  # nothing written


@dataclass
class TallyV2:
    """``Tally`` after a deploy that added a field without a default: a mistake."""

    count: int
    seen: list[str]
    limit: int


@handler("Tally", TallyV2, types=["Add"])
def tally_v2(state: TallyV2, message: Message, ctx: HandlerContext) -> None:
    state.count += 1


def test_a_state_class_that_cannot_load_old_states_abandons_with_the_reason(
    table: TableClient, game: str
) -> None:
    Processor(tally, table, InMemoryPublisher()).process_batch(game, adds(game, ["a", "b"]))

    (outcome,) = Processor(tally_v2, table, InMemoryPublisher()).process_batch(
        game, adds(game, ["c"])
    )

    assert outcome.status == "abandoned"
    assert outcome.reason == (
        f"the stored state of key {game!r} (handler 'Tally') at version 2 cannot be read: "
        "a stored state of 'Tally' lacks ['limit'], which have no default: give new fields "
        "a default so older snapshots still load"
    )


def test_a_duplicate_whose_stored_version_cannot_be_read_is_abandoned_alone(
    table: TableClient, game: str
) -> None:
    p = Processor(tally, table, InMemoryPublisher(), compression="zlib")
    p.process_batch(game, [Message(f"s{n}", game, "Add", {}) for n in range(1, 31)])
    _corrupt(table, game, "Tally|SS-SE-0000000009", b"x\x9c\xab")  # the state before s10

    outcomes = p.process_batch(game, [Message("s10", game, "Add", {}), *adds(game, ["n"])])

    # The duplicate cannot be answered; the new message applies on the newest
    # state, which is readable, as it would without the duplicate.
    assert [(o.status, o.version) for o in outcomes] == [("abandoned", None), ("completed", 31)]
    assert outcomes[0].reason is not None
    assert outcomes[0].reason.startswith(
        f"the stored state of key {game!r} (handler 'Tally') at version 9 cannot be read: "
    ), outcomes[0].reason
    assert p.current_state(game).state.count == 31


# --- 7. retention's cut is the same with and without a cache ----------------------


@pytest.mark.parametrize("keep_last", [0, 1, 2])
@pytest.mark.parametrize("at_least", [1, 2, 3, 4])
def test_retention_cuts_the_same_with_and_without_a_cache(
    table: TableClient, strategy: StrategyName, game: str, keep_last: int, at_least: int
) -> None:
    removed: dict[str, int] = {}
    for mode in ("cache", "none"):
        key = f"{game}-{mode}"
        p: Processor[Any] = Processor(
            tally, table, InMemoryPublisher(), strategy=strategy, dispatch="by_caller",
            cache=HeaderCache() if mode == "cache" else None,
        )  # fmt: skip
        p.process_batch(key, adds(key, ["v1", "v2", "v3"]))
        removed[mode] = p.retain(key, keep_last=keep_last, at_least=at_least)
    assert removed["cache"] == removed["none"], removed


def test_keep_last_zero_removes_every_version_but_the_newest_state(
    table: TableClient, game: str
) -> None:
    p = Processor(tally, table, InMemoryPublisher(), cache=HeaderCache())
    p.process_batch(game, adds(game, ["v1", "v2", "v3"]))

    assert p.retain(game, keep_last=0, at_least=3) == 3

    stream = Stream.open(Partition(table, game, "Tally"))
    assert (stream.version, stream.first_version) == (3, 4)
    assert p.current_state(game).state.seen == ["v1", "v2", "v3"]
