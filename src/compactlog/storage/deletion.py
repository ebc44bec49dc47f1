"""Deletion vectors: per ledger file, the offsets of its records that left the view.

Invariant: a deletion vector (DV) is an immutable file, written once under a name that
carries the run id of the compaction that wrote it (temporary file, fsync, rename,
directory fsync), never overwritten, and listed by the manifest next to the one ledger
file it belongs to (SegmentInfo.dv_file). It holds, sorted and without duplicates,
every offset of that ledger file that is no longer in the compacted view: a newer run
replaces the DV by a new file holding the union, so a ledger file has at most one
current DV. The live rows of a ledger file are its rows minus its DV's offsets; every
reader of the compacted view filters them through `drop_deleted` (or the same test).

Format: a Parquet file with a non-null int64 column `offset`, sorted ascending, and,
in DVs written since positions were recorded, a non-null int64 column `position`:
each offset's row index in the ledger file, which the writer had in hand. Readers of
the view need only the offsets; the state table's position deletes need the positions,
which a DV without them makes it find by reading the ledger file's offset column
(iceberg/deletes.py). Both columns are written DELTA_BINARY_PACKED, uncompressed
(DV_WRITE_OPTIONS; DVs written before are zstd-compressed plain pages: the same
columns to any Parquet reader). The manifest carries its size and CRC32C, checked
before it is parsed, as for data files.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from compactlog import faults, fsutil
from compactlog.errors import CorruptionError
from compactlog.storage.sealed import SegmentMissingError, file_crc32c, verify_file

DV_SCHEMA = pa.schema([pa.field("offset", pa.int64(), nullable=False),
                       pa.field("position", pa.int64(), nullable=False)])


# Both columns ascend: DELTA_BINARY_PACKED, no dictionary, no compression. For 630,000
# offsets with their positions, 12 ms to write and 0.77 MB, against 80 ms and 1.9 MB
# with zstd over a dictionary attempt, and a quarter of the time to read (pyarrow 26,
# bench/deletion_vectors.py). compactlog reads DVs with pyarrow; DuckDB and Polars,
# which docs/querying.md's queries read them with, decode the encoding too.
DV_WRITE_OPTIONS: dict[str, object] = {
    "compression": "none", "use_dictionary": False,
    "column_encoding": "DELTA_BINARY_PACKED"}


# deleted_mask of an ascending group spanning at most this many offsets per row indexes
# a table of bools over the span (at most 32 bytes a row) instead of searching: for a
# ledger file of 250,000 rows (one offset in ten) and a DV of 157,000 of them, 0.9 ms
# against 4.4 ms; 1M rows, 3.7 against 20.0 ms (bench/deletion_vectors.py, "mask").
DENSE_SPAN = 32


def dv_file_name(ledger_file: str, run_id: str) -> str:
    """The DV of `ledger_file` written by run `run_id` (unique per file and run)."""
    stem = ledger_file.removesuffix(".parquet")
    return f"{stem}.dv-{run_id}.parquet"


def write_deletion_vector(directory: Path, name: str, offsets: np.ndarray,
                          positions: np.ndarray | None) -> tuple[int, int]:
    """Write the sorted unique `offsets`, with their rows' `positions` in the ledger
    file (None: not known, the column is left out), as DV `name` in `directory`;
    returns the file's (size, CRC32C). The file is whole under its name or absent."""
    if positions is not None and len(positions) != len(offsets):
        raise ValueError(f"deletion vector {name}: {len(offsets)} offsets but "
                         f"{len(positions)} positions")
    final = directory / name
    temp = fsutil.temp_path(directory, name)
    try:
        faults.point("write", temp)
        columns = {"offset": pa.array(np.asarray(offsets, np.int64))}
        if positions is not None:
            columns["position"] = pa.array(np.asarray(positions, np.int64))
        table = pa.table(columns, schema=pa.schema(DV_SCHEMA.field(name) for name in columns))
        # Ascending integers: delta-encoded, a few bits each (DV_WRITE_OPTIONS).
        pq.write_table(table, temp, **DV_WRITE_OPTIONS)
        fsutil.fsync_path(temp)
        fsutil.publish_replace(temp, final)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return final.stat().st_size, file_crc32c(final)


