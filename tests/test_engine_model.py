"""The engine against a model: hypothesis drives several streams, plain and
virtual, that share one physical partition of a real Azurite, injects
transport faults into the engine's client, and after every step compares the
partition's rows with an in-memory model, row for row.

The model is plain Python: per stream its header (version, first version,
properties, tombstone), its event and id rows, and an ETag token that changes
with every header change; the included rows are shared by the partition. It
predicts the result or the exact error type of every call.

``make test`` runs a budget of about half a minute, drawn from a fixed seed
per runner, and checks that those draws reach the rare branches (a split
write, and each way a lost answer is settled). ``STREAMSTONE_MODEL_SEED=N``
draws from another seed; ``STREAMSTONE_MODEL_STEPS=N`` runs machines until at
least N steps have passed (``-s`` prints the count and the seeds).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest
from azure.data.tables import TableClient
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from azurite.proxy import Action, Proxy, Request
from streamstone_py import (
    ConcurrencyConflictError,
    DuplicateEventError,
    EventData,
    Include,
    IncludedOperationConflictError,
    Partition,
    RetryPolicy,
    Stream,
    StreamBeingDeletedError,
    StreamNotFoundError,
    WireTableClient,
    WriteResult,
    _maintenance,
)
from streamstone_py._codec._values import from_table
from streamstone_py._transport._protocol import Done, advance
from tests.faults import FaultPlan, FaultyTransport
from tests.helpers import perform

E = TypeVar("E", bound=BaseException)

#: Steps of the on-demand long run (0: the suite's budget).
LONG_STEPS = int(os.environ.get("STREAMSTONE_MODEL_STEPS", "0"))
#: The seed of the draws (each further round of a long run: the next one).
SEEDS = {"sdk": 3, "wire": 2}
SEED = os.environ.get("STREAMSTONE_MODEL_SEED")
#: What the suite's draws must reach: the branches a budget this small could miss.
RARE = {"split write", "resolved committed", "resolved not applied", "resolved conflict"}
FAST = RetryPolicy(attempts=4, initial_delay=0.001, max_delay=0.005, total_time=10)

#: Virtual stream names next to the plain stream's "SS-" rows, but allowed.
NEAR_NAMES = ("SS", "S", "ss-SE-0000000001", "SR", "SS_HEAD", "orders")
#: Virtual stream names that would reach the plain stream's rows.
RESERVED_NAMES = ("SS-SE-0000000001", "SS-UID-a", "SS-HEAD", "SS-")
IDS = ("a", "b", "c", "x|SS-HEAD", "SS-SE-0000000001", "SS|SS-UID-a", "orders|SS-SE-2")
INCLUDE_KEYS = ("inc", "SS", "x|ySS-HEAD", "orders|OB-1", "S|inc", "SS_SE")
RESERVED_INCLUDE_KEYS = ("SS-x", "orders|SS-SE-0000000001|x", "SS|SS-HEAD", "|SS-", "a|SS-UID-b|c")
FAULT_KINDS = ("before", "after", "lost")


@dataclass
class StreamModel:
    """What one stream's rows must be."""

    exists: bool = False
    deleting: bool = False
    version: int = 0
    first: int = 1
    properties: dict[str, Any] = field(default_factory=dict)
    events: dict[int, tuple[str | None, dict[str, Any]]] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)
    token: int = 0

    @property
    def live(self) -> bool:
        return self.exists and not self.deleting

    def header_row(self) -> dict[str, Any]:
        row = {"Version": self.version, **self.properties}
        if self.first > 1:
            row["SS_First"] = self.first
        if self.deleting:
            row["SS_Deleted"] = True
        return row

    def drop_events_below(self, before: int) -> None:
        for version in [v for v in self.events if v < before]:
            event_id, _ = self.events.pop(version)
            if event_id is not None and self.ids.get(event_id) == version:
                del self.ids[event_id]


@dataclass
class Context:
    """The clients one machine uses: the engine's (faults injected) and a clean one."""

    engine: TableClient
    clean: TableClient
    plan: FaultPlan
    steps: int = 0
    #: The rare branches the draws reached, how often.
    reached: Counter[str] = field(default_factory=Counter)


