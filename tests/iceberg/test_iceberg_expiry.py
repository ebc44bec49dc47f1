"""Snapshot expiry and file deletion agree (issue 23, item 5; compactlog/iceberg/
expiry.py, storage/holds.py): a ledger file that a retained snapshot of the state table
references outlives file.delete.delay.ms, sweeps and later commits, so time travel to
the snapshot reads it in DuckDB, pyiceberg and Polars; once the snapshot expires
(`iceberg.history.expire.max-snapshot-age-ms`, keeping the newest
`iceberg.history.expire.min-snapshots-to-keep`), the sweep deletes the files only it
held, and the table's own files that no retained snapshot lists go too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from compactlog.iceberg import expire_snapshots, state_table_location
from compactlog.iceberg.kinds import STATE
from compactlog.storage.holds import Holds
from compactlog.storage.store import LogStore
from support.fakes import FakeClock
from support.iceberg_readers import StateRow, snapshots
from support.iceberg_support import (
    TOPIC,
    assert_engines_read,
    compact,
    expected_state,
    produce,
    updates,
)

DELAY_MS = 1000
CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
          # Every run rewrites the ledger, so each retires the files of the one before.
          "compaction.deletion.vectors": "false",
          "file.delete.delay.ms": str(DELAY_MS),
          "iceberg.history.expire.max-snapshot-age-ms": "60000"}


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> LogStore:
    opened = LogStore.open(tmp_path / "data", clock=clock)
    opened.create_topic(TOPIC, 2, CONFIG)
    return opened


def ledger_files(store: LogStore) -> set[Path]:
    return {path for partition in store.topic(TOPIC).partitions
            for path in partition.ledger_dir.glob("*.parquet")}


def sweep_all(store: LogStore) -> None:
    for partition in store.topic(TOPIC).partitions:
        partition.sweep()


def rounds(store: LogStore, clock: FakeClock, count: int) -> list[list[StateRow]]:
    states = []
    for round_ in range(count):
        produce(store, updates(round_ * 150, 150, 40 + 10 * round_, tombstone_every=6))
        compact(store)
        states.append(expected_state(store))
        clock.advance(2 * DELAY_MS / 1000)  # past the delay: a sweep may delete
        sweep_all(store)
    return states


def test_a_retained_snapshot_keeps_its_ledger_files_past_the_delay(
        store: LogStore, clock: FakeClock) -> None:
    states = rounds(store, clock, 3)
    table = state_table_location(store, TOPIC)
    taken = snapshots(table)
    assert len(taken) == 3
    # The first run's ledger files were retired two runs ago, past the delay, swept
    # twice and forgotten by a later commit: a snapshot still lists them, so they stay.
    for snapshot, state in zip(taken, states, strict=True):
        assert_engines_read(table, state, snapshot["id"])


def test_expired_snapshots_release_their_files_and_the_sweep_deletes_them(
        store: LogStore, clock: FakeClock) -> None:
    states = rounds(store, clock, 3)
    table = state_table_location(store, TOPIC)
    held_before = ledger_files(store)
    owned_before = {p for p in Path(table).rglob("*") if p.suffix in (".avro", ".parquet")}
    clock.advance(61)  # every snapshot but the current is past the maximum age
    result = expire_snapshots(store, TOPIC)
    assert len(result.expired) == 2 and result.table_files_removed > 0
    (current,) = snapshots(table)
    assert current["id"] not in result.expired
    assert_engines_read(table, states[-1])
    sweep_all(store)
    kept = ledger_files(store)
    assert kept < held_before  # the expired snapshots' files are gone
    listed = {partition.ledger_dir / info.file for partition in store.topic(TOPIC).partitions
              for info in partition.manifest.ledger}
    assert kept == listed  # what is left is what the manifests list
    owned_after = {p for p in Path(table).rglob("*") if p.suffix in (".avro", ".parquet")}
    assert owned_after < owned_before
    assert_engines_read(table, states[-1])  # the current snapshot reads on


def test_the_newest_snapshots_are_kept_whatever_their_age(
        store: LogStore, clock: FakeClock) -> None:
    store.alter_topic(TOPIC, {"iceberg.history.expire.min-snapshots-to-keep": "2"})
    states = rounds(store, clock, 3)
    clock.advance(3600)
    result = expire_snapshots(store, TOPIC)
    table = state_table_location(store, TOPIC)
    assert len(result.expired) == 1
    taken = snapshots(table)
    assert len(taken) == 2
    sweep_all(store)
    for snapshot, state in zip(taken, states[1:], strict=True):
        assert_engines_read(table, state, snapshot["id"])


def test_expiry_holds_the_files_of_a_table_made_before_holds(
        store: LogStore, clock: FakeClock) -> None:
    states = rounds(store, clock, 2)
    for partition in store.topic(TOPIC).partitions:  # as a table of an older version
        for path in sorted((partition.directory / "holds").rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        (partition.directory / "holds").rmdir()
        partition.holds = Holds(partition.volume.document("holds"))
    assert expire_snapshots(store, TOPIC).expired == []
    for partition in store.topic(TOPIC).partitions:
        assert partition.holds.entries(STATE.holder)
    produce(store, updates(900, 150, 70))
    compact(store)
    clock.advance(10)
    sweep_all(store)
    compact(store)  # a commit that forgets the retired entries
    sweep_all(store)
    table = state_table_location(store, TOPIC)
    for snapshot, state in zip(snapshots(table)[:2], states, strict=True):
        assert_engines_read(table, state, snapshot["id"])


def test_a_hold_within_the_grace_period_outlives_a_replace(tmp_path: Path) -> None:
    """A sync in flight holds files before its snapshot commits: an expiry that reads
    the metadata without that snapshot must not release them yet (holds.py, step 2)."""
    from compactlog.backend.local.document import LocalDocument

    holds = Holds(LocalDocument(tmp_path / "holds"))
    holds.add(STATE.holder, ["ledger/a.parquet", "ledger/b.parquet"], now_ms=1_000)
    holds.add(STATE.holder, ["ledger/c.parquet"], now_ms=50_000)  # the sync in flight
    holds.replace(STATE.holder, ["ledger/a.parquet"], now_ms=55_000, grace_ms=10_000)
    assert holds.entries(STATE.holder) == {"ledger/a.parquet": 1_000, "ledger/c.parquet": 50_000}
    assert holds.held() == {"ledger/a.parquet", "ledger/c.parquet"}
    holds.replace(STATE.holder, [], now_ms=70_000, grace_ms=10_000)
    assert holds.held() == frozenset()


def test_a_table_deleted_by_hand_releases_its_holds(store: LogStore, clock: FakeClock) -> None:
    """docs/querying.md: a moved data directory needs its iceberg/ directories deleted;
    the holds of the deleted table must not keep ledger files forever."""
    import shutil

    rounds(store, clock, 2)
    shutil.rmtree(state_table_location(store, TOPIC))
    clock.advance(10)
    expire_snapshots(store, TOPIC)
    assert all(not p.holds.held() for p in store.topic(TOPIC).partitions)
    sweep_all(store)
    listed = {partition.ledger_dir / info.file for partition in store.topic(TOPIC).partitions
              for info in partition.manifest.ledger}
    assert ledger_files(store) == listed
