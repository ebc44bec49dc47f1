"""Deletion vectors record their rows' positions (storage/deletion.py), and the state
table's sync takes them from there (iceberg/deletes.py): a ledger file whose only
deleted rows are its DV's is then not read to make its position-delete file.

- the positions a compaction records are the rows of the DV's offsets in the file;
- a sync made from scratch over a ledger with DVs and no tombstone reads no ledger file
  and still shows the compacted view (every engine);
- a DV written before positions were recorded (an offset column only) gives the same
  positions, from the ledger file's offsets, with tombstones in the ledger or none;
- a DV that a commit replaced and the sweep deleted after the sync loaded its manifest
  makes the sync load again (step 4c); one missing while still listed fails it.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import compactlog.iceberg.deletes as deletes
from compactlog.iceberg import state_table_location, sync_state_table
from compactlog.iceberg.avro import forget_entries
from compactlog.iceberg.kinds import STATE
from compactlog.storage import (
    TimeRules,
    cached_deletion_positions,
    cached_deletion_vector,
)
from compactlog.storage.sealed import SegmentMissingError, file_crc32c
from compactlog.storage.store import LogStore
from support.fakes import FakeClock
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
def store_with_dvs(tmp_path: Path, clock: FakeClock) -> LogStore:
    """Two compactions of updates without tombstones: the second gives the first's
    ledger files deletion vectors."""
    store = LogStore.open(tmp_path / "data", clock=clock)
    store.create_topic(TOPIC, 2, CONFIG)
    produce(store, updates(0, 600, 200))
    compact(store)
    produce(store, updates(600, 80, 120))
    compact(store)
    assert any(info.dv_file for partition in store.topic(TOPIC).partitions
               for info in partition.manifest.ledger), "the second run wrote DVs"
    return store


def test_a_dv_records_the_positions_of_its_offsets(store_with_dvs: LogStore) -> None:
    for partition in store_with_dvs.topic(TOPIC).partitions:
        for info in partition.manifest.ledger:
            if info.dv_file is None:
                continue
            dv = partition.ledger_dir / info.dv_file
            positions = cached_deletion_positions(dv, info.dv_size_bytes, info.dv_crc32c)
            offsets = cached_deletion_vector(dv, info.dv_size_bytes, info.dv_crc32c)
            assert positions is not None and len(positions) == len(offsets) == info.dv_count
            file_offsets = pq.read_table(partition.ledger_dir / info.file,
                                         columns=["offset"]).column("offset").to_numpy()
            assert (file_offsets[positions] == offsets).all()


def test_a_sync_from_scratch_reads_no_ledger_file(store_with_dvs: LogStore,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    store = store_with_dvs
    table = Path(state_table_location(store, TOPIC))
    shutil.rmtree(table)
    deletes.forget_cache()
    forget_entries()

    def no_read(*_: object) -> pa.Table:
        raise AssertionError("a ledger file was read")

    monkeypatch.setattr(deletes, "_columns_of", no_read)
    result = sync_state_table(store, TOPIC)
    assert result.snapshot_id is not None
    monkeypatch.undo()
    assert_engines_read(str(table), expected_state(store))


@pytest.fixture
def store_with_tombstones(tmp_path: Path, clock: FakeClock) -> LogStore:
    """As store_with_dvs, with a tombstone in every seven records: the sync then reads
    each file's value sizes, and takes its DV's rows from the positions recorded."""
    store = LogStore.open(tmp_path / "tombstones", clock=clock)
    store.create_topic(TOPIC, 2, CONFIG)
    produce(store, updates(0, 600, 200, tombstone_every=7))
    compact(store)
    produce(store, updates(600, 80, 120, tombstone_every=7))
    compact(store)
    return store


@pytest.mark.parametrize("with_tombstones", [False, True])
def test_a_dv_without_positions_gives_the_same_ones(
        request: pytest.FixtureRequest, with_tombstones: bool) -> None:
    """With tombstones possible, the file's columns are read and its DV's rows come from
    the positions recorded (or, for an old DV, from looking its offsets up): the same
    positions either way, and the state table reads as the view."""
    store: LogStore = request.getfixturevalue(
        "store_with_tombstones" if with_tombstones else "store_with_dvs")
    checked = with_tombstone_rows = 0
    for partition in store.topic(TOPIC).partitions:
        rules = TimeRules.of(partition.config, int(store.clock() * 1000))
        for rows in STATE.rows(partition.manifest, rules):
            info = rows.info
            if info.dv_file is None:
                continue
            # The DV as written before positions were recorded: its offsets alone.
            dv = partition.ledger_dir / info.dv_file
            old_name = info.dv_file.replace(".dv-", ".old-dv-")
            offsets = pq.read_table(dv, columns=["offset"])
            pq.write_table(offsets, partition.ledger_dir / old_name)
            old_path = partition.ledger_dir / old_name
            old = replace(rows, info=replace(
                info, dv_file=old_name, dv_size_bytes=old_path.stat().st_size,
                dv_crc32c=file_crc32c(old_path)))
            assert cached_deletion_positions(old_path, old.info.dv_size_bytes,
                                             old.info.dv_crc32c) is None
            deletes.forget_cache()
            from_offsets = deletes.deleted_positions(partition.volume, old, rules, "old",
                                                     tombstones_possible=with_tombstones)
            recorded = deletes.deleted_positions(partition.volume, rows, rules, "new",
                                                 tombstones_possible=with_tombstones)
            assert np.array_equal(from_offsets, recorded)
            assert len(recorded) >= info.dv_count
            assert (len(recorded) > info.dv_count) == (with_tombstones and bool(
                deletes.tombstones(pq.read_table(partition.ledger_dir / info.file,
                                                 columns=["value_size"]), False).any()))
            checked += 1
            with_tombstone_rows += len(recorded) > info.dv_count
    assert checked, "no ledger file with a DV"
    assert bool(with_tombstone_rows) == with_tombstones, "a DV'd file holds tombstones"
    if with_tombstones:
        deletes.forget_cache()
        result = sync_state_table(store, TOPIC)
        assert result.current is not None
        assert_engines_read(state_table_location(store, TOPIC), expected_state(store))


def test_a_dv_replaced_and_deleted_under_a_sync_makes_it_start_again(
        store_with_dvs: LogStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 4c's rule for DVs: a compaction commits between the sync's steps 2 and 3,
    replacing a DV that is then deleted (file.delete.delay.ms 0) before step 3 reads
    it; the sync loads again and snapshots the new manifests. A DV missing while its
    manifest still lists it fails the sync instead."""
    store = store_with_dvs
    table = Path(state_table_location(store, TOPIC))
    shutil.rmtree(table)
    deletes.forget_cache()
    forget_entries()
    read = deletes.cached_deletion_positions
    raced: list[bool] = []

    def replaced_then_gone(path: Path, size: int | None, crc: int | None) -> object:
        if not raced:  # the first read of a DV: another run commits, its DV is swept
            raced.append(True)
            produce(store, updates(680, 40, 120))
            compact(store)
            raise SegmentMissingError(path, "deletion vector is missing")
        return read(path, size, crc)

    monkeypatch.setattr(deletes, "cached_deletion_positions", replaced_then_gone)
    sync_state_table(store, TOPIC)  # (the racing run's own sync may have made it current)
    monkeypatch.undo()
    assert raced
    assert_engines_read(str(table), expected_state(store))

    def missing(path: Path, size: int | None, crc: int | None) -> object:
        raise SegmentMissingError(path, "deletion vector is missing")

    shutil.rmtree(table)
    deletes.forget_cache()
    monkeypatch.setattr(deletes, "cached_deletion_positions", missing)
    with pytest.raises(SegmentMissingError):
        sync_state_table(store, TOPIC)
