"""A call's time, on a real socket (through azurite.proxy): ``total_time`` is a
deadline for the whole call, answers included; no HTTP layer sends a request
again by itself; a ``Retry-After`` is honoured in both of its forms."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from azure.core.exceptions import AzureError, HttpResponseError, ServiceResponseTimeoutError
from azure.data.tables import UpdateMode

from azurite.proxy import Action, Proxy, Request
from streamstone_py import ConcurrencyConflictError, EventData, Partition, RetryPolicy, Stream
from streamstone_py._transport._faults import MAX_RETRY_AFTER, parse_retry_after
from streamstone_py._transport._wire import _client as client_module
from streamstone_py._transport._wire._deadline import Watch, watching
from tests.helpers import S, raw, rows

#: One try of at most a second.
ONE_TRY = RetryPolicy(attempts=1, total_time=1.0)
#: What a call may take beyond its total time: the socket's close, the scheduler.
MARGIN = 1.0
#: A byte every 6 ms: a deadline of a second falls among the answer's headers,
#: before its ETag (Azurite sends it after about 240 bytes).
AMID_HEADERS = 0.006


def gets(proxy: Proxy) -> list[Action]:
    return [action for request, action in proxy.seen if request.method == "GET"]


def write_never_answered(client: Any, proxy: Proxy, policy: RetryPolicy) -> None:
    """A write whose POST hangs: a lost answer by the deadline, resolved by one read."""
    partition = Partition(client, "hung-" + uuid.uuid4().hex[:8], retry=policy)
    proxy.plan(lambda request: "pass" if request.method == "GET" else "hang")
    started = time.monotonic()

    with pytest.raises(ServiceResponseTimeoutError):
        S.write(partition, EventData(id="e1"), expected_version=0)

    assert time.monotonic() - started < policy.total_time + MARGIN
    assert [(r.method, a) for r, a in proxy.seen] == [("POST", "hang"), ("GET", "pass")]
    assert rows(partition) == {}


def first(action: Action, method: str) -> Any:
    """A plan: ``action`` for the first request of ``method``, then pass everything."""
    taken: list[Request] = []

    def decide(request: Request) -> Action:
        if not taken and request.method == method:
            taken.append(request)
            return action
        return "pass"

    return decide


@pytest.mark.parametrize("proxied_client", ["wire", "wire-async", "async"], indirect=True)
def test_an_answer_that_trickles_ends_the_call_by_its_total_time(
    proxied_client: Any, proxy: Proxy
) -> None:
    # No socket read ever waits long; the answer would take seconds. Cut amid
    # its headers, it must not pass for a whole answer: it is a lost one.
    # (The sync SDK runner times each socket read only: see docs/streams.md.)
    key = "trickle-" + uuid.uuid4().hex[:8]
    S.write(Stream(Partition(proxied_client, key)), EventData(id="e1"), EventData(id="e2"))
    partition = Partition(proxied_client, key, retry=ONE_TRY)
    proxy.trickle = AMID_HEADERS
    proxy.plan(lambda request: "trickle" if request.method == "GET" else "pass")
    proxy.seen.clear()

    for read in (S.open, lambda p: S.read(p, 1, 2)):  # one read, then two side by side
        started = time.monotonic()
        with pytest.raises(ServiceResponseTimeoutError):
            read(partition)
        elapsed = time.monotonic() - started
        assert elapsed < ONE_TRY.total_time + MARGIN, elapsed

    assert gets(proxy) == ["trickle"] * 4  # nothing sent again below the engine
    proxy.plan(lambda request: "pass")
    assert sorted(rows(partition)) == sorted(
        ["SS-HEAD", "SS-SE-0000000001", "SS-SE-0000000002", "SS-UID-e1", "SS-UID-e2"]
    )


@pytest.mark.parametrize("proxied_client", ["wire", "wire-async", "async"], indirect=True)
def test_a_write_whose_answer_is_cut_at_its_deadline_is_a_lost_answer_resolved_by_reading(
    proxied_client: Any, proxy: Proxy
) -> None:
    # An answer cut amid its headers, ETag not come yet, once passed for a
    # whole one with an empty ETag, and the next write with that header went
    # unconditional (If-Match: *) over a rival's change.
    key = "cut-" + uuid.uuid4().hex[:8]
    partition = Partition(proxied_client, key, retry=ONE_TRY)
    proxy.trickle = AMID_HEADERS
    proxy.plan(lambda request: "pass" if request.method == "GET" else "trickle")

    provisioned = S.provision(partition, {"Owner": "me"})
    assert provisioned.etag == raw(partition).get_entity(key, "SS-HEAD").metadata["etag"]
    changed = S.set_properties(provisioned, {"Owner": "us"})
    assert changed.etag == raw(partition).get_entity(key, "SS-HEAD").metadata["etag"]

    assert [action for _, action in proxy.seen].count("trickle") == 2
    proxy.plan(lambda request: "pass")
    rival = {"PartitionKey": key, "RowKey": "SS-HEAD", "Owner": "them", "Version": 0}
    raw(partition).update_entity(rival, mode=UpdateMode.REPLACE)
    with pytest.raises(ConcurrencyConflictError):
        S.write(changed, EventData(id="e1"))
    assert rows(partition) == {"SS-HEAD": {"Owner": "them", "Version": 0}}


@pytest.mark.parametrize("proxied_client", ["wire", "wire-async"], indirect=True)
def test_a_read_whose_kept_alive_connection_drops_is_not_sent_again_below_the_engine(
    proxied_client: Any, proxy: Proxy
) -> None:
    # aiohttp repeats an idempotent request (GET, PUT, DELETE) by itself when a
    # kept-alive connection drops; only the engine's policy may send one again.
    partition = Partition(proxied_client, "resend-" + uuid.uuid4().hex[:8], retry=ONE_TRY)
    S.write(Stream(partition), EventData(id="e1"))
    assert S.open(partition).version == 1  # the connection is kept alive
    proxy.seen.clear()
    proxy.plan(first("refuse", "GET"))

    with pytest.raises(AzureError):
        S.open(partition)

    assert gets(proxy) == ["refuse"]


def test_retry_after_as_an_http_date_is_honoured(proxied_client: Any, proxy: Proxy) -> None:
    # HTTP allows an HTTP date as well as delta-seconds (test_transport_faults
    # waits those out, on reads and writes). A date has whole seconds: one 2 s
    # ahead asks for over 1 s.
    proxy.retry_after = 2
    proxy.retry_after_date = True
    policy = RetryPolicy(attempts=3, initial_delay=0.001, max_delay=0.01, total_time=10.0)
    partition = Partition(proxied_client, "busy-" + uuid.uuid4().hex[:8], retry=policy)
    proxy.plan(first("throttle", "POST"))
    started = time.monotonic()

    S.write(Stream(partition), EventData(id="e1"))  # 503, nothing applied, written again

    assert time.monotonic() - started >= 1.0
    assert [a for _, a in proxy.seen].count("throttle") == 1
    assert sorted(rows(partition)) == ["SS-HEAD", "SS-SE-0000000001", "SS-UID-e1"]


def test_a_write_that_never_gets_an_answer_ends_by_its_total_time(
    proxied_client: Any, proxy: Proxy
) -> None:
    # Each storage call once had a deadline of its own, and the verb sent the
    # write again after each read found it not applied: 6 tries of 2 s took 12 s.
    policy = RetryPolicy(attempts=6, initial_delay=0.01, max_delay=0.05, total_time=1.0)
    write_never_answered(proxied_client, proxy, policy)


@pytest.mark.parametrize("retry_after", [30, 10**12])
def test_a_retry_after_past_the_deadline_ends_the_call_at_once(
    proxied_client: Any, proxy: Proxy, caplog: pytest.LogCaptureFixture, retry_after: int
) -> None:
    # Waited out in full, past any total_time; 10**12 s overflowed time.sleep
    # on the sync runner and hung the async one.
    policy = RetryPolicy(attempts=3, initial_delay=0.01, max_delay=0.05, total_time=2.0)
    partition = Partition(proxied_client, "busy-" + uuid.uuid4().hex[:8], retry=policy)
    proxy.retry_after = retry_after
    proxy.plan(first("throttle", "POST"))
    started = time.monotonic()

    with pytest.raises(HttpResponseError) as write:
        S.write(partition, EventData(id="e1"), expected_version=0)
    proxy.plan(first("throttle", "GET"))
    with pytest.raises(HttpResponseError) as read:
        S.open(partition)

    assert time.monotonic() - started < 1.0
    for error in (write.value, read.value):
        assert error.status_code == 503
        assert any("past the call's deadline" in note for note in error.__notes__)
    said = [r.getMessage() for r in caplog.records if r.name == "streamstone_py"]
    assert sum("Retry-After" in line and "past the call's deadline" in line for line in said) == 2
    assert [(r.method, a) for r, a in proxy.seen] == [
        ("POST", "throttle"), ("GET", "pass"), ("GET", "throttle"),
    ]  # fmt: skip
    assert rows(partition) == {}


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("3", 3.0),
        (" 120 ", 120.0),
        ("99999999999999999999", MAX_RETRY_AFTER),  # capped, not overflowing a sleep
        ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date gone by: no wait
        ("inf", None),  # float() and int() take these; HTTP does not
        ("1_000", None),
        ("\u0663", None),  # ARABIC-INDIC DIGIT THREE
        ("1e3", None),
        ("-1", None),
        ("2.5", None),
        ("", None),
    ],
)
def test_retry_after_is_delta_seconds_in_ascii_digits_or_an_http_date(
    header: str, seconds: float | None
) -> None:
    assert parse_retry_after(header) == seconds


@pytest.mark.parametrize("proxied_client", ["wire"], indirect=True)
def test_a_hung_write_is_a_lost_answer_when_the_read_timeout_comes_before_the_watchdog(
    proxied_client: Any, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The socket's read timeout and the watchdog share the deadline; on a
    # busy machine the watchdog's thread may run after urllib3's timeout, and
    # the hang was then said as a broken connection (ServiceResponseError),
    # not the lost answer the docs promise. A watchdog that never fires in
    # time stands for that thread, starved.
    @contextlib.contextmanager
    def starved(deadline: float) -> Iterator[Watch]:
        with watching(deadline + 60.0) as watch:
            yield watch

    monkeypatch.setattr(client_module, "watching", starved)
    write_never_answered(proxied_client, proxy, ONE_TRY)