def _dv_column(path: Path, size_bytes: int | None, crc32c: int | None,
               name: str) -> np.ndarray | None:
    """Column `name` of DV `path` (checked against size and CRC32C when given), or None
    when the file has no such column. A missing file raises SegmentMissingError, so a
    read retries from a newer manifest (reads.with_view)."""
    try:
        verify_file(path, size_bytes, crc32c, "deletion vector")
        handle = pq.ParquetFile(path)
        try:
            if name not in handle.schema_arrow.names:
                return None
            column = handle.read(columns=[name]).column(name)
        finally:
            handle.close()
    except FileNotFoundError:
        raise SegmentMissingError(path, "deletion vector is missing") from None
    return np.asarray(column.to_numpy(), dtype=np.int64)


def read_deletion_vector(path: Path, size_bytes: int | None = None,
                         crc32c: int | None = None) -> np.ndarray:
    """The sorted deleted offsets of DV `path` (see _dv_column)."""
    found = _dv_column(path, size_bytes, crc32c, "offset")
    if found is None:
        raise CorruptionError(path, "deletion vector without an offset column")
    return found


@functools.lru_cache(maxsize=32)
def cached_deletion_vector(path: Path, size_bytes: int | None,
                           crc32c: int | None) -> np.ndarray:
    """As read_deletion_vector, remembered: a DV's name is never reused for other bytes,
    so a copy read once stays right (readers call this per read; keep it read-only)."""
    found = read_deletion_vector(path, size_bytes, crc32c)
    found.setflags(write=False)
    return found


@functools.lru_cache(maxsize=32)
def cached_deletion_positions(path: Path, size_bytes: int | None,
                              crc32c: int | None) -> np.ndarray | None:
    """The row positions of DV `path`'s offsets in its ledger file (ascending), or None
    for a DV written before they were recorded; remembered as cached_deletion_vector."""
    found = _dv_column(path, size_bytes, crc32c, "position")
    if found is not None:
        found.setflags(write=False)
    return found


def deleted_mask(offsets: np.ndarray, deleted: np.ndarray) -> np.ndarray:
    """True where `offsets[i]` is in the sorted array `deleted`."""
    if not len(deleted) or not len(offsets):
        return np.zeros(len(offsets), bool)
    if len(offsets) > 1 and bool((offsets[1:] > offsets[:-1]).all()):
        return _ascending_mask(offsets, deleted)
    position = np.searchsorted(deleted, offsets)
    position[position >= len(deleted)] = 0
    found: np.ndarray = deleted[position] == offsets
    return found


def _ascending_mask(offsets: np.ndarray, deleted: np.ndarray) -> np.ndarray:
    """deleted_mask for strictly ascending `offsets` (a file's row group): only the
    members of `deleted` within the group's range are looked up, so the cost follows
    those members and the group's rows, not the size of `deleted` (phase 2 keeps about
    one row in ten of a dirty segment). A group whose offsets span at most DENSE_SPAN
    times its rows (a segment's are dense; a ledger file's keep about one in ten) takes
    them by indexing a table of its span; a sparser one by binary search."""
    first, last = int(offsets[0]), int(offsets[-1])
    within = deleted[np.searchsorted(deleted, first):np.searchsorted(deleted, last, "right")]
    span = last - first + 1
    if span == len(offsets):  # every offset of the range, in order: no table needed
        found = np.zeros(len(offsets), bool)
        found[within - first] = True
        return found
    if span <= DENSE_SPAN * len(offsets):
        table = np.zeros(span, bool)
        table[within - first] = True
        dense: np.ndarray = table[offsets - first]
        return dense
    found = np.zeros(len(offsets), bool)
    position = np.searchsorted(offsets, within)  # < len(offsets): within <= last
    found[position[offsets[position] == within]] = True
    return found


def drop_deleted(table: pa.Table, deleted: np.ndarray | None) -> pa.Table:
    """`table` without the rows whose offset is in `deleted` (None: no DV)."""
    if deleted is None or not len(deleted) or not table.num_rows:
        return table
    offsets = table.column("offset").to_numpy()
    mask = deleted_mask(offsets, deleted)
    if not mask.any():
        return table
    return table.filter(pa.array(~mask))
