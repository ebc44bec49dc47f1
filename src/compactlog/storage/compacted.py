"""Reads of a partition's compacted view: the ledger up to the horizon, then the raw log.

The manifest's `compaction` entry holds the (horizon, ledger) pair:
  {"horizon": H, "ledger": [SegmentInfo...], "oldest_tombstone_ms": ..., ...}
Ledger files are Parquet files in `ledger/` with the sealed-segment schema (plus
`tombstone_since_ms`), holding the surviving records of offsets <= H with their
original offsets, in offset order. A read from offset o <= H starts in the first
ledger file whose last offset is >= o, at the row group found through the offset
statistics (a binary search, as Pulsar's readCompacted does over entry IDs), and
continues at H + 1 in the raw log. Offsets in the ledger have gaps: they are the
offsets of the records that survived.

The pair is read from one manifest version, so a read never mixes two compactions. A
ledger file deleted under a read (a newer compaction committed in another process)
makes the read reload the manifest and start again.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from compactlog.errors import CorruptionError
from compactlog.storage.manifest import PartitionManifest, SegmentInfo
from compactlog.storage.records import Record
from compactlog.storage.sealed import (
    RECORD_COLUMNS,
    SealedSegment,
    SegmentMissingError,
    record_bytes,
    records_to_table,
    table_to_records,
)

if TYPE_CHECKING:
    from compactlog.storage.partition import Partition


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

LEDGER_DIR = "ledger"
READ_ATTEMPTS = 5


def horizon_of(manifest: PartitionManifest) -> int | None:
    horizon = (manifest.compaction or {}).get("horizon")
    return None if horizon is None else int(horizon)


def ledger_infos(manifest: PartitionManifest) -> list[SegmentInfo]:
    return [SegmentInfo.from_json(info) for info in (manifest.compaction or {}).get("ledger", [])]


class CompactedView:
    """The compacted view of one partition."""

    def __init__(self, partition: Partition) -> None:
        self.partition = partition
        self._files: dict[str, SealedSegment] = {}

    def _ledger_file(self, info: SegmentInfo) -> SealedSegment:
        segment = self._files.get(info.file)
        if segment is None:
            segment = SealedSegment(self.partition.directory / LEDGER_DIR / info.file, info)
            self._files[info.file] = segment
        return segment

    def horizon(self) -> int | None:
        return horizon_of(self.partition.manifest)

    def read(self, offset: int, max_records: int, max_bytes: int) -> list[Record]:
        records: list[Record] = []
        for part in self._parts(offset, max_records, max_bytes, ledger_only=False):
            records.extend(table_to_records(part) if isinstance(part, pa.Table) else part)
        return records

    def read_table(self, offset: int, max_records: int, max_bytes: int) -> pa.Table:
        parts = [
            part if isinstance(part, pa.Table) else records_to_table(part)
            for part in self._parts(offset, max_records, max_bytes, ledger_only=False)
        ]
        return pa.concat_tables(parts) if parts else records_to_table([])

    def read_ledger(self, offset: int, max_records: int) -> list[Record]:
        records: list[Record] = []
        for part in self._parts(offset, max_records, 2**62, ledger_only=True):
            records.extend(table_to_records(part) if isinstance(part, pa.Table) else part)
        return records

    def last_ledger_record(self) -> Record | None:
        for _ in range(READ_ATTEMPTS):
            manifest, version = self._snapshot()
            infos = ledger_infos(manifest)
            if not infos:
                return None
            last = infos[-1]
            try:
                tables = list(self._ledger_file(last).iter_tables(last.last_offset,
                                                                  RECORD_COLUMNS))
            except SegmentMissingError:
                self.partition.refresh()
                if self.partition.manifest_version == version:
                    raise
                continue
            table = tables[-1]
            return table_to_records(table.slice(table.num_rows - 1))[-1]
        raise CorruptionError(self.partition.directory / LEDGER_DIR, "ledger kept changing")

    def last_record(self) -> Record | None:
        """The last record a compacted reader gets: the raw log's last record when it
        goes past the horizon, else the ledger's last (a tombstone, maybe)."""
        self.partition.refresh()
        manifest = self.partition.manifest
        horizon = horizon_of(manifest)
        end = self.partition.log_end_offset
        if horizon is None or end - 1 > horizon:
            if end <= self.partition.log_start_offset:
                return None
            found = self.partition.read(end - 1, 1)
            return found[-1] if found else None
        return self.last_ledger_record()

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset of the view whose record timestamp is >= `timestamp`."""
        self.partition.refresh()
        manifest = self.partition.manifest
        horizon = horizon_of(manifest)
        for info in ledger_infos(manifest):
            if info.max_timestamp >= timestamp:
                found = self._ledger_file(info).offset_for_timestamp(timestamp)
                if found is not None:
                    return found
        raw = self.partition.offset_for_timestamp(timestamp)
        if raw is not None and horizon is not None and raw <= horizon:
            # The first raw match is in the compacted range, where the ledger had none:
            # look again past the horizon.
            position = horizon + 1
            while chunk := self.partition.read(position, 10_000, 16 * 1024 * 1024):
                for record in chunk:
                    if record.timestamp >= timestamp:
                        return record.offset
                position = chunk[-1].offset + 1
            return None
        return raw

    # -- internals --------------------------------------------------------------------

    def _snapshot(self) -> tuple[PartitionManifest, int]:
        partition = self.partition
        return partition.manifest, partition.manifest_version

    def _parts(
        self, offset: int, max_records: int, max_bytes: int, ledger_only: bool
    ) -> list[pa.Table | list[Record]]:
        for _ in range(READ_ATTEMPTS):
            manifest, version = self._snapshot()
            try:
                return self._parts_of(manifest, offset, max_records, max_bytes, ledger_only)
            except SegmentMissingError:
                self.partition.refresh()
                if self.partition.manifest_version == version:
                    raise
        raise CorruptionError(self.partition.directory / LEDGER_DIR, "ledger kept changing")

    def _parts_of(
        self,
        manifest: PartitionManifest,
        offset: int,
        max_records: int,
        max_bytes: int,
        ledger_only: bool,
    ) -> list[pa.Table | list[Record]]:
        horizon = horizon_of(manifest)
        if horizon is None or offset > horizon:
            if ledger_only:
                return []
            return self.partition._read_parts(offset, max_records, max_bytes)
        parts: list[pa.Table | list[Record]] = []
        count = taken = 0
        for table in self._ledger_tables(manifest, offset):
            wanted = table.slice(0, max_records - count)
            kept = trim_to_bytes(wanted, max_bytes - taken)
            if not kept.num_rows:
                continue
            parts.append(kept)
            count += kept.num_rows
            taken += record_bytes(kept)
            if count >= max_records or taken >= max_bytes or kept.num_rows < wanted.num_rows:
                return parts
        if ledger_only:
            return parts
        try:
            parts += self.partition._read_parts(horizon + 1, max_records - count,
                                                max(max_bytes - taken, 1))
        except CorruptionError:
            if not parts:
                raise
        return parts

    def _ledger_tables(self, manifest: PartitionManifest, offset: int) -> Iterator[pa.Table]:
        infos = ledger_infos(manifest)
        start = bisect.bisect_left([info.last_offset for info in infos], offset)
        for info in infos[start:]:
            yield from self._ledger_file(info).iter_tables(offset, RECORD_COLUMNS)
