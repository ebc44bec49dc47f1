"""Ledger files: the compacted view's Parquet files, and phase 2 that writes them.

A ledger file has the sealed-segment schema (storage/sealed.py) plus one column,
`tombstone_since_ms`: for a tombstone, when the compaction that first kept it ran
(delete.retention.ms counts from there, as Kafka's cleaner counts from its first pass);
null for other records. Files hold surviving records with their original offsets, in
offset order, and carry the same offset statistics as sealed segments, so a reader
seeks in them the same way.

Phase 2 (`write_ledger_piece`) is plain pyarrow so that any engine can run it: the
Spark pipeline runs one call per output file inside a Spark task, next to the data,
and values never cross the cluster. It reads its input files a row group at a time,
keeps the rows whose offsets phase 1 chose, applies tombstone retention, the null-key
policy and (for compact,delete) time retention, and writes one ledger file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compactlog import fsutil
from compactlog.compaction.io_throttle import observe_growth, observe_row_group
from compactlog.compaction.verified import remember, verify_input
from compactlog.storage import (
    SCHEMA,
    SegmentInfo,
    deleted_mask,
    file_crc32c,
    open_writer,
    read_deletion_vector,
)

LEDGER_SCHEMA = SCHEMA.append(pa.field("tombstone_since_ms", pa.int64()))


@dataclass(frozen=True)
class TombstoneRules:
    """How one partition's phase 2 treats tombstones, null keys and old records."""

    now_ms: int
    delete_retention_ms: int
    empty_value_is_tombstone: bool
    null_key_policy: str  # reject | drop | keep (reject: records from before the switch drop)
    retention_ms: int  # >= 0 only for compact,delete: older records leave the view
    deleted_below: int = 0  # DeleteRecords: no record below this offset is kept


@dataclass(frozen=True)
class PieceInput:
    """One file that phase 2 reads: a previous ledger file or a dirty sealed segment."""

    path: str
    is_ledger: bool
    # What the manifest says of the file; checked before it is read, as the store's
    # reader does, so that damage outside the checksummed pages cannot slip through.
    size_bytes: int | None = None
    crc32c: int | None = None
    # A ledger file's deletion vector (storage/deletion.py): its rows are not input.
    dv_path: str | None = None
    dv_size_bytes: int = 0
    dv_crc32c: int | None = None
    # Rows below this offset are not input either (plan.InputFile.from_offset).
    from_offset: int = 0
    # A ledger file adopted from a sealed segment (SegmentInfo.adopted_at_ms): it has no
    # tombstone_since_ms column, and its tombstones were kept at this instant.
    adopted_at_ms: int | None = None

    def verify(self) -> None:
        # Remembered per process (compaction/verified.py): ledger files are immutable.
        verify_input(Path(self.path), self.size_bytes, self.crc32c, "compaction input")

    def deleted(self) -> np.ndarray | None:
        """The offsets this file's deletion vector deletes (None: it has none)."""
        if self.dv_path is None:
            return None
        return read_deletion_vector(Path(self.dv_path), self.dv_size_bytes, self.dv_crc32c)

    @classmethod
    def of(cls, path: Path, is_ledger: bool, info: SegmentInfo,
           checksum: bool = True, from_offset: int = 0) -> PieceInput:
        """The input `path` described by its manifest entry `info` (its CRC32C is not
        checked again when `checksum` is False: the caller proved the file whole)."""
        dv = str(path.parent / info.dv_file) if info.dv_file else None
        return cls(str(path), is_ledger, info.size_bytes, info.crc32c if checksum else None,
                   dv, info.dv_size_bytes, info.dv_crc32c, from_offset, info.adopted_at_ms)

    def not_input(self, offsets: np.ndarray, deleted: np.ndarray | None) -> np.ndarray | None:
        """Which of a row group's `offsets` are not input (its DV's, `deleted`, and those
        below from_offset); None when every one is input."""
        gone = (deleted_mask(offsets, deleted)
                if deleted is not None and len(deleted) else None)
        if self.from_offset and len(offsets) and offsets[0] < self.from_offset:
            below = offsets < self.from_offset
            gone = below if gone is None else gone | below
        return gone


@dataclass(frozen=True)
class PieceResult:
    """What one phase-2 call wrote (info is None when nothing survived)."""

    info: SegmentInfo | None
    records_in: int
    bytes_in: int
    records_out: int
    tombstones_kept: int
    tombstones_removed: int
    null_keys_removed: int
    expired_removed: int
    oldest_tombstone_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        body["info"] = None if self.info is None else asdict(self.info)
        return body

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> PieceResult:
        fields = dict(body)
        info = fields.pop("info")
        return cls(info=None if info is None else SegmentInfo.from_json(info), **fields)


def ledger_file_name(run_id: str, sequence: int, base_offset: int) -> str:
    return f"{base_offset:020d}-{run_id}-{sequence:05d}.parquet"


