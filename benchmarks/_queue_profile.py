"""``queue.profile.*``: one consumer run profiled on every thread, the
client's CPU grouped by package, and its top functions."""

from __future__ import annotations

import cProfile
import os
import pstats
from collections import Counter
from pathlib import Path
from typing import Any

from _common import ROOT, emit
from _queue_sides import Bench

SITE = f"{os.sep}site-packages{os.sep}"


def group(filename: str, function: str) -> str | None:
    """The package a function belongs to, or what a builtin does (None: a
    thread waiting on another, or idle)."""
    if filename == "~":
        if any(lock in function for lock in ("_thread.lock", "_thread.RLock", "SimpleQueue")):
            return None
        if "socket" in function or "ssl" in function or "select" in function:
            return "socket calls"
        return "builtins"
    if f"{os.sep}email{os.sep}" in filename:
        return "stdlib email (http.client parsing response headers)"
    if f"{os.sep}http{os.sep}" in filename:
        return "stdlib http.client"
    if SITE in filename:
        return filename.split(SITE, 1)[1].split(os.sep)[0]
    if filename.startswith(str(ROOT)):
        return filename[len(str(ROOT)) + 1 :].split(os.sep)[0]
    return "stdlib " + Path(filename).stem.strip("<>").replace("frozen ", "")


def where(filename: str, line: int, function: str) -> str:
    if SITE in filename:
        filename = filename.split(SITE, 1)[1]
    elif filename.startswith(str(ROOT)):
        filename = filename[len(str(ROOT)) + 1 :]
    elif filename != "~":
        filename = "stdlib " + Path(filename).name  # no machine paths in the report
    return f"{filename}:{line}({function})"


def bench_profile(bench: Bench) -> None:
    profiles: list[cProfile.Profile] = []
    run = bench.consumer("wire", profile=profiles)
    stats = pstats.Stats(profiles[0])
    for more in profiles[1:]:
        stats.add(more)
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    groups: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for (filename, line, function), (_, _, tottime, _, _) in entries.items():
        kind = group(filename, function)
        if kind is not None:
            groups[kind] += tottime
            functions[where(filename, line, function)] += tottime
    total = sum(groups.values())
    # The profiler's own cost inflates CPU seconds several times; the shares are the figures.
    params = {
        "messages": len(bench.texts), "queue_depth": bench.depth, "workers": bench.workers,
        "threads": len(profiles),
        "profiled_seconds": round(run.wall, 3), "profiled_cpu_seconds": round(total, 3),
    }  # fmt: skip
    for rank, (name, seconds) in enumerate(groups.most_common(8), start=1):
        emit(f"queue.profile.group.{rank}", "share of client CPU", "lower", [seconds / total],
             None, None, {**params, "group": name, "seconds": round(seconds, 3)})  # fmt: skip
    for rank, (name, seconds) in enumerate(functions.most_common(10), start=1):
        emit(f"queue.profile.function.{rank}", "share of client CPU", "lower",
             [seconds / total], None, None,
             {**params, "function": name, "seconds": round(seconds, 3)})  # fmt: skip
