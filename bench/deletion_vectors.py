"""A deletion vector's write, read and merge, as an incremental run makes them: the
product's format against the one before, on one thread.

A DV (storage/deletion.py) holds a ledger file's deleted offsets, ascending, with each
one's row position. The workload is the issue-26 10% run that keeps old ledger files
(`compaction.ledger.rewrite.live.fraction=0.3`): a 1M-row ledger file of which 63% of
the rows leave the view, a third of them through an older DV.

Rows:
- `write: delta, uncompressed (the product)`: `storage.write_deletion_vector`, which
  writes DELTA_BINARY_PACKED pages without compression (DV_WRITE_OPTIONS), fsync
  included;
- `write: zstd, dictionary attempted (before)`: the same table through pyarrow's
  defaults with zstd, as DVs were written before, fsync included: the baseline;
- `read: ...`: `storage.read_deletion_vector` of each file (size and CRC32C checked);
- `merge: one stable sort (the product)` against `merge: np.union1d (before)`: the old
  DV's offsets with the run's removals (`incremental.merge_sorted`);
- `delete file: ...`: the state table's position-delete file of the same positions
  (`iceberg.deletes.delete_file_bytes`, whose file_path column is a dictionary of the
  one path) against the same file built from a copy of the path per position, as
  before;
- `mask: ...`: which of the file's rows the DV deletes (`storage.deleted_mask`, as a
  compaction finds a DV's positions and a reader drops its rows), through a table of
  the file's offset span (the product, for a span of at most DENSE_SPAN offsets a row)
  against a binary search of each deleted offset among the file's (before).

Each row is timed `--runs` times after one untimed run; the table gives the median and
the minimum, the ratio of medians to the row's baseline, and each file's size. Every
row's result is checked against the others.

    .venv/bin/python bench/deletion_vectors.py
    .venv/bin/python bench/deletion_vectors.py --rows 250000 --runs 21
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from compactlog import fsutil
from compactlog.compaction.incremental import merge_sorted
from compactlog.iceberg.deletes import delete_file_bytes
from compactlog.iceberg.schema import DELETE_SCHEMA
from compactlog.storage import (
    deleted_mask,
    file_crc32c,
    read_deletion_vector,
    write_deletion_vector,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import commit, machine_info

URL = "file:///var/lib/compactlog/topics/prices/0/ledger/00000000000000000000-run-0.parquet"


def workload(rows: int, seed: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(old DV's offsets, the run's removals, the union, its positions, the file's
    offsets) for a file of `rows` rows whose offsets ascend with gaps (a ledger file:
    one offset in ten)."""
    rng = np.random.default_rng(seed)
    offsets = np.sort(rng.choice(np.arange(rows * 10, dtype=np.int64), rows, replace=False))
    gone = rng.random(rows) < 0.63
    positions = np.flatnonzero(gone).astype(np.int64)
    old = rng.random(len(positions)) < 1 / 3
    return (offsets[positions[old]], offsets[positions[~old]], offsets[positions], positions,
            offsets)


def write_before(path: Path, offsets: np.ndarray, positions: np.ndarray) -> None:
    table = pa.table({"offset": pa.array(offsets), "position": pa.array(positions)})
    pq.write_table(table, path, compression="zstd")
    fsutil.fsync_path(path)


