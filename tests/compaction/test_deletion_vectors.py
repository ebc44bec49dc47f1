"""Incremental compaction with deletion vectors (compaction/incremental.py,
storage/deletion.py): the compacted view after many incremental runs equals a full
compaction of the same records; the rewrite threshold decides between a DV and a
rewrite; retention, DeleteRecords and tombstone retention leave the view through DVs;
retired DVs are swept; every reader applies them (the Reader, the TableView, Fetch's
read path, offset lookups). The Spark readers are covered by tests/spark/test_spark_source.py
and tests/spark/test_spark_fast.py, whose fixture has DVs, and the docs' DuckDB and Polars
queries by tests/docs/test_docs_querying.py.
"""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pyspark.sql import SparkSession

from compactlog.client.reader import Reader
from compactlog.compaction import load_factory
from compactlog.compaction.incremental import merge_sorted, small_runs
from compactlog.compaction.plan import InputFile
from compactlog.iceberg import expire_snapshots
from compactlog.storage.deletion import (
    cached_deletion_positions,
    deleted_mask,
    read_deletion_vector,
    write_deletion_vector,
)
from compactlog.storage.manifest import SegmentInfo
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.fakes import FakeClock

TOPIC = "t"


def service(store: LogStore, clock: FakeClock, topic: str = TOPIC) -> Any:
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    return factory.new_service(store, topic, {"clock": clock, "engine": "arrow"})


def config(rewrite: float, **extra: str) -> dict[str, str]:
    return {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
            "delete.retention.ms": str(10**12), "compaction.deletion.vectors": "true",
            "compaction.ledger.rewrite.live.fraction": str(rewrite),
            "segment.bytes": "4096", **extra}


def batch(rng: random.Random, count: int, keys: int, tag: str) -> list[ProducerRecord]:
    return [ProducerRecord(b"k%03d" % rng.randrange(keys),
                           None if rng.random() < 0.1 else f"{tag}-{i}".encode())
            for i in range(count)]


def compacted(store: LogStore, topic: str, partition: int = 0) -> list[Record]:
    reader = Reader(store, topic, partition, read_compacted=True)
    records: list[Record] = []
    while chunk := reader.poll(max_records=97):
        records += chunk
    return records