def is_tombstone_mask(table: pa.Table, empty_value_is_tombstone: bool) -> pa.Array:
    """Per row, whether it is a tombstone: never null, so numpy can combine it."""
    value = table.column("value")
    tombstone = pc.is_null(value)
    if empty_value_is_tombstone:
        # A null value's length is null: `or_` would make its row's mask null (and numpy
        # would then see None), where Kleene logic gives true OR null = true.
        tombstone = pc.or_kleene(tombstone, pc.equal(pc.binary_length(value), 0))
    return tombstone


def _row_groups(path: str, page_checksums: bool = True) -> Iterator[pa.Table]:
    handle = pq.ParquetFile(path, page_checksum_verification=page_checksums)
    try:
        for index in range(handle.metadata.num_row_groups):
            group = handle.read_row_group(index)
            observe_row_group(handle.metadata, index)
            yield group
    finally:
        handle.close()  # at once, not when the collector finds it (bounded open files)


def _as_ledger_table(table: pa.Table, adopted_at_ms: int | None) -> pa.Table:
    """A row group of a segment or ledger file with the ledger's columns: a segment's
    rows were never kept (null); an adopted file's tombstones of then, its keys' null
    values, were kept at `adopted_at_ms` (an empty value that is a tombstone now was
    not one then: null, so _filter_group counts it from this run)."""
    if "tombstone_since_ms" not in table.column_names:
        since = pa.nulls(table.num_rows, type=pa.int64())
        if adopted_at_ms is not None:
            was_tombstone = pc.and_(pc.is_null(table.column("value")),
                                    pc.is_valid(table.column("key")))
            since = pc.if_else(was_tombstone, pa.scalar(adopted_at_ms, pa.int64()), since)
        table = table.append_column("tombstone_since_ms", since)
    return table.select(LEDGER_SCHEMA.names).cast(LEDGER_SCHEMA)


def write_ledger_piece(
    inputs: list[PieceInput],
    survivors: np.ndarray,
    rules: TombstoneRules,
    out_dir: Path,
    file_name: str,
    compression: str = "zstd",
    row_group_bytes: int = 4 * 1024 * 1024,
    page_checksums: bool = True,
) -> PieceResult:
    """Copy the surviving rows of `inputs` into one ledger file, in offset order.

    `survivors` is the sorted int64 array of surviving offsets that phase 1 chose for
    this piece's offset range (tombstones included). Rows with null keys are not in it:
    they follow the null-key policy. `page_checksums=False` is for a caller that has just
    proven every input whole against its manifest CRC32C: the page CRCs add nothing then.
    """
    counts: dict[str, int] = dict.fromkeys(
        ("records_in", "bytes_in", "records_out", "tombstones_kept", "tombstones_removed",
         "null_keys_removed", "expired_removed"), 0,
    )
    temp = fsutil.temp_path(out_dir, file_name)
    writer: pq.ParquetWriter | None = None
    pending: list[pa.Table] = []
    pending_bytes = 0
    written = 0  # bytes of `temp` reported to the I/O throttle so far
    base_offset = last_offset = -1
    min_ts, max_ts = 2**63 - 1, -(2**63)
    try:
        for source in inputs:
            source.verify()
            deleted = source.deleted()
            counts["bytes_in"] += os.stat(source.path).st_size
            for group in _row_groups(source.path, page_checksums):
                # The DV's rows leave with the rest in _filter_group's one filter: every
                # column is copied once, not once for the DV and again for the survivors.
                gone = source.not_input(group.column("offset").to_numpy(), deleted)
                counts["records_in"] += group.num_rows - (0 if gone is None else int(gone.sum()))
                kept = _filter_group(_as_ledger_table(group, source.adopted_at_ms), survivors,
                                     rules, counts, gone, source.is_ledger)
                if not kept.num_rows:
                    continue
                offsets = kept.column("offset")
                if base_offset < 0:
                    base_offset = offsets[0].as_py()
                last_offset = offsets[-1].as_py()
                timestamps = kept.column("timestamp")
                min_ts = min(min_ts, pc.min(timestamps).as_py())
                max_ts = max(max_ts, pc.max(timestamps).as_py())
                counts["records_out"] += kept.num_rows
                pending.append(kept)
                pending_bytes += kept.nbytes
                if pending_bytes >= row_group_bytes:
                    writer = writer or open_writer(temp, LEDGER_SCHEMA, compression,
                                                   key_dictionary=False)
                    writer.write_table(pa.concat_tables(pending))
                    written = observe_growth(temp, written)
                    pending, pending_bytes = [], 0
        if pending:
            writer = writer or open_writer(temp, LEDGER_SCHEMA, compression,
                                           key_dictionary=False)
            writer.write_table(pa.concat_tables(pending))
        if writer is None:
            return PieceResult(None, **counts)
        oldest = counts.pop("oldest_tombstone_ms", None)
        writer.close()
        writer = None
        observe_growth(temp, written)
        fsutil.fsync_path(temp)
        final = out_dir / file_name
        fsutil.publish_replace(temp, final)
    except BaseException:
        if writer is not None:
            writer.close()
        temp.unlink(missing_ok=True)
        raise
    checksum = file_crc32c(final)
    remember(final, checksum)
    info = SegmentInfo(
        file=file_name,
        base_offset=base_offset,
        last_offset=last_offset,
        record_count=counts["records_out"],
        size_bytes=final.stat().st_size,
        min_timestamp=min_ts,
        max_timestamp=max_ts,
        sealed_at_ms=int(time.time() * 1000),
        crc32c=checksum,
    )
    return PieceResult(info, **counts, oldest_tombstone_ms=oldest)


