"""The Arrow phase 1 (compaction/arrow_survivors.py) against the Spark SQL one.

Both run on the same random sealed-segment files: tombstones (null values, and empty
ones when empty.value.is.tombstone), null keys, keys repeated within and across
segments, ties in the ordering values, headers missing or repeated, with and without
bucketing (a budget forced below the estimate). They must choose the same offsets.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from compactlog.compaction.arrow_survivors import (
    estimate_bytes,
    key_buckets,
    needed_columns,
    partition_survivors,
    supports,
)
from compactlog.compaction.ledger import TombstoneRules
from compactlog.compaction.plan import InputFile, PartitionPlan
from compactlog.compaction.spark_pipeline import find_survivors
from compactlog.compaction.strategies import parse_strategy
from compactlog.storage.manifest import SegmentInfo
from compactlog.storage.sealed import SCHEMA

STRATEGIES = ["latest", "first", "order:timestamp", "order:header:h"]
KEYS = [None, b"", b"a", b"b", b"ab", b"a\x00", b"\x00", b"\xff", b"key-0001", b"key-0002"]
VALUES = [None, b"", b"v", b"value"]
HEADER_VALUES = [None, b"", b"1", b"10", b"2", b"\xff", b"\x00"]

Row = tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]
row_strategy = st.tuples(
    st.sampled_from(KEYS), st.sampled_from(VALUES), st.integers(0, 3),
    st.lists(st.tuples(st.sampled_from(["h", "g"]), st.sampled_from(HEADER_VALUES)),
             max_size=3),
)
# Partitions, each a list of segments, each a non-empty list of rows.
partitions_strategy = st.lists(
    st.lists(st.lists(row_strategy, min_size=1, max_size=12), min_size=1, max_size=3),
    min_size=1, max_size=3,
)


def write_segment(path: Path, rows: list[Row], base: int) -> SegmentInfo:
    offsets = list(range(base, base + len(rows)))
    table = pa.table({
        "offset": offsets,
        "timestamp": [row[2] for row in rows],
        "key": pa.array([row[0] for row in rows], pa.binary()),
        "value": pa.array([row[1] for row in rows], pa.binary()),
        "headers": [[{"key": k, "value": v} for k, v in row[3]] for row in rows],
        "value_size": [None if row[1] is None else len(row[1]) for row in rows],
        "batch_base_offset": offsets,
        "batch_last_offset": offsets,
        "batch_attributes": [0] * len(rows),
        "producer_id": [-1] * len(rows),
        "producer_epoch": [-1] * len(rows),
        "base_sequence": [-1] * len(rows),
    }, schema=SCHEMA)
    pq.write_table(table, path, row_group_size=5)  # several row groups per file
    return SegmentInfo(path.name, base, base + len(rows) - 1, len(rows),
                       path.stat().st_size, 0, 3, 0)


def make_plans(root: Path, partitions: list[list[list[Row]]], spec: str,
               empty_is_tombstone: bool) -> list[PartitionPlan]:
    plans = []
    rules = TombstoneRules(0, 0, empty_is_tombstone, "drop", -1)
    for index, segments in enumerate(partitions):
        directory = root / str(index) / "segments"
        directory.mkdir(parents=True)
        inputs, base = [], 0
        for rows in segments:
            path = directory / f"{base:020d}.parquet"
            inputs.append(InputFile(write_segment(path, rows, base), path, False))
            base += len(rows)
        plans.append(PartitionPlan("t", index, root / str(index), 0, None, base - 1, [],
                                   inputs, rules, parse_strategy(spec), 1 << 20, "zstd"))
    return plans


_COUNTER = [0]


def fresh_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    _COUNTER[0] += 1
    return tmp_path_factory.mktemp(f"phase1-{_COUNTER[0]}")


@pytest.mark.parametrize("spec", STRATEGIES)
def test_arrow_phase1_chooses_what_spark_sql_chooses(
    spec: str, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> None:
    @settings(max_examples=12, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(partitions=partitions_strategy, empty_is_tombstone=st.booleans(),
           divide=st.sampled_from([0, 2, 3, 7]))
    def check(partitions: list[list[list[Row]]], empty_is_tombstone: bool, divide: int) -> None:
        plans = make_plans(fresh_dir(tmp_path_factory), partitions, spec, empty_is_tombstone)
        find_survivors(spark, plans)
        strategy = parse_strategy(spec)
        for plan in plans:
            paths = [str(item.path) for item in plan.inputs]
            estimate = estimate_bytes(paths, needed_columns(strategy))
            budget = estimate // divide if divide else estimate + 1
            found = partition_survivors(paths, strategy, empty_is_tombstone, budget)
            assert found.tolist() == plan.survivors.tolist(), (spec, plan.partition)

    check()


def test_every_strategy_but_long_headers_and_functions_runs_in_arrow() -> None:
    runs: Callable[[str], bool] = lambda spec: supports(parse_strategy(spec))  # noqa: E731
    assert all(runs(spec) for spec in STRATEGIES)
    assert not runs("order:header:h:long")
    assert not runs("function:user_strategies:keep_larger")


@given(st.lists(st.binary(max_size=80), max_size=300), st.integers(1, 9))
def test_a_key_goes_to_the_same_bucket_wherever_it_is(keys: list[bytes], buckets: int) -> None:
    array = pa.array(keys, pa.binary())
    whole = key_buckets(array, buckets)
    assert ((whole >= 0) & (whole < buckets)).all()
    by_key: dict[bytes, Any] = {}
    for key, bucket in zip(keys, whole.tolist(), strict=True):
        assert by_key.setdefault(key, bucket) == bucket
    if len(keys) > 2:
        assert key_buckets(array.slice(1), buckets).tolist() == whole[1:].tolist()


def test_buckets_spread_keys() -> None:
    keys = pa.array([f"key-{i:08d}".encode() for i in range(20000)], pa.binary())
    counts = np.bincount(key_buckets(keys, 8), minlength=8)
    assert counts.min() > 20000 / 8 * 0.8, counts
