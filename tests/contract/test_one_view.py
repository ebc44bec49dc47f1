"""One compacted view (DESIGN.md, contract items 2, 10 and 14): every read path leaves out
what DeleteRecords deleted, ledger records past retention.ms on a `compact,delete`
topic, and tombstones past delete.retention.ms, at read time, before any compaction
makes it final; and a DeleteRecords below the horizon schedules the run that does.

The paths (tests/support/read_paths.py): the Reader, Kafka Fetch's bytes, `tables.view_dataset`
through DuckDB and through Polars, `spark.read.format("compactlog")` and `read_topic`.
The Spark source plans at the current time, so these topics are built against the real
clock: old records carry timestamps two hours back, and the tombstones were kept by a
compaction whose clock ran two hours back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from compactlog.compaction.plan import plan_partition
from compactlog.compaction.scheduler import CompactionScheduler, SchedulerPolicy
from compactlog.server.cleaner import partition_load
from compactlog.storage.deletion import read_deletion_vector
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from local_engine import LocalCompactionService
from support.fakes import FakeClock
from support.read_paths import (
    Row,
    duckdb_rows,
    fetch_rows,
    polars_rows,
    read_topic_rows,
    reader_rows,
    spark_rows,
)

HOUR_MS = 3_600_000
PARTITIONS = 2
BASE = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0", "segment.bytes": str(1 << 20),
        "compaction.deletion.vectors": "true",
        "compaction.ledger.rewrite.live.fraction": "0"}
ADOPTED = "-adopted"
ADOPT = {"compaction.segment.adopt.min.bytes": "0", "compaction.segment.adopt.live.fraction": "0"}
PATHS = ["reader", "fetch", "duckdb", "polars", "spark", "read_topic"]


def compact(store: LogStore, topic: str, clock: Callable[[], float] = time.time) -> None:
    LocalCompactionService(store, topic, {"clock": clock, "engine": "arrow"}).compact()


def roll_all(store: LogStore, topic: str) -> None:
    for partition in store.topic(topic).partitions:
        partition.roll()


def append_each(store: LogStore, topic: str, records: list[ProducerRecord]) -> None:
    """The same records (keys told apart by partition) into every partition."""
    for index in range(len(store.topic(topic).partitions)):
        store.append(topic, [ProducerRecord(b"p%d-" % index + (r.key or b""), r.value,
                                            r.headers, r.timestamp) for r in records],
                     partition=index)


def raw_records(store: LogStore, topic: str) -> dict[int, list[Record]]:
    found: dict[int, list[Record]] = {}
    for partition in store.topic(topic).partitions:
        found[partition.index] = records = []
        while chunk := partition.read(len(records) and records[-1].offset + 1, 1000):
            records += chunk
    return found


def fold(raw: dict[int, list[Record]], horizons: dict[int, int | None]) -> list[Row]:
    """The compacted view by its definition: per partition, each key's latest record up
    to the horizon, in offset order, then every record after it."""
    rows: list[Row] = []
    for index, records in raw.items():
        horizon = horizons[index]
        latest: dict[bytes | None, Record] = {}
        for record in records:
            if horizon is not None and record.offset <= horizon:
                latest[record.key] = record
        kept = sorted(latest.values(), key=lambda r: r.offset)
        kept += [r for r in records if horizon is None or r.offset > horizon]
        rows += [(index, r.offset, r.key, r.value) for r in kept]
    return rows


def horizons_of(store: LogStore, topic: str) -> dict[int, int | None]:
    return {p.index: p.manifest.horizon for p in store.topic(topic).partitions}


@pytest.fixture(scope="module")
def topics(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[Row]]]:
    """Three topics and the same three with adoption, all sealed (so the table paths,
    which read the sealed part, hold the whole view), and the rows each view must hold."""
    path = tmp_path_factory.mktemp("one-view") / "data"
    now_ms = int(time.time() * 1000)
    expected: dict[str, list[Row]] = {}
    with LogStore.open(path) as store:
        # Each topic twice: the second time its dirty segments are adopted into the
        # ledger as they are (compaction/adoption.py: files without tombstone_since_ms).
        for suffix, base in (("", BASE), (ADOPTED, {**BASE, **ADOPT})):
            # erased: DeleteRecords below the horizon, after two compactions (the first
            # ledger file has a deletion vector), and no new data since.
            erased = "erased" + suffix
            store.create_topic(erased, PARTITIONS, base)
            append_each(store, erased, [ProducerRecord(b"k%d" % (i % 8),
                                                       None if i % 9 == 4 else b"v%d" % i)
                                        for i in range(48)])
            roll_all(store, erased)
            compact(store, erased)
            append_each(store, erased, [ProducerRecord(b"k%d" % (i % 3), b"w%d" % i)
                                        for i in range(6)])
            roll_all(store, erased)
            compact(store, erased)
            raw = raw_records(store, erased)
            view = fold(raw, horizons_of(store, erased))
            cuts = {}
            for partition in store.topic(erased).partitions:
                assert any(info.dv_file for info in partition.manifest.ledger)
                ledger = [row for row in view if row[0] == partition.index
                          and row[1] <= (partition.manifest.horizon or -1)]
                cuts[partition.index] = ledger[len(ledger) // 2][1]
                partition.delete_records(cuts[partition.index])
            expected[erased] = [row for row in view if row[1] >= cuts[row[0]]]
            assert expected[erased] != view

            # aged: compacted under `compact`, then switched to `compact,delete` with
            # retention.ms of an hour: the ledger's records two hours old leave the view.
            aged = "aged" + suffix
            store.create_topic(aged, PARTITIONS, base)
            append_each(store, aged, [ProducerRecord(b"k%d" % (i % 10), b"old%d" % i, (),
                                                     now_ms - 2 * HOUR_MS) for i in range(20)])
            append_each(store, aged, [ProducerRecord(b"k%d" % (5 + i % 10), b"new%d" % i, (),
                                                     now_ms) for i in range(20)])
            roll_all(store, aged)
            compact(store, aged)
            store.alter_topic(aged, {"cleanup.policy": "compact,delete",
                                     "retention.ms": str(HOUR_MS)})
            view = fold(raw_records(store, aged), horizons_of(store, aged))
            expected[aged] = [row for row in view if not row[3].startswith(b"old")]
            assert expected[aged] != view

            # tombstones: kept by a compaction two hours ago, with delete.retention.ms an
            # hour: the contract says the key does not appear at all any more.
            tombstones = "tombstones" + suffix
            store.create_topic(tombstones, PARTITIONS, {**base,
                                                        "delete.retention.ms": str(HOUR_MS)})
            append_each(store, tombstones, [
                ProducerRecord(b"k%d" % (i % 12), None if i >= 30 and i % 2 else b"v%d" % i)
                for i in range(36)])
            roll_all(store, tombstones)
            compact(store, tombstones, lambda: time.time() - 2 * HOUR_MS / 1000)
            view = fold(raw_records(store, tombstones), horizons_of(store, tombstones))
            expected[tombstones] = [row for row in view if row[3] is not None]
            assert expected[tombstones] != view
            if suffix:
                for name in (erased, aged, tombstones):
                    for partition in store.topic(name).partitions:
                        assert any(info.adopted_at_ms for info in partition.manifest.ledger)
    return path, expected


def rows_of(path_name: str, data: Path, topic: str, spark: SparkSession | None) -> list[Row]:
    if path_name in ("reader", "fetch"):
        with LogStore.open(data, read_only=True) as store:
            read = reader_rows if path_name == "reader" else fetch_rows
            return read(store, topic)
    if path_name == "duckdb":
        return duckdb_rows(data, topic)
    if path_name == "polars":
        return polars_rows(data, topic)
    assert spark is not None
    if path_name == "spark":
        return spark_rows(spark, data, topic)
    return read_topic_rows(spark, data, topic)


@pytest.fixture
def session_if_needed(request: pytest.FixtureRequest) -> SparkSession | None:
    path_name = request.node.callspec.params["path_name"]
    if path_name in ("spark", "read_topic"):
        spark: SparkSession = request.getfixturevalue("spark")
        return spark
    return None


@pytest.mark.parametrize("topic", ["erased", "aged", "tombstones", "erased" + ADOPTED,
                                   "aged" + ADOPTED, "tombstones" + ADOPTED])
@pytest.mark.parametrize("path_name", PATHS)
def test_every_read_path_serves_the_one_compacted_view(
    topics: tuple[Path, dict[str, list[Row]]], topic: str, path_name: str,
    session_if_needed: SparkSession | None,
) -> None:
    data, expected = topics
    got = sorted(rows_of(path_name, data, topic, session_if_needed))
    assert got == sorted(expected[topic])


# -- DeleteRecords below the horizon schedules the run that makes it final -------------------


def live_ledger_offsets(partition: Partition) -> list[int]:
    """The offsets the ledger files hold, minus their deletion vectors', read from the
    files themselves (not through any read path)."""
    offsets: list[int] = []
    for info in partition.manifest.ledger:
        column = pq.read_table(partition.ledger_dir / info.file, columns=["offset"])["offset"]
        found = column.to_numpy()
        if info.dv_file:
            gone = read_deletion_vector(partition.ledger_dir / info.dv_file)
            found = found[~np.isin(found, gone)]
        offsets += found.tolist()
    return offsets


@pytest.mark.parametrize("deletion_vectors", [True, False])
def test_delete_records_below_the_horizon_schedules_the_run_that_makes_it_final(
    tmp_path: Path, clock: FakeClock, deletion_vectors: bool,
) -> None:
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        store.create_topic("t", 1, {**BASE,
                                    "compaction.deletion.vectors": str(deletion_vectors).lower()})
        store.append("t", [ProducerRecord(b"k%d" % i, b"v%d" % i) for i in range(20)])
        roll_all(store, "t")
        compact(store, "t", clock)
        partition = store.topic("t").partition(0)
        assert live_ledger_offsets(partition) == list(range(20))
        partition.delete_records(12)

        def plan_now() -> bool:
            return plan_partition("t", 0, partition.directory, partition.manifest,
                                  partition.manifest_version, partition.config,
                                  clock.ms).has_work

        assert plan_now(), "no new sealed data, but the ledger still holds deleted records"
        scheduler = CompactionScheduler(SchedulerPolicy(), clock)
        load = partition_load("t", partition, clock.ms)
        assert scheduler.reasons(load, clock.ms) == ["delete_records"]
        (job,) = scheduler.pick([load])
        assert job.partitions == [0]
        scheduler.finished(job, 0)

        compact(store, "t", clock)
        assert live_ledger_offsets(partition) == list(range(12, 20))
        assert not plan_now(), "the deletion is final: nothing more to do"
        load = partition_load("t", partition, clock.ms)
        assert scheduler.reasons(load, clock.ms) == []
        assert [r.offset for r in partition.read_compacted(0, 100)] == list(range(12, 20))
