"""A data directory moved or copied to another path (a restore from a backup, a renamed
folder): its Iceberg tables name the old path, and the next sync starts each afresh
where it now is (compactlog/iceberg/relocate.py). The state table then follows the next
compaction and reads as the compacted view in DuckDB and pyiceberg; the raw table too;
and the hold documents name no file of the dropped history, so the sweep may delete
what only that history kept.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from compactlog.iceberg import (
    state_table_location,
    sync_raw_table,
    sync_state_table,
)
from compactlog.iceberg.kinds import RAW, STATE
from compactlog.storage.store import LogStore
from support.fakes import FakeClock
from support.iceberg_readers import data_files, read_state, snapshots
from support.iceberg_support import CONFIG, TOPIC, compact, expected_state, produce, updates

DELAY_S = 3600  # CONFIG's file.delete.delay.ms


def made_and_moved(tmp_path: Path, clock: FakeClock, config: dict[str, str],
                   copy: bool) -> LogStore:
    """A topic with two compactions (so a retained snapshot holds retired ledger files),
    its data directory then moved (or copied) to `tmp_path / "moved"` and opened there."""
    store = LogStore.open(tmp_path / "data", clock=clock)
    store.create_topic(TOPIC, 2, config)
    produce(store, updates(0, 200, 30, tombstone_every=7))
    compact(store, clock=clock)
    produce(store, updates(200, 60, 45, tombstone_every=5))
    compact(store, clock=clock)
    assert len(snapshots(state_table_location(store, TOPIC))) == 2
    store.close()
    (shutil.copytree if copy else shutil.move)(tmp_path / "data", tmp_path / "moved")
    clock.advance(DELAY_S + 1)  # the old holds are past file.delete.delay.ms
    return LogStore.open(tmp_path / "moved", clock=clock)


def held_paths(store: LogStore, holder: str) -> set[str]:
    return {str(partition.volume.path_of(relative).resolve())
            for partition in store.topic(TOPIC).partitions
            for relative in partition.holds.entries(holder)}


def test_a_moved_state_table_follows_the_next_compaction(tmp_path: Path,
                                                         clock: FakeClock) -> None:
    store = made_and_moved(tmp_path, clock, CONFIG, copy=False)
    produce(store, updates(260, 40, 50, tombstone_every=6))
    compact(store, clock=clock)  # its sync starts the table afresh here
    table = state_table_location(store, TOPIC)
    assert table.startswith(str((tmp_path / "moved").resolve()))
    assert [s["summary"]["compactlog.cause"] for s in snapshots(table)] == ["compaction"]
    expected = expected_state(store)
    assert len(expected) > 40
    for engine in ("duckdb", "pyiceberg"):
        assert read_state(engine, table) == expected, engine
    listed = data_files(table)
    assert all(path.startswith(str((tmp_path / "moved").resolve())) for path, _, _ in listed)
    # (2) the holds name exactly the new snapshot's data files: none of the old history
    assert held_paths(store, STATE.holder) == {path for path, content, _ in listed
                                               if content == 0}
    # and the next sync and compaction build on it as on any table
    produce(store, updates(300, 30, 50))
    compact(store, clock=clock)
    assert len(snapshots(table)) == 2
    assert read_state("duckdb", table) == expected_state(store)


def test_a_copied_directory_s_tables_leave_the_original_alone(tmp_path: Path,
                                                               clock: FakeClock) -> None:
    config = {**CONFIG, "iceberg.raw.enabled": "true"}
    original = tmp_path / "data" / "topics" / TOPIC / "iceberg" / "raw"
    store = made_and_moved(tmp_path, clock, config, copy=True)
    assert not original.exists()  # never synced before the copy: made in the copy
    result = sync_state_table(store, TOPIC)
    assert result.snapshot_id is not None  # nothing changed but the place: a snapshot
    table = state_table_location(store, TOPIC)
    assert read_state("pyiceberg", table) == expected_state(store)
    assert sync_state_table(store, TOPIC).snapshot_id is None  # then current
    raw = state_table_location(store, TOPIC, "raw")
    sync_raw_table(store, TOPIC)
    store.close()
    shutil.copytree(tmp_path / "moved", tmp_path / "again")
    again = LogStore.open(tmp_path / "again", clock=clock)
    produce(again, updates(400, 20, 50))
    assert sync_raw_table(again, TOPIC).snapshot_id is not None
    moved_raw = state_table_location(again, TOPIC, "raw")
    assert moved_raw != raw and len(snapshots(moved_raw)) == 1
    rows = read_state("duckdb", moved_raw)
    assert len(rows) == sum(p.manifest.sealed_end_offset for p in again.topic(TOPIC).partitions)
    assert all(path.startswith(str((tmp_path / "again").resolve()))
               for path, _, _ in data_files(moved_raw))
    assert held_paths(again, RAW.holder) == {path for path, content, _ in data_files(moved_raw)
                                             if content == 0}
    assert len(snapshots(raw)) == 1  # the copy's source is as it was
