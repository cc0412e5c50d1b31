"""The header cache: a key's next batch written without reading first, and a new
key written as a new stream, with every outcome still exact.

Requests are counted at the SDK's transport, below every layer of ours. Each
test compares states, versions and outputs with the same messages processed
one by one on a clean key, without a cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import HeaderCache, InMemoryPublisher, Message, Outcome, Processor
from handlers._outcome import StrategyName
from tests.faults import FaultPlan, FaultyTransport
from tests.test_handlers_holes import (
    REFUSAL_LINE,
    account,
    adds,
    faulty_client,
    history,
    one_by_one,
    tally,
)


def counted(connection_string: str, table: TableClient) -> tuple[TableClient, FaultPlan]:
    """A client whose HTTP requests are counted (a plan without faults)."""
    plan = FaultPlan()
    return faulty_client(connection_string, table, FaultyTransport(plan)), plan


def cached(
    client: TableClient,
    strategy: StrategyName,
    cache: HeaderCache | None,
    publisher: InMemoryPublisher | None = None,
    h: Any = tally,
) -> Processor[Any]:
    # by_caller: the outbox strategy then sends nothing after the write either.
    return Processor(
        h, client, publisher or InMemoryPublisher(), strategy=strategy,
        cache=cache, dispatch="by_caller",
    )  # fmt: skip


def outputs(outcomes: Sequence[Outcome]) -> list[list[tuple[str, Any]]]:
    return [[(o.type, o.body) for o in outcome.outputs] for outcome in outcomes]


def test_one_request_per_batch_for_new_keys_and_for_revisited_keys(
    connection_string: str, table: TableClient, strategy: StrategyName, game: str
) -> None:
    keys = [f"{game}-{n}" for n in range(5)]
    runs: dict[str, list[Outcome]] = {}
    requests = {}
    for mode in ("cache", "none"):
        client, plan = counted(connection_string, table)
        cache = HeaderCache() if mode == "cache" else None
        p = cached(client, strategy, cache)
        runs[mode] = []
        for k in keys:
            runs[mode] += p.process_batch(f"{mode}{k}", adds(f"{mode}{k}", [f"{k}-a"]))
        first = plan.requests
        for k in keys:
            runs[mode] += p.process_batch(f"{mode}{k}", adds(f"{mode}{k}", [f"{k}-b", f"{k}-c"]))
        requests[mode] = (first, plan.requests - first)
        if cache is not None:
            assert (cache.hits, cache.misses, cache.stale, len(cache)) == (5, 5, 0, 5)
            assert cache.wrong_guesses == 0

    assert requests == {"cache": (5, 5), "none": (10, 10)}
    assert [o.status for o in runs["cache"]] == ["completed"] * 15
    assert outputs(runs["cache"]) == outputs(runs["none"])
    for k in keys:
        reference, _ = one_by_one(
            table, strategy, f"ref{k}", adds("x", [f"{k}-a", f"{k}-b", f"{k}-c"])
        )
        expected = [(v, m, s) for v, m, s in history(reference, f"ref{k}")]
        assert history(cached(table, strategy, None), f"cache{k}") == expected


def test_a_rival_write_makes_the_cached_header_stale_and_nothing_is_lost(
    connection_string: str, table: TableClient, strategy: StrategyName, game: str
) -> None:
    # Two workers with their own caches take turns on one key: each turn finds
    # its cached header stale, and must neither lose nor repeat a message.
    client, plan = counted(connection_string, table)
    caches = [HeaderCache(), HeaderCache()]
    workers = [cached(client, strategy, c) for c in caches]
    ids = [f"t{n}" for n in range(8)]
    seen = []
    for n, message_id in enumerate(ids):
        seen += workers[n % 2].process_batch(game, adds(game, [message_id]))

    assert [(o.status, o.version) for o in seen] == [("completed", v) for v in range(1, 9)]
    # Worker 0: a new stream (1), then three stale turns: the refused write, the
    # header the engine reads with the refusal, the write (3 each). Worker 1:
    # four stale turns, its first one a guessed new stream on a key that exists.
    assert plan.requests == 1 + 3 * 3 + 4 * 3
    assert [(c.stale, c.wrong_guesses) for c in caches] == [(3, 0), (3, 1)]
    assert [w.stats.conflicts_retried for w in workers] == [0, 0]
    reference, _ = one_by_one(table, strategy, game + "ref", adds("x", ids))
    assert history(workers[0], game) == history(reference, game + "ref")
    assert [[b for _, b in out] for out in outputs(seen)] == [
        [{"count": n, "of": f"t{n - 1}"}] for n in range(1, 9)
    ]


def test_a_handler_error_on_a_stale_cached_state_is_decided_on_the_stored_state(
    connection_string: str, table: TableClient, strategy: StrategyName, game: str
) -> None:
    client, _ = counted(connection_string, table)
    cache = HeaderCache()
    mine = cached(client, strategy, cache, h=account)
    rival = cached(client, strategy, None, h=account)
    deposit = mine.process_batch(game, [Message("d1", game, "Deposit", {"amount": 10})])
    rival.process_batch(game, [Message("d2", game, "Deposit", {"amount": 100})])

    # The cached state holds 10: withdrawing 50 fails there, and succeeds on
    # the stored 110.
    (withdraw,) = mine.process_batch(game, [Message("w1", game, "Withdraw", {"amount": 50})])

    assert deposit[0].status == "completed"
    assert (withdraw.status, withdraw.version) == ("completed", 3)
    assert outputs([withdraw]) == [[("Balance", {"balance": 60, "after": "w1"})]]
    assert history(mine, game)[-1] == (3, "w1", {"balance": 60, "note": "last: w1"})
    assert cache.stale == 0  # no write was sent on the stale header

    # And a real refusal is still one, decided on the stored state.
    (refused,) = mine.process_batch(game, [Message("w2", game, "Withdraw", {"amount": 500})])
    assert (refused.status, str(refused.error)) == (
        "abandoned",
        "handler 'Account' failed on message 'w2': ValueError: insufficient funds: 60 < 500 "
        f"(at tests/test_handlers_holes.py:{REFUSAL_LINE} in account)",
    )


def test_a_duplicate_with_a_warm_cache_yields_its_original_outputs(
    connection_string: str, table: TableClient, strategy: StrategyName, game: str
) -> None:
    client, _ = counted(connection_string, table)
    p = cached(client, strategy, HeaderCache())
    first = p.process_batch(game, adds(game, ["a1", "a2", "a3"]))

    again = p.process_batch(game, adds(game, ["a2", "a4", "a3"]))

    # (The outbox strategy finds a duplicate by its outbox row, without its version.)
    v2, v3 = (2, 3) if strategy == "state" else (None, None)
    assert [(o.status, o.version) for o in again] == [
        ("duplicate", v2),
        ("completed", 4),
        ("duplicate", v3),
    ]
    assert outputs([again[0], again[2]]) == outputs([first[1], first[2]])
    assert outputs([again[1]]) == [[("Counted", {"count": 4, "of": "a4"})]]
    reference, _ = one_by_one(table, strategy, game + "ref", adds("x", ["a1", "a2", "a3", "a4"]))
    assert history(p, game) == history(reference, game + "ref")


def test_guessing_new_streams_stops_over_existing_keys_and_resumes_for_new_ones(
    connection_string: str, table: TableClient, game: str
) -> None:
    old = [f"{game}-old{n}" for n in range(10)]
    seed = cached(table, "state", None)
    for k in old:
        seed.process_batch(k, adds(k, [f"{k}-1"]))
    client, plan = counted(connection_string, table)
    cache = HeaderCache(window=4)
    p = cached(client, "state", cache)

    for k in old:
        assert p.process_batch(k, adds(k, [f"{k}-2"]))[0].version == 2
    over_old = plan.requests
    for n in range(6):
        k = f"{game}-new{n}"
        assert p.process_batch(k, adds(k, [f"{k}-1"]))[0].version == 1
    over_new = plan.requests - over_old

    # Old keys: the first guess is refused (the write, and the header read with
    # the refusal), then written; from then on each is read and written.
    assert over_old == 3 + 9 * 2
    # New keys: read (404) and written, until half of the last 4 were new;
    # then written directly.
    assert over_new == 2 * 2 + 4 * 1
    assert (cache.stale, cache.wrong_guesses) == (0, 1)
    for k in old:
        assert [v for v, _, _ in history(p, k)] == [1, 2]


def test_retain_drops_the_cached_header_it_changes(
    connection_string: str, table: TableClient, strategy: StrategyName, game: str
) -> None:
    client, plan = counted(connection_string, table)
    cache = HeaderCache()
    p = cached(client, strategy, cache)
    ids = [f"r{n}" for n in range(6)]
    p.process_batch(game, adds(game, ids[:4]))
    p.mark_dispatched(game, ids[:4])
    p.retain(game, keep_last=1)
    before = plan.requests

    (outcome,) = p.process_batch(game, adds(game, ids[4:5]))

    assert (outcome.status, outcome.version) == ("completed", 5)
    assert plan.requests - before == 1  # retain left its header in the cache
    assert cache.stale == 0
    # The state strategy also keeps the version before the one answered.
    kept = [(3, "r2")] if strategy == "state" else []
    assert [(v, m) for v, m, _ in history(p, game)] == [*kept, (4, "r3"), (5, "r4")]


def test_the_cache_is_bounded_by_entries_and_by_bytes(
    connection_string: str, table: TableClient, game: str
) -> None:
    with pytest.raises(ValueError, match="max_entries must be >= 1, got 0"):
        HeaderCache(max_entries=0)
    with pytest.raises(ValueError, match="window must be >= 1, got 0"):
        HeaderCache(window=0)
    cache = HeaderCache(max_entries=3)
    p = cached(table, "state", cache)
    keys = [f"{game}-{n}" for n in range(5)]
    for k in keys:
        p.process_batch(k, adds(k, [f"{k}-1"]))
    assert len(cache) == 3
    assert [cache.get(p.store.partition(k)) is not None for k in keys] == [
        False, False, True, True, True,
    ]  # fmt: skip

    one = cache.size_bytes // 3
    small = HeaderCache(max_bytes=one * 2 + one // 2)
    q = cached(table, "state", small)
    for k in keys:
        q.process_batch(k, adds(k, [f"{k}-2"]))
    assert len(small) == 2
    assert one * 2 - 10 <= small.size_bytes <= small.max_bytes


def test_two_handlers_on_one_key_share_a_cache_without_mixing_their_streams(
    connection_string: str, table: TableClient, game: str
) -> None:
    # Each handler's stream is a virtual partition of the key's table partition:
    # the cache must keep one header per stream, not per key.
    client, plan = counted(connection_string, table)
    cache = HeaderCache()
    counter = cached(client, "state", cache)
    bank = cached(client, "state", cache, h=account)
    for n in range(3):
        counter.process_batch(game, adds(game, [f"c{n}"]))
        bank.process_batch(game, [Message(f"b{n}", game, "Deposit", {"amount": 10})])

    assert plan.requests == 6  # every batch written on its own stream's header
    assert (cache.hits, cache.misses, cache.stale, len(cache)) == (4, 2, 0, 2)
    assert [(v, m) for v, m, _ in history(counter, game)] == [(1, "c0"), (2, "c1"), (3, "c2")]
    assert history(bank, game)[-1] == (3, "b2", {"balance": 30, "note": "last: b2"})
