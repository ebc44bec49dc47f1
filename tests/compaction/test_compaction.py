"""Scenario tests of compaction and the compacted view, on real Spark and real files.

Most scenarios run on both services: the Spark one (the default) and the plain-Python
one in local_engine.py, loaded by import path as a user's own service would be.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from compactlog.client.reader import Reader
from compactlog.client.table_view import TableView
from compactlog.compaction import TopicCompactionService, load_factory
from compactlog.compaction.spark_service import SparkCompactionService
from compactlog.compaction.status import (
    CompactionRunningError,
    compaction_lock,
    read_status,
)
from compactlog.errors import CorruptionError, UserError
from compactlog.storage.partition import Partition
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.engines import Engine
from support.fakes import FakeClock

DAY_MS = 24 * 3600 * 1000


COMPACT = {"cleanup.policy": "compact", "segment.bytes": "2048", "min.compaction.lag.ms": "0"}

Compactor = Callable[[LogStore, str], TopicCompactionService]


@pytest.fixture(params=["spark", "local"])
def service(request: pytest.FixtureRequest, clock: FakeClock) -> Compactor:
    if request.param == "spark":
        spark: SparkSession = request.getfixturevalue("spark")
        return lambda store, topic: SparkCompactionService(
            store, topic, {"spark.session": spark, "clock": clock}
        )
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    return lambda store, topic: factory.new_service(store, topic, {"clock": clock})


def produce(store: LogStore, topic: str, pairs: list[tuple[bytes | None, bytes | None]],
            clock: FakeClock, headers: Any = ()) -> list[int]:
    offsets = []
    for key, value in pairs:
        (result,) = store.append(topic, [ProducerRecord(key, value, headers, clock.ms)],
                                 partition=0)
        offsets.append(result.base_offset)
    return offsets


def seal_all(store: LogStore, topic: str) -> None:
    for partition in store.topic(topic).partitions:
        partition.roll()


def compacted(partition: Partition, offset: int = 0) -> list[Record]:
    records: list[Record] = []
    while batch := partition.read_compacted(offset, 100):
        records += batch
        offset = batch[-1].offset + 1
    return records


def raw(partition: Partition) -> list[Record]:
    records: list[Record] = []
    offset = 0
    while batch := partition.read(offset, 100):
        records += batch
        offset = batch[-1].offset + 1
    return records


def latest_per_key(records: list[Record]) -> dict[bytes, Record]:
    latest: dict[bytes, Record] = {}
    for record in records:
        assert record.key is not None
        latest[record.key] = record
    return latest


# -- the basic contract ----------------------------------------------------------------


def test_overwritten_keys_keep_one_record_each_at_its_offset(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config=COMPACT)
    produce(store, "t", [(b"k%d" % (i % 7), b"v%d" % i) for i in range(100)], clock)
    seal_all(store, "t")
    partition = store.topic("t").partitions[0]
    everything = raw(partition)

    report = service(store, "t").compact()

    view = compacted(partition)
    expected = sorted(latest_per_key(everything).values(), key=lambda r: r.offset)
    assert view == expected
    assert [r.value for r in view] == [b"v%d" % i for i in range(93, 100)]
    (summary,) = report.partitions
    assert (summary.records_in, summary.records_out, summary.keys) == (100, 7, 7)
    assert summary.horizon == 99 and summary.old_horizon is None
    assert raw(partition) == everything  # the raw log is never rewritten
    assert read_status(partition.directory).state == "SUCCESS"


def test_a_tombstone_deletes_its_key_after_delete_retention(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config={**COMPACT, "delete.retention.ms": str(DAY_MS)})
    produce(store, "t", [(b"a", b"1"), (b"b", b"1"), (b"a", None), (b"c", b"1")], clock)
    seal_all(store, "t")
    partition = store.topic("t").partitions[0]
    compactor = service(store, "t")

    report = compactor.compact()
    assert [(r.key, r.value) for r in compacted(partition)] == [
        (b"b", b"1"), (b"a", None), (b"c", b"1"),
    ]
    assert report.partitions[0].tombstones_kept == 1

    clock.advance(DAY_MS / 1000 - 1)  # not yet: the tombstone stays
    compactor.compact()
    assert [r.key for r in compacted(partition)] == [b"b", b"a", b"c"]

    clock.advance(1)  # delete.retention.ms has passed since the run that first kept it
    report = compactor.compact()  # no new data: the expiring tombstone alone is work
    assert [(r.key, r.value) for r in compacted(partition)] == [(b"b", b"1"), (b"c", b"1")]
    assert report.partitions[0].tombstones_removed == 1


def test_zero_delete_retention_drops_tombstones_at_once_as_pulsar(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config={**COMPACT, "delete.retention.ms": "0"})
    produce(store, "t", [(b"a", b"1"), (b"b", b"1"), (b"a", None)], clock)
    seal_all(store, "t")
    service(store, "t").compact()
    assert [r.key for r in compacted(store.topic("t").partitions[0])] == [b"b"]


def test_null_and_empty_tombstones_compact_when_empty_values_are_tombstones(
    store: LogStore, clock: FakeClock, engine: Engine
) -> None:
    """Issue 21, item 6: with empty.value.is.tombstone a null value's tombstone mask was
    null (Kleene logic), and every run of a partition holding one failed."""
    store.create_topic("t", config={**COMPACT, **engine.config, "delete.retention.ms":
                                    str(DAY_MS), "empty.value.is.tombstone": "true"})
    partition = store.topic("t").partitions[0]
    compactor = engine.service(store, "t")
    produce(store, "t", [(b"a", b"1"), (b"b", b"1"), (b"a", None), (b"b", b""),
                         (b"c", b"1"), (b"d", b"")], clock)
    seal_all(store, "t")
    report = compactor.compact()
    assert [(r.offset, r.value) for r in compacted(partition)] == [
        (2, None), (3, b""), (4, b"1"), (5, b"")]
    assert report.partitions[0].tombstones_kept == 3
    clock.advance(60)
    produce(store, "t", [(b"c", None), (b"e", b"1")], clock)
    seal_all(store, "t")
    compactor.compact()  # over a ledger that holds both kinds of tombstone
    assert [(r.offset, r.value) for r in compacted(partition)] == [
        (2, None), (3, b""), (5, b""), (6, None), (7, b"1")]
    clock.advance(DAY_MS / 1000)  # every tombstone's retention has passed
    compactor.compact()
    assert [(r.key, r.value) for r in compacted(partition)] == [(b"e", b"1")]


def test_compacting_an_empty_topic_changes_nothing(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", partitions=2, config=COMPACT)
    before = [p.manifest for p in store.topic("t").partitions]
    report = service(store, "t").compact()
    assert [p.manifest for p in store.topic("t").partitions] == before
    assert all(s.skipped for s in report.partitions)
    assert all(p.read_compacted(0) == [] for p in store.topic("t").partitions)


def test_second_compaction_reads_the_ledger_and_only_new_segments(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config=COMPACT)
    produce(store, "t", [(b"k%d" % (i % 5), b"v%d" % i) for i in range(60)], clock)
    seal_all(store, "t")
    partition = store.topic("t").partitions[0]
    compactor = service(store, "t")
    first = compactor.compact().partitions[0]
    ledger_records = first.records_out
    segments_before = len(partition.manifest.segments)

    produce(store, "t", [(b"k%d" % (i % 3), b"w%d" % i) for i in range(30)], clock)
    seal_all(store, "t")
    new_segments = partition.manifest.segments[segments_before:]
    second = compactor.compact().partitions[0]

    assert second.old_horizon == first.horizon
    assert second.dirty_segments == len(new_segments)
    assert second.records_in == ledger_records + sum(s.record_count for s in new_segments)
    assert second.horizon == partition.log_end_offset - 1
    expected = sorted(latest_per_key(raw(partition)).values(), key=lambda r: r.offset)
    assert compacted(partition) == expected


def key_chunk(path: Path) -> Any:
    """The metadata of the key column's chunk in the first row group of `path`."""
    import pyarrow.parquet as pq

    group = pq.ParquetFile(path).metadata.row_group(0)
    names = [group.column(i).path_in_schema for i in range(group.num_columns)]
    return group.column(names.index("key"))


