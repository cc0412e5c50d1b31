"""Retention: removing a key's old versions, so that storage stays bounded,
in steps that a later call can finish after a crash."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from streamstone_py import ConcurrencyConflictError, Stream

from ._batch._strategy import Strategy
from ._batch._tokens import Tokens
from ._cache import HeaderCache
from ._store import RETAIN_CUT, WATERMARK, StoredVersion

__all__ = ["check_bounds", "retain"]


def check_bounds(keep_last: int | None, older_than: timedelta | None) -> None:
    if keep_last is None and older_than is None:
        raise ValueError("give keep_last, older_than, or both")
    if keep_last is not None and (
        not isinstance(keep_last, int) or isinstance(keep_last, bool) or keep_last < 0
    ):
        raise ValueError(f"keep_last must be an int >= 0, got {keep_last!r}")
    if older_than is not None and (
        not isinstance(older_than, timedelta) or older_than < timedelta(0)
    ):
        raise ValueError(f"older_than must be a timedelta >= 0, got {older_than!r}")


def retain(
    strategy: Strategy,
    cache: HeaderCache | None,
    now: Callable[[], datetime],
    key: str,
    keep_last: int | None,
    older_than: timedelta | None,
    keep_from: int | None = None,
    at_least: int = 1,
    tokens: Tokens | None = None,
) -> int:
    """What :meth:`Processor.retain` does (documented there): returns how many
    versions this call removed."""
    check_bounds(keep_last, older_than)
    for name, value in (("keep_from", keep_from), ("at_least", at_least)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    store = strategy.store
    partition = store.partition(key)
    if cache is not None:
        cached = cache.get(partition)
        if older_than is None and _nothing_to_remove(
            strategy, cached, keep_last, keep_from, at_least
        ):
            return 0
        cache.drop(partition)  # the header changes below; put back at the end
    stream = store.open(partition)
    if stream is None:
        return 0
    first = stream.first_version
    removed = _removable(strategy, now, stream, keep_last, older_than, keep_from, tokens)
    if len(removed) < at_least and not _interrupted(stream):
        removed = []  # fewer, larger cuts: wait until at_least versions can go
    retained: list[str] = []
    if removed:
        cut = removed[-1].version + 1
        stream = _record_cut(strategy, stream, max(r.now for r in removed), cut)
        # Before the versions, as the outbox rows: once these are gone, nothing lists them.
        store.delete_records(partition, [d for r in removed for d in r.records])
        strategy.before_truncate(partition, removed)
        if tokens is not None:
            retained = tokens.forget(partition, removed, cut)
    else:
        cut = first
    if cut > 1:
        # Also sweeps what an interrupted call left below the header's cut.
        stream = store.truncate(stream, max(cut, stream.first_version))
    if tokens is not None and retained:  # after their versions: see TokenRows.record
        tokens.rows.sweep(partition, retained)
    if cache is not None:
        cache.put(stream)  # the header as this call left it
    return len(removed)


def _interrupted(stream: Stream) -> bool:
    """Whether an earlier call recorded a cut it did not finish."""
    recorded = stream.properties.get(RETAIN_CUT)
    return isinstance(recorded, int) and recorded > stream.first_version


def _nothing_to_remove(
    strategy: Strategy,
    cached: Stream | None,
    keep_last: int | None,
    keep_from: int | None,
    at_least: int = 1,
) -> bool:
    """Whether the header this worker last saw shows that a ``keep_last`` call
    would remove fewer than ``at_least`` versions (no request needed).

    The same cut as :func:`_removable`'s before what only a read can tell
    (the outbox's undispatched rows), which can only lower it: so a stale
    header only ever postpones a removal to a later call, never removes more.
    """
    if cached is None or keep_last is None:
        return False
    if _interrupted(cached):
        return False  # an interrupted cut to finish
    cut = strategy.hold_bound(_bounded_cut(cached, keep_last, keep_from), cached.version)
    return cut - cached.first_version < at_least


def _bounded_cut(stream: Stream, keep_last: int | None, keep_from: int | None) -> int:
    """The cut the count bounds allow: versions below it may go (``first``: none)."""
    first = stream.first_version
    cut = stream.version + 1
    if keep_last is not None:
        cut = min(cut, max(first, stream.version - keep_last + 1))
    if keep_from is not None:
        cut = min(cut, max(first, keep_from))
    return cut


def _removable(
    strategy: Strategy,
    now: Callable[[], datetime],
    stream: Stream,
    keep_last: int | None,
    older_than: timedelta | None,
    keep_from: int | None = None,
    tokens: Tokens | None = None,
) -> list[StoredVersion]:
    """The versions retention may remove now, oldest first: ``[first, cut)``.

    An earlier call that was interrupted may have recorded a higher cut (and
    removed outbox rows below it): that cut is finished whatever this call's
    bounds, so no kept version is left without its outbox row.
    """
    first = stream.first_version
    cut = _bounded_cut(stream, keep_last, keep_from)
    recorded = stream.properties.get(RETAIN_CUT)
    started = recorded if isinstance(recorded, int) and first < recorded else first
    started = min(started, stream.version + 1)
    upper = max(cut, started)
    if upper <= first:
        return []
    page = strategy.store.read(stream.partition, first, upper - first)
    key = stream.partition.partition_key
    candidates = [strategy.store.stored_version(key, e) for e in page.events]
    if older_than is not None:
        limit = now() - older_than
        young = [r.version for r in candidates if r.now >= limit]
        if young:
            cut = min(cut, min(young))
    cut = strategy.hold(stream.partition, candidates, cut, stream.version)
    if tokens is not None:  # a version whose outputs' tokens did not go out yet stays
        cut = tokens.hold(stream.partition, candidates, cut)
    cut = max(cut, started)
    return [r for r in candidates if r.version < cut]


def _record_cut(strategy: Strategy, stream: Stream, watermark: datetime, cut: int) -> Stream:
    """Store the watermark and the cut in the header before removing anything."""
    store = strategy.store
    while True:
        previous = stream.properties.get(WATERMARK)
        recorded = stream.properties.get(RETAIN_CUT)
        changes: dict[str, Any] = {}
        if not isinstance(previous, datetime) or previous < watermark:
            changes[WATERMARK] = watermark
        if not isinstance(recorded, int) or recorded < cut:
            changes[RETAIN_CUT] = cut
        if not changes:
            return stream
        try:
            return store.set_properties(stream, {**stream.properties, **changes})
        except ConcurrencyConflictError:
            reopened = store.open(stream.partition)
            assert reopened is not None
            stream = reopened
