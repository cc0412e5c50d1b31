"""Every interleaving of two copies of one transfer sent with tokens, stopped
before each write (the transfer's, and each token step's), against Azurite.

Two workers handle copies of the same ``Transfer`` at once: one stores it,
the other finds it stored; each then registers, creates and checkpoints
tokens, dispatches and finishes, in every order the turnstile allows (the
reads between run in their worker's turn). Each run must end with one token
id on every dispatched credit, exactly that token in the receiver's partition
(the losing attempt's deleted), and the sender's checkpoint marked
dispatched with no registration left.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from azure.data.tables import TableClient

from handlers import InMemoryPublisher, Message, Processor, StateStore
from handlers._batch._token_rows import Attempt, TokenRows
from handlers.examples import accounts
from streamstone_py import Partition, RetryPolicy
from tests.test_handlers_interleavings import Turnstile, run_threads, walk
from tests.tokening import H, credits, token_of, token_rows

FAST = RetryPolicy(initial_delay=0.0005, max_delay=0.001)


class GatedStore(StateStore):
    """The write waits for the turnstile too: the schedule decides who stores
    the transfer (the reads before it, and between gates, run in turn)."""

    def __init__(self, table: TableClient, gate: Callable[[], None]) -> None:
        super().__init__(table, accounts.name, FAST)
        self._gate = gate

    def write(self, stream: Any, events: Any) -> Any:
        self._gate()
        return super().write(stream, events)


class GatedRows(TokenRows):
    def __init__(self, store: StateStore, gate: Callable[[], None]) -> None:
        super().__init__(store)
        self._gate = gate

    def register(self, partition: Partition, attempts: Sequence[Attempt]) -> None:
        self._gate()
        super().register(partition, attempts)

    def create(self, key: str, tokens: Sequence[tuple[str, str, str]]) -> None:
        self._gate()
        super().create(key, tokens)

    def record(self, partition: Partition, attempts: Sequence[Attempt]) -> Any:
        self._gate()
        return super().record(partition, attempts)

    def finish(self, partition: Partition, dispatched: Any, registrations: Any) -> None:
        self._gate()
        super().finish(partition, dispatched, registrations)


def run_schedule(table: TableClient, key: str, bits: tuple[int, ...]) -> tuple[int, ...]:
    a, b = f"{key}-a", f"{key}-b"
    sink = InMemoryPublisher()
    transfer = Message("t-1", a, "Transfer", {"to": b, "amount": 10})
    turnstile = Turnstile(2, iter(bits))
    results: list[str] = []
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        def gate() -> None:
            turnstile.gate(index)

        store = GatedStore(table, gate)
        p = Processor(accounts, table, sink, retry=FAST, store=store, tokens=True)
        assert p._tokens is not None
        p._tokens.rows = GatedRows(store, gate)
        try:
            results.append(p.process(transfer).status)
        except BaseException as exc:  # surfaced below, with the schedule
            errors.append(exc)
        finally:
            turnstile.finish(index)

    workers = [threading.Thread(target=worker, args=(i,)) for i in (0, 1)]
    run_threads(turnstile, workers, errors, bits)
    assert sorted(results) == ["completed", "duplicate"], bits
    sent = credits(sink.deliveries)
    assert len(sent) == 2, bits
    assert sink.divergent == [], bits  # one token id for both copies
    # Exactly the winner's token is left, for the credit every copy sent; what
    # the receiver does with it is tested on its own (test_tokens_late_copy).
    token = token_of(sent[0])
    assert token_rows(table, b) == {f"{H}|TK-{token}": {"MessageId": "t-1", "From": a}}, bits
    assert token_rows(table, a) == {f"{H}|TC-t-1": {"Tokens": [token], "Dispatched": True}}, bits
    return tuple(turnstile.decisions)


def test_every_interleaving_of_two_copies_sending_with_tokens(
    table: TableClient, game: str
) -> None:
    # The count pins the size of the tree: a change to the token steps changes it.
    assert walk(lambda key, bits: run_schedule(table, key, bits), f"{game}-") == 396
