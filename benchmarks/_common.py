"""What every benchmark shares: an account, paired timing, and the JSON line format.

Every script prints one JSON object per measurement on stdout, with the peer
measured in the same run beside the value, medians of repeats with min and
max; a correctness check that fails stops the run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from azure.core.pipeline.transport import RequestsTransport  # noqa: E402

from azurite.launcher import account  # noqa: E402

__all__ = [
    "CountingTransport",
    "account",
    "check",
    "emit",
    "entity_bytes",
    "log",
    "machine",
    "paired",
    "quick",
    "timed",
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def quick(doc: str | None) -> bool:
    """The ``--quick`` flag of a benchmark script (its docstring's first line is
    the description); logs the machine, which every run reports beside its figures."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, under a minute")
    flag = bool(parser.parse_args().quick)
    log(f"machine: {machine()}")
    return flag


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


class CheckFailed(SystemExit):
    def __init__(self, message: str) -> None:
        log(f"CHECK FAILED: {message}")
        super().__init__(1)


def check(condition: bool, message: str) -> None:
    """A fast wrong answer is not a result: stop the run with a failure."""
    if not condition:
        raise CheckFailed(message)


def paired(
    value: Callable[[int], float], peer: Callable[[int], float], repeats: int
) -> tuple[list[float], list[float]]:
    """Run value and peer alternately (each gets the repeat index); return both series.

    Alternating, and swapping who goes first, spreads drift of a shared
    machine over both sides instead of charging it to one.
    """
    values: list[float] = []
    peers: list[float] = []
    for i in range(repeats):
        if i % 2 == 0:
            values.append(value(i))
            peers.append(peer(i))
        else:
            peers.append(peer(i))
            values.append(value(i))
    return values, peers


def raw_get(table: Any, partition_key: str, row_key: str) -> dict[str, Any]:
    """One point read sent by hand (SharedKey-signed, urllib3, no SDK, no
    engine): what the server's answer costs. ``table`` gives the account."""
    import base64
    import hashlib
    import hmac
    import json as _json
    from email.utils import formatdate
    from urllib.parse import quote

    named = table.credential.named_key
    base = table.url.rstrip("/")
    path = "/" + base.split("/", 3)[3] if base.count("/") >= 3 else ""
    key = f"(PartitionKey='{quote(partition_key)}',RowKey='{quote(row_key, safe='')}')"
    resource = f"{path}/{table.table_name}{key}"
    date = formatdate(usegmt=True)
    text = f"GET\n\n\n{date}\n/{named.name}{resource}"
    digest = hmac.new(base64.b64decode(named.key), text.encode(), hashlib.sha256).digest()
    answer = _RAW_HTTP.request(
        "GET",
        f"{base}/{table.table_name}{key}",
        headers={
            "x-ms-date": date, "x-ms-version": "2019-02-02",
            "Accept": "application/json;odata=minimalmetadata",
            "Authorization": f"SharedKey {named.name}:{base64.b64encode(digest).decode()}",
        },
    )  # fmt: skip
    check(answer.status == 200, f"raw read: status {answer.status}")
    return dict(_json.loads(answer.data))


def _pool() -> Any:
    import urllib3

    return urllib3.PoolManager(maxsize=4)


_RAW_HTTP = _pool()


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def emit(
    name: str,
    unit: str,
    better: str,
    values: list[float],
    peer: str | None,
    peers: list[float] | None,
    params: dict[str, Any],
) -> dict[str, Any]:
    value = statistics.median(values)
    peer_value = statistics.median(peers) if peers else None
    record = {
        "name": name,
        "unit": unit,
        "better": better,
        "value": round(value, 3),
        "peer": peer,
        "peer_value": round(peer_value, 3) if peer_value is not None else None,
        "ratio": round(value / peer_value, 3) if peer_value else None,
        "params": params,
        "repeats": len(values),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }
    print(json.dumps(record), flush=True)
    return record


def entity_bytes(row: dict[str, Any]) -> int:
    """Azure's documented entity size: keys, then each property's name and value."""
    size = 4 + 2 * (len(row["PartitionKey"]) + len(row["RowKey"]))
    for name, value in row.items():
        if name in ("PartitionKey", "RowKey"):
            continue
        if isinstance(value, bool):
            value_size = 1
        elif isinstance(value, str):
            value_size = 4 + 2 * len(value)
        elif isinstance(value, bytes):
            value_size = 4 + len(value)
        elif isinstance(value, int) and -(2**31) <= value < 2**31:
            value_size = 4
        else:  # Int64, Double, DateTime
            value_size = 8
        size += 8 + 2 * len(name) + value_size
    return size


class CountingTransport(RequestsTransport):  # type: ignore[misc]
    """The SDK's own transport, counting the HTTP requests (storage round trips) it sends."""

    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    def send(self, request: Any, **kwargs: Any) -> Any:
        self.requests += 1
        return super().send(request, **kwargs)