def test_ledger_files_write_keys_plain_and_segments_with_a_dictionary(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    """A ledger file's keys are distinct, so its key column is written without a
    dictionary (sealed.open_writer's key_dictionary); a segment whose keys repeat (50
    keys in 400 records) keeps its dictionary (sealed.keys_repeat). Both read back the
    same keys through pyarrow, DuckDB and Polars."""
    import duckdb
    import polars as pl
    import pyarrow.parquet as pq

    store.create_topic("t", config={**COMPACT, "segment.bytes": "1000000"})
    produce(store, "t", [(b"k%d" % (i % 50), b"v%d" % i) for i in range(400)], clock)
    seal_all(store, "t")
    partition = store.topic("t").partitions[0]
    service(store, "t").compact()
    (ledger,) = partition.manifest.ledger
    (segment,) = partition.manifest.segments

    ledger_path = partition.ledger_dir / ledger.file
    assert not key_chunk(ledger_path).has_dictionary_page
    assert key_chunk(partition.segment_dir / segment.file).has_dictionary_page
    expected = sorted(b"k%d" % k for k in range(50))
    assert sorted(pq.read_table(ledger_path).column("key").to_pylist()) == expected
    rows = duckdb.sql(f"SELECT key FROM read_parquet('{ledger_path}') ORDER BY key")
    assert [row[0] for row in rows.fetchall()] == expected
    assert sorted(pl.read_parquet(ledger_path)["key"].to_list()) == expected


def test_a_segment_of_distinct_keys_is_sealed_with_plain_keys(
    store: LogStore, clock: FakeClock
) -> None:
    """The first row group's keys choose a sealed segment's key encoding: distinct keys
    get plain pages (sealed.keys_repeat), and read back the same."""
    import pyarrow.parquet as pq

    store.create_topic("t", config={**COMPACT, "segment.bytes": "1000000"})
    offsets = produce(store, "t", [(b"k%d" % i, b"v%d" % i) for i in range(300)], clock)
    seal_all(store, "t")
    partition = store.topic("t").partitions[0]
    (segment,) = partition.manifest.segments
    path = partition.segment_dir / segment.file
    assert not key_chunk(path).has_dictionary_page
    assert pq.read_table(path).column("key").to_pylist() == [b"k%d" % i for i in range(300)]
    assert [record.offset for record in raw(partition)] == offsets


def test_active_segment_and_young_segments_are_never_compacted(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config={**COMPACT, "min.compaction.lag.ms": "60000"})
    produce(store, "t", [(b"k", b"old%d" % i) for i in range(20)], clock)
    seal_all(store, "t")
    clock.advance(61)
    produce(store, "t", [(b"k", b"young%d" % i) for i in range(20)], clock)
    seal_all(store, "t")
    produce(store, "t", [(b"k", b"active")], clock)  # stays in the active segment
    partition = store.topic("t").partitions[0]
    compactor = service(store, "t")

    report = compactor.compact().partitions[0]
    assert report.horizon == 19  # the old segments only
    view = compacted(partition)
    assert [r.value for r in view] == [b"old19"] + [b"young%d" % i for i in range(20)] + [
        b"active"
    ]
    clock.advance(61)
    assert compactor.compact().partitions[0].horizon == 39
    assert [r.value for r in compacted(partition)] == [b"young19", b"active"]


def test_seek_inside_the_compacted_range(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config={**COMPACT, "parquet.row.group.bytes": str(64 * 1024)})
    produce(store, "t", [(b"k%03d" % (i % 150), b"x" * 500 + b"%d" % i) for i in range(600)],
            clock)
    seal_all(store, "t")
    produce(store, "t", [(b"tail%d" % i, b"t") for i in range(5)], clock)
    partition = store.topic("t").partitions[0]
    service(store, "t").compact()
    view = compacted(partition)
    assert len(view) == 155
    for offset in (0, 449, 450, 451, 500, 599, 600, 603, 605):
        assert compacted(partition, offset) == [r for r in view if r.offset >= offset], offset
    reader = Reader(store, "t", 0, 500, read_compacted=True)
    assert reader.poll(3) == [r for r in view if r.offset >= 500][:3]
    reader.seek_to_timestamp(0)
    assert reader.position == view[0].offset


def test_raw_reader_still_sees_every_record(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config=COMPACT)
    produce(store, "t", [(b"k%d" % (i % 3), b"v%d" % i) for i in range(50)], clock)
    seal_all(store, "t")
    partition = store.topic("t").partitions[0]
    before = raw(partition)
    service(store, "t").compact()
    reader = Reader(store, "t", 0)
    seen: list[Record] = []
    while batch := reader.poll(7):
        seen += batch
    assert seen == before and [r.offset for r in seen] == list(range(50))


def test_compaction_while_producing(store: LogStore, clock: FakeClock, service: Compactor) -> None:
    store.create_topic("t", partitions=2, config=COMPACT)
    produce(store, "t", [(b"k%d" % (i % 9), b"v%d" % i) for i in range(200)], clock)
    seal_all(store, "t")
    stop = threading.Event()
    errors: list[BaseException] = []

    def keep_producing() -> None:
        i = 0
        try:
            while not stop.is_set():
                store.append("t", [ProducerRecord(b"k%d" % (i % 9), b"live%d" % i)])
                i += 1
        except BaseException as error:  # surfaced below
            errors.append(error)

    producer = threading.Thread(target=keep_producing)
    producer.start()
    try:
        service(store, "t").compact()
    finally:
        stop.set()
        producer.join()
    assert not errors
    for partition in store.topic("t").partitions:
        everything = raw(partition)
        assert [r.offset for r in everything] == list(range(len(everything)))
        assert latest_per_key(compacted(partition)) == latest_per_key(everything)


# -- strategies ---------------------------------------------------------------------------


def _values_after(store: LogStore, clock: FakeClock, service: Compactor, strategy: str,
                  records: list[tuple[bytes, bytes | None, tuple[tuple[str, bytes], ...]]]
                  ) -> dict[bytes, bytes | None]:
    store.create_topic("s", config={**COMPACT, "compaction.strategy": strategy,
                                    "delete.retention.ms": str(DAY_MS)})
    for key, value, headers in records:
        produce(store, "s", [(key, value)], clock, headers)
        clock.advance(0.001)
    seal_all(store, "s")
    service(store, "s").compact()
    return {r.key: r.value for r in compacted(store.topic("s").partitions[0]) if r.key}


def test_first_wins_strategy(store: LogStore, clock: FakeClock, service: Compactor) -> None:
    got = _values_after(store, clock, service, "first", [
        (b"a", b"1", ()), (b"a", b"2", ()), (b"b", b"1", ()), (b"b", None, ()),
        (b"c", b"1", ()), (b"c", None, ()), (b"c", b"3", ()), (b"c", b"4", ()),
    ])
    # A tombstone deletes; the first record after it wins again.
    assert got == {b"a": b"1", b"b": None, b"c": b"3"}


def test_ordering_by_a_numeric_header(store: LogStore, clock: FakeClock,
                                      service: Compactor) -> None:
    def v(n: bytes) -> tuple[tuple[str, bytes], ...]:
        return (("version", n),)

    got = _values_after(store, clock, service, "order:header:version:long", [
        (b"a", b"v9", v(b"9")), (b"a", b"v10", v(b"10")), (b"a", b"v2", v(b"2")),
        (b"b", b"x", v(b"5")), (b"b", b"y", v(b"5")),  # tie: the later offset wins
        (b"c", b"no-header", ()), (b"c", b"junk", v(b"abc")), (b"c", b"v1", v(b"1")),
    ])
    assert got == {b"a": b"v10", b"b": b"y", b"c": b"v1"}


def test_ordering_by_timestamp(store: LogStore, clock: FakeClock, service: Compactor) -> None:
    store.create_topic("s", config={**COMPACT, "compaction.strategy": "order:timestamp"})
    for value, ts in ((b"new", 3000), (b"old", 1000), (b"mid", 2000)):
        store.append("s", [ProducerRecord(b"k", value, (), clock.ms - 10_000 + ts)], partition=0)
    seal_all(store, "s")
    service(store, "s").compact()
    assert [r.value for r in compacted(store.topic("s").partitions[0])] == [b"new"]


def test_user_function_strategy(store: LogStore, clock: FakeClock, service: Compactor) -> None:
    got = _values_after(store, clock, service, "function:user_strategies:keep_larger_value", [
        (b"a", b"3", ()), (b"a", b"9", ()), (b"a", b"5", ()),
        (b"b", b"7", ()), (b"b", None, ()), (b"b", b"1", ()),
    ])
    assert got == {b"a": b"9", b"b": b"1"}


@pytest.mark.parametrize("policy", ["drop", "keep"])
def test_null_key_policy(store: LogStore, clock: FakeClock, service: Compactor,
                         policy: str) -> None:
    store.create_topic("t", config={**COMPACT, "null.key.policy": policy})
    produce(store, "t", [(b"a", b"1"), (None, b"orphan"), (b"a", b"2")], clock)
    seal_all(store, "t")
    report = service(store, "t").compact().partitions[0]
    view = [(r.key, r.value) for r in compacted(store.topic("t").partitions[0])]
    if policy == "keep":
        assert view == [(None, b"orphan"), (b"a", b"2")]
    else:
        assert view == [(b"a", b"2")] and report.null_keys_removed == 1


def test_compact_delete_drops_old_records_from_the_view(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config={**COMPACT, "cleanup.policy": "compact,delete",
                                    "retention.ms": "60000"})
    produce(store, "t", [(b"old", b"1")], clock)
    clock.advance(120)
    produce(store, "t", [(b"new", b"1")], clock)
    seal_all(store, "t")
    service(store, "t").compact()
    assert [r.key for r in compacted(store.topic("t").partitions[0])] == [b"new"]


# -- the view's edges, table views, status and failures ------------------------------------


def test_last_message_when_the_tail_is_all_tombstones(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config={**COMPACT, "delete.retention.ms": "0"})
    produce(store, "t", [(b"a", b"1"), (b"b", b"1"), (b"b", None), (b"c", b"1"),
                         (b"c", None)], clock)
    seal_all(store, "t")
    compactor = service(store, "t")
    compactor.compact()
    reader = Reader(store, "t", 0, read_compacted=True)
    last = reader.last_message()
    assert last is not None and (last.offset, last.key) == (0, b"a")
    assert compactor.read_last_compacted_entry(0) == last
    assert compactor.get_last_compacted_position(0) == 4
    assert compactor.read_compacted_entries(0, 0, 10) == [last]
    assert Reader(store, "t", 0).last_message().offset == 4  # type: ignore[union-attr]
    produce(store, "t", [(b"d", b"1")], clock)
    assert reader.last_message().key == b"d"  # type: ignore[union-attr]


def test_table_view_from_the_compacted_view_and_from_the_raw_log(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", partitions=3, config=COMPACT)
    for i in range(300):
        store.append("t", [ProducerRecord(b"k%d" % (i % 40), b"v%d" % i, (), clock.ms)])
    store.append("t", [ProducerRecord(b"k7", None, (), clock.ms)])
    seal_all(store, "t")
    service(store, "t").compact()
    from_raw = TableView(store, "t", read_compacted=False)
    from_view = TableView(store, "t")
    assert from_view.snapshot() == from_raw.snapshot()
    assert len(from_view) == 39 and b"k7" not in from_view
    assert from_view.records_read < from_raw.records_read

    changes: list[tuple[bytes, bytes | None]] = []
    from_view.add_listener(lambda key, value: changes.append((key, value)))
    store.append("t", [ProducerRecord(b"k1", b"changed"), ProducerRecord(b"k2", None)])
    from_view.catch_up()
    assert sorted(changes) == [(b"k1", b"changed"), (b"k2", None)]
    assert from_view[b"k1"] == b"changed" and b"k2" not in from_view


def test_a_failed_run_leaves_the_old_pair_and_says_error(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config=COMPACT)
    produce(store, "t", [(b"k%d" % (i % 4), b"v%d" % i) for i in range(40)], clock)
    seal_all(store, "t")
    partition = store.topic("t").partitions[0]
    compactor = service(store, "t")
    compactor.compact()
    good_view, good_manifest = compacted(partition), partition.manifest
    ledger_files = sorted(p.name for p in (partition.directory / "ledger").iterdir())

    produce(store, "t", [(b"k%d" % (i % 4), b"w%d" % i) for i in range(40)], clock)
    seal_all(store, "t")
    damaged = partition.segment_dir / partition.manifest.segments[-1].file
    damaged.write_bytes(b"PAR1" + b"\0" * 100)

    with pytest.raises(Exception):  # noqa: B017 - each engine reports it its own way
        compactor.compact()
    partition.refresh()
    assert partition.manifest.compaction == good_manifest.compaction
    assert sorted(p.name for p in (partition.directory / "ledger").iterdir()) == ledger_files
    assert partition.read_compacted(0, len(good_view)) == good_view
    status = read_status(partition.directory)
    assert status.state == "ERROR" and status.error and status.failures_in_a_row == 1
    with pytest.raises(CorruptionError):
        compacted(partition, good_view[-1].offset + 1)


def test_one_run_per_partition_at_a_time(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config=COMPACT)
    partition = store.topic("t").partitions[0]
    service = load_factory("local_engine:LocalCompactionServiceFactory").new_service(
        store, "t", {"clock": clock})
    with compaction_lock(partition.directory, partition.name):
        with pytest.raises(CompactionRunningError, match="already running"):
            service.compact()
        assert read_status(partition.directory).state == "NOT_RUN"


def test_compacting_a_delete_topic_is_refused(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("plain")
    service = load_factory("local_engine:LocalCompactionServiceFactory").new_service(
        store, "plain", {})
    with pytest.raises(UserError, match=r"cleanup\.policy=delete"):
        service.compact()


def test_bad_factory_paths_are_clear_errors() -> None:
    for path, message in (("nope", "MODULE:NAME"), ("no_such_module:X", "cannot load"),
                          ("local_engine:Missing", "cannot load"),
                          ("local_engine:LocalEngine", "no new_service")):
        with pytest.raises(UserError, match=message):
            load_factory(path)


def test_retention_removes_compacted_raw_segments_and_the_view_survives(
    store: LogStore, clock: FakeClock, service: Compactor
) -> None:
    store.create_topic("t", config={**COMPACT, "retention.bytes": "0"})
    produce(store, "t", [(b"k%d" % (i % 5), b"v%d" % i) for i in range(60)], clock)
    seal_all(store, "t")
    partition = store.topic("t").partitions[0]
    assert partition.apply_retention() == []  # nothing is compacted yet: nothing may go
    service(store, "t").compact()
    view = compacted(partition)
    assert partition.apply_retention()
    assert partition.manifest.segments == ()
    assert compacted(partition) == view and len(view) == 5
