"""Adopting a dirty sealed segment into the ledger as it is, so that an incremental run's
cost follows its new data: the new survivors are never decoded and encoded again.

Invariant: an adopted file's rows in the view are exactly the rows that phase 2 would
have copied from the segment into a new ledger file (ledger.rows_kept, the rules for a
dirty segment), with the same tombstone_since_ms: each row phase 2 would leave out is in
the file's deletion vector, and each tombstone kept counts from this run's now, which
the file's ledger entry records (SegmentInfo.adopted_at_ms) in place of the column a
segment lacks. Every reader and every later run reads that instant from the entry
(storage/view_rows.py RowCondition.trimmed, compaction/incremental.py, ledger.py).

The file's bytes are the segment's. On a local disk it is a hard link in ledger/ to the
segment (the same inode: nothing is copied; a copy where links are impossible). On an
object store the store copies the segment's object within the bucket (remote_files.py,
step 3: CopyObject, nothing sent but the request). Either way the
ledger entry names a file of ledger/ like every other, so retention, merges and the
sweep of segments/ never see it, and deleting the segment leaves it whole.

When (`adoptable`): with compaction.deletion.vectors, a dirty segment of at least
compaction.segment.adopt.min.bytes (smaller ones are copied as before: adopting them
would multiply the ledger's files), without a lost range, wholly above the old horizon,
of which phase 1 chose at least compaction.segment.adopt.live.fraction of the rows (0.9:
an adopted file keeps its dead rows' bytes, and every later run reads their keys, until
it is rewritten), and never less than compaction.ledger.rewrite.live.fraction, the share
below which a ledger file is rewritten rather than kept with a DV (incremental.py), so
that the next run does not rewrite it at once.

Steps of `adopt` (tests/compaction/test_adoption.py):
  1. read the segment's narrow columns: offset and value_size; timestamp on
     compact,delete; the key only when its statistics say it may be null;
  2. the rows that stay, by ledger.rows_kept; below the live fraction, give up: phase 2
     copies the segment as before;
  3. write the DV of the others, if any, under a name that carries the run id;
  4. link the segment into the output directory under a ledger name that carries the
     run id, through a temporary name and an atomic rename (a retried task replaces its
     own output with the same bytes).
Nothing is committed here: the runner's step 5 lists the file with its DV, or the run's
closing sweep deletes both as orphans (storage/sweep.py).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compactlog import faults, fsutil
from compactlog.compaction.io_throttle import observe_growth, observe_row_group
from compactlog.compaction.ledger import PieceResult, TombstoneRules, rows_kept
from compactlog.compaction.plan import InputFile, wholly_cut
from compactlog.storage import dv_file_name, tombstones_by_size, write_deletion_vector


def adoptable(item: InputFile, survivors: np.ndarray, min_bytes: int,
              live_fraction: float, deleted_below: int) -> bool:
    """Whether the dirty segment `item` may be adopted (see the module), judged without
    reading it: phase 1's survivors in its range bound its live rows from above."""
    info = item.info
    if (item.is_ledger or min_bytes < 0 or info.size_bytes < min_bytes or item.from_offset
            or info.missing or wholly_cut(info, deleted_below)):
        return False
    low, high = np.searchsorted(survivors, [info.base_offset, info.last_offset + 1])
    return bool(high - low >= live_fraction * info.record_count)


def adopted_file_name(run_id: str, base_offset: int) -> str:
    """A ledger name for the segment with this base offset adopted by run `run_id`
    (ledger.ledger_file_name's form, with `adopted` for the piece sequence)."""
    return f"{base_offset:020d}-{run_id}-adopted.parquet"


def adopt(item: InputFile, survivors: np.ndarray, rules: TombstoneRules,
          live_fraction: float, run_id: str, out_dir: Path,
          page_checksums: bool = True) -> PieceResult | None:
    """Adopt the dirty segment `item` into `out_dir` (steps 1-4 of the module); None
    when too few of its rows stay (step 2): phase 2 copies it then."""
    info = item.info
    handle = pq.ParquetFile(item.path, page_checksum_verification=page_checksums)
    try:  # 1.
        metadata = handle.metadata
        key_index = handle.schema_arrow.get_field_index("key")
        may_hold_null_keys = any(
            not (stats := metadata.row_group(group).column(key_index).statistics)
            or not stats.has_null_count or stats.null_count > 0
            for group in range(metadata.num_row_groups))
        columns = ["offset", "value_size"]
        columns += ["timestamp"] if rules.retention_ms >= 0 else []
        columns += ["key"] if may_hold_null_keys else []
        table = handle.read(columns=columns)
        for group in range(metadata.num_row_groups):
            observe_row_group(metadata, group, columns)
    finally:
        handle.close()
    offsets = table.column("offset").to_numpy()
    null_key = (pc.is_null(table.column("key")).to_numpy(zero_copy_only=False)
                if may_hold_null_keys else np.zeros(len(offsets), bool))
    tombstone = tombstones_by_size(table.column("value_size"),
                                   rules.empty_value_is_tombstone) & ~null_key
    counts = dict.fromkeys(("tombstones_kept", "tombstones_removed", "null_keys_removed",
                            "expired_removed"), 0)
    keep = rows_kept(  # 2.
        offsets, null_key, tombstone, np.full(len(offsets), rules.now_ms, np.int64),
        table.column("timestamp").to_numpy() if rules.retention_ms >= 0 else None,
        survivors, rules, counts)
    live = int(keep.sum())
    if live == 0 or live < live_fraction * info.record_count:
        return None
    name = adopted_file_name(run_id, info.base_offset)
    adopted = replace(info, file=name, adopted_at_ms=rules.now_ms, dv_file=None,
                      dv_size_bytes=0, dv_crc32c=None, dv_count=0)
    removed = offsets[~keep]
    if len(removed):  # 3.
        dv_name = dv_file_name(name, run_id)
        dv_size, dv_crc = write_deletion_vector(out_dir, dv_name, removed,
                                                np.flatnonzero(~keep))
        adopted = replace(adopted, dv_file=dv_name, dv_size_bytes=dv_size,
                          dv_crc32c=dv_crc, dv_count=len(removed))
    _link(item.path, out_dir, name)  # 4.
    return PieceResult(adopted, len(offsets), 0, live, counts["tombstones_kept"],
                       counts["tombstones_removed"], counts["null_keys_removed"],
                       counts["expired_removed"],
                       rules.now_ms if counts["tombstones_kept"] else None)


def _link(source: Path, out_dir: Path, name: str) -> None:
    """Give `out_dir/name` the bytes of `source`: a hard link where the file system
    allows one (same inode, nothing copied), else a copy; made under a temporary name,
    fsynced and renamed, so the name holds the whole file or none."""
    temp = fsutil.temp_path(out_dir, name)
    try:
        faults.point("write", temp)  # the new name's directory entry, as a write makes one
        try:
            os.link(source, temp)
        except OSError:  # another file system, or one without hard links
            shutil.copyfile(source, temp)
            observe_growth(temp, 0)  # bytes written, for the I/O cap (io_throttle.py)
        fsutil.fsync_path(temp)
        fsutil.publish_replace(temp, out_dir / name)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
