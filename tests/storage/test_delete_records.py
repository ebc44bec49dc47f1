"""DeleteRecords in the store (Partition.delete_records): no view serves offsets below
the given one any more, raw or compacted, across seals, reopens and compactions."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compactlog.errors import OffsetOutOfRangeError
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.engines import Engine, compact
from support.fakes import FakeClock
from support.faultkit import read_all

COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.bytes": "1024",
             "file.delete.delay.ms": "0"}


def fill(store: LogStore, topic: str, count: int, keys: int) -> None:
    for i in range(count):
        store.append(topic, [ProducerRecord(b"k%d" % (i % keys), b"v%03d-" % i + b"." * 200)])


def test_delete_records_in_sealed_and_log_segments(tmp_path: Path, clock: FakeClock) -> None:
    data = tmp_path / "data"
    with LogStore.open(data, clock=clock) as store:
        store.create_topic("t", 1, {"segment.bytes": "1024", "file.delete.delay.ms": "0"})
        fill(store, "t", 20, keys=20)
        partition = store.topic("t").partition(0)
        sealed_end = partition.manifest.sealed_end_offset
        assert 0 < sealed_end < 20
        assert partition.delete_records(sealed_end - 2) == sealed_end - 2
        assert [r.offset for r in read_all(partition)] == list(range(sealed_end - 2, 20))
        assert partition.manifest.segments[0].last_offset >= sealed_end - 2
        # Into the log segments: the records stay in their files, hidden from reads.
        assert partition.delete_records(sealed_end + 1) == sealed_end + 1
        assert [r.offset for r in read_all(partition)] == list(range(sealed_end + 1, 20))
        assert partition.read(0, 5)[0].offset == sealed_end + 1
        fill(store, "t", 10, keys=10)
        partition.roll()
        partition.sweep()
        assert [r.offset for r in read_all(partition)] == list(range(sealed_end + 1, 30))
        with pytest.raises(OffsetOutOfRangeError):
            partition.delete_records(31)
        assert partition.delete_records(30) == 30
        assert read_all(partition) == []
        partition.sweep()  # retired by the commit; file.delete.delay.ms is 0 here
        # Segments wholly below the start are gone from the manifest and the disk.
        assert not partition.manifest.segments
        assert not list(partition.segment_dir.glob("*.parquet"))
    with LogStore.open(data, clock=clock) as store:
        partition = store.topic("t").partition(0)
        assert partition.log_start_offset == 30
        store.append("t", [ProducerRecord(b"k", b"after")])
        assert [r.offset for r in read_all(partition)] == [30]


def test_delete_records_on_a_compacted_topic_hides_the_ledger_below_it(
    tmp_path: Path, clock: FakeClock
) -> None:
    data = tmp_path / "data"
    with LogStore.open(data, clock=clock) as store:
        store.create_topic("c", 1, COMPACTED)
        fill(store, "c", 30, keys=6)
        partition = store.topic("c").partition(0)
        partition.roll()
        compact(store, "c", clock)
        view = read_all(partition, compacted=True)
        assert [r.key for r in view] == [b"k%d" % (i % 6) for i in range(24, 30)]
        cut = view[3].offset
        partition.delete_records(cut)
        after = read_all(partition, compacted=True)
        assert after == view[3:]
        assert partition.compacted.read(0, 10, 1 << 20)[0].offset == cut
        # The next compaction drops the ledger's records below the cut for good (new
        # keys, so that the old records would otherwise survive).
        store.append("c", [ProducerRecord(b"new%d" % i, b"v") for i in range(6)])
        partition.roll()
        report = compact(store, "c", clock)
        assert all(info.base_offset >= cut for info in partition.manifest.ledger)
        assert report.total("expired_removed") == 3
        assert [r.offset for r in read_all(partition, compacted=True)][:3] == \
            [r.offset for r in view[3:]]
    with LogStore.open(data, read_only=True, clock=clock) as store:
        partition = store.topic("c").partition(0)
        assert min(r.offset for r in read_all(partition, compacted=True)) >= cut


@pytest.mark.parametrize("strategy", ["first", "order:timestamp"])
@pytest.mark.parametrize("cut_into", ["ledger", "dirty"])
def test_a_key_whose_survivor_was_deleted_keeps_its_later_record(
    store: LogStore, clock: FakeClock, engine: Engine, strategy: str, cut_into: str
) -> None:
    """Issue 21, item 8: phase 1 chose the ledger record DeleteRecords deleted as its
    key's survivor (the first one; the one with the greatest timestamp), phase 2 dropped
    it, and the key vanished although a later record of it is live. Phase 1 sees only
    records in the view, so the key keeps its best live record, as a full compaction of
    the records from the cut on keeps it. `cut_into`: the cut lies in the ledger (below
    the horizon) or in the dirty segments (above it, so every ledger record goes)."""
    store.create_topic("c", 1, {**COMPACTED, **engine.config, "compaction.strategy": strategy})
    partition = store.topic("c").partition(0)
    compactor = engine.service(store, "c")
    late = clock.ms + 60_000  # the first records carry the greater timestamp

    def append(key: bytes, value: bytes, timestamp: int) -> None:
        store.append("c", [ProducerRecord(key, value, (), timestamp)])

    for key in (b"k0", b"k1", b"k2"):
        append(key, b"old", late)
    partition.roll()
    compactor.compact()
    assert [r.offset for r in read_all(partition, compacted=True)] == [0, 1, 2]
    if cut_into == "ledger":
        partition.delete_records(2)  # k0@0 and k1@1: k2@2 stays
    append(b"k4", b"cut", clock.ms)
    for key in (b"k0", b"k1", b"k3"):
        append(key, b"new", clock.ms)
    partition.roll()
    if cut_into == "dirty":
        partition.delete_records(4)  # the whole ledger and k4@3
    compactor.compact()
    view = [(r.offset, r.key, r.value) for r in read_all(partition, compacted=True)]
    below = [(2, b"k2", b"old"), (3, b"k4", b"cut")] if cut_into == "ledger" else []
    assert view == [*below, (4, b"k0", b"new"), (5, b"k1", b"new"), (6, b"k3", b"new")]


def test_the_sql_engine_finds_each_partitions_cut_from_file_paths(
    store: LogStore, clock: FakeClock, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past UNION_LIMIT partitions the SQL engine scans all files at once and takes each
    row's partition from its file's path: each partition's own cut applies (item 8)."""
    from compactlog.compaction import spark_pipeline
    from compactlog.compaction.spark_service import SparkCompactionService

    monkeypatch.setattr(spark_pipeline, "UNION_LIMIT", 0)
    store.create_topic("c", 2, {**COMPACTED, "compaction.strategy": "first",
                                "compaction.phase1.engine": "sql"})
    compactor = SparkCompactionService(store, "c", {"spark.session": spark, "clock": clock})
    for index in (0, 1):
        store.append("c", [ProducerRecord(b"k", b"old%d" % index)], partition=index)
        store.topic("c").partition(index).roll()
    compactor.compact()
    for index in (0, 1):
        store.append("c", [ProducerRecord(b"k", b"new%d" % index)], partition=index)
        store.topic("c").partition(index).roll()
    store.topic("c").partition(1).delete_records(1)  # k@0 of partition 1 only
    compactor.compact()
    views = [[r.value for r in read_all(p, compacted=True)] for p in store.topic("c").partitions]
    assert views == [[b"old0"], [b"new1"]]
