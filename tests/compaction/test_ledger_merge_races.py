"""A compaction that merges small ledger files (compaction/incremental.py `small_runs`)
while other actors change the partition between its plan and its commit (runner.py,
step 5: what the commit lets others change, and what it checks).

The run rewrites three small ledger files with its new survivors and retires them in
its commit. Landed before that commit:
  - DeleteRecords inside the merged range: under `latest` the commit goes through (the
    merged file holds records below the cut, which every reader hides and the next run
    drops; 5e); under `first` it conflicts and nothing of the run stays;
  - another machine's compaction that merged the same files (S3): the commit
    conflicts (5a);
  - retention of segments below the old horizon: the commit goes through (5d).
After each, the compacted view is the model's (each key's latest record at or above the
log start), read by the Reader, by Kafka Fetch's bytes, by DuckDB and Polars over
`tables.view_dataset`, and, on a local disk, by the Spark source and by pyiceberg from
the Iceberg state table; on a local disk and on S3 (moto on loopback)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from compactlog.compaction.runner import run_compaction
from compactlog.errors import ConflictError
from compactlog.iceberg import state_table_location
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.engines import ArrowCommitHookEngine
from support.fakes import FakeClock
from support.iceberg_readers import pyiceberg_rows
from support.iceberg_support import expected_state
from support.read_paths import (
    clocked_spark_rows,
    duckdb_rows,
    fetch_rows,
    polars_rows,
    reader_rows,
)
from support.s3_support import open_local_or_s3

TOPIC = "t"
CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
          "delete.retention.ms": str(10**12), "compaction.deletion.vectors": "true",
          # only merging rewrites a file that keeps a live record
          "compaction.ledger.rewrite.live.fraction": "0",
          "compaction.ledger.merge.min.files": "3", "segment.bytes": str(1 << 20),
          "file.delete.delay.ms": "0", "iceberg.history.expire.max-snapshot-age-ms": "0"}
Produced = list[tuple[int, bytes, bytes | None]]  # (offset, key, value) in offset order


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path,
          monkeypatch: pytest.MonkeyPatch) -> Iterator[LogStore]:
    # Today's time, not FakeClock's default (a date ahead of the bucket's own clock):
    # a sweep compares its clock with the objects' Last-Modified times (sweep.py).
    opened = open_local_or_s3(request.param, request, tmp_path, monkeypatch,
                              FakeClock(time.time()), "merge-races")
    try:
        yield opened
    finally:
        opened.close()


def clock_of(store: LogStore) -> FakeClock:
    clock = store.clock  # type: ignore[attr-defined]
    assert isinstance(clock, FakeClock)
    return clock


def produce(store: LogStore, produced: Produced, records: list[ProducerRecord],
            twin: str | None = None) -> None:
    """Append `records` to the topic (and to `twin`, at the same offsets) and seal."""
    for topic in (TOPIC, twin) if twin else (TOPIC,):
        partition = store.topic(topic).partition(0)
        result = partition.append(records)
        partition.roll()
    produced += [(result.base_offset + i, r.key or b"", r.value) for i, r in enumerate(records)]
    clock_of(store).advance_ms(1000)


def run(store: LogStore, before_commit: Callable[[], object] = lambda: None,
        topic: str = TOPIC) -> None:
    run_compaction(store, topic, ArrowCommitHookEngine(before_commit), clock=clock_of(store))


def three_small_files(store: LogStore, strategy: str = "latest",
                      twin: str | None = None) -> tuple[Produced, set[str]]:
    """Three incremental runs, each leaving a small ledger file (new keys and updates of
    old ones), then a fourth batch whose run merges all three; the same on `twin`."""
    store.create_topic(TOPIC, 1, {**CONFIG, "compaction.strategy": strategy})
    produced: Produced = []
    for run_index in range(3):
        produce(store, produced, [
            ProducerRecord(b"r%d-%02d" % (run_index, i), b"v%d.%d" % (run_index, i))
            for i in range(12)] + [
            ProducerRecord(b"shared-%d" % (i % 4), None if i == 5 else b"s%d.%d" % (run_index, i))
            for i in range(6)], twin)
        run(store)
        if twin:
            run(store, topic=twin)
    small = {info.file for info in store.topic(TOPIC).partition(0).manifest.ledger}
    assert len(small) == 3, small
    produce(store, produced, [ProducerRecord(b"r0-%02d" % i, b"new-%d" % i) for i in range(4)]
            + [ProducerRecord(b"r3-%02d" % i, b"v3.%d" % i) for i in range(5)], twin)
    return produced, small


def model(produced: Produced, log_start: int) -> list[tuple[int, bytes, bytes | None]]:
    """The compacted view under `latest`: each key's last record at or above the log
    start (tombstones kept: delete.retention.ms has not passed)."""
    latest: dict[bytes, tuple[int, bytes, bytes | None]] = {}
    for offset, key, value in produced:
        if offset >= log_start:
            latest[key] = (offset, key, value)
    return sorted(latest.values())


def assert_every_path_serves(store: LogStore, expected: list[tuple[int, bytes, bytes | None]],
                             request: pytest.FixtureRequest) -> None:
    """The Reader, Kafka Fetch's bytes, DuckDB and Polars over `view_dataset`, and, on a
    local store, the Spark source (at the store's clock) and the Iceberg state table
    (pyiceberg) serve `expected`."""
    def rows(found: list[tuple[int, int, bytes | None, bytes | None]]
             ) -> list[tuple[int, bytes | None, bytes | None]]:
        return sorted((offset, key, value) for _, offset, key, value in found)

    assert rows(reader_rows(store, TOPIC)) == expected, "reader"
    assert rows(fetch_rows(store, TOPIC)) == expected, "fetch"
    assert rows(duckdb_rows(store.target, TOPIC)) == expected, "duckdb over view_dataset"
    assert rows(polars_rows(store.target, TOPIC)) == expected, "polars over view_dataset"
    if is_local(store):  # on S3: the state table in test_iceberg_state_s3, Spark's workers
        # in tests/spark (their credentials are the session's, not this bucket's)
        spark = request.getfixturevalue("spark")
        assert rows(clocked_spark_rows(spark, store.target, TOPIC, clock_of(store)())
                    ) == expected, "spark source"
        table = state_table_location(store, TOPIC)
        assert pyiceberg_rows(table) == expected_state(store, TOPIC), "Iceberg state table"


def is_local(store: LogStore) -> bool:
    return not store.location.is_s3


def test_delete_records_under_a_merge_lets_it_commit(store: LogStore,
                                                     request: pytest.FixtureRequest) -> None:
    """5e under `latest`: the cut lands inside the second small file; the merged file
    still holds records below it, hidden from every reader, and the next run deletes
    them with a DV."""
    produced, small = three_small_files(store)
    partition = store.topic(TOPIC).partition(0)
    cut = partition.manifest.ledger[1].base_offset + 3
    run(store, lambda: partition.delete_records(cut))
    after = {info.file for info in partition.manifest.ledger}
    assert not small & after, "the three small files were merged"
    assert partition.manifest.deleted_below == cut
    assert_every_path_serves(store, model(produced, cut), request)
    merged = partition.manifest.ledger[0]
    produce(store, produced, [ProducerRecord(b"r1-00", b"again")])
    run(store)
    # the merged file stays (rewrite fraction 0), and its DV now deletes what the cut hid
    kept = partition.manifest.ledger[0]
    assert kept.file == merged.file and kept.dv_count > merged.dv_count
    assert_every_path_serves(store, model(produced, cut), request)


def test_delete_records_under_a_merge_with_first_makes_it_conflict(
        store: LogStore, request: pytest.FixtureRequest) -> None:
    """5e under `first`: a survivor it chose may be below the new cut while a later
    record of its key was left out; the commit conflicts, the three small files stay
    listed, and the next run merges them over the cut. The view is then the one of the
    same steps in series (DeleteRecords, then the run) on a twin topic."""
    store.create_topic("twin", 1, {**CONFIG, "compaction.strategy": "first"})
    _, small = three_small_files(store, "first", twin="twin")
    partition = store.topic(TOPIC).partition(0)
    cut = partition.manifest.ledger[1].base_offset + 3
    with pytest.raises(ConflictError, match="DeleteRecords"):
        run(store, lambda: partition.delete_records(cut))
    assert {info.file for info in partition.manifest.ledger} == small
    if is_local(store):  # the run's own files went in its final sweep (runner step 6)
        on_disk = {path.name for path in partition.ledger_dir.iterdir()}
        listed = small | {info.dv_file for info in partition.manifest.ledger if info.dv_file}
        assert on_disk == listed
    run(store)
    assert not small & {info.file for info in partition.manifest.ledger}
    store.topic("twin").partition(0).delete_records(cut)
    run(store, topic="twin")
    view = [(r.offset, r.key, r.value) for r in read_all(partition)]
    assert view == [(r.offset, r.key, r.value)
                    for r in read_all(store.topic("twin").partition(0))]
    assert view and all(offset >= cut for offset, _, _ in view)
    assert len({key for _, key, _ in view}) == len(view), "each key once"


def read_all(partition: Partition) -> list[Record]:
    return list(partition.read_compacted(0, 10_000, 1 << 30))


def test_a_compaction_that_merged_first_makes_the_second_conflict(
        store: LogStore, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """5a, on S3 (on a local disk the compaction lock makes runs on a partition
    exclusive): two machines plan the same merge; the one that commits second finds the
    files it retires already retired, and conflicts. The view holds each key once. (The
    loser's uploads stay until they are orphans by age, 6 hours: storage/sweep.py.)"""
    if is_local(store):
        pytest.skip("two compactions of one partition need two machines: S3")
    produced, small = three_small_files(store)
    partition = store.topic(TOPIC).partition(0)

    def another_machine() -> None:
        with LogStore.open(store.target, read_only=True, local_dir=tmp_path / "b",
                           clock=clock_of(store)) as other:
            run(other)

    with pytest.raises(ConflictError):
        run(store, another_machine)
    partition.load_manifest()
    assert not small & {info.file for info in partition.manifest.ledger}
    assert_every_path_serves(store, model(produced, 0), request)


def test_retention_under_a_merge_lets_it_commit(store: LogStore,
                                                request: pytest.FixtureRequest) -> None:
    """5d: retention removes sealed segments at or below the old horizon (their records
    are in the ledger); the run's new segment is above it, so the merge commits."""
    produced, small = three_small_files(store)
    partition = store.topic(TOPIC).partition(0)
    old_horizon = partition.manifest.horizon

    def retention() -> None:
        store.alter_topic(TOPIC, {"retention.bytes": "1"})
        removed = partition.apply_retention()
        assert removed and all(info.last_offset <= old_horizon for info in removed)

    run(store, retention)
    assert not small & {info.file for info in partition.manifest.ledger}
    assert_every_path_serves(store, model(produced, 0), request)
