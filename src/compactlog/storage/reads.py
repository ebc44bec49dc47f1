"""Reads of a partition, raw or compacted: the one read path of the store.

Invariant: a read sees one view of the partition (a manifest and the log segments that
went with it, `Partition.view`), never a mix of two; it holds a lease on each Parquet
file while it reads it (filecache.py), so no file closes under it; and if a file that
its view lists is gone (a newer manifest retired it and the sweep deleted it, here or in
another process), `with_view` reads again from a fresh view. Every reader (records,
Arrow tables, the server's wire batches in server/protocol/record_batches.py, the
compacted view) goes through `with_view` and the table sources below.

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
start past records the ledger still holds, so the view can start below the log start.

Which files, offsets and rows a view holds (deletion vectors, DeleteRecords, retention
on compact,delete, tombstone retention, the high watermark) is decided in one place,
view_rows.py; the readers here apply it and decide nothing themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from contextlib import closing
from dataclasses import replace
from typing import TYPE_CHECKING, TypeAlias, TypeVar

import numpy as np
import pyarrow as pa

from compactlog.errors import ConflictError, CorruptionError
from compactlog.storage.deletion import cached_deletion_vector
from compactlog.storage.logfile import LogSegment
from compactlog.storage.records import Record
from compactlog.storage.sealed import (
    RECORD_COLUMNS,
    SegmentMissingError,
    record_bytes,
    records_to_table,
    table_to_records,
)
from compactlog.storage.view_rows import FileRows, PartitionRows, rows_of, upper_bound

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


# -- table sources --------------------------------------------------------------------

def _file_tables(partition: Partition, files: Iterable[FileRows],
                 columns: list[str] | None) -> Tables:
    """The rows of `files` in the view (view_rows.py), row group by row group, with
    `columns` (None: all of the file's)."""
    for rows in files:
        info = rows.info
        begin = rows.first_offset
        if not rows.is_ledger:
            hole = info.missing_range_at(begin)
            if hole is not None:
                raise CorruptionError(
                    partition.volume.describe(rows.relative),
                    f"offsets {hole[0]}..{hole[1]} were lost to a corrupt range in the log "
                    "before this segment was sealed",
                )
        # The condition's own columns are read too, and dropped once it is applied.
        wanted = columns
        if columns is not None and not set(rows.condition.columns) <= set(columns):
            wanted = columns + [c for c in rows.condition.columns if c not in columns]
        end = rows.condition.end_offset
        try:
            deleted = (cached_deletion_vector(partition.data_path(rows.dv_relative),
                                              info.dv_size_bytes, info.dv_crc32c)
                       if rows.dv_relative else None)
            path = partition.data_path(rows.relative)
            with partition.files.lease(path, info) as segment:
                for table in segment.iter_tables(begin, wanted):
                    past_end = (end is not None and table.num_rows > 0
                                and table.column("offset")[-1].as_py() >= end - 1)
                    kept = rows.keep(table, deleted)
                    yield kept if wanted is columns else kept.select(columns)
                    if past_end:
                        return  # the files after this one are past the end too
        except CorruptionError as error:
            if not isinstance(error, SegmentMissingError):
                # On an object store the damage may be the downloaded copy's: the next
                # read downloads it again (and fails again if the object is damaged).
                partition.files.retire(partition.volume.path_of(rows.relative))
                for relative in filter(None, (rows.relative, rows.dv_relative)):
                    partition.volume.evict(relative)
            raise


def sealed_tables(partition: Partition, rows: PartitionRows,
                  columns: list[str] | None = RECORD_COLUMNS) -> Tables:
    """The raw part's sealed rows of `rows`, from its first offset on."""
    return _file_tables(partition, rows.segments(), columns)


def ledger_tables(partition: Partition, rows: PartitionRows,
                  columns: list[str] | None = RECORD_COLUMNS) -> Tables:
    """The ledger's rows in the view `rows` (deletion vectors, DeleteRecords, retention
    on compact,delete and tombstone retention applied: view_rows.py)."""
    return _file_tables(partition, rows.ledger(), columns)


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
        rows = rows_of(self.partition, self.view, compacted, offset)
        if rows.horizon is not None and offset <= rows.horizon:
            self._ledger(rows)
            if self.full:
                return self.parts
        try:
            self._raw(rows)
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

    def _ledger(self, rows: PartitionRows) -> None:
        tables = ledger_tables(self.partition, rows)
        with closing(tables):
            for table in tables:
                kept, done = self._take(table)
                if kept.num_rows:
                    self._add(kept)
                if done or self.full:
                    return

    def _raw(self, rows: PartitionRows) -> None:
        expected = rows.raw_start
        tables = sealed_tables(self.partition, rows)
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
        self._logs(expected, rows.end)

    def _logs(self, expected: int, end: int) -> None:
        for segment in self.view.logs:
            if self.full:
                return
            if segment.next_offset <= expected:
                continue
            more = segment.read(expected, self.max_records - self.count,
                                max(self.max_bytes - self.taken, 1))
            more = [record for record in more if record.offset < end]
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
        tables = ledger_tables(partition, rows_of(partition, view, True, offset))
        records: list[Record] = []
        with closing(tables):
            for table in tables:
                records += table_to_records(table.slice(0, max_records - len(records)))
                if len(records) >= max_records:
                    break
        return records

    return with_view(partition, read)


def last_ledger_record(partition: Partition) -> Record | None:
    """The ledger's last record in the view, looking back file by file: the last file's
    last rows may have left it (a DV, a tombstone's or retention's time)."""

    def read(view: View) -> Record | None:
        rows = rows_of(partition, view, True)
        for file in reversed(tuple(rows.ledger())):
            # A whole file's last row is in the view: read its last row group only.
            start = file.info.last_offset if file.is_whole else file.first_offset
            tables = _file_tables(partition, (_from(file, start),), RECORD_COLUMNS)
            with closing(tables):
                found = [table for table in tables if table.num_rows]
            if found:
                return table_to_records(found[-1].slice(found[-1].num_rows - 1))[-1]
        return None

    return with_view(partition, read)


def _from(file: FileRows, offset: int) -> FileRows:
    """`file` read from `offset` on."""
    condition = replace(file.condition, min_offset=max(offset, file.first_offset))
    return replace(file, condition=condition)


def last_record(partition: Partition) -> Record | None:
    """The last record a compacted reader gets: the raw log's last record when it goes
    past the horizon, else the ledger's last (a tombstone, maybe)."""
    partition.refresh()
    view = partition.view()
    horizon = view.manifest.horizon
    end = upper_bound(view)
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
        rows = rows_of(partition, view, False)
        for file in rows.segments():
            if file.info.max_timestamp >= timestamp:
                found = _first_in_file(partition, file, timestamp)
                if found is not None:
                    return found
        for log_segment in view.logs:
            found = log_segment.offset_for_timestamp(timestamp)
            if found is not None and rows.raw_start <= found < rows.end:
                return found
        return None

    def ledger(view: View) -> int | None:
        for file in rows_of(partition, view, True).ledger():
            if file.info.max_timestamp >= timestamp:
                found = _first_in_file(partition, file, timestamp)
                if found is not None:
                    return found
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

def _first_in_file(partition: Partition, file: FileRows, timestamp: int) -> int | None:
    """The first offset of `file`'s rows in the view whose timestamp is >= `timestamp`."""
    if file.is_whole:
        # Every row is in the view: the file's row-group statistics find it.
        with partition.files.lease(partition.data_path(file.relative), file.info) as segment:
            return segment.offset_for_timestamp(timestamp)
    tables = _file_tables(partition, (file,), ["offset", "timestamp"])
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
           "sealed_tables", "with_view"]
