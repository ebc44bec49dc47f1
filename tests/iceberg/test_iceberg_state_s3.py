"""The state table on an s3:// data location (moto's S3 server on loopback): compaction
in the bucket makes it under PREFIX/topics/<topic>/<topic id>/iceberg/state, and DuckDB
(httpfs), pyiceberg and Polars read it from the bucket, equal to the Reader's view.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from pyiceberg.table import StaticTable

from compactlog.iceberg import state_table_location
from compactlog.storage.store import LogStore
from local_engine import LocalCompactionService
from support.iceberg_readers import StateRow, _row
from support.iceberg_support import duckdb_on_s3, expected_state, pyiceberg_properties, updates
from support.s3_faults import S3Proxy
from support.s3_support import S3Server


def test_the_state_table_in_the_bucket(s3: S3Server, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path: Path) -> None:
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    url = str(s3.location("iceberg"))
    with LogStore.open(url, local_dir=tmp_path / "writer") as store:
        store.create_topic("prices", 2, {"cleanup.policy": "compact",
                                         "min.compaction.lag.ms": "0",
                                         "compaction.ledger.rewrite.live.fraction": "0"})
        for start, keys in ((0, 30), (200, 45)):
            store.append("prices", updates(start, 200, keys, tombstone_every=6))
            for partition in store.topic("prices").partitions:
                partition.roll()
            LocalCompactionService(store, "prices", {"engine": "arrow"}).compact()
        table = state_table_location(store, "prices")
        expected = expected_state(store, "prices")
        topic_id = store.topic("prices").meta.topic_id
    assert table == f"{url}/topics/prices/{topic_id}/iceberg/state"
    assert len(expected) > 30

    properties = pyiceberg_properties(s3)
    scan = StaticTable.from_metadata(table, properties).scan()
    found = scan.to_arrow().select(["partition", "offset", "key", "value", "headers"])
    assert sorted(_row(**row) for row in found.to_pylist()) == expected

    frame = pl.scan_iceberg(StaticTable.from_metadata(table, properties)).select(
        "partition", "offset", "key", "value", "headers").collect()
    assert sorted(_row(*row) for row in frame.rows()) == expected

    con = duckdb_on_s3(s3)
    rows: list[StateRow] = sorted(_row(*row) for row in con.execute(
        f"""SELECT partition, "offset", key, value, headers
            FROM iceberg_scan('{table}')""").fetchall())
    assert rows == expected


def test_retained_snapshots_keep_their_files_in_the_bucket_until_they_expire(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Holds and expiry on S3 (iceberg/expiry.py): the first snapshot's ledger objects,
    retired by the next run and past file.delete.delay.ms, stay while it is retained and
    read in pyiceberg; once it expires, the sweep deletes them from the bucket."""
    from compactlog.iceberg import expire_snapshots
    from support.fakes import FakeClock

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    clock = FakeClock()
    url = str(s3.location("expiry"))
    properties = pyiceberg_properties(s3)
    with LogStore.open(url, local_dir=tmp_path / "writer", clock=clock) as store:
        store.create_topic("prices", 1, {"cleanup.policy": "compact",
                                         "min.compaction.lag.ms": "0",
                                         "compaction.deletion.vectors": "false",
                                         "file.delete.delay.ms": "1000"})
        partition = store.topic("prices").partition(0)
        states, first_files = [], set()
        for start, keys in ((0, 30), (200, 45), (400, 50)):
            store.append("prices", updates(start, 200, keys, tombstone_every=6))
            partition.roll()
            LocalCompactionService(store, "prices", {"engine": "arrow"}).compact()
            states.append(expected_state(store, "prices"))
            first_files = first_files or {info.file for info in partition.manifest.ledger}
            clock.advance(5)
            partition.sweep()
        table = state_table_location(store, "prices")
        first = StaticTable.from_metadata(table, properties).metadata.snapshots[0]
        scan = StaticTable.from_metadata(table, properties).scan(snapshot_id=first.snapshot_id)
        found = scan.to_arrow().select(["partition", "offset", "key", "value", "headers"])
        assert sorted(_row(**row) for row in found.to_pylist()) == states[0]
        listed = {item.name for item in partition.volume.listing("ledger")}
        assert first_files <= listed  # held past the delay and two sweeps
        clock.advance(6 * 86400)
        assert len(expire_snapshots(store, "prices").expired) == 2
        partition.sweep()
        listed = {item.name for item in partition.volume.listing("ledger")}
        assert not first_files & listed
        assert listed == {info.file for info in partition.manifest.ledger}


