"""Which rows of a partition's ledger files the state table leaves out, as positions,
and the position-delete files that say so (see the package's "Deletes").

Invariant: the rows of a ledger file that the state table shows are exactly the rows
`storage/view_rows.partition_rows` puts in the compacted view up to the horizon, at the
snapshot's instant, less tombstones: the view's conditions are taken from there (the
deletion vector, `deleted_below`, retention.ms), never restated, and only the tombstone
rule is the state's own. A ledger file with no row in the state is left out of the
snapshot; one whose rows are all in it has no delete file.

Reads are avoided where the manifest alone decides: a file without a deletion vector,
wholly within the view's bounds, in a ledger that holds no tombstone (its
`oldest_tombstone_ms` is None and empty values are not tombstones) has no deleted row.
A file whose only deleted rows are its deletion vector's (no bound cuts it, no tombstone
is possible) takes their positions from the DV, which records them (storage/deletion.py;
a DV written before they were has none). Otherwise its offset and value_size columns
(the key column too under null.key.policy=keep, and timestamp under retention.ms) are
read, after the file is proven whole against the manifest, as every reader does, and
its DV's rows are still taken from the positions the DV records, when it does. The
positions of a file are determined by what decided them (`inputs`: the file, its
deletion vector, the view's bounds within it, the tombstone setting); a delete file's
name carries both that hash and its positions' hash, so a later snapshot whose inputs
are the same keeps the file without reading anything, and one whose inputs changed but
whose positions did not (retention's cut moved past no row) keeps it too. The columns
read of a file are kept in the process (up to COLUMNS_KEPT_BYTES), since a compaction
with deletion vectors gives old ledger files new positions, not new rows.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from compactlog.backend import Volume
from compactlog.bounded_cache import BoundedCache
from compactlog.compaction.verified import verify_input
from compactlog.iceberg.schema import DELETE_SCHEMA
from compactlog.storage import (
    FileRows,
    PartitionManifest,
    TimeRules,
    cached_deletion_positions,
    cached_deletion_vector,
    deleted_mask,
    tombstones_by_size,
)

# Positions computed in this process, by inputs (a ledger file never changes).
POSITIONS_KEPT = 4096
_positions: BoundedCache[str, np.ndarray] = BoundedCache(max_entries=POSITIONS_KEPT)
# The columns read of files (a file never changes), by file and columns.
COLUMNS_KEPT_BYTES = 64 << 20
_columns: BoundedCache[tuple[str, tuple[str, ...]], pa.Table] = BoundedCache(
    max_weight=COLUMNS_KEPT_BYTES, weigh=lambda table: table.nbytes)


def may_hold_tombstones(manifest: PartitionManifest, rules: TimeRules) -> bool:
    compaction = manifest.compaction
    return rules.empty_value_is_tombstone or (
        compaction is not None and compaction.oldest_tombstone_ms is not None)


def inputs_of(url: str, rows: FileRows, rules: TimeRules, drop_tombstones: bool = True) -> str:
    """What decides `rows`' positions (the file at `url`, ...), hashed."""
    condition = rows.condition
    decided_by = [url, rows.info.dv_file, condition.min_offset,
                  condition.end_offset, condition.min_timestamp,
                  rules.empty_value_is_tombstone and drop_tombstones, drop_tombstones]
    return hashlib.sha256(json.dumps(decided_by).encode()).hexdigest()[:16]


def unbounded(rows: FileRows) -> bool:
    """No bound of the view (DeleteRecords' cut, the horizon, retention.ms) cuts the
    file: only its deletion vector and tombstones can take rows out."""
    condition = rows.condition
    return (condition.min_offset is None and condition.end_offset is None
            and condition.min_timestamp is None)


def needs_no_read(rows: FileRows, tombstones: bool) -> bool:
    """The manifest alone proves every row of the file is in the state."""
    return rows.info.dv_file is None and unbounded(rows) and not tombstones


def deleted_positions(volume: Volume, rows: FileRows, rules: TimeRules, inputs: str,
                      null_keys: bool = False, drop_tombstones: bool = True,
                      tombstones_possible: bool = True) -> np.ndarray:
    """The positions of `rows`' file that the table leaves out (see the module).
    `null_keys`: the ledger may hold null-key records (null.key.policy=keep), which are
    never tombstones; only then is the key column read. `drop_tombstones`: False for
    the raw table, which shows them. `tombstones_possible`: False when the manifest
    proves the ledger holds none (`may_hold_tombstones`)."""
    found = _positions.get(inputs)
    if found is not None:
        return found
    info = rows.info
    recorded = _recorded_positions(volume, rows)
    if (recorded is not None and unbounded(rows)
            and not (drop_tombstones and tombstones_possible)):
        # Only the deletion vector takes rows out: its own positions spare reading the
        # file's offsets (a compaction that gives old ledger files new DVs would
        # otherwise make the sync read each of them again).
        _positions.put(inputs, recorded)
        return recorded
    # Every tombstone leaves the state: the view's tombstone retention adds nothing.
    condition = replace(rows.condition, tombstone_cutoff_ms=None)
    columns = ["offset", "value_size"] + (["key"] if null_keys else [])
    if condition.min_timestamp is not None:
        columns.append("timestamp")
    table = _columns_of(volume, rows, tuple(columns))
    offsets = table.column("offset").to_numpy()
    keep = condition.mask(table)
    gone = np.zeros(len(offsets), bool) if keep is None else ~keep
    if recorded is not None:
        gone[recorded] = True  # the DV's rows, without looking its offsets up
    elif info.dv_file is not None:
        deleted = cached_deletion_vector(volume.fetch(rows.dv_relative or ""),
                                         info.dv_size_bytes, info.dv_crc32c)
        gone |= deleted_mask(offsets, deleted)
    if drop_tombstones:
        gone |= tombstones(table, rules.empty_value_is_tombstone)
    positions = np.flatnonzero(gone).astype(np.int64)
    positions.setflags(write=False)
    _positions.put(inputs, positions)
    return positions


