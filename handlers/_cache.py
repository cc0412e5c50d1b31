"""Stream headers a worker last wrote or read, so the next batch of a key can
write without reading first."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque

from streamstone_py import Partition, Stream

from ._store import StateStore

__all__ = ["BatchHeader", "HeaderCache"]


def _size(stream: Stream) -> int:
    """Roughly what a header holds in memory: its byte and text properties."""
    return 256 + sum(
        len(value) for value in stream.properties.values() if isinstance(value, bytes | str)
    )


class HeaderCache:
    """A bounded, thread-safe map from a key's stream to its newest known header.

    Share one between the processors of a worker: it is keyed by account
    endpoint, table, handler and key, and hands a header back on the caller's
    own partition, so a write goes through the caller's client, never through
    the client of the processor that stored the entry (which may be another
    account's, or closed). A cached header is only ever a guess: the write that uses it is
    conditional on its ETag, so a stale entry costs a refused write and a read,
    never a wrong state. The least recently used entries go first once either
    bound is reached; ``max_bytes`` counts the state each header carries.

    A key the cache has not seen is written as a new stream directly while
    most such guesses succeed (a new key takes one request, not two); once
    more than half of the last ``window`` guesses met an existing stream (a
    fresh worker over old keys), keys are read first until guesses pay again.
    """

    def __init__(
        self, max_entries: int = 10_000, max_bytes: int = 64 * 2**20, window: int = 64
    ) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, str, str, str], tuple[Stream, int]] = OrderedDict()
        self._bytes = 0
        self._guesses: deque[bool] = deque(maxlen=window)
        #: Lookups that found a header, and lookups that did not.
        self.hits = 0
        self.misses = 0
        #: Cached headers that a refused write proved stale (a rival wrote).
        self.stale = 0
        #: Keys the cache had not seen, written as new streams, that existed.
        self.wrong_guesses = 0

    @staticmethod
    def _key(partition: Partition) -> tuple[str, str, str, str]:
        # Two accounts may hold tables of the same name: the endpoint tells them
        # apart. The row-key prefix names the virtual partition (the handler).
        return (
            partition.endpoint,
            partition.table_name,
            partition.partition_key,
            partition.row_key_prefix,
        )

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def size_bytes(self) -> int:
        """The estimated bytes the cached headers hold."""
        with self._lock:
            return self._bytes

    def get(self, partition: Partition) -> Stream | None:
        """The header last put for this partition's stream, on ``partition``
        itself (its client and retry policy), or None."""
        key = self._key(partition)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            stream = entry[0]
        return stream.with_partition(partition)

    def put(self, stream: Stream) -> None:
        """Remember this header as the newest known for its stream."""
        if stream.is_transient:
            return
        key = self._key(stream.partition)
        size = _size(stream)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if size > self.max_bytes:
                return
            self._entries[key] = (stream, size)
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._bytes -= evicted

    def drop(self, partition: Partition) -> None:
        """Forget a header that proved stale, or that another call changed."""
        key = self._key(partition)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]

    def refused(self, partition: Partition, *, guessed_new: bool = False) -> None:
        """A write on this partition's cached header (or, ``guessed_new``, on a
        guess that an unseen key was new) was refused."""
        self.drop(partition)
        with self._lock:
            if guessed_new:
                self.wrong_guesses += 1
            else:
                self.stale += 1

    def guess_new(self) -> bool:
        """Whether to write an unseen key as a new stream without reading first."""
        with self._lock:
            return sum(not ok for ok in self._guesses) * 2 <= len(self._guesses)

    def guessed(self, ok: bool) -> None:
        """Record whether an unseen key was new: from a guess, or from the read
        made instead (so that guessing resumes when new keys come back)."""
        with self._lock:
            self._guesses.append(ok)


class BatchHeader:
    """The header a batch folds over: cached, guessed new, or read.

    With a :class:`HeaderCache`, a key's next batch is written on the cached
    header, and a key the cache has not seen is written as a new stream while
    most unseen keys turn out new. A refused guess costs no conflict: the
    engine hands back the stored header, and the batch folds again on it.
    """

    def __init__(self, store: StateStore, cache: HeaderCache | None, partition: Partition):
        self.store = store
        self.cache = cache
        self.partition = partition
        cached = cache.get(partition) if cache is not None else None
        # A key the cache has not seen: learn once whether it was new.
        self.unseen = cache is not None and cached is None
        self.guess = cached
        if self.unseen and cache is not None and cache.guess_new():
            self.guess = Stream(partition)
        self.read: Stream | None = None  # a header the engine read after a conflict

    @property
    def guessing(self) -> bool:
        return self.guess is not None

    def stream(self) -> Stream:
        if self.guess is not None:
            return self.guess
        stream = self._open() if self.read is None else self._seen(self.read)
        self.read = None
        self._learned(stream.is_transient)
        return stream

    def read_instead(self) -> None:
        """Fold next on the stored header (read afresh), not on a guess."""
        self.guess = None
        self.read = None

    def written(self, folded: Stream, stored: Stream) -> None:
        """The write on ``folded`` held: ``stored`` is the header it left."""
        self._learned(folded.is_transient)
        if self.cache is not None:
            self.cache.put(stored)

    def refused(self, current: Stream | None) -> bool:
        """A write refused on a conflict: was it the guess? Fold next on ``current``."""
        guessed = self.guess is not None
        self.guess = None
        self.read = current
        if guessed:
            assert self.cache is not None
            new_key = self.unseen
            self._learned(False)
            self.cache.refused(self.partition, guessed_new=new_key)
        return guessed

    def _learned(self, new: bool) -> None:
        if self.unseen and self.cache is not None:
            self.cache.guessed(new)
            self.unseen = False

    def _open(self) -> Stream:
        """The stored header (or a new stream), and the cache told of it."""
        stream = self.store.open(self.partition)
        if self.cache is None:
            return stream or Stream(self.partition)
        if stream is None:
            self.cache.drop(self.partition)
            return Stream(self.partition)
        self.cache.put(stream)
        return stream

    def _seen(self, stream: Stream) -> Stream:
        if self.cache is not None:
            self.cache.put(stream)
        return stream