def test_expiry_reads_a_hold_once_and_only_where_it_may_shrink(
        s3_proxy: S3Proxy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The S3 requests of expiry (iceberg/expiry.py, steps 1 and 4), counted by the
    proxy: after a compaction's sync, an expiry that expires nothing sends none; one
    that expires a snapshot touches only the hold documents of partitions whose files
    the expired snapshot alone listed: one load and one commit each (before: every
    partition's document was loaded twice, has() then replace(), in both cases)."""
    from compactlog.iceberg import expire_snapshots, sync_after_compaction
    from compactlog.iceberg.expiry import expire
    from support.fakes import FakeClock

    for name, value in s3_proxy.env.items():
        monkeypatch.setenv(name, value)
    clock = FakeClock()
    with LogStore.open(str(s3_proxy.server.location("expiry-requests")),
                       local_dir=tmp_path / "writer", clock=clock) as store:
        store.create_topic("prices", 4, {"cleanup.policy": "compact",
                                         "min.compaction.lag.ms": "0",
                                         "compaction.deletion.vectors": "false",
                                         "iceberg.history.expire.max-snapshot-age-ms": "60000"})
        partitions = store.topic("prices").partitions
        store.append("prices", updates(0, 200, 40))
        for partition in partitions:
            partition.roll()
        LocalCompactionService(store, "prices", {"engine": "arrow"}).compact()
        partitions[0].append(updates(200, 50, 40))  # the next run changes partition 0 only
        partitions[0].roll()
        clock.advance(1)
        LocalCompactionService(store, "prices", {"engine": "arrow"}).compact()

        def holds_requests(since: int) -> dict[int, list[str]]:
            found: dict[int, list[str]] = {}
            for seen in s3_proxy.requests(key=r"/holds/current\.json$", since=since):
                index = int(seen.key.rsplit("/holds/", 1)[0].rsplit("/", 1)[1])
                found.setdefault(index, []).append(seen.method)
            return found

        mark = s3_proxy.mark()
        synced = sync_after_compaction(store, "prices", "run")  # the table is current
        assert synced is not None and synced.snapshot_id is None
        after_sync = s3_proxy.requests(since=mark)
        assert not any("/holds/" in seen.key for seen in after_sync)
        mark = s3_proxy.mark()
        assert expire(store, "prices", current=synced.current, repair=False).expired == []
        assert s3_proxy.requests(since=mark) == []  # nothing expired: not one request
        clock.advance(61)  # the first snapshot is past the maximum age
        mark = s3_proxy.mark()
        result = expire_snapshots(store, "prices")
        assert len(result.expired) == 1 and result.holds_replaced == 1
        # The load, then the commit's own compare (backend/s3/document.py, step 2) and its
        # conditional PUT; no other partition's hold document is read.
        assert holds_requests(mark) == {0: ["GET", "GET", "PUT"]}


@pytest.mark.slow  # the default run has it locally (test_iceberg_raw, the REST catalog's)
def test_a_raw_table_switched_off_is_dropped_from_the_bucket(
        s3: S3Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """iceberg/drop.py on S3: the raw table's objects go (v1 and the hint first), and
    the raw holder leaves every partition's hold document; the state table stays."""
    from compactlog.iceberg import drop_table, sync_raw_table
    from compactlog.iceberg.files import table_files
    from compactlog.iceberg.kinds import RAW, STATE

    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    with LogStore.open(str(s3.location("drop")), local_dir=tmp_path / "writer") as store:
        store.create_topic("prices", 2, {"cleanup.policy": "compact",
                                         "min.compaction.lag.ms": "0",
                                         "iceberg.raw.enabled": "true"})
        store.append("prices", updates(0, 100, 20))
        for partition in store.topic("prices").partitions:
            partition.roll()
        LocalCompactionService(store, "prices", {"engine": "arrow"}).compact()
        assert sync_raw_table(store, "prices").snapshot_id is not None
        partitions = store.topic("prices").partitions
        assert all(p.holds.has(RAW.holder) for p in partitions)
        raw = table_files(store, "prices", "raw")
        assert raw.listing("metadata")
        store.alter_topic("prices", {"iceberg.raw.enabled": "false"})
        result = drop_table(store, "prices")
        assert result.table_files_removed > 0 and result.holds_released == 2
        assert raw.listing("metadata") == [] and raw.size("metadata/version-hint.text") is None
        assert not any(p.holds.has(RAW.holder) for p in partitions)
        assert all(p.holds.has(STATE.holder) for p in partitions)
        assert table_files(store, "prices", "state").listing("metadata")
        assert drop_table(store, "prices").table_files_removed == 0  # nothing left