@pytest.mark.parametrize("rewrite", [0.0, 0.3, 0.7, 1.0])
@pytest.mark.parametrize("seed", [1, 2])
def test_many_incremental_runs_equal_one_full_compaction(
        tmp_path: Path, rewrite: float, seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        store.create_topic(TOPIC, 2, config(rewrite))
        store.create_topic("full", 2, config(rewrite, **{
            "compaction.deletion.vectors": "false"}))
        incremental = service(store, clock)
        dvs_seen = 0
        for run in range(8):
            records = batch(rng, 300 if run == 0 else rng.choice([5, 30, 120]), 150, str(run))
            for topic in (TOPIC, "full"):
                for index in range(2):
                    store.append(topic, records, partition=index)
                for partition in store.topic(topic).partitions:
                    partition.roll()
            incremental.compact()
            clock.advance_ms(1000)
            ledgers = [p.manifest.ledger for p in store.topic(TOPIC).partitions]
            dvs_seen += sum(1 for ledger in ledgers for info in ledger if info.dv_file)
            for ledger in ledgers:
                assert all(info.live_count > 0 for info in ledger)
                assert all(a.last_offset < b.base_offset for a, b in itertools.pairwise(ledger))
        service(store, clock, "full").compact()
        for index in range(2):
            assert compacted(store, TOPIC, index) == compacted(store, "full", index)
            keys = [r.key for r in compacted(store, TOPIC, index)]
            assert len(keys) == len(set(keys))
            status = store.topic(TOPIC).partition(index).stats()
            ledger = store.topic(TOPIC).partition(index).manifest.ledger
            assert status["ledger_records"] == sum(i.record_count - i.dv_count for i in ledger)
        if rewrite == 1.0:
            assert dvs_seen == 0  # every file that lost a record was rewritten
        if rewrite == 0.0:
            assert dvs_seen > 0


def test_a_file_is_rewritten_below_the_threshold_and_old_dvs_are_swept(
        tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        store.create_topic(TOPIC, 1, config(0.5, **{
            "file.delete.delay.ms": "1000",
            # no snapshot keeps the replaced ledger (tests/iceberg/test_iceberg_expiry.py)
            "iceberg.history.expire.max-snapshot-age-ms": "0"}))
        partition = store.topic(TOPIC).partition(0)
        compactor = service(store, clock)
        store.append(TOPIC, [ProducerRecord(b"k%03d" % k, b"a") for k in range(100)])
        partition.roll()
        compactor.compact()
        (first,) = partition.manifest.ledger
        for start in (0, 20):  # 20 keys superseded each time: a DV, then a larger DV
            store.append(TOPIC, [ProducerRecord(b"k%03d" % k, b"b")
                                 for k in range(start, start + 20)])
            partition.roll()
            compactor.compact()
            assert partition.manifest.ledger[0].file == first.file
        dv = partition.manifest.ledger[0]
        assert dv.dv_count == 40 and dv.live_count == 60
        retired = {Path(item.path).name for item in partition.manifest.retired}
        assert any(".dv-" in name for name in retired)  # the first DV, replaced
        store.append(TOPIC, [ProducerRecord(b"k%03d" % k, b"c") for k in range(40, 60)])
        partition.roll()
        compactor.compact()  # 40 of 100 left live: below 0.5, so the file is rewritten
        assert first.file not in {info.file for info in partition.manifest.ledger}
        assert not any(info.dv_file for info in partition.manifest.ledger)
        # Without a DV the manifest has no DV fields: builds before DVs read it as before.
        assert "dv_" not in (partition.directory / "manifest" / "current.json").read_text()
        clock.advance_ms(2000)
        # The server's upkeep expires snapshots too: the replaced file's hold (taken
        # less than file.delete.delay.ms before the last run) is released now.
        expire_snapshots(store, TOPIC)
        partition.sweep()
        on_disk = {p.name for p in partition.ledger_dir.glob("*.parquet")}
        assert on_disk == {Path(p).name for p in partition.manifest.live_files()
                           if p.startswith("ledger/")}
        view = compacted(store, TOPIC)
        assert len(view) == 100
        assert [r.value for r in view].count(b"a") == 40


def test_retention_and_delete_records_leave_the_view_through_dvs(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        store.create_topic(TOPIC, 1, config(0.0, **{
            "cleanup.policy": "compact,delete", "retention.ms": "60000",
            "delete.retention.ms": "5000"}))
        partition = store.topic(TOPIC).partition(0)
        compactor = service(store, clock)
        store.append(TOPIC, [ProducerRecord(b"old%d" % k, b"v") for k in range(10)])
        clock.advance_ms(30_000)
        store.append(TOPIC, [ProducerRecord(b"new%d" % k, b"v") for k in range(10)]
                     + [ProducerRecord(b"new0", None)])
        partition.roll()
        compactor.compact()
        assert len(partition.manifest.ledger) == 1
        clock.advance_ms(40_000)  # the "old" records are past retention.ms, tombstone too
        store.append(TOPIC, [ProducerRecord(b"x", b"v")])
        partition.roll()
        compactor.compact()
        view = compacted(store, TOPIC)
        assert {r.key for r in view} == {b"new%d" % k for k in range(1, 10)} | {b"x"}
        assert any(info.dv_file for info in partition.manifest.ledger)
        cut = sorted(r.offset for r in view)[3]
        partition.delete_records(cut)
        store.append(TOPIC, [ProducerRecord(b"y", b"v")])
        partition.roll()
        compactor.compact()
        view = compacted(store, TOPIC)
        assert all(r.offset >= cut for r in view)
        assert {r.key for r in view} >= {b"x", b"y"}


def test_reads_that_seek_skip_deleted_rows(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        store.create_topic(TOPIC, 1, config(0.0))
        partition = store.topic(TOPIC).partition(0)
        compactor = service(store, clock)
        store.append(TOPIC, [ProducerRecord(b"k%d" % k, b"a") for k in range(10)])
        partition.roll()
        compactor.compact()
        clock.advance_ms(1000)
        store.append(TOPIC, [ProducerRecord(b"k9", b"b"), ProducerRecord(b"k0", b"b")])
        partition.roll()
        compactor.compact()
        ledger = partition.manifest.ledger
        assert ledger[0].dv_file is not None and ledger[0].dv_count == 2
        view = compacted(store, TOPIC)
        assert [r.offset for r in view] == [*range(1, 9), 10, 11]
        assert partition.read_compacted(0, 1)[0].offset == 1
        assert partition.read_compacted(9, 5)[0].offset == 10
        last = partition.compacted.last_ledger_record()
        assert last is not None and last.offset == 11
        assert partition.compacted.offset_for_timestamp(0) == 1
        entries = partition.compacted.read_ledger(0, 100)
        assert [r.offset for r in entries] == [*range(1, 9), 10, 11]


def make_first_strategy_dvs(store: LogStore, clock: FakeClock) -> None:
    """Under `first`, a key's old ledger record deleted by a tombstone whose retention
    (0) ended at once: only the DV says the old record is gone."""
    store.create_topic(TOPIC, 1, config(0.0, **{"compaction.strategy": "first",
                                                 "delete.retention.ms": "0"}))
    partition = store.topic(TOPIC).partition(0)
    store.append(TOPIC, [ProducerRecord(b"k%d" % k, b"a") for k in range(10)])
    partition.roll()
    service(store, clock).compact()
    store.append(TOPIC, [ProducerRecord(b"k1", None)])
    partition.roll()
    service(store, clock).compact()
    assert partition.manifest.ledger[0].dv_count == 1
    store.append(TOPIC, [ProducerRecord(b"k1", b"b"), ProducerRecord(b"k2", b"b")])
    partition.roll()


def test_every_engine_leaves_out_what_a_dv_deleted(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        make_first_strategy_dvs(store, clock)
        factory = load_factory("local_engine:LocalCompactionServiceFactory")
        factory.new_service(store, TOPIC, {"clock": clock}).compact()  # plain Python
        view = {r.key: r.value for r in compacted(store, TOPIC)}
        assert view[b"k1"] == b"b" and view[b"k2"] == b"a"


def test_the_sql_engine_leaves_out_what_a_dv_deleted(tmp_path: Path,
                                                     spark: SparkSession) -> None:
    from compactlog.compaction.spark_service import SparkCompactionService

    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        make_first_strategy_dvs(store, clock)
        store.alter_topic(TOPIC, {"compaction.phase1.engine": "sql"})
        SparkCompactionService(store, TOPIC, {"spark.session": spark, "clock": clock}).compact()
        view = {r.key: r.value for r in compacted(store, TOPIC)}
        assert view[b"k1"] == b"b" and view[b"k2"] == b"a"
        assert not any(info.dv_file for info in store.topic(TOPIC).partition(0).manifest.ledger)


@pytest.mark.parametrize("merge_below", [0, 1 << 20])
def test_small_ledger_files_merge_and_the_view_stays(tmp_path: Path, merge_below: int) -> None:
    """Each incremental run that keeps the previous files adds one; merging small
    neighbours (compaction.ledger.merge.below.bytes, .min.files) keeps their number
    bounded, and the view is a full compaction's. Merging off, every run's file stays."""
    rng = random.Random(7)
    clock = FakeClock()
    merge = {"compaction.ledger.merge.below.bytes": str(merge_below),
             "compaction.ledger.merge.min.files": "3"}
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        # Rewrite fraction 0: only merging rewrites a file that keeps a live record.
        store.create_topic(TOPIC, 1, config(0.0, **merge))
        store.create_topic("full", 1, config(0.0, **{"compaction.deletion.vectors": "false"}))
        incremental = service(store, clock)
        counts = []
        for run in range(24):
            # New keys each run, and a few updates of old ones (a DV, never a drop).
            records = [ProducerRecord(b"n%02d-%02d" % (run, i), b"v%d" % i) for i in range(20)]
            records += batch(rng, 3, 150, str(run))
            for topic in (TOPIC, "full"):
                store.append(topic, records, partition=0)
                store.topic(topic).partition(0).roll()
            report = incremental.compact()
            clock.advance_ms(1000)
            ledger = store.topic(TOPIC).partition(0).manifest.ledger
            assert all(a.last_offset < b.base_offset for a, b in itertools.pairwise(ledger))
            # The report counts the files before and after the run.
            assert report.total("ledger_files_in") == (counts[-1] if counts else 0)
            assert report.total("ledger_files_out") == len(ledger)
            counts.append(len(ledger))
        service(store, clock, "full").compact()
        assert compacted(store, TOPIC) == compacted(store, "full")
    if merge_below:
        # Unmerged groups hold fewer than min.files files and at least double in size
        # going back: a handful, whatever the number of runs.
        assert max(counts) <= 8, counts
        assert counts[-1] < 24
    else:
        assert counts == list(range(1, 25))


@pytest.mark.parametrize(("sizes", "merged"), [
    ([10, 10, 10], [0, 1, 2]),              # three small neighbours
    ([10, 10], []),                          # too few
    ([10, 10, 100, 10, 10], []),             # a large file between them: no neighbours
    ([80, 10, 10, 10], [1, 2, 3]),           # the older 80 is over twice the newer 30
    ([60, 10, 10, 10], [0, 1, 2, 3]),        # 60 is twice the newer 30: it joins
    ([5, 5, 5, 80, 10, 10], [0, 1, 2, 3]),   # 80 > 2 x 20 starts the next group: 80, 5, 5, 5
    ([13, 12, 11, 10], [0, 1, 2, 3]),        # a write rate that falls run after run
    ([95, 30, 9, 2], []),                    # each over twice the newer: groups of one
])
def test_small_runs_picks_neighbours_of_like_size(sizes: list[int], merged: list[int]) -> None:
    """incremental.small_runs with merge.below.bytes 100 and merge.min.files 3."""
    files = [InputFile(SegmentInfo(f"{n}.parquet", n * 10, n * 10 + 9, 10, size, 0, 0, 0),
                       Path(f"{n}.parquet"), True) for n, size in enumerate(sizes)]
    assert small_runs(files, 100, 3) == {f"{n}.parquet" for n in merged}


@given(
    start=st.integers(-5, 50),
    offsets=st.one_of(
        st.integers(0, 60).map(lambda n: list(range(n))),  # a group without gaps
        st.sets(st.integers(0, 120), max_size=60).map(sorted),  # ascending, with gaps
        st.lists(st.integers(0, 100), max_size=60),  # any order, repeats: the general path
    ),
    deleted=st.lists(st.integers(-10, 130), max_size=80).map(sorted),
)
# One group per path of an ascending group: dense, a table of its span (span <= 32 a
# row: 3 rows over 90 offsets), a binary search (2 rows over 100 offsets).
@example(start=0, offsets=[0, 1, 2, 3], deleted=[1, 3, 9])
@example(start=7, offsets=[0, 45, 89], deleted=[7, 52, 60, 96, 200])
@example(start=-3, offsets=[0, 99], deleted=[-3, 50, 96, 97])
def test_deleted_mask_is_membership_in_the_sorted_array(
        start: int, offsets: list[int], deleted: list[int]) -> None:
    """deleted_mask, on each of its paths (an ascending group without gaps, one indexed
    through a table of its span, one searched; a group in any order), is exactly
    "offset i is in `deleted`"."""
    shifted = np.asarray([start + offset for offset in offsets], dtype=np.int64)
    members = np.asarray(deleted, dtype=np.int64)
    assert np.array_equal(deleted_mask(shifted, members), np.isin(shifted, members))


@given(
    deleted=st.sets(st.integers(0, 400), max_size=120),
    removed=st.sets(st.integers(0, 400), max_size=120),
)
def test_merge_sorted_is_the_union_of_two_ascending_arrays(
        deleted: set[int], removed: set[int]) -> None:
    """decide's merge of an old DV with the rows a run takes out is np.union1d's result:
    disjoint (as decide gives it) through one stable sort, and with common members too."""
    old = np.asarray(sorted(deleted), dtype=np.int64)
    new = np.asarray(sorted(removed - deleted), dtype=np.int64)
    assert np.array_equal(merge_sorted(old, new), np.union1d(old, new))
    overlapping = np.asarray(sorted(removed), dtype=np.int64)
    assert np.array_equal(merge_sorted(old, overlapping), np.union1d(old, overlapping))


def test_a_dv_is_delta_encoded_and_every_reader_reads_what_was_written(
        tmp_path: Path) -> None:
    """A DV is written DELTA_BINARY_PACKED and uncompressed (DV_WRITE_OPTIONS): pyarrow
    (compactlog's readers), DuckDB and Polars (docs/querying.md's queries) read the
    offsets and positions written; a DV written before (zstd, plain) reads the same."""
    import duckdb
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(7)
    rows = np.sort(rng.choice(np.arange(10**6, 10**6 + 60_000), 20_000, replace=False))
    gone = np.sort(rng.choice(len(rows), 7_000, replace=False))
    offsets, positions = rows[gone], gone.astype(np.int64)
    size, crc = write_deletion_vector(tmp_path, "f.dv-run.parquet", offsets, positions)
    path = tmp_path / "f.dv-run.parquet"
    chunk = pq.ParquetFile(path).metadata.row_group(0)
    for index in range(chunk.num_columns):
        column = chunk.column(index)
        assert "DELTA_BINARY_PACKED" in column.encodings, column
        assert column.compression == "UNCOMPRESSED"
    assert np.array_equal(read_deletion_vector(path, size, crc), offsets)
    assert np.array_equal(cached_deletion_positions(path, size, crc), positions)
    found = duckdb.sql(f"SELECT \"offset\", position FROM read_parquet('{path}')").fetchnumpy()
    assert np.array_equal(found["offset"], offsets)
    assert np.array_equal(found["position"], positions)
    frame = pl.read_parquet(path)
    assert np.array_equal(frame["offset"].to_numpy(), offsets)
    assert np.array_equal(frame["position"].to_numpy(), positions)
    old = tmp_path / "old.dv-run.parquet"
    pq.write_table(pa.table({"offset": pa.array(offsets)}), old, compression="zstd")
    assert np.array_equal(read_deletion_vector(old), offsets)
