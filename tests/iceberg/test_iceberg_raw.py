"""The raw topic as an append-only Iceberg table (issue 23, item 3; iceberg/kinds.py's
RAW): every topic's sealed segments are its data files, byte for byte; DuckDB, pyiceberg
and Polars read it equal to the raw view's sealed part as the Reader serves it,
tombstones included; a seal appends, a merge of small segments replaces its inputs
with rows unchanged, retention and DeleteRecords take records out; every snapshot reads
as it was while it is retained (the holds keep a merge's inputs), and the server's
upkeep syncs it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compactlog.iceberg import state_table_location, sync_raw_table
from compactlog.iceberg.table_upkeep import StateTableUpkeep
from compactlog.storage.merging import merge_small_segments
from compactlog.storage.records import ProducerRecord
from compactlog.storage.sealed import file_crc32c
from compactlog.storage.store import LogStore
from support.fakes import FakeClock
from support.iceberg_raw import TOPIC, raw_rows
from support.iceberg_readers import ENGINES, StateRow, data_files, read_state, snapshots
from support.paths import ROOT


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> LogStore:
    opened = LogStore.open(tmp_path / "data", clock=clock)
    opened.create_topic(TOPIC, 2, {"cleanup.policy": "delete",
                                   "file.delete.delay.ms": "1000"})
    return opened


def table(store: LogStore) -> str:
    return state_table_location(store, TOPIC, "raw")


def seal_batches(store: LogStore, clock: FakeClock, start: int, batches: int,
                 size: int = 20) -> None:
    for batch in range(batches):
        store.append(TOPIC, [
            ProducerRecord(b"k%d" % ((start + batch * size + i) % 13),
                           None if i % 9 == 4 else b"v%d" % (start + batch * size + i),
                           (("h", b"%d" % i),) if i % 5 == 0 else ())
            for i in range(size)])
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
        clock.advance(1)


def assert_read(store: LogStore, expected: list[StateRow],
                snapshot_id: int | None = None) -> None:
    for engine in ENGINES:
        assert read_state(engine, table(store), snapshot_id) == expected, engine


def test_the_raw_table_is_the_sealed_log_in_every_engine(
        store: LogStore, clock: FakeClock) -> None:
    seal_batches(store, clock, 0, 4)
    result = sync_raw_table(store, TOPIC)
    assert result.snapshot_id is not None
    expected = raw_rows(store)
    assert len(expected) == 80 and any(row[3] is None for row in expected)  # tombstones
    assert_read(store, expected)
    # Zero-copy: every data file is a sealed segment the manifest lists, byte for byte.
    listed = {os.path.realpath(p.segment_dir / info.file): info
              for p in store.topic(TOPIC).partitions for info in p.manifest.segments}
    found = [(path, size) for path, content, size in data_files(table(store)) if content == 0]
    assert len(found) == len(listed)
    for path, size in found:
        info = listed[os.path.realpath(path)]
        assert size == info.size_bytes and file_crc32c(Path(path)) == info.crc32c
    assert sync_raw_table(store, TOPIC).snapshot_id is None  # nothing new: no snapshot


def test_seals_append_merges_replace_and_each_snapshot_reads_as_it_was(
        store: LogStore, clock: FakeClock) -> None:
    states: list[list[StateRow]] = []
    seal_batches(store, clock, 0, 6, size=3)  # small segments
    sync_raw_table(store, TOPIC)
    states.append(raw_rows(store))
    seal_batches(store, clock, 100, 2, size=3)
    sync_raw_table(store, TOPIC)
    states.append(raw_rows(store))
    for partition in store.topic(TOPIC).partitions:
        assert merge_small_segments(partition, min_run=4) is not None
    sync_raw_table(store, TOPIC)
    states.append(raw_rows(store))
    assert states[2] == states[1]  # a merge moves rows between files, changes none
    taken = snapshots(table(store))
    assert [s["operation"] for s in taken] == ["append", "append", "replace"]
    # The merge's inputs, retired past the delay and swept, stay for the snapshots.
    clock.advance(10)
    seal_batches(store, clock, 200, 1, size=3)  # a commit that forgets retired entries
    for partition in store.topic(TOPIC).partitions:
        partition.sweep()
    for snapshot, state in zip(taken, states, strict=True):
        assert_read(store, state, snapshot["id"])


def test_delete_records_and_retention_take_records_out(
        store: LogStore, clock: FakeClock) -> None:
    seal_batches(store, clock, 0, 4)
    sync_raw_table(store, TOPIC)
    partition = store.topic(TOPIC).partition(0)
    partition.delete_records(partition.manifest.segments[1].base_offset + 3)
    sync_raw_table(store, TOPIC)
    assert_read(store, raw_rows(store))  # a position delete inside a segment
    store.alter_topic(TOPIC, {"retention.ms": "1000"})
    clock.advance(3600)
    seal_batches(store, clock, 500, 1)
    for each in store.topic(TOPIC).partitions:
        each.apply_retention()
    sync_raw_table(store, TOPIC)
    expected = raw_rows(store)
    assert expected and min(row[1] for row in expected if row[0] == 0) > 0
    assert_read(store, expected)


def test_the_upkeep_syncs_the_raw_table_when_enabled_once_per_target_lag(
        store: LogStore, clock: FakeClock) -> None:
    now = [0.0]
    upkeep = StateTableUpkeep(store, clock=lambda: now[0])
    seal_batches(store, clock, 0, 2)
    assert not upkeep.run(TOPIC)  # off by default
    store.alter_topic(TOPIC, {"iceberg.raw.enabled": "true",
                              "iceberg.raw.target.lag.ms": "60000"})
    assert upkeep.run(TOPIC)
    assert not upkeep.run(TOPIC)  # nothing sealed since
    seal_batches(store, clock, 50, 1)
    now[0] = 30.0
    assert not upkeep.run(TOPIC)  # sealed, but within the target lag
    now[0] = 61.0
    assert upkeep.run(TOPIC)
    assert_read(store, raw_rows(store))
    assert len(snapshots(table(store))) == 2


def test_the_querying_pages_raw_table_example(tmp_path: Path, clock: FakeClock) -> None:
    """docs/querying.md's raw table block, as written, in a Python without this checkout
    on its path, in a directory holding compactlog-data with topic `events`."""
    import re
    import subprocess
    import sys

    page = (ROOT / "docs" / "querying.md").read_text()
    section = page.split("## The raw log as an Iceberg table", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    with LogStore.open(tmp_path / "compactlog-data", clock=clock) as opened:
        opened.create_topic(TOPIC, 2, {"iceberg.raw.enabled": "true"})
        seal_batches(opened, clock, 0, 3)
        sync_raw_table(opened, TOPIC)
        expected = raw_rows(opened)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    tombstones = sum(1 for row in expected if row[3] is None)
    assert done.stdout.strip() == f"{len(expected)} records, {tombstones} tombstones"


def test_switching_the_raw_table_off_drops_it_and_frees_its_segments(
        store: LogStore, clock: FakeClock) -> None:
    """A raw table nothing syncs or expires any more must not hold the segments that a
    merge retired (iceberg/drop.py): switched off, the upkeep drops the table, then its
    holds, and the sweep deletes them; the state table keeps its snapshots and holds."""
    from compactlog.iceberg.catalog import table_names
    from compactlog.iceberg.kinds import RAW, STATE
    from support.iceberg_support import compact, expected_state

    name = "both"
    store.create_topic(name, 2, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
                                 "file.delete.delay.ms": "1000",
                                 "iceberg.raw.enabled": "true"})
    partitions = store.topic(name).partitions

    def seal(start: int, batches: int) -> None:
        for batch in range(batches):
            store.append(name, [ProducerRecord(b"k%d" % (start + batch * 3 + i), b"v")
                                for i in range(3)])
            for partition in partitions:
                partition.roll()
            clock.advance(1)

    now = [0.0]
    upkeep = StateTableUpkeep(store, clock=lambda: now[0])
    seal(0, 6)  # small segments
    compact(store, name)
    assert upkeep.run(name)
    merged = {partition.segment_dir / info.file for partition in partitions
              for info in partition.manifest.segments}
    for partition in partitions:
        assert merge_small_segments(partition, min_run=4) is not None
    now[0] = 61.0
    assert upkeep.run(name)  # the raw table's `replace` snapshot
    clock.advance(10)  # the merge's inputs: retired past file.delete.delay.ms
    seal(100, 1)  # a commit that forgets them
    for partition in partitions:
        partition.sweep()
    replaced = merged - {partition.segment_dir / info.file for partition in partitions
                         for info in partition.manifest.segments}
    assert replaced and all(path.exists() for path in replaced)  # the raw table holds them
    state = expected_state(store, name)
    raw = state_table_location(store, name, "raw")
    assert table_names(store, "raw", [name]) == [name]

    store.alter_topic(name, {"iceberg.raw.enabled": "false"})
    now[0] = 62.0
    upkeep.run(name)
    assert not Path(raw).exists()
    assert not any(p.holds.has(RAW.holder) for p in partitions)
    for partition in partitions:
        partition.sweep()
    assert not any(path.exists() for path in replaced)
    assert table_names(store, "raw", [name]) == []
    assert table_names(store, "state", [name]) == [name]
    assert all(p.holds.entries(STATE.holder) for p in partitions)
    for engine in ENGINES:
        assert read_state(engine, state_table_location(store, name)) == state, engine
    # Switched on again, the upkeep makes it anew from the segments as they are.
    store.alter_topic(name, {"iceberg.raw.enabled": "true"})
    now[0] = 200.0
    assert upkeep.run(name)
    assert read_state("pyiceberg", raw) == raw_rows(store, name)