def delete_file_before(data_file_url: str, positions: np.ndarray) -> bytes:
    paths = pa.repeat(pa.scalar(data_file_url, pa.string()), len(positions))
    table = pa.table({"file_path": paths, "pos": pa.array(positions, pa.int64())},
                     schema=DELETE_SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", use_dictionary=["file_path"])
    return bytes(sink.getvalue().to_pybytes())


def mask_before(offsets: np.ndarray, deleted: np.ndarray) -> np.ndarray:
    """deleted_mask of an ascending group with gaps as it was: each deleted offset
    within the group's range searched for among the group's offsets."""
    first, last = int(offsets[0]), int(offsets[-1])
    within = deleted[np.searchsorted(deleted, first):np.searchsorted(deleted, last, "right")]
    found = np.zeros(len(offsets), bool)
    position = np.searchsorted(offsets, within)
    found[position[offsets[position] == within]] = True
    return found


def timed(runs: int, body: Callable[[], object]) -> list[float]:
    body()  # untimed: first allocations
    found = []
    for _ in range(runs):
        began = time.perf_counter()
        body()
        found.append(time.perf_counter() - began)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000,
                        help="rows of the ledger file the DV belongs to")
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    info = machine_info()
    old, removed, union, positions, offsets = workload(args.rows, args.seed)
    print(f"deletion vector bench, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
          f"commit {commit()}; {info['cpu']}, {info['cores']} cores, {info['memory']}; "
          f"pyarrow {pa.__version__}, numpy {np.__version__}; a ledger file of "
          f"{args.rows:,} rows, a DV of {len(union):,} offsets ({len(old):,} from the old "
          f"DV), {args.runs} runs per row", flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        product, before = folder / "f.dv-new.parquet", folder / "f.dv-old.parquet"
        rows: list[tuple[str, list[float], str, int | None]] = [
            ("write: delta, uncompressed (the product)", timed(args.runs, lambda: (
                write_deletion_vector(folder, product.name, union, positions))),
             "write", product.stat().st_size),
            ("write: zstd, dictionary attempted (before)", timed(args.runs, lambda: (
                write_before(before, union, positions))), "write", before.stat().st_size),
            ("read: delta, uncompressed (the product)", timed(args.runs, lambda: (
                read_deletion_vector(product, product.stat().st_size,
                                     file_crc32c(product)))), "read", None),
            ("read: zstd, dictionary attempted (before)", timed(args.runs, lambda: (
                read_deletion_vector(before, before.stat().st_size,
                                     file_crc32c(before)))), "read", None),
            ("merge: one stable sort (the product)",
             timed(args.runs, lambda: merge_sorted(old, removed)), "merge", None),
            ("merge: np.union1d (before)",
             timed(args.runs, lambda: np.union1d(old, removed)), "merge", None),
            ("delete file: one-path dictionary (the product)",
             timed(args.runs, lambda: delete_file_bytes(URL, positions)), "delete",
             len(delete_file_bytes(URL, positions))),
            ("delete file: a path per position (before)",
             timed(args.runs, lambda: delete_file_before(URL, positions)), "delete",
             len(delete_file_before(URL, positions))),
            ("mask: a table of the span (the product)",
             timed(args.runs, lambda: deleted_mask(offsets, union)), "mask", None),
            ("mask: binary search (before)",
             timed(args.runs, lambda: mask_before(offsets, union)), "mask", None),
        ]
        for path in (product, before):
            assert np.array_equal(read_deletion_vector(path), union), path
        assert np.array_equal(merge_sorted(old, removed), np.union1d(old, removed))
        assert np.array_equal(np.flatnonzero(deleted_mask(offsets, union)), positions)
        assert np.array_equal(mask_before(offsets, union), deleted_mask(offsets, union))
        for made in (delete_file_bytes, delete_file_before):
            table = pq.read_table(pa.BufferReader(made(URL, positions)))
            assert table.schema.equals(DELETE_SCHEMA, check_metadata=True), made
            assert np.array_equal(table.column("pos").to_numpy(), positions), made
    baselines = {kind: statistics.median(times) for name, times, kind, _ in rows
                 if "(before)" in name}
    print(f"{'row (one thread)':45} {'median ms':>10} {'min ms':>8} {'x before':>9} "
          f"{'file MB':>8}")
    for name, times, kind, size in rows:
        median = statistics.median(times)
        print(f"{name:45} {median * 1000:10.1f} {min(times) * 1000:8.1f} "
              f"{median / baselines[kind]:9.2f} "
              f"{'' if size is None else f'{size / 1e6:8.2f}'}")
    print("(x before: the row's median over the median of the same step as before; every "
          "file read back the same offsets, every merge gave the same union, both delete "
          "files read back with the Iceberg delete schema and the same positions, both masks "
          "gave the DV's positions)")


if __name__ == "__main__":
    main()
