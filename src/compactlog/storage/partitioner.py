"""Kafka's default partitioner for keyed records, so compactlog and Kafka clients agree.

Java's `Utils.toPositive(Utils.murmur2(keyBytes)) % numPartitions`, with murmur2's seed
0x9747b28c; librdkafka's `murmur2_random` partitioner computes the same. The compiled
murmurhash2 package does the hashing; tests check it against Kafka's own vectors.
"""

from __future__ import annotations

import itertools

from murmurhash2 import murmurhash2

KAFKA_MURMUR2_SEED = 0x9747B28C


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 of `key`, as a signed 32-bit int like Java's."""
    value: int = murmurhash2(key, KAFKA_MURMUR2_SEED)
    return value - (1 << 32) if value >= 1 << 31 else value


def partition_for_key(key: bytes, partitions: int) -> int:
    return (murmurhash2(key, KAFKA_MURMUR2_SEED) & 0x7FFFFFFF) % partitions


def partitions_for_keys(keys: list[bytes | None], partitions: int, keyless: int) -> list[int]:
    """The partition of each key; null keys go to `keyless`."""
    seed = KAFKA_MURMUR2_SEED
    return [
        keyless if key is None else (murmurhash2(key, seed) & 0x7FFFFFFF) % partitions
        for key in keys
    ]


class NullKeyPartitioner:
    """Spreads keyless batches round-robin, a whole batch at a time (Kafka's sticky idea)."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def next(self, partitions: int) -> int:
        return next(self._counter) % partitions
