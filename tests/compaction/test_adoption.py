"""Adopting dirty sealed segments into the ledger as they are (compaction/adoption.py):
the adopted file is the segment's bytes (a hard link locally), its deletion vector
holds exactly the rows phase 2 would not have copied, its tombstones count their
retention from the run that adopted it, and it outlives the segment it came from.

The view after adoption is also checked against a model under random schedules
(tests/compaction/test_compaction_model.py, tests/support/compaction_model.py: `adopt`),
on S3 (tests/compaction/test_compaction_s3.py), by every read path
(tests/contract/test_one_view.py, the `-adopted` topics) and by the Iceberg state table
(tests/iceberg/test_iceberg_equivalence.py).
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from rich.console import Console

from compactlog.cli.compaction_report import summary_table
from compactlog.client.reader import Reader
from compactlog.compaction import load_factory
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.fakes import FakeClock

ADOPTING = "adopting"
COPYING = "copying"


def config(**extra: str) -> dict[str, str]:
    return {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
            "delete.retention.ms": str(10**12), "compaction.deletion.vectors": "true",
            "compaction.ledger.rewrite.live.fraction": "0.5",
            "compaction.segment.adopt.min.bytes": "0",
            # The rewrite fraction decides (the default 0.9 is tested on its own).
            "compaction.segment.adopt.live.fraction": "0", **extra}


def compact(store: LogStore, topic: str, clock: FakeClock) -> Any:
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    return factory.new_service(store, topic, {"clock": clock, "engine": "arrow"}).compact()


def view(store: LogStore, topic: str) -> list[Record]:
    reader = Reader(store, topic, 0, read_compacted=True)
    records: list[Record] = []
    while chunk := reader.poll(max_records=50):
        records += chunk
    return records


def render(table: Any) -> str:
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def append(store: LogStore, records: list[ProducerRecord]) -> None:
    """The same records into both topics, each batch sealed into a segment of its own."""
    for topic in (ADOPTING, COPYING):
        store.append(topic, records)
        store.topic(topic).partition(0).roll()


def both(store: LogStore, clock: FakeClock, **extra: str) -> None:
    store.create_topic(ADOPTING, 1, config(**extra))
    store.create_topic(COPYING, 1, config(**{**extra,
                                             "compaction.segment.adopt.min.bytes": "-1"}))


def test_an_adopted_segment_is_a_hard_link_with_a_dv_of_its_superseded_rows(
        tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        both(store, clock, **{"retention.ms": "1000", "file.delete.delay.ms": "0"})
        partition = store.topic(ADOPTING).partition(0)
        append(store, [ProducerRecord(b"k%03d" % k, b"a") for k in range(100)])
        (segment,) = partition.manifest.segments
        reports = [compact(store, topic, clock) for topic in (ADOPTING, COPYING)]
        assert [report.total("segments_adopted") for report in reports] == [1, 0]
        assert reports[0].total("records_out") == reports[1].total("records_out") == 100
        assert "1 segment adopted as it is" in render(summary_table(reports[0]))
        assert "ledger files 0 → 1" in render(summary_table(reports[0]))
        (first,) = partition.manifest.ledger
        assert first.file.endswith("-adopted.parquet")
        assert first.adopted_at_ms == clock.ms and first.dv_file is None
        assert (first.base_offset, first.record_count, first.crc32c) == (
            segment.base_offset, segment.record_count, segment.crc32c)
        assert os.stat(partition.ledger_dir / first.file).st_ino == os.stat(
            partition.directory / "segments" / segment.file).st_ino  # nothing copied
        assert "tombstone_since_ms" not in pq.read_schema(partition.ledger_dir / first.file).names

        # 80 of 100 rows superseded within the segment: below the live fraction, copied.
        append(store, [ProducerRecord(b"k%03d" % (k % 20), b"b") for k in range(100)])
        # 10 of 100 superseded within it: adopted, with a DV of those 10.
        append(store, [ProducerRecord(b"k%03d" % (20 + k % 90), b"c") for k in range(100)])
        clock.advance_ms(10)
        reports = [compact(store, topic, clock) for topic in (ADOPTING, COPYING)]
        assert [report.total("segments_adopted") for report in reports] == [1, 0]
        for name in ("records_in", "records_out", "keys", "tombstones_kept"):
            assert reports[0].total(name) == reports[1].total(name), name
        ledger = partition.manifest.ledger
        adopted = [info for info in ledger if info.adopted_at_ms is not None]
        # Every key of the first file was written again (0..19, then 20..99): dropped.
        assert first.file not in {info.file for info in ledger}
        (third,) = adopted
        assert third.adopted_at_ms == clock.ms
        assert third.dv_count == 10 and third.live_count == 90
        assert view(store, ADOPTING) == view(store, COPYING)
        assert len({r.key for r in view(store, ADOPTING)}) == len(view(store, ADOPTING)) == 110

        # Retention removes the segments below the horizon; the adopted file stays whole.
        clock.advance_ms(5000)
        partition.apply_retention()
        partition.sweep()
        assert not partition.manifest.segments
        assert not list((partition.directory / "segments").glob("*.parquet"))
        assert view(store, ADOPTING) == view(store, COPYING)


def test_tombstones_of_an_adopted_segment_count_from_the_run_that_adopted_it(
        tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        both(store, clock, **{"delete.retention.ms": "10000",
                              "compaction.ledger.rewrite.live.fraction": "0.1"})
        partition = store.topic(ADOPTING).partition(0)
        append(store, [ProducerRecord(b"k%d" % k, b"v") for k in range(10)]
               + [ProducerRecord(b"k%d" % k, None) for k in range(4)])
        for topic in (ADOPTING, COPYING):
            compact(store, topic, clock)
        (adopted,) = partition.manifest.ledger
        assert adopted.adopted_at_ms == clock.ms and adopted.dv_count == 4
        assert partition.manifest.compaction is not None
        assert partition.manifest.compaction.oldest_tombstone_ms == clock.ms
        clock.advance_ms(9_999)
        assert [r.value for r in view(store, ADOPTING)].count(None) == 4
        assert view(store, ADOPTING) == view(store, COPYING)
        clock.advance_ms(1)  # delete.retention.ms since the adopting run: gone on read
        assert None not in [r.value for r in view(store, ADOPTING)]
        assert view(store, ADOPTING) == view(store, COPYING)
        for topic in (ADOPTING, COPYING):  # and for good, by a DV of the tombstones
            report = compact(store, topic, clock)
            assert report.total("tombstones_removed") == 4
        (kept,) = partition.manifest.ledger
        assert kept.file == adopted.file and kept.dv_count == 8
        assert view(store, ADOPTING) == view(store, COPYING)


def test_an_empty_value_that_became_a_tombstone_counts_from_the_run_after_the_switch(
        tmp_path: Path) -> None:
    """An adopted file holds no tombstone_since_ms, so a row that became a tombstone
    after its adoption (empty.value.is.tombstone switched on) cannot be told apart:
    the next run rewrites the file, and the tombstone counts from that run."""
    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        both(store, clock, **{"delete.retention.ms": "10000"})
        partition = store.topic(ADOPTING).partition(0)
        append(store, [ProducerRecord(b"k%d" % k, b"" if k < 3 else b"v") for k in range(10)])
        for topic in (ADOPTING, COPYING):
            compact(store, topic, clock)
        (adopted,) = partition.manifest.ledger
        assert adopted.adopted_at_ms is not None
        clock.advance_ms(8_000)
        for topic in (ADOPTING, COPYING):
            store.alter_topic(topic, {"empty.value.is.tombstone": "true"})
        append(store, [ProducerRecord(b"other", b"v")])
        switched_ms = clock.ms
        for topic in (ADOPTING, COPYING):
            compact(store, topic, clock)
        assert adopted.file not in {info.file for info in partition.manifest.ledger}
        clock.advance_ms(5_000)  # past retention from the adoption, not from the switch
        assert [r.value for r in view(store, ADOPTING)].count(b"") == 3
        assert view(store, ADOPTING) == view(store, COPYING)
        clock.advance_ms(switched_ms + 10_000 - clock.ms)
        assert b"" not in [r.value for r in view(store, ADOPTING)]
        assert view(store, ADOPTING) == view(store, COPYING)


def test_by_default_only_a_segment_nine_tenths_live_is_adopted(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        for name, live in (("most", 95), ("less", 85)):
            topic_config = config()
            del topic_config["compaction.segment.adopt.live.fraction"]
            store.create_topic(name, 1, topic_config)
            store.append(name, [ProducerRecord(b"k%d" % (k % live), b"v") for k in range(100)])
            store.topic(name).partition(0).roll()
            compact(store, name, clock)
            (only,) = store.topic(name).partition(0).manifest.ledger
            assert (only.adopted_at_ms is not None) is (name == "most"), name
            assert only.live_count == live


def test_small_segments_are_copied_and_minus_one_never_adopts(tmp_path: Path) -> None:
    clock = FakeClock()
    with LogStore.open(tmp_path / "data", clock=clock) as store:
        for name, limit in (("default", None), ("never", "-1"), ("small", "4096")):
            extra = {} if limit is None else {"compaction.segment.adopt.min.bytes": limit}
            topic_config = config(**extra)
            if limit is None:
                del topic_config["compaction.segment.adopt.min.bytes"]
            store.create_topic(name, 1, topic_config)
            store.append(name, [ProducerRecord(b"k%d" % k, b"v" * 10) for k in range(50)])
            store.topic(name).partition(0).roll()
            compact(store, name, clock)
            (only,) = store.topic(name).partition(0).manifest.ledger
            (segment,) = store.topic(name).partition(0).manifest.segments
            assert segment.size_bytes < 4096 < 1024 * 1024  # below each bound
            assert only.adopted_at_ms is None, name
