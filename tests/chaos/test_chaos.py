"""The chaos harness in ``make test``: a short fixed-seed run, seed replay, the oracle's teeth."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from azure.data.tables import TableClient

from handlers import Message
from handlers._messages._codec import digest, pack
from streamstone_py import EventData, Partition, Stream, split_binary

from .harness import ChaosConfig, Report, read_back, run
from .injector import KINDS
from .ledger import HANDLER, LedgerV2, fold, ledger_v2, shared
from .oracle import Fates, StoredKey, check

SEED = 20261121


def _regions(report: Report) -> dict[str, bool]:
    """Whether the run reached each region a pass must have gone through to prove anything."""
    return {
        "every fault kind": all(report.faults[kind] > 0 for kind in KINDS),
        "a lost answer that committed": report.ambiguous["committed"] >= 1,
        "transactions": report.chunks["batch"] > 0,
        "single writes": report.chunks["single"] > 0,
        # The regions of issue 11.
        "long chunks": report.long_chunks > 0,
        "split writes": report.splits > 0,
        "retains": report.retains > 0,
        "versions removed by a retain": report.retained_versions > 0,
        "interrupted retains": report.retains_interrupted > 0,
        "a final retain that removed": report.final_retained > 0,
        "states of both classes": report.states_by_version[1] > 0
        and report.states_by_version[2] > 0,
        "handler failures": report.handler_failures > 0,
    }


@pytest.mark.timeout(600)
def test_short_run_settles_with_no_violation() -> None:
    # Which regions a run reaches follows the wall clock (retention's limit,
    # which copies arrive as duplicates), so a region one seed misses on a
    # fast or a loaded machine is asked of the next; every run must be clean.
    missed: set[str] | None = None  # the regions no run so far has reached
    for seed in (SEED, SEED + 1, SEED + 2):
        # The first with tracing on: every delivery in its own trace, every
        # output carrying one, compared without it (issue 43's determinism).
        tracing = seed == SEED
        config = ChaosConfig(
            seed=seed,
            messages=400,
            threads=2,
            processes=1,
            keys=6,
            restarts=1,
            hard_share=0.2,
            long_share=0.05,
            retain_share=0.08,
            tracing=tracing,
        )
        report = run(config)
        print(report.table())
        assert report.violations == []
        assert report.outputs_traced == (report.outputs_published if tracing else 0)
        assert report.errors == []
        assert report.messages == 400
        assert report.restarts == 1
        assert report.process_kills >= 1
        assert report.evolutions == 1
        unreached = {name for name, hit in _regions(report).items() if not hit}
        missed = unreached if missed is None else missed & unreached
        if not missed:
            return
    pytest.fail(f"no run of seeds {SEED} to {SEED + 2} reached: {sorted(missed or ())}")


def _figures(report: Report) -> dict[str, object]:
    keep = (
        "log_copies",
        "deliveries",
        "redeliveries",
        "late",
        "chunks",
        "outcomes",
        "faults",
        "conflicts",
        "ambiguous",
        "outputs_published",
    )
    return {name: getattr(report, name) for name in keep}


@pytest.mark.timeout(300)
def test_a_seed_replays_the_same_run_with_one_worker() -> None:
    # Retention's limit follows the wall clock: without it, one worker replays exactly.
    config = ChaosConfig(
        seed=SEED, messages=60, threads=1, processes=0, keys=3, restarts=0, retain_share=0.0
    )
    first, second = run(config), run(config)
    other = run(dataclasses.replace(config, seed=SEED + 1))
    assert first.violations == second.violations == other.violations == []
    assert _figures(first) == _figures(second)
    assert _figures(first)["faults"] != _figures(other)["faults"]


# --- the oracle catches each kind of violation --------------------------------


Reported = dict[str, set[int | None]]


def _clean() -> tuple[dict[str, Message], dict[str, StoredKey], list[bytes], Reported]:
    messages = {}
    stored = {}
    published = []
    reported: Reported = {}
    for key in ("state-a", "outbox-b"):
        batch = [
            Message(f"{key}-{n}", key, kind, {"amount": amount})
            for n, (kind, amount) in enumerate(
                [("Deposit", 50), ("Withdraw", 80), ("Audit", 1), ("Withdraw", 20), ("Audit", 1)]
            )
        ]
        steps = fold(batch)
        found = StoredKey(header_state=steps[-1].state, header_version=len(batch))
        for version, (message, step) in enumerate(zip(batch, steps, strict=True), start=1):
            messages[message.id] = message
            found.events.append((version, message.id, step.state))
            found.id_rows[message.id] = version
            found.digests[version] = digest(pack([o.encode() for o in step.outputs]))
            reported[message.id] = {version}
            published += [o.encode() for o in step.outputs]
            if key.startswith("outbox"):
                found.outbox[message.id] = True
        stored[key] = found
    return messages, stored, published, reported


def _kinds(violations: list[str]) -> set[str]:
    return {v.split(":")[0] for v in violations}


def test_the_oracle_passes_a_clean_run_with_repeated_publications() -> None:
    messages, stored, published, reported = _clean()
    assert check(messages, stored, published + published[:3], reported, ["outbox-b"]) == []
    # Published under a trace: the same outputs (its headers are transport).
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    traced = [
        dataclasses.replace(m, headers={**m.headers, "traceparent": parent}).encode()
        for m in map(Message.decode, published)
    ]
    assert check(messages, stored, traced, reported, ["outbox-b"]) == []


def test_the_oracle_names_each_violation() -> None:
    messages, stored, published, reported = _clean()
    a, b = stored["state-a"], stored["outbox-b"]
    first = Message.decode(published[0])
    gapped = [a.events[0], *((v + 1, i, s) for v, i, s in a.events[1:])]
    foreign = [*b.events, (6, "state-a-0", b"")]
    cases: dict[str, Callable[[], list[str]]] = {
        "zombie": lambda: check(messages, stored, published[1:], reported),
        "divergent": lambda: check(
            messages,
            stored,
            [*published, Message(first.id, first.key, first.type, {"amount": 0}).encode()],
            reported,
        ),
        "ghost": lambda: check(
            messages, stored, [*published, Message("x", "state-a", "Deposited").encode()], reported
        ),
        "double": lambda: check(
            messages,
            {
                **stored,
                "state-a": dataclasses.replace(a, events=[*a.events, (6, *a.events[-1][1:])]),
            },
            published,
            reported,
        ),
        "lost": lambda: check(messages, stored, published, {**reported, "state-a-2": set()}),
        "order": lambda: check(messages, stored, published, {**reported, "state-a-0": {3}}),
        "gap": lambda: check(
            messages,
            {**stored, "state-a": dataclasses.replace(a, events=gapped)},
            published,
            reported,
        ),
        "state": lambda: check(
            messages,
            {**stored, "outbox-b": dataclasses.replace(b, header_state=b"\x80")},
            published,
            reported,
        ),
        "foreign": lambda: check(
            messages,
            {**stored, "outbox-b": dataclasses.replace(b, events=foreign)},
            published,
            reported,
        ),
    }
    for kind, violations in cases.items():
        assert kind in _kinds(violations()), kind
    headed = dataclasses.replace(first, headers={"x": "1"}).encode()
    assert _kinds(check(messages, stored, [*published, headed], reported)) == {"divergent"}
    reordered = [(v, i, s) for (v, _, _), (_, i, s) in zip(a.events, a.events[::-1], strict=True)]
    found = check(
        messages,
        {**stored, "state-a": dataclasses.replace(a, events=reordered)},
        published,
        reported,
    )
    assert {"order", "state"} <= _kinds(found)
    undispatched = dataclasses.replace(b, outbox={**b.outbox, "outbox-b-1": False})
    found = check(messages, {**stored, "outbox-b": undispatched}, published, reported)
    assert found == ["zombie: outputs of 'outbox-b-1' never marked dispatched"]
    missing_row = dataclasses.replace(b, outbox={})
    found = check(messages, {**stored, "outbox-b": missing_row}, published, reported, ["outbox-b"])
    assert found == ["zombie: outbox rows of 'outbox-b' do not match its stored versions"]


def test_the_oracle_sees_the_rows_beside_the_events() -> None:
    # Duplicate detection's own record, the header's version and the output
    # digest: tampering with any of them is a violation, named exactly.
    messages, stored, published, reported = _clean()
    a = stored["state-a"]
    no_id_row = {k: v for k, v in a.id_rows.items() if k != "state-a-2"}
    moved = {**a.id_rows, "state-a-1": 4}
    corrupted = {**a.digests, 3: "0" * 64}
    cases = {
        "metadata: the id row of 'state-a-2' in 'state-a' is missing, its event is version 3": (
            dataclasses.replace(a, id_rows=no_id_row)
        ),
        "metadata: the id row of 'state-a-1' in 'state-a' points at version 4, "
        "its event is version 2": dataclasses.replace(a, id_rows=moved),
        "metadata: the header of 'state-a' says version 6, the last stored version is 5": (
            dataclasses.replace(a, header_version=6)
        ),
        "metadata: the output digest of version 3 of 'state-a' differs from its outputs'": (
            dataclasses.replace(a, digests=corrupted)
        ),
    }
    for expected, tampered in cases.items():
        assert check(messages, {**stored, "state-a": tampered}, published, reported) == [expected]


def _retained() -> tuple[dict[str, Message], dict[str, StoredKey], list[bytes], Reported, Fates]:
    """A clean run in which retention removed the first three versions of each key,
    refused a late copy of the first, and a strict withdrawal was given up."""
    messages, stored, published, reported = _clean()
    fates = Fates()
    for key, found in stored.items():
        found.seen = {v: (i, s) for v, i, s in found.events}
        found.events = found.events[3:]
        fates.refused[f"{key}-0"] = "sent before the watermark"
        if key.startswith("outbox"):
            found.outbox = {i: True for _, i, _ in found.events}
        strict = Message(f"{key}-strict", key, "StrictWithdraw", {"amount": 10**6})
        messages[strict.id] = strict
        fates.given_up[strict.id] = ("HandlerFailedError", "Overdrawn")
    return messages, stored, published, reported, fates


def test_the_oracle_passes_retention_and_an_evolved_state() -> None:
    messages, stored, published, reported, fates = _retained()
    values, version = shared(stored["state-a"].header_state or b"")
    assert version == 1
    evolved = ledger_v2.encode_state(LedgerV2(**values, fee_rate=0))
    stored["state-a"].header_state = evolved
    assert check(messages, stored, published, reported, ["outbox-b"], fates) == []


def test_the_oracle_names_what_retention_must_not_do() -> None:
    messages, stored, published, reported, fates = _retained()
    a = stored["state-a"]
    never = Message("state-a-late", "state-a", "Deposit", {"amount": 1})
    cases: dict[str, tuple[str, dict[str, StoredKey], Fates]] = {
        "lost": (
            "refused as outside the window but never stored",
            stored,
            dataclasses.replace(fates, refused={**fates.refused, never.id: "late"}),
        ),
        "stuck": (
            "is stored, yet its redeliveries failed",
            stored,
            dataclasses.replace(fates, given_up={**fates.given_up, "state-a-4": ("x", "y")}),
        ),
        "zombie": (
            "outlived the retention",
            {**stored, "state-a": dataclasses.replace(a, leftovers=["ChaosLedger|SS-UID-x"])},
            fates,
        ),
        "rewritten": (
            "changed after it was read",
            {**stored, "state-a": dataclasses.replace(a, seen={**a.seen, 4: ("state-a-3", b"")})},
            fates,
        ),
        "gap": (
            "are not 1..",
            {**stored, "state-a": dataclasses.replace(a, seen={})},
            fates,
        ),
    }
    for kind, (text, found, given) in cases.items():
        violations = check({**messages, never.id: never}, found, published, reported, [], given)
        assert any(v.startswith(f"{kind}:") and text in v for v in violations), (kind, violations)
    not_raising = dataclasses.replace(
        fates, given_up={**fates.given_up, never.id: ("NonDeterministicHandlerError", "y")}
    )
    violations = check({**messages, never.id: never}, stored, published, reported, [], not_raising)
    assert "lost: 'state-a-late' of 'state-a' changed no state" in violations


def test_a_run_that_cannot_settle_stops_within_its_bound() -> None:
    # settle=0: the first moment without new messages and with deliveries still
    # open ends the run, as a run whose messages never settle would end.
    config = ChaosConfig(messages=200, threads=1, processes=0, restarts=0, settle=0.0)
    with pytest.raises(RuntimeError, match=r"deliveries still unsettled 0 s after"):
        run(config)


def test_read_back_finds_the_kept_versions_of_a_long_truncated_stream(table: TableClient) -> None:
    # The final retains keep a few versions; past version 1,000 none of them lies
    # in the first 1,000-version slice, which a read from version 1 asks for.
    partition = Partition(table, "long-key", HANDLER)
    state = split_binary("State", b"s")
    events = [
        EventData(id=f"m{v}", properties={"Digest": "d", **state}, stream_properties=state)
        for v in range(1, 1006)
    ]
    stream = Stream.write(Stream(partition), *events).stream
    Stream.truncate(stream, 1004)

    found = read_back(table, ["long-key"], {})["long-key"]

    assert [(v, m) for v, m, _ in found.events] == [(1004, "m1004"), (1005, "m1005")]
    assert found.leftovers == []
    assert found.id_rows == {"m1004": 1004, "m1005": 1005}


@pytest.mark.timeout(300)
def test_queue_mode_settles_with_no_violation() -> None:
    """The queue mode, short: real queues, hostile texts, killed workers, lost locks, a
    Table service outage, a restart."""
    from .queue_mode import QueueChaosConfig, run_queue

    report = run_queue(
        QueueChaosConfig(seed=SEED, duration=16, processes=2, keys=6, restarts=1, kill_every=3,
                         hostile=0.05, outages=1, outage_seconds=4)
    )  # fmt: skip
    print(report.table())
    assert report.violations == []
    assert report.restarts == 1
    assert report.kills >= 3
    assert report.stored > 0
    assert report.output_copies > report.outputs  # duplicates published their outputs again
    assert report.poisoned >= report.hostile > 0
    assert report.outages == 1