def rows_kept(
    offsets: np.ndarray, null_key: np.ndarray, tombstone: np.ndarray, since: np.ndarray,
    timestamps: np.ndarray | None, survivors: np.ndarray, rules: TombstoneRules,
    counts: dict[str, int], gone: np.ndarray | None = None, is_ledger: bool = False,
) -> np.ndarray:
    """Per row of a file's row group, whether it stays in the view (phase 2's rules), its
    removals counted into `counts`. The row group is given by its columns: `offsets`,
    `null_key` (its key is null), `tombstone` (a key's null value, or an empty one under
    empty.value.is.tombstone), `since` (tombstone_since_ms, rules.now_ms where unset),
    `timestamps` (needed only on compact,delete). `gone` marks rows that are not input
    (a deletion vector took them out before, or they lie below the input's
    from_offset): neither kept nor counted. `is_ledger`: the rows are a ledger file's."""
    chosen = deleted_mask(offsets, survivors)  # "is in the sorted array", whatever it holds
    if gone is not None:  # not input: every mask below starts without them
        chosen &= ~gone
        null_key = null_key & ~gone
    keep: np.ndarray
    if rules.null_key_policy == "keep":
        keep = chosen | null_key
    else:
        keep = chosen & ~null_key
        counts["null_keys_removed"] += int(null_key.sum())
    expired_tombstone = tombstone & (rules.now_ms - since >= rules.delete_retention_ms)
    counts["tombstones_removed"] += int((keep & expired_tombstone).sum())
    keep &= ~expired_tombstone
    if rules.retention_ms >= 0:
        assert timestamps is not None, "compact,delete reads the timestamps"
        too_old = timestamps < rules.now_ms - rules.retention_ms
        counts["expired_removed"] += int((keep & too_old).sum())
        keep &= ~too_old
    if rules.deleted_below:
        # Counted with retention: both take records out of the view by their position.
        # Phase 1 never sees a row below the cut (it is not in the view), so none is
        # chosen; a ledger row there was in the view until DeleteRecords took it out.
        deleted = offsets < rules.deleted_below
        was_in_view = keep | (~null_key if is_ledger else np.zeros(len(offsets), bool))
        if gone is not None:
            was_in_view &= ~gone
        counts["expired_removed"] += int((was_in_view & deleted).sum())
        keep &= ~deleted
    counts["tombstones_kept"] += int((keep & tombstone).sum())
    return keep


def _filter_group(
    table: pa.Table, survivors: np.ndarray, rules: TombstoneRules, counts: dict[str, int],
    gone: np.ndarray | None = None, is_ledger: bool = False,
) -> pa.Table:
    """The rows of `table` (a row group of a ledger file when `is_ledger`) that stay in
    the view (`rows_kept`), with tombstone_since_ms set on exactly the kept tombstones."""
    null_key = pc.is_null(table.column("key")).to_numpy(zero_copy_only=False)
    # A null-key record deletes no key, so it is never a tombstone: `keep` passes it on.
    tombstone = is_tombstone_mask(table, rules.empty_value_is_tombstone).to_numpy(
        zero_copy_only=False
    ) & ~null_key
    keep = rows_kept(
        table.column("offset").to_numpy(), null_key, tombstone,
        table.column("tombstone_since_ms").fill_null(rules.now_ms).to_numpy(),
        table.column("timestamp").to_numpy() if rules.retention_ms >= 0 else None,
        survivors, rules, counts, gone, is_ledger)
    kept = table.filter(pa.array(keep))
    if not kept.num_rows:
        return kept
    # A tombstone kept for the first time starts its retention now.
    kept_tombstone = pc.and_(
        is_tombstone_mask(kept, rules.empty_value_is_tombstone),
        pc.is_valid(kept.column("key")),
    )
    since_col = pc.if_else(
        kept_tombstone,
        kept.column("tombstone_since_ms").fill_null(rules.now_ms),
        pa.nulls(kept.num_rows, pa.int64()),
    )
    oldest = pc.min(since_col).as_py()
    if oldest is not None:
        previous = counts.get("oldest_tombstone_ms")
        counts["oldest_tombstone_ms"] = oldest if previous is None else min(previous, oldest)
    return kept.set_column(
        kept.schema.get_field_index("tombstone_since_ms"), "tombstone_since_ms", since_col
    )
