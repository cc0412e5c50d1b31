"""Stable sharding of keys over a number of tables or partitions."""

from __future__ import annotations

import hashlib

__all__ = ["Shard"]

_JUMP_MULTIPLIER = 2862933555777941757
_MASK64 = (1 << 64) - 1


class Shard:
    """Maps keys to shards the same way in every process, machine and Python version."""

    @staticmethod
    def resolve(key: str, total: int) -> int:
        """The shard of ``key`` among ``total`` shards, in ``range(total)``.

        The key's UTF-8 bytes are hashed with BLAKE2b (never the salted
        built-in ``hash()``), and the hash is placed with jump consistent
        hashing: growing from ``n`` to ``n + 1`` shards moves only about
        ``1 / (n + 1)`` of the keys.
        """
        if not isinstance(key, str):
            raise TypeError(f"key must be a str, got {type(key).__name__}: {key!r}")
        if not isinstance(total, int) or isinstance(total, bool):
            raise TypeError(f"total must be an int, got {total!r}")
        if total < 1:
            raise ValueError(f"total must be >= 1, got {total}")
        state = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
        bucket, candidate = -1, 0
        while candidate < total:
            bucket = candidate
            state = (state * _JUMP_MULTIPLIER + 1) & _MASK64
            candidate = int((bucket + 1) * ((1 << 31) / ((state >> 33) + 1)))
        return bucket
