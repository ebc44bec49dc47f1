"""Reads of a partition, raw or compacted: the one read path of the store.

Invariant: a read sees one view of the partition (a manifest and the log segments that
went with it, `Partition.view`), never a mix of two; it holds a lease on each Parquet
file while it reads it (filecache.py), so no file closes under it; and if a file that
its view lists is gone (a newer manifest retired it and the sweep deleted it, here or in
another process), `with_view` reads again from a fresh view. Every reader (records,
Arrow tables, the server's wire batches in server/wire.py, the compacted view) goes
through `with_view` and the table sources below.

The raw log: sealed segments from the one holding the offset, then the log segments.
Raw offsets are dense from the log start, so each part must begin where the one before
ended; a read stops at the first gap or damage after it has records (the caller gets
what precedes it, as a consumer needs to get past damage) and raises CorruptionError
only when the damage is where the read starts.

The compacted view: the ledger files from the one holding the offset up to the horizon
(their offsets have gaps: those of the records that survived), then the raw log from
horizon + 1. A read from offset o <= horizon starts in the first ledger file whose last
offset is >= o, at the row group found through the offset statistics (a binary search,
as Pulsar's readCompacted does over entry IDs). Retention may have moved the raw log's
start past records the ledger still holds, so the view can start below the log start
(`view_start`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Generator
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from compactlog.errors import ConflictError, CorruptionError
from compactlog.storage.deletion import cached_deletion_vector, drop_deleted
from compactlog.storage.logfile import LogSegment
from compactlog.storage.manifest import LEDGER_DIR, SEGMENT_DIR, PartitionManifest, SegmentInfo
from compactlog.storage.records import Record
from compactlog.storage.sealed import (
    RECORD_COLUMNS,
    SegmentMissingError,
    record_bytes,
    records_to_table,
    table_to_records,
)

if TYPE_CHECKING:
    from compactlog.storage.partition import Partition, View

T = TypeVar("T")
READ_ATTEMPTS = 5
Part: TypeAlias = "pa.Table | list[Record]"
Tables: TypeAlias = Generator[pa.Table, None, None]


def with_view(partition: Partition, read: Callable[[View], T]) -> T:
    """Run `read` on one consistent view; again on a fresh one when a file it lists was
    deleted under it (and the manifest has moved on: else the file is truly missing)."""
    for _ in range(READ_ATTEMPTS):
        view = partition.view()
        try:
            return read(view)
        except SegmentMissingError:
            partition.refresh()
            if partition.manifest_version == view.version:
                raise
    raise ConflictError(f"{partition.name}: files kept changing under a read")


def view_start(manifest: PartitionManifest, compacted: bool) -> int:
    """The first offset a read of the view can serve (Fetch's log_start_offset): the raw
    log's start; for the compacted view the ledger's first offset when retention moved
    the raw log past it; never below what DeleteRecords deleted."""
    log_start = manifest.log_start_offset
    if not compacted or manifest.horizon is None or not manifest.ledger:
        return log_start
    return max(manifest.deleted_below, min(log_start, manifest.ledger[0].base_offset))


# -- table sources --------------------------------------------------------------------

def _file_tables(partition: Partition, path_dir: str, infos: tuple[SegmentInfo, ...],
                 offset: int, columns: list[str] | None,
                 check_holes: bool) -> Tables:
    start = bisect.bisect_left([info.last_offset for info in infos], offset)
    for info in infos[start:]:
        if check_holes:
            hole = info.missing_range_at(offset)
            if hole is not None:
                raise CorruptionError(
                    partition.volume.describe(f"{path_dir}/{info.file}"),
                    f"offsets {hole[0]}..{hole[1]} were lost to a corrupt range in the log "
                    "before this segment was sealed",
                )
        try:
            deleted = (cached_deletion_vector(_local(partition, path_dir, info.dv_file),
                                              info.dv_size_bytes, info.dv_crc32c)
                       if info.dv_file else None)
            path = _local(partition, path_dir, info.file)
            with partition.files.lease(path, info) as segment:
                for table in segment.iter_tables(offset, columns):
                    if table.num_rows:
                        offset = table.column("offset")[-1].as_py() + 1
                    yield drop_deleted(table, deleted)
        except CorruptionError as error:
            if not isinstance(error, SegmentMissingError):
                # On an object store the damage may be the downloaded copy's: the next
                # read downloads it again (and fails again if the object is damaged).
                partition.files.retire(partition.volume.path_of(f"{path_dir}/{info.file}"))
                for name in filter(None, (info.file, info.dv_file)):
                    partition.volume.evict(f"{path_dir}/{name}")
            raise


def _local(partition: Partition, path_dir: str, name: str) -> Path:
    """A local path of a data file (volume.py: on an object store a cached copy)."""
    return partition.data_path(f"{path_dir}/{name}")


def sealed_tables(partition: Partition, manifest: PartitionManifest, offset: int,
                  columns: list[str] | None = RECORD_COLUMNS) -> Tables:
    """The raw log's sealed row groups from the one holding `offset`, sliced to start there."""
    return _file_tables(partition, "segments", manifest.segments, offset, columns, True)


def ledger_tables(partition: Partition, manifest: PartitionManifest, offset: int,
                  columns: list[str] | None = RECORD_COLUMNS) -> Tables:
    """The ledger's row groups from the one holding `offset`, sliced to start there.

    On a `compact,delete` topic, records older than retention.ms leave the compacted view
    at once, here, not only at the next compaction (which drops them for good): Kafka's
    retention deletes old records on time alone, whether or not new records arrive.
    """
    tables = _file_tables(partition, "ledger", manifest.ledger, offset, columns, False)
    cutoff = expiry_cutoff_ms(partition)
    if cutoff is None:
        return tables
    return _unexpired(tables, cutoff)


def expiry_cutoff_ms(partition: Partition) -> int | None:
    """Records older than this leave the compacted view (compact,delete topics only)."""
    config = partition.config
    retention_ms: int = config["retention.ms"]
    if retention_ms < 0 or "delete" not in config.cleanup_policy.split(","):
        return None
    return partition.now_ms() - retention_ms


def _unexpired(tables: Tables, cutoff: int) -> Tables:
    with closing(tables):
        for table in tables:
            timestamps = table.column("timestamp")
            if table.num_rows and pc.min(timestamps).as_py() < cutoff:
                table = table.filter(pc.greater_equal(timestamps, cutoff))
            yield table


# -- bounded reads of records ---------------------------------------------------------

class TableRead:
    """One bounded read over a view: parts (Arrow tables from Parquet, record lists from
    log segments) within max_records and about max_bytes."""

    def __init__(self, partition: Partition, view: View, max_records: int,
                 max_bytes: int) -> None:
        self.partition = partition
        self.view = view
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.parts: list[Part] = []
        self.count = 0
        self.taken = 0

    @property
    def full(self) -> bool:
        return self.count >= self.max_records or (self.count > 0 and self.taken >= self.max_bytes)

    def run(self, offset: int, compacted: bool) -> list[Part]:
        offset = max(offset, self.view.manifest.deleted_below)
        horizon = self.view.manifest.horizon if compacted else None
        if horizon is not None and offset <= horizon:
            self._ledger(offset)
            if self.full:
                return self.parts
            offset = horizon + 1
        try:
            self._raw(max(offset, self.view.manifest.log_start_offset))
        except CorruptionError:
            if self.count:
                return self.parts
            raise
        return self.parts

    def _take(self, table: pa.Table) -> tuple[pa.Table, bool]:
        """The rows of `table` that fit; True when the read is done after them."""
        wanted = table.slice(0, self.max_records - self.count)
        kept = trim_to_bytes(wanted, self.max_bytes - self.taken)
        return kept, kept.num_rows < wanted.num_rows

    def _add(self, part: pa.Table) -> None:
        self.parts.append(part)
        self.count += part.num_rows
        self.taken += record_bytes(part)

    def _ledger(self, offset: int) -> None:
        tables = ledger_tables(self.partition, self.view.manifest, offset)
        with closing(tables):
            for table in tables:
                kept, done = self._take(table)
                if kept.num_rows:
                    self._add(kept)
                if done or self.full:
                    return

    def _raw(self, offset: int) -> None:
        expected = offset
        tables = sealed_tables(self.partition, self.view.manifest, offset)
        with closing(tables):
            for table in tables:
                if not table.num_rows:
                    continue
                kept, done = self._take(table)
                dense = _dense_prefix(kept, expected)
                if dense.num_rows:
                    self._add(dense)
                    expected += dense.num_rows
                if dense.num_rows < kept.num_rows:
                    self._gap(expected)
                    return
                # Stop before the generator reads another row group that would go unused.
                if done or self.full:
                    return
        self._logs(expected)

    def _logs(self, expected: int) -> None:
        for segment in self.view.logs:
            if self.full:
                return
            if segment.next_offset <= expected:
                continue
            more = segment.read(expected, self.max_records - self.count,
                                max(self.max_bytes - self.taken, 1))
            more = [record for record in more if record.offset < self.view.high_watermark]
            if not more:
                continue
            if more[0].offset != expected:
                self._gap(expected)
                return
            self.parts.append(more)
            self.count += len(more)
            self.taken += sum(16 + len(r.key or b"") + len(r.value or b"") for r in more)
            expected = more[-1].offset + 1
            if expected < segment.next_offset and not self.full:
                return  # the segment stopped before a corrupt range (or the view's end)

    def _gap(self, expected: int) -> None:
        if not self.count:
            raise CorruptionError(
                self.partition.directory, f"offset {expected} is missing from the log"
            )


def read_parts(partition: Partition, offset: int, max_records: int, max_bytes: int,
               compacted: bool) -> list[Part]:
    return with_view(partition, lambda view: TableRead(
        partition, view, max_records, max_bytes).run(offset, compacted))


def read_records(partition: Partition, offset: int, max_records: int, max_bytes: int,
                 compacted: bool) -> list[Record]:
    """Records from `offset` on, in offset order: at least one when any exists at or
    after `offset`, then up to max_records and about max_bytes. Offsets below the view's
    start are served from its start, as a consumer resetting to earliest expects."""
    records: list[Record] = []
    for part in read_parts(partition, offset, max_records, max_bytes, compacted):
        records.extend(table_to_records(part) if isinstance(part, pa.Table) else part)
    return records


def read_table(partition: Partition, offset: int, max_records: int, max_bytes: int,
               compacted: bool) -> pa.Table:
    """As read_records, as one Arrow table (offset, timestamp, key, value, headers):
    sealed data comes straight from Parquet without building Python objects."""
    parts = [part if isinstance(part, pa.Table) else records_to_table(part)
             for part in read_parts(partition, offset, max_records, max_bytes, compacted)]
    return pa.concat_tables(parts) if parts else records_to_table([])


def read_ledger(partition: Partition, offset: int, max_records: int) -> list[Record]:
    """Records of the ledger alone (up to the horizon), from `offset`."""

    def read(view: View) -> list[Record]:
        tables = ledger_tables(partition, view.manifest, offset)
        records: list[Record] = []
        with closing(tables):
            for table in tables:
                records += table_to_records(table.slice(0, max_records - len(records)))
                if len(records) >= max_records:
                    break
        return records

    return with_view(partition, read)


def last_ledger_record(partition: Partition) -> Record | None:
    def read(view: View) -> Record | None:
        ledger = view.manifest.ledger
        if not ledger:
            return None
        last = ledger[-1]
        # With a DV the file's last row may be deleted; it holds a live one (a file
        # with none leaves the ledger).
        start = last.base_offset if last.dv_file else last.last_offset
        tables = ledger_tables(partition, view.manifest, start)
        with closing(tables):
            found = [table for table in tables if table.num_rows]
        if not found:
            return None
        table = found[-1]
        return table_to_records(table.slice(table.num_rows - 1))[-1]

    return with_view(partition, read)


def last_record(partition: Partition) -> Record | None:
    """The last record a compacted reader gets: the raw log's last record when it goes
    past the horizon, else the ledger's last (a tombstone, maybe)."""
    partition.refresh()
    view = partition.view()
    horizon = view.manifest.horizon
    end = view.high_watermark
    if horizon is None or end - 1 > horizon:
        if end <= view.manifest.log_start_offset:
            return None
        found = partition.read(end - 1, 1)
        return found[-1] if found else None
    return last_ledger_record(partition)


def offset_for_timestamp(partition: Partition, timestamp: int,
                         compacted: bool = False) -> int | None:
    """The first offset of the view whose record timestamp is >= `timestamp`."""

    def raw(view: View) -> int | None:
        manifest = view.manifest
        for info in manifest.segments:
            if info.max_timestamp >= timestamp and info.last_offset >= manifest.log_start_offset:
                path = _local(partition, SEGMENT_DIR, info.file)
                with partition.files.lease(path, info) as segment:
                    found = segment.offset_for_timestamp(timestamp)
                if found is not None and found >= manifest.log_start_offset:
                    return found
        for log_segment in view.logs:
            found = log_segment.offset_for_timestamp(timestamp)
            if found is not None and found < view.high_watermark:
                return found
        return None

    def ledger(view: View) -> int | None:
        deleted_below = view.manifest.deleted_below
        for info in view.manifest.ledger:
            if info.max_timestamp >= timestamp and info.last_offset >= deleted_below:
                if info.dv_file:  # the file's own index may find a deleted record
                    found = _first_at_or_after(partition, view, max(deleted_below,
                                                                    info.base_offset), timestamp)
                    if found is not None:
                        return found
                    continue
                path = _local(partition, LEDGER_DIR, info.file)
                with partition.files.lease(path, info) as segment:
                    found = segment.offset_for_timestamp(timestamp)
                if found is not None and found >= deleted_below:
                    return found
                if found is not None:  # below what DeleteRecords deleted: look on
                    return _first_at_or_after(partition, view, deleted_below, timestamp)
        return None

    if not compacted:
        return with_view(partition, raw)
    partition.refresh()
    found = with_view(partition, ledger)
    if found is not None:
        return found
    horizon = partition.manifest.horizon
    first = with_view(partition, raw)
    if first is None or horizon is None or first > horizon:
        return first
    # The first raw match is in the compacted range, where the ledger had none: look
    # again past the horizon.
    position = horizon + 1
    while chunk := partition.read(position, 10_000, 16 * 1024 * 1024):
        for record in chunk:
            if record.timestamp >= timestamp:
                return record.offset
        position = chunk[-1].offset + 1
    return None


# -- helpers --------------------------------------------------------------------------

def _first_at_or_after(partition: Partition, view: View, offset: int,
                       timestamp: int) -> int | None:
    """The first ledger record at or after `offset` whose timestamp is >= `timestamp`."""
    tables = ledger_tables(partition, view.manifest, offset, ["offset", "timestamp"])
    with closing(tables):
        for table in tables:
            matches = np.flatnonzero(table.column("timestamp").to_numpy() >= timestamp)
            if matches.size:
                return int(table.column("offset")[int(matches[0])].as_py())
    return None


def trim_to_bytes(table: pa.Table, budget: int) -> pa.Table:
    """Keep rows while the running size stays within `budget`, but always the first row."""
    if table.num_rows <= 1 or record_bytes(table) <= budget:
        return table
    low, high = 1, table.num_rows
    while low < high:
        middle = (low + high + 1) // 2
        if record_bytes(table.slice(0, middle)) <= budget:
            low = middle
        else:
            high = middle - 1
    return table.slice(0, low)


def _dense_prefix(table: pa.Table, expected: int) -> pa.Table:
    """The leading rows of `table` whose offsets run expected, expected + 1, ..."""
    offsets = table.column("offset")
    rows = table.num_rows
    if not rows or offsets[0].as_py() != expected:
        return table.slice(0, 0)
    if offsets[rows - 1].as_py() == expected + rows - 1:
        return table  # sorted and unique, so first and last prove it dense
    gaps = np.flatnonzero(offsets.to_numpy() != np.arange(expected, expected + rows))
    return table.slice(0, int(gaps[0]))


__all__ = ["LogSegment", "TableRead", "ledger_tables", "read_records", "read_table",
           "sealed_tables", "view_start", "with_view"]