CONTEXT: Context | None = None


def normal(value: Any) -> Any:
    """Values as compared: NaN equals NaN."""
    return "<nan>" if isinstance(value, float) and math.isnan(value) else value


def normal_rows(found: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {k: {n: normal(v) for n, v in row.items()} for k, row in found.items()}


def raises(expected: type[E], call: Callable[[], Any]) -> E:
    """Run ``call``; it must raise exactly ``expected`` (not a subclass, not a base)."""
    try:
        call()
    except BaseException as exc:
        if type(exc) is not expected:
            raise AssertionError(f"expected {expected.__name__}, got {exc!r}") from exc
        return exc
    raise AssertionError(f"expected {expected.__name__}, nothing was raised")


#: The fault of a step: its kind, the method it aims at (None: any), and how
#: many matching requests pass before it.
Fault = tuple[str, str | None, int]
faults = st.none() | st.tuples(
    st.sampled_from(FAULT_KINDS), st.sampled_from([None, "POST", "PUT", "GET"]), st.integers(0, 2)
)
properties = st.fixed_dictionaries({"N": st.integers(-5, 5)}) | st.just({"F": math.nan})


def model_header(partition: Partition, s: StreamModel) -> Stream:
    """The header the model says is stored (its ETag is not needed to predict)."""
    return Stream._stored(partition, "", s.version, s.properties, s.first)


class EngineMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        assert CONTEXT is not None
        self.ctx = CONTEXT
        self.tokens = itertools.count(1)
        self.big = itertools.count()
        # Every event and property set differs from all others, so that no write
        # is ever indistinguishable from one already stored (see docs/streams.md).
        self.seq = itertools.count()

    # --- set up, check ------------------------------------------------------

    @initialize(
        names=st.lists(st.sampled_from(NEAR_NAMES), min_size=1, max_size=3, unique=True),
        lengths=st.lists(st.integers(0, 7), min_size=4, max_size=4),
    )
    def streams(self, names: list[str], lengths: list[int]) -> None:
        """The plain stream and up to three virtual ones; most start with some events."""
        self.pk = "model-" + uuid.uuid4().hex
        self.names: list[str | None] = [None, *names]
        self.parts = [Partition(self.ctx.engine, self.pk, name, retry=FAST) for name in self.names]
        self.clean = [Partition(self.ctx.clean, self.pk, name) for name in self.names]
        self.model = [StreamModel() for _ in self.names]
        self.held: list[tuple[Stream, int | None]] = [(Stream(p), None) for p in self.parts]
        self.includes: dict[str, dict[str, Any]] = {}
        for i, length in zip(range(len(self.parts)), lengths, strict=False):
            if not length:
                continue
            s = self.model[i]
            ids = [f"{IDS[v % len(IDS)]}" if v < len(IDS) else None for v in range(length)]
            events = [EventData(ids[v], {"Seq": next(self.seq)}) for v in range(length)]
            stream = Stream.write(Stream(self.clean[i]), *events).stream
            s.exists, s.version = True, length
            for version, event in enumerate(events, start=1):
                s.events[version] = (event.id, dict(event.properties))
                if event.id is not None:
                    s.ids[event.id] = version
            self.new_token(s)
            self.held[i] = (Stream._stored(self.parts[i], str(stream.etag), length, {}), s.token)

    def expected_rows(self) -> dict[str, dict[str, Any]]:
        expected = dict(self.includes)
        for part, s in zip(self.parts, self.model, strict=True):
            if not s.exists:
                continue
            expected[part.header_row_key] = s.header_row()
            for version, (event_id, props) in s.events.items():
                row = {"Version": version, **props}
                if event_id is not None:
                    row["SS_Id"] = event_id
                expected[part.event_row_key(version)] = row
            for event_id, version in s.ids.items():
                expected[part.id_row_key(event_id)] = {"Version": version}
        return normal_rows(expected)

    @invariant()
    def rows_match_the_model(self) -> None:
        self.ctx.plan.faults.clear()
        self.ctx.steps += 1
        found = self.ctx.clean.query_entities("PartitionKey eq @pk", parameters={"pk": self.pk})
        actual = {
            e["RowKey"]: {
                k: from_table(v) for k, v in e.items() if k not in ("PartitionKey", "RowKey")
            }
            for e in found
        }
        assert normal_rows(actual) == self.expected_rows()

    def arm(self, fault: Fault | None) -> None:
        """The fault for this step: let ``skip`` matching requests through, then fail the next."""
        if fault is not None:
            kind, method, skip = fault
            if skip:
                self.ctx.plan.add("pass", method, times=skip)
            self.ctx.plan.add(kind, method)

    def new_token(self, s: StreamModel) -> None:
        s.token = next(self.tokens)

    def pick_held(self, i: int) -> int:
        """A stream whose held header is stored, when there is one (transient
        headers are refused before anything is sent: a rarer case to test)."""
        stored = [n for n, (_, token) in enumerate(self.held) if token is not None]
        return stored[i % len(stored)] if stored else i % len(self.parts)

    def is_current(self, i: int) -> bool:
        token = self.held[i][1]
        return token is not None and token == self.model[i].token and self.model[i].live

    def check_header(self, stream: Stream, s: StreamModel) -> None:
        assert (stream.version, stream.first_version) == (s.version, s.first)
        assert {k: normal(v) for k, v in stream.properties.items()} == {
            k: normal(v) for k, v in s.properties.items()
        }

    # --- writes -------------------------------------------------------------

    def build_events(
        self, draws: list[tuple[str | None, dict[str, Any], bool]], include_ops: list[Any]
    ) -> list[EventData]:
        events = []
        for n, (event_id, props, snapshot) in enumerate(draws):
            includes = [op for idx, op in include_ops if idx == n]
            stream_properties = {"Snap": next(self.seq)} if snapshot else None
            events.append(EventData(event_id, props, includes, stream_properties=stream_properties))
        return events

    def apply_write(
        self, i: int, start: Stream, events: list[EventData], write: Callable[[], WriteResult]
    ) -> None:
        """Predict and check a write that starts where the stream is: ``start``
        (version and properties) is the model's header, ``write`` the call."""
        s = self.model[i]
        for event in events:
            if event.id is not None and event.id in s.ids:
                raises(DuplicateEventError, write)
                return
        for op in [inc for e in events for inc in e.includes]:
            present = op.row_key in self.includes
            if (op.operation == "insert" and present) or (op.operation == "delete" and not present):
                raises(IncludedOperationConflictError, write)
                return
        result = write()
        first_new = start.version + 1
        assert [(e.version, e.id) for e in result.events] == [
            (v, e.id) for v, e in enumerate(events, start=first_new)
        ]
        s.exists = True
        s.version = start.version + len(events)
        snapshots = [e.stream_properties for e in events if e.stream_properties is not None]
        s.properties = dict(snapshots[-1]) if snapshots else dict(start.properties)
        for version, event in enumerate(events, start=first_new):
            s.events[version] = (event.id, dict(event.properties))
            if event.id is not None:
                s.ids[event.id] = version
            for op in event.includes:
                if op.operation == "delete":
                    self.includes.pop(op.row_key)
                else:
                    self.includes[op.row_key] = {"V": op.entity["V"]}
        self.new_token(s)
        self.check_header(result.stream, s)
        self.held[i] = (result.stream, s.token)

    def draw_events(self, data: st.DataObject) -> tuple[list[EventData], bool]:
        """Events to write, and whether they hold an id twice (refused before sending)."""
        if data.draw(st.integers(0, 15)) == 0:  # a write split over two transactions
            self.ctx.reached["split write"] += 1
            draws: list[tuple[str | None, dict[str, Any], bool]] = [
                (f"big{next(self.big)}", {"Seq": next(self.seq)}, False) for _ in range(55)
            ]
            return self.build_events(draws, []), False
        count = data.draw(st.integers(1, 3))
        draws = [
            (
                data.draw(st.none() | st.sampled_from(IDS)),
                {**data.draw(properties), "Seq": next(self.seq)},
                data.draw(st.integers(0, 5)) == 0,
            )
            for _ in range(count)
        ]
        keys = data.draw(st.lists(st.sampled_from(INCLUDE_KEYS), max_size=2, unique=True))
        include_ops = []
        for key in keys:
            kind = data.draw(st.sampled_from(["insert", "insert_or_replace", "delete"]))
            entity = {"RowKey": key, "V": data.draw(st.integers(0, 9))}
            op = Include.delete(entity, "*") if kind == "delete" else getattr(Include, kind)(entity)
            include_ops.append((data.draw(st.integers(0, count - 1)), op))
        ids = [d[0] for d in draws if d[0] is not None]
        return self.build_events(draws, include_ops), len(ids) != len(set(ids))

    @rule(i=st.integers(0, 3), data=st.data(), fault=faults)
    def write_after_held_header(self, i: int, data: st.DataObject, fault: Fault | None) -> None:
        i %= len(self.parts)
        s = self.model[i]
        start, token = self.held[i]
        events, twice = self.draw_events(data)
        if twice:
            raises(ValueError, lambda: Stream.write(start, *events))
            return
        self.arm(fault)
        if (token is None and s.exists) or (token is not None and not self.is_current(i)):
            expected = StreamBeingDeletedError if s.deleting else ConcurrencyConflictError
            raises(expected, lambda: Stream.write(start, *events))
            return
        self.apply_write(i, start, events, lambda: Stream.write(start, *events))

    @rule(i=st.integers(0, 3), data=st.data(), fault=faults)
    def write_at_expected_version(self, i: int, data: st.DataObject, fault: Fault | None) -> None:
        i %= len(self.parts)
        s = self.model[i]
        expected_version = data.draw(st.sampled_from([s.version, s.version, 0, s.version + 1]))
        events, twice = self.draw_events(data)
        part = self.parts[i]

        def write() -> Any:
            return Stream.write(part, *events, expected_version=expected_version)

        if twice:
            raises(ValueError, write)
            return
        self.arm(fault)
        if s.deleting:
            raises(StreamBeingDeletedError, write)
        elif expected_version == 0 and s.exists:
            raises(ConcurrencyConflictError, write)
        elif expected_version > 0 and not s.exists:
            raises(StreamNotFoundError, write)
        elif expected_version > 0 and expected_version != s.version:
            raises(ConcurrencyConflictError, write)
        else:
            start = Stream(part) if expected_version == 0 else model_header(part, s)
            self.apply_write(i, start, events, write)

    @rule(i=st.integers(0, 3), props=properties, fault=faults)
    def provision(self, i: int, props: dict[str, Any], fault: Fault | None) -> None:
        i %= len(self.parts)
        s = self.model[i]
        props = {**props, "Seq": next(self.seq)}
        self.arm(fault)
        if s.exists:
            expected = StreamBeingDeletedError if s.deleting else ConcurrencyConflictError
            raises(expected, lambda: Stream.provision(self.parts[i], props))
            return
        stream = Stream.provision(self.parts[i], props)
        s.exists, s.properties = True, props
        self.new_token(s)
        self.check_header(stream, s)
        self.held[i] = (stream, s.token)

    @rule(i=st.integers(0, 3), props=properties, fault=faults)
    def set_properties(self, i: int, props: dict[str, Any], fault: Fault | None) -> None:
        i = self.pick_held(i)
        s = self.model[i]
        props = {**props, "Seq": next(self.seq)}
        held, token = self.held[i]
        if token is None:
            raises(ValueError, lambda: Stream.set_properties(held, props))
            return
        self.arm(fault)
        if s.deleting:
            raises(StreamBeingDeletedError, lambda: Stream.set_properties(held, props))
        elif not self.is_current(i):
            raises(ConcurrencyConflictError, lambda: Stream.set_properties(held, props))
        else:
            updated = Stream.set_properties(held, props)
            s.properties = dict(props)
            self.new_token(s)
            self.check_header(updated, s)
            self.held[i] = (updated, s.token)

    @rule(i=st.integers(0, 3))
    @precondition(lambda self: any(s.live for s in self.model))
    def rival_appends(self, i: int) -> None:
        """Another writer, on a clean client: the header this machine holds goes stale."""
        live = [n for n, s in enumerate(self.model) if s.live]
        i = live[i % len(live)]
        s = self.model[i]
        Stream.write(Stream.open(self.clean[i]), EventData(properties={"R": 1}))
        s.version += 1
        s.events[s.version] = (None, {"R": 1})
        self.new_token(s)

    # --- reads --------------------------------------------------------------

    @rule(i=st.integers(0, 3), fault=faults)
    def open(self, i: int, fault: Fault | None) -> None:
        i %= len(self.parts)
        s = self.model[i]
        self.arm(fault)
        if not s.live:
            error = raises(StreamNotFoundError, lambda: Stream.open(self.parts[i]))
            assert error.deleting is s.deleting
            assert Stream.try_open(self.parts[i]) is None
            self.held[i] = (Stream(self.parts[i]), None)  # nothing there: the next write creates
            return
        opened = Stream.open(self.parts[i])
        self.check_header(opened, s)
        self.held[i] = (opened, s.token)

    @rule(
        i=st.integers(0, 3),
        start=st.integers(1, 8),
        size=st.sampled_from([1, 2, 3, 4, 5, 7, 1000]),
        fault=faults,
    )
    def read(self, i: int, start: int, size: int, fault: Fault | None) -> None:
        i %= len(self.parts)
        s = self.model[i]
        start = max(1, s.version + 2 - start) if start > 4 else start
        self.arm(fault)
        if not s.live:
            raises(StreamNotFoundError, lambda: Stream.read(self.parts[i], start, size))
            return
        page = Stream.read(self.parts[i], start, size)
        end = start + size - 1
        self.check_header(page.stream, s)
        assert [(e.version, e.id, {k: normal(v) for k, v in e.properties.items()})
                for e in page.events] == [
            (v, s.events[v][0], {k: normal(x) for k, x in s.events[v][1].items()})
            for v in range(max(start, s.first), min(end, s.version) + 1)
        ]  # fmt: skip
        assert page.is_end_of_stream is (end >= s.version)
        assert page.truncated is (start < s.first)

    @rule(i=st.integers(0, 3), event_id=st.sampled_from(IDS), fault=faults)
    def find(self, i: int, event_id: str, fault: Fault | None) -> None:
        i %= len(self.parts)
        self.arm(fault)
        assert Stream.find(self.parts[i], event_id) == self.model[i].ids.get(event_id)

    @rule(name=st.sampled_from(RESERVED_NAMES), key=st.sampled_from(RESERVED_INCLUDE_KEYS))
    def reserved_names_are_refused(self, name: str, key: str) -> None:
        raises(ValueError, lambda: Partition(self.ctx.engine, self.pk, name))
        raises(ValueError, lambda: Include.insert({"RowKey": key}))

    # --- truncate, delete ----------------------------------------------------

    @rule(
        i=st.integers(0, 3),
        data=st.data(),
        batch=st.sampled_from([2, 3, 4, 100]),
        fault=faults,
    )
    def truncate(self, i: int, data: st.DataObject, batch: int, fault: Fault | None) -> None:
        i = self.pick_held(i)
        s = self.model[i]
        held, token = self.held[i]
        before = data.draw(st.integers(0, held.version + 1))
        if token is None or before < 1:
            raises(ValueError, lambda: Stream.truncate(held, before, batch_size=batch))
            return
        self.arm(fault)

        def call() -> Stream:
            return Stream.truncate(held, before, batch_size=batch)

        if not s.exists:
            raises(StreamNotFoundError, call)
            return
        if s.deleting:
            raises(StreamBeingDeletedError, call)
            return
        if s.first < before:
            if before > s.version + 1:
                raises(ConcurrencyConflictError, call)
                return
            s.first = before
            self.new_token(s)
        result = call()
        s.drop_events_below(before)
        self.check_header(result, s)
        self.held[i] = (result, s.token)

    @rule(
        i=st.integers(0, 3),
        how=st.sampled_from(["header", "partition", "crash"]),
        batch=st.sampled_from([2, 4, 100]),
        requests=st.integers(1, 7),
        fault=faults,
    )
    def delete(self, i: int, how: str, batch: int, requests: int, fault: Fault | None) -> None:
        """With the header held, by partition alone, or a delete that dies midway."""
        if how == "partition":
            self.delete_by_partition(i, batch, fault)
            return
        if how == "crash":
            if any(s.live for s in self.model):
                self.delete_then_crash(i, requests, min(batch, 4))
            return
        i = self.pick_held(i)
        s = self.model[i]
        held, token = self.held[i]
        if token is None:
            raises(ValueError, lambda: Stream.delete(held, batch_size=batch))
            return
        self.arm(fault)
        if not s.exists:
            raises(StreamNotFoundError, lambda: Stream.delete(held, batch_size=batch))
        elif not s.deleting and not self.is_current(i):
            raises(ConcurrencyConflictError, lambda: Stream.delete(held, batch_size=batch))
        else:
            Stream.delete(held, batch_size=batch)
            self.model[i] = StreamModel()

    def delete_by_partition(self, i: int, batch: int, fault: Fault | None) -> None:
        """Deletes the stream as it is, and finishes an interrupted delete."""
        i %= len(self.parts)
        self.arm(fault)
        if not self.model[i].exists:
            raises(StreamNotFoundError, lambda: Stream.delete(self.parts[i], batch_size=batch))
        else:
            Stream.delete(self.parts[i], batch_size=batch)
            self.model[i] = StreamModel()

    def delete_then_crash(self, i: int, requests: int, batch: int) -> None:
        """A delete that stops after some requests, as if its process died."""
        live = [n for n, s in enumerate(self.model) if s.live]
        i = live[i % len(live)]
        s = self.model[i]
        steps = _maintenance.delete(Stream.open(self.clean[i]), batch, Stream)
        result: object = None
        finished = False
        for _ in range(requests):
            try:
                request = advance(steps, result, None)
            except Done:
                finished = True
                break
            result = perform(self.ctx.clean, request)
        else:
            try:
                advance(steps, result, None)
            except Done:
                finished = True
            steps.close()
        self.crash_model(s, batch, requests)
        if finished:
            assert not s.exists
            self.model[i] = StreamModel()

    def crash_model(self, s: StreamModel, batch: int, requests: int) -> None:
        """What ``requests`` storage calls of a delete leave: the tombstone, then
        (query, delete) pairs of the sweeps in key order, then the header."""
        sent = iter(range(requests))

        def send() -> bool:
            return next(sent, None) is not None

        send()
        s.deleting = True
        self.new_token(s)
        while send():
            batch_versions = sorted(s.events)[: batch // 2]
            if not batch_versions:
                break
            if not send():
                return
            s.drop_events_below(batch_versions[-1] + 1)
        else:
            return
        while send():
            keys = sorted(s.ids)[:batch]
            if not keys:
                break
            if not send():
                return
            for key in keys:
                del s.ids[key]
        else:
            return
        if send():
            s.exists = False


class _Seen:
    """A request the proxy saw, as a fault plan matches it (method and URL)."""

    def __init__(self, request: Request) -> None:
        self.method = request.method
        self.url = request.head.split(b" ", 2)[1].decode("latin-1")


#: A plan's faults on a real socket: "before" and "lost" close the connection
#: before the request is forwarded (nothing applied, and the client cannot
#: know); "after" forwards it and drops the answer (applied).
_ON_THE_WIRE: dict[str, Action] = {"before": "refuse", "lost": "refuse", "after": "drop"}


@contextmanager
def engine_client(
    connection_string: str, table: TableClient, plan: FaultPlan, transport: str
) -> Iterator[TableClient]:
    """The machine's engine client: the SDK's with faults injected in its
    transport, or the wire runner's behind a proxy that injects them."""
    if transport == "sdk":
        with TableClient.from_connection_string(
            connection_string, table.table_name, transport=FaultyTransport(plan)
        ) as client:
            yield client
        return
    port = int(connection_string.split("TableEndpoint=http://127.0.0.1:")[1].split("/")[0])

    def decide(request: Request) -> Action:
        fault = plan.take(_Seen(request))
        if fault is None or fault.kind == "pass":
            return "pass"
        if fault.meanwhile is not None:
            fault.meanwhile()
        return _ON_THE_WIRE[fault.kind]

    with Proxy(port) as proxy:
        proxy.plan(decide)
        through = proxy.endpoint_of(connection_string)
        with WireTableClient.from_connection_string(through, table.table_name) as client:
            yield client


class _Resolutions(logging.Handler):
    """Counts how the engine settled each write whose answer was lost."""

    def __init__(self, reached: Counter[str]) -> None:
        super().__init__(logging.INFO)
        self.reached = reached

    def emit(self, record: logging.LogRecord) -> None:
        outcome = getattr(record, "outcome", None)
        if outcome is not None:
            self.reached[f"resolved {outcome}"] += 1


def run_machines(
    connection_string: str,
    table: TableClient,
    steps: int,
    examples: int,
    transport: str = "sdk",
    first_seed: int = 0,
) -> Context:
    """Run machines until ``steps`` steps have passed (or ``examples`` examples),
    drawing from ``first_seed``, then the seeds after it; what they reached."""
    global CONTEXT
    plan = FaultPlan()
    profile = settings(
        max_examples=examples,
        stateful_step_count=40,
        deadline=None,
        database=None,
        phases=[Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    started = time.monotonic()
    logger = logging.getLogger("streamstone_py")
    with engine_client(connection_string, table, plan, transport) as engine:
        CONTEXT = Context(engine, table, plan)
        resolutions = _Resolutions(CONTEXT.reached)
        logger.addHandler(resolutions)
        level = logger.level
        logger.setLevel(logging.INFO)
        rounds = itertools.count(first_seed)
        try:
            while True:
                drawn = next(rounds)
                print(f"model ({transport}): seed {drawn}", flush=True)
                machine = seed(drawn)(type("SeededMachine", (EngineMachine,), {}))
                try:
                    run_state_machine_as_test(machine, settings=profile)
                except BaseException as exc:
                    exc.add_note(f"STREAMSTONE_MODEL_SEED={drawn} draws this run again")
                    raise
                if CONTEXT.steps >= steps:
                    break
                print(
                    f"model: {CONTEXT.steps} steps, {time.monotonic() - started:.0f} s", flush=True
                )
            # Each kind of fault is met: the plan records every one it injected.
            kinds = {entry.split()[0] for entry in plan.injected}
            assert kinds >= {"before", "after", "lost"}, f"faults met: {sorted(kinds)}"
            return CONTEXT
        finally:
            logger.removeHandler(resolutions)
            logger.setLevel(level)
            CONTEXT = None


# The long run takes as long as it needs; the suite's stays well within the default.
@pytest.mark.timeout(0 if LONG_STEPS else 300)
@pytest.mark.parametrize("transport", ["sdk", "wire"])
def test_engine_matches_the_model(
    connection_string: str, table: TableClient, transport: str
) -> None:
    steps, examples = (LONG_STEPS, 100) if LONG_STEPS else (0, 25)
    first_seed = SEEDS[transport] if SEED is None else int(SEED)
    started = time.monotonic()
    ran = run_machines(connection_string, table, steps, examples, transport, first_seed)
    print(f"model ({transport}): {ran.steps} steps in {time.monotonic() - started:.0f} s")
    print(f"model ({transport}): reached {dict(sorted(ran.reached.items()))}")
    if SEED is None:  # the fixed draws are known to reach each of them
        assert set(ran.reached) >= RARE, f"reached {dict(ran.reached)}"
