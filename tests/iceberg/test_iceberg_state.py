"""The compacted state table (compactlog/iceberg): read by DuckDB, pyiceberg and Polars
(tests/support/iceberg_readers.py, which import nothing of compactlog), it equals the compacted
view's live keys and latest values up to each partition's horizon, as the Reader serves
the view (`Partition.read_compacted`); its data files are the ledger files themselves;
each compaction commit makes one snapshot, and every snapshot reads as the state it was
made from; a snapshot is never ahead of the manifests, and one missed is made by the
next sync.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import compactlog.compaction.runner as runner
from compactlog.iceberg import state_table_location, sync_state_table
from compactlog.storage.records import ProducerRecord
from compactlog.storage.sealed import file_crc32c
from compactlog.storage.store import LogStore
from support.fakes import FakeClock
from support.iceberg_readers import StateRow, data_files, read_state, snapshots
from support.iceberg_support import (
    CONFIG,
    TOPIC,
    assert_engines_read,
    compact,
    expected_state,
    produce,
    updates,
)


@pytest.fixture
def topic_store(tmp_path: Path, clock: FakeClock) -> LogStore:
    store = LogStore.open(tmp_path / "data", clock=clock)
    store.create_topic(TOPIC, 3, CONFIG)
    return store


def test_the_state_table_equals_the_compacted_view_in_every_engine(
        topic_store: LogStore) -> None:
    store = topic_store
    produce(store, updates(0, 400, 60, tombstone_every=7))
    compact(store)
    produce(store, updates(400, 60, 90, tombstone_every=5))
    compact(store)
    assert any(info.dv_file for p in store.topic(TOPIC).partitions
               for info in p.manifest.ledger), "the second run wrote deletion vectors"
    # DeleteRecords below one partition's horizon: the next sync leaves those rows out.
    partition = store.topic(TOPIC).partition(1)
    partition.delete_records(partition.manifest.ledger[0].base_offset + 5)
    sync_state_table(store, TOPIC)
    expected = expected_state(store)
    assert len(expected) > 50 and any(row[4] for row in expected)
    assert all(row[3] is not None for row in expected)
    assert_engines_read(state_table_location(store, TOPIC), expected)


def test_every_data_file_is_a_ledger_file_byte_for_byte(topic_store: LogStore) -> None:
    store = topic_store
    produce(store, updates(0, 300, 40, tombstone_every=6))
    compact(store)
    produce(store, updates(300, 30, 80, tombstone_every=5))
    compact(store)
    table = state_table_location(store, TOPIC)
    listed = {}
    for partition in store.topic(TOPIC).partitions:
        for info in partition.manifest.ledger:
            listed[os.path.realpath(partition.ledger_dir / info.file)] = info
    found = data_files(table)
    data = [(path, size) for path, content, size in found if content == 0]
    deletes = [path for path, content, _ in found if content == 1]
    assert data and deletes
    for path, size in data:
        info = listed[os.path.realpath(path)]  # a ledger file the manifest lists
        assert os.path.samefile(path, os.path.realpath(path))
        assert size == info.size_bytes == os.stat(path).st_size
        assert file_crc32c(Path(path)) == info.crc32c  # the very bytes compaction wrote
    # The table's own files are its metadata and delete files, in iceberg/state.
    for path in deletes:
        assert Path(path).is_relative_to(Path(table) / "deletes")
    owned = [p for p in Path(table).rglob("*") if p.is_file()]
    assert all(p.suffix in (".json", ".avro", ".text") or "deletes" in p.parts
               for p in owned)


def test_one_snapshot_per_compaction_commit_and_each_reads_as_it_was(
        topic_store: LogStore, clock: FakeClock) -> None:
    store = topic_store
    table = state_table_location(store, TOPIC)
    states: list[list[StateRow]] = []
    for round_ in range(4):
        produce(store, updates(round_ * 200, 200, 30 + 20 * round_, tombstone_every=6))
        compact(store)
        states.append(expected_state(store))
        clock.advance(5)
    taken = snapshots(table)
    assert len(taken) == 4
    for snapshot, state in zip(taken, states, strict=True):
        summary = snapshot["summary"]
        assert summary["compactlog.cause"] == "compaction"
        assert summary["compactlog.run-id"]
        for partition in store.topic(TOPIC).partitions:
            assert f"compactlog.partition.{partition.index}.horizon" in summary
        assert_engines_read(table, state, snapshot["id"])
    # The last snapshot's horizons are the manifests'.
    last = taken[-1]["summary"]
    for partition in store.topic(TOPIC).partitions:
        assert last[f"compactlog.partition.{partition.index}.horizon"] == str(
            partition.manifest.horizon)
    # Nothing changed: a sync makes no snapshot.
    assert sync_state_table(store, TOPIC).snapshot_id is None
    assert len(snapshots(table)) == 4


def test_a_crash_between_the_commit_and_the_snapshot_is_repaired(
        topic_store: LogStore, monkeypatch: pytest.MonkeyPatch) -> None:
    store = topic_store
    table = state_table_location(store, TOPIC)
    produce(store, updates(0, 200, 30, tombstone_every=5))
    compact(store)
    before = expected_state(store)
    # The compaction commits, then "dies" before its sync (step 5b never runs).
    monkeypatch.setattr(runner, "sync_after_compaction", lambda *args: None)
    produce(store, updates(200, 200, 50))
    compact(store)
    after = expected_state(store)
    assert after != before
    # The table is behind, never ahead: it still shows the last synced state.
    assert_engines_read(table, before)
    result = sync_state_table(store, TOPIC)
    assert result.snapshot_id is not None
    assert_engines_read(table, after)
    assert snapshots(table)[-1]["summary"]["compactlog.cause"] == "sync"


def test_a_failing_sync_never_fails_the_compaction(
        topic_store: LogStore, monkeypatch: pytest.MonkeyPatch) -> None:
    import compactlog.iceberg.state as state

    store = topic_store
    produce(store, updates(0, 100, 20))

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(state, "sync", broken)
    compact(store)  # commits; the table is not made
    assert all(p.manifest.horizon is not None for p in store.topic(TOPIC).partitions)
    monkeypatch.undo()
    sync_state_table(store, TOPIC)
    assert_engines_read(state_table_location(store, TOPIC), expected_state(store))


def test_a_stale_hint_and_a_lost_race_leave_the_newest_snapshot(
        topic_store: LogStore) -> None:
    store = topic_store
    table = Path(state_table_location(store, TOPIC))
    produce(store, updates(0, 100, 20))
    compact(store)
    produce(store, updates(100, 100, 40))
    compact(store)
    # A sync that died after creating v2 but before its hint: readers see v1, an older
    # committed state; the next sync finds v2 by probing and commits v3 after it.
    (table / "metadata" / "version-hint.text").write_text("1")
    produce(store, updates(200, 50, 60))
    compact(store)
    assert (table / "metadata" / "v3.metadata.json").exists()
    assert (table / "metadata" / "version-hint.text").read_text() == "3"
    assert_engines_read(str(table), expected_state(store))


def test_retention_on_compact_delete_leaves_the_state_as_time_passes(
        tmp_path: Path, clock: FakeClock) -> None:
    store = LogStore.open(tmp_path / "data", clock=clock)
    store.create_topic(TOPIC, 2, {**CONFIG, "cleanup.policy": "compact,delete",
                                  "retention.ms": "60000"})
    now_ms = int(clock() * 1000)
    store.append(TOPIC, [ProducerRecord(b"old%d" % i, b"x", (), now_ms) for i in range(10)])
    clock.advance(50)
    store.append(TOPIC, [ProducerRecord(b"new%d" % i, b"y", (), now_ms + 50_000)
                         for i in range(10)])
    for partition in store.topic(TOPIC).partitions:
        partition.roll()
    compact(store, clock=clock)
    table = state_table_location(store, TOPIC)
    assert len(read_state("duckdb", table)) == 20
    clock.advance(20)  # the old records are past retention.ms now; no compaction ran
    result = sync_state_table(store, TOPIC)
    assert result.snapshot_id is not None
    expected = expected_state(store)
    assert len(expected) == 10 and all(row[2].startswith(b"new") for row in expected)
    assert_engines_read(table, expected)


def test_the_upkeep_makes_the_snapshots_no_compaction_made(topic_store: LogStore) -> None:
    from compactlog.server.upkeep import Upkeep

    store = topic_store
    table = state_table_location(store, TOPIC)
    produce(store, updates(0, 200, 30, tombstone_every=5))
    compact(store)
    upkeep = Upkeep(store)
    upkeep.run_once()  # the table is current: no snapshot
    assert len(snapshots(table)) == 1
    partition = store.topic(TOPIC).partition(0)
    partition.delete_records(partition.manifest.ledger[0].base_offset + 3)
    upkeep.run_once()
    taken = snapshots(table)
    assert len(taken) == 2 and taken[-1]["summary"]["compactlog.cause"] == "upkeep"
    assert_engines_read(table, expected_state(store))
    upkeep.run_once()  # nothing changed since
    assert len(snapshots(table)) == 2