def _recorded_positions(volume: Volume, rows: FileRows) -> np.ndarray | None:
    """The row positions `rows`' deletion vector records, when it has a DV that records
    them and they fit the file: one per offset, ascending, within its rows (else None:
    a DV written before positions were, whose offsets are then looked up)."""
    info = rows.info
    if info.dv_file is None:
        return None
    recorded = cached_deletion_positions(volume.fetch(rows.dv_relative or ""),
                                         info.dv_size_bytes, info.dv_crc32c)
    if recorded is None or len(recorded) != info.dv_count:
        return None
    if len(recorded) and not (int(recorded[0]) >= 0 and int(recorded[-1]) < info.record_count
                              and bool((recorded[1:] > recorded[:-1]).all())):
        return None
    return recorded


def _columns_of(volume: Volume, rows: FileRows, columns: tuple[str, ...]) -> pa.Table:
    """`columns` of the file, proven whole against the manifest when first read, then
    kept (up to COLUMNS_KEPT_BYTES): a compaction that gives an old ledger file a new
    deletion vector changes its positions, never its columns."""
    key = (volume.describe(rows.relative), columns)
    found = _columns.get(key)
    if found is not None:
        return found
    info = rows.info
    path = volume.fetch(rows.relative)
    what = "ledger file" if rows.is_ledger else "sealed segment"
    verify_input(path, info.size_bytes, info.crc32c,
                 f"{what} with offsets {info.base_offset}..{info.last_offset}")
    handle = pq.ParquetFile(path)  # not read_table: its dataset layer costs more here
    try:
        table = handle.read(columns=list(columns))
    finally:
        handle.close()
    _columns.put(key, table)
    return table


def tombstones(table: pa.Table, empty_value_is_tombstone: bool) -> np.ndarray:
    """Rows that delete their key (as compaction's tombstone rule, from value_size): a
    null value, or an empty one under empty.value.is.tombstone; never a null key's."""
    found = tombstones_by_size(table.column("value_size"), empty_value_is_tombstone)
    if "key" in table.column_names:
        found &= pc.is_valid(table.column("key")).to_numpy(zero_copy_only=False)
    return found


def content_hash(positions: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(positions, np.int64).tobytes()).hexdigest()[:16]


def delete_file_name(partition: int, rows: FileRows, inputs: str, content: str) -> str:
    """`deletes/<n>/<ledger stem>.<inputs>.<content>.<unique>.parquet`: what decided the
    positions and the positions themselves, hashed, then a name no other sync uses."""
    stem = rows.info.file.removesuffix(".parquet")
    return f"deletes/{partition}/{stem}.{inputs}.{content}.{uuid.uuid4().hex[:8]}.parquet"


def name_hashes(url: str) -> tuple[str, str] | None:
    """(inputs, content) from a delete file's name or URL."""
    parts = url.rsplit("/", 1)[-1].removesuffix(".parquet").rsplit(".", 3)
    return (parts[1], parts[2]) if len(parts) == 4 else None


# DELETE_SCHEMA with file_path built as a dictionary of its one value: written as the
# same dictionary-encoded string column, without first making (and hashing) a copy of
# the path per position (26 ms against 46 ms for 630,000 positions).
_DELETE_WRITE_SCHEMA = pa.schema([
    DELETE_SCHEMA.field("file_path").with_type(pa.dictionary(pa.int32(), pa.string())),
    DELETE_SCHEMA.field("pos")])


def delete_file_bytes(data_file_url: str, positions: np.ndarray) -> bytes:
    """A position-delete file of one data file: (file_path, pos) sorted by pos. Its
    Parquet schema is DELETE_SCHEMA's (no Arrow schema stored: a reader sees file_path
    as a string, not as the dictionary it was built from)."""
    paths = pa.DictionaryArray.from_arrays(pa.array(np.zeros(len(positions), np.int32)),
                                           pa.array([data_file_url], pa.string()))
    table = pa.table({"file_path": paths, "pos": pa.array(positions, pa.int64())},
                     schema=_DELETE_WRITE_SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", use_dictionary=["file_path"],
                   store_schema=False)
    return bytes(sink.getvalue().to_pybytes())


def forget_cache() -> None:
    """Empty the positions and columns kept (for tests)."""
    _positions.clear()
    _columns.clear()
