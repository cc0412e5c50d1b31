"""Random histories against a reference: load_state (id row + point reads)
agrees with the seed's replay of the whole stream, and process_batch over long
batches, retention and a state class that evolves agrees with the serial run."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from azure.data.tables import TableClient

from handlers import (
    DuplicateOutsideWindowError,
    HandlerContext,
    HandlerFailedError,
    HeaderCache,
    InMemoryPublisher,
    Message,
    Outcome,
    Processor,
)
from handlers._outcome import StrategyName
from handlers.examples import shooting_range
from handlers.testing import replay_load
from streamstone_py import Partition, Stream, join_binary

from .chaos.ledger import HANDLER, TYPES, VERSIONS, Ledger, Overdrawn, ledger, shared


def test_load_state_agrees_with_replay_on_random_histories(table: TableClient, game: str) -> None:
    rng = random.Random(20261121)
    for history in range(6):
        key = f"{game}-{history}"
        p = Processor(shooting_range, table, InMemoryPublisher())
        pool = [Message(f"h{history}-r{n}", key, "StartNewRound") for n in range(3)]
        pool += [
            Message(f"h{history}-f{n}", key, "FireAt", {"position": rng.randrange(100)})
            for n in range(30)
        ]
        delivered: list[Message] = []
        for _ in range(rng.randrange(10, 40)):
            batch = [rng.choice(pool) for _ in range(rng.randrange(1, 6))]
            delivered += batch
            p.process_batch(key, batch)
        probes = {m.id for m in delivered} | {f"h{history}-never-{n}" for n in range(3)}
        for message_id in sorted(probes):
            loaded = p.load_state(key, message_id)
            found = (loaded.state, loaded.version, loaded.is_duplicate)
            assert found == replay_load(p, key, message_id), (history, message_id)


# --- long batches, retention and evolution against a serial reference --------------


@dataclass
class _Reference:
    """The serial, one-message-at-a-time run of a key, and what retention removed."""

    state: Ledger = field(default_factory=Ledger)
    ids: dict[str, int] = field(default_factory=dict)  # message id -> version
    outputs: dict[str, tuple[Message, ...]] = field(default_factory=dict)
    first: int = 1  # the oldest version retention kept
    processed: dict[int, datetime] = field(default_factory=dict)  # version -> Now
    protected: set[str] = field(default_factory=set)  # keep_last promised their duplicates
    #: duplicates whose handler would raise on the newest state (issue 11, case 2)
    failing_duplicates: int = 0

    def expect(
        self, batch: list[Message], strategy: StrategyName, now: datetime
    ) -> list[_Expected]:
        """What ``process_batch`` must answer, message by message; applies the new ones."""
        expected: list[_Expected] = []
        stopped = False
        for message in batch:
            version = self.ids.get(message.id)
            if stopped:
                expected.append(("abandoned", None, (), False))
            elif version is not None and version < self.first:
                expected.append(("abandoned", None, (), False))  # refused: outside the window
            elif version is not None:
                outputs = self.outputs[message.id] if strategy == "state" else ()
                # the oldest kept version may lack the state before it, unless promised
                optional = version == self.first > 1 and message.id not in self.protected
                self.failing_duplicates += (
                    message.type == "StrictWithdraw" and message.body["amount"] > self.state.balance
                )
                expected.append(("duplicate", version, outputs, optional))
            elif self.watermark is not None and self.watermark >= datetime.fromisoformat(
                message.headers["sent_at"]
            ):
                # never stored, but sent before what retention removed: it cannot
                # be told from a forgotten duplicate, so it is refused
                expected.append(("abandoned", None, (), False))
            else:
                ctx = HandlerContext(message, handler=HANDLER, now=now)
                try:
                    self.state = ledger.apply(self.state, message, ctx)
                except Overdrawn:
                    expected.append(("abandoned", None, (), False))
                    stopped = True
                    continue
                self.ids[message.id] = len(self.ids) + 1
                self.processed[len(self.ids)] = now
                self.outputs[message.id] = ctx.outputs
                expected.append(("completed", self.ids[message.id], ctx.outputs, False))
        return expected

    @property
    def watermark(self) -> datetime | None:
        """The newest ``Now`` retention removed."""
        return max((self.processed[v] for v in range(1, self.first)), default=None)


#: status, version, outputs, and whether a refusal is also acceptable
_Expected = tuple[str, int | None, tuple[Message, ...], bool]


def _check(outcomes: list[Outcome], expected: list[_Expected], strategy: StrategyName) -> None:
    for outcome, (status, version, outputs, optional) in zip(outcomes, expected, strict=True):
        if optional and outcome.status == "abandoned":
            assert isinstance(outcome.error, DuplicateOutsideWindowError), outcome
            continue
        assert (outcome.status, outcome.outputs) == (status, outputs), (
            outcome.message,
            outcome.reason,
        )
        # under outbox a duplicate found stored is answered without its version
        versions = {version, None} if (status, strategy) == ("duplicate", "outbox") else {version}
        assert outcome.version in versions, outcome


@pytest.mark.parametrize("cached", [False, True], ids=["read", "cached"])
@pytest.mark.parametrize("strategy", ["state", "outbox"])
def test_long_batches_retention_and_evolution_agree_with_the_serial_run(
    table: TableClient, game: str, strategy: StrategyName, cached: bool
) -> None:
    rng = random.Random(f"20261123/{strategy}")
    key = f"{game}-{strategy}"
    # One cache for both releases of the handler, as one worker has.
    cache = HeaderCache() if cached else None
    clock = [datetime(2026, 11, 23, tzinfo=UTC)]

    def now() -> datetime:
        return clock[0]

    processors: dict[int, Processor[Any]] = {
        v: Processor(h, table, InMemoryPublisher(), strategy=strategy, clock=now, cache=cache)
        for v, h in VERSIONS.items()
    }
    reference = _Reference()
    sent: list[Message] = []
    version = 1
    last_v1 = 0
    drained: list[Message] = []
    figures = {"splits": 0, "retains": 0, "refused": 0, "evolved duplicates": 0, "raises": 0}

    def new(kinds: tuple[int, int, int, int]) -> Message:
        kind = rng.choices(TYPES, weights=kinds)[0]
        top = 150 if kind == "StrictWithdraw" else 60
        body = {"amount": rng.randint(1, top)}
        message = Message(f"{key}-{len(sent)}", key, kind, body, {"sent_at": now().isoformat()})
        sent.append(message)
        return message

    for step in range(36):
        clock[0] += timedelta(seconds=1)
        if step == 18:
            version = 2  # the state class gains fee_rate and drops legacy
        draw = rng.random()
        if draw < 0.25:  # long: enough new messages of the key to split the write
            batch = [new((50, 45, 0, 5)) for _ in range(rng.randint(51, 120))]
            batch += rng.sample(sent, min(len(sent), rng.randint(0, 30)))
            figures["splits"] += 1
        else:
            batch = [new((35, 30, 25, 10)) for _ in range(rng.randint(0, 6))]
            batch += rng.sample(sent, min(len(sent), rng.randint(1, 8)))
            rng.shuffle(batch)
            # A strict withdrawal of the whole balance, redelivered first in the
            # next batch, when the balance is lower: it must be answered, not run.
            batch = drained + batch
            drained = []
            if reference.state.balance > 0 and rng.random() < 0.5:
                drain = Message(
                    f"{key}-{len(sent)}",
                    key,
                    "StrictWithdraw",
                    {"amount": reference.state.balance},
                    {"sent_at": now().isoformat()},
                )
                sent.append(drain)
                batch.insert(0, drain)
                drained = [drain]
        expected = reference.expect(batch, strategy, now())
        outcomes = processors[version].process_batch(key, batch)
        _check(outcomes, expected, strategy)
        figures["raises"] += sum(isinstance(o.error, HandlerFailedError) for o in outcomes)
        figures["refused"] += sum(
            isinstance(o.error, DuplicateOutsideWindowError) for o in outcomes
        )
        if version == 1:
            last_v1 = len(reference.ids)
        else:  # duplicates of messages the old state class processed
            figures["evolved duplicates"] += sum(
                o.status == "duplicate" and reference.ids[o.message.id] <= last_v1 for o in outcomes
            )
        header = Stream.open(Partition(table, key, HANDLER))
        values, written_by = shared(join_binary("State", header.properties))
        assert values == {k: getattr(reference.state, k) for k in values}
        if any(o.status == "completed" for o in outcomes):
            assert written_by == version
        if step % 5 == 4:  # retention, then the newest messages it promised to keep answer
            keep_last = rng.choice((None, 0, 1, 2, 5))
            older_than = rng.choice((None, timedelta(seconds=rng.randint(0, 8))))
            if keep_last is None and older_than is None:
                keep_last = 3
            before = header.first_version
            removed = processors[version].retain(key, keep_last=keep_last, older_than=older_than)
            after = Stream.open(Partition(table, key, HANDLER)).first_version
            assert removed == after - before
            newest = len(reference.ids)
            if older_than is None:
                assert keep_last is not None
                assert after <= max(newest - keep_last + 1, 1)
            figures["retains"] += removed > 0
            reference.first = after
            kept = [m for m, v in reference.ids.items() if v > newest - (keep_last or 0)]
            reference.protected = set(kept) if older_than is None else set()
            if kept and older_than is None:
                again = [m for m in sent if m.id in reference.protected]
                _check(
                    processors[version].process_batch(key, again),
                    reference.expect(again, strategy, now()),
                    strategy,
                )
    figures["failing duplicates"] = reference.failing_duplicates
    assert all(n > 0 for n in figures.values()), sorted(figures.items())
