"""Kafka's murmur2 partitioner: Kafka's own vectors, and agreement with kafka-python."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactlog.storage.partitioner import (
    KAFKA_MURMUR2_SEED,
    NullKeyPartitioner,
    murmur2,
    partition_for_key,
)

# From Kafka's clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java (testMurmur2).
KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


def test_seed_is_kafkas() -> None:
    assert KAFKA_MURMUR2_SEED == 0x9747B28C


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS)
def test_murmur2_matches_kafka_vectors(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), KAFKA_VECTORS)
@pytest.mark.parametrize("partitions", [1, 2, 3, 7, 16, 100, 10_000])
def test_partition_for_key_is_kafkas_to_positive(
    key: bytes, expected: int, partitions: int
) -> None:
    # Java: Utils.toPositive(murmur2(key)) % numPartitions, toPositive = n & 0x7fffffff.
    assert partition_for_key(key, partitions) == (expected & 0x7FFFFFFF) % partitions


def _load_kafka_python_murmur2() -> Callable[[bytes], int] | None:
    with warnings.catch_warnings():
        # kafka-python's protocol modules use deprecated importlib.resources calls.
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            from kafka.partitioner.default import murmur2 as reference
        except ImportError:  # pragma: no cover - kafka-python is a test dependency
            return None
    return reference  # type: ignore[no-any-return]


KAFKA_PYTHON_MURMUR2 = _load_kafka_python_murmur2()


def _kafka_python_murmur2() -> Callable[[bytes], int]:
    if KAFKA_PYTHON_MURMUR2 is None:  # pragma: no cover
        pytest.skip("kafka-python is not importable; its pure-Python murmur2 is the reference")
    return KAFKA_PYTHON_MURMUR2


def test_kafka_python_reference_agrees_with_vectors() -> None:
    reference = _kafka_python_murmur2()
    for key, expected in KAFKA_VECTORS:
        assert reference(key) & 0xFFFFFFFF == expected & 0xFFFFFFFF


@settings(max_examples=500, deadline=None)
@given(key=st.binary(max_size=100), partitions=st.integers(min_value=1, max_value=10_000))
def test_agrees_with_kafka_python(key: bytes, partitions: int) -> None:
    reference = _kafka_python_murmur2()
    expected_hash = reference(key)
    assert murmur2(key) & 0xFFFFFFFF == expected_hash & 0xFFFFFFFF
    assert -(2**31) <= murmur2(key) < 2**31
    assert partition_for_key(key, partitions) == (expected_hash & 0x7FFFFFFF) % partitions


def test_null_key_partitioner_round_robin() -> None:
    partitioner = NullKeyPartitioner()
    assert [partitioner.next(3) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert partitioner.next(1) == 0
