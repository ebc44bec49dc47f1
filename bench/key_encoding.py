"""The key column's encoding in sealed files: a dictionary against plain pages, on one
thread.

`storage.sealed.open_writer` writes a ledger file's key column without a dictionary
(`key_dictionary=False`): a ledger file holds each live key once. A segment's key column
gets a dictionary only when its first row group's keys repeat (`sealed.keys_repeat`: at
most a fifth of them distinct). Incremental runs read every ledger file's key column
(`arrow_survivors.latest_over_ledger`), full runs read every segment's twice (phases 1
and 2) and write every ledger file; this bench is what the threshold was chosen from.

Workloads, all 100-byte values and `--rows` rows in the product's ledger layout
(`LEDGER_SCHEMA`, zstd, page checksums, the product's row groups of about 4 MiB):
- `ledger: distinct keys`: each key once, as in a ledger file (the issue-26 workload's
  key names, `key-00000000`);
- `segment: N keys`: keys drawn from N, as in a segment of a topic with N keys (hot keys
  at N = 100).

Each row: the file written through `open_writer` with and without the key dictionary
(write time, fsync excluded), its size, and the time to read its key and offset columns
through `ParquetFile.read_row_group` (as phase 1 reads them); median of `--runs` runs
after one untimed run, and the ratio of medians, plain over dictionary.

A second table takes the ledger workload's plain key column through each codec (the
other columns stay zstd, the product's parquet.compression default): zstd (the
product), lz4 (Parquet's LZ4_RAW) and none; the same timings, the file's size and the
key column's, and the ratios to zstd's.

    .venv/bin/python bench/key_encoding.py
    .venv/bin/python bench/key_encoding.py --rows 1000000 --runs 21
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from compactlog.compaction.ledger import LEDGER_SCHEMA
from compactlog.storage import open_writer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import commit, machine_info

ROW_GROUP_ROWS = 30_000  # about 4 MiB of 100-byte values, as the product's row groups


def table(rows: int, keys: int | None, seed: int) -> pa.Table:
    """`rows` rows in LEDGER_SCHEMA, ascending offsets; distinct keys when `keys` is
    None, else drawn from `keys` keys."""
    rng = np.random.default_rng(seed)
    numbers = (rng.permutation(rows) if keys is None else rng.integers(0, keys, rows))
    columns: dict[str, pa.Array] = {
        "offset": pa.array(np.arange(rows, dtype=np.int64) * 3),
        "timestamp": pa.array(np.full(rows, 1_795_820_000_000, np.int64)),
        "key": pa.array([b"key-%08d" % n for n in numbers], pa.binary()),
        "value": pa.array([rng.bytes(100) for _ in range(rows)], pa.binary()),
    }
    columns["value_size"] = pa.array(np.full(rows, 100, np.int32))
    columns["batch_base_offset"] = columns["batch_last_offset"] = columns["offset"]
    for field in LEDGER_SCHEMA:  # one producer, no headers, no tombstones
        if field.name not in columns:
            columns[field.name] = (pa.nulls(rows, field.type) if field.nullable else
                                   pa.array(np.zeros(rows, field.type.to_pandas_dtype())))
    return pa.table([columns[name] for name in LEDGER_SCHEMA.names], schema=LEDGER_SCHEMA)


def write(data: pa.Table, path: Path, key_dictionary: bool,
          compression: str | dict[str, str] = "zstd") -> float:
    began = time.perf_counter()
    writer = open_writer(path, LEDGER_SCHEMA, compression, key_dictionary=key_dictionary)
    writer.write_table(data, row_group_size=ROW_GROUP_ROWS)
    writer.close()
    return time.perf_counter() - began


def column_paths(metadata: pq.FileMetaData) -> list[str]:
    """A file's column paths (`headers.list.element.key` and the like included)."""
    return [metadata.schema.column(i).path for i in range(len(metadata.schema))]


def key_bytes(path: Path) -> int:
    """The compressed bytes of the top-level key column (by its path: a header's key is
    a leaf called `key` too)."""
    metadata = pq.ParquetFile(path).metadata
    index = column_paths(metadata).index("key")
    return sum(metadata.row_group(group).column(index).total_compressed_size
               for group in range(metadata.num_row_groups))


def codec_table(data: pa.Table, scratch: Path, runs: int) -> None:
    """The second table (see the module): the ledger's plain key column per codec."""
    print(f"{'ledger: distinct keys':26} {'key codec':12} {'write ms':>9} {'read ms':>8} "
          f"{'MB':>6} {'key MB':>7}  ratio to zstd (write, read, size, key size)")
    found: dict[str, tuple[float, float, int, int]] = {}
    # pyarrow leaves a column that a codec mapping does not name uncompressed: name all.
    empty = scratch / "schema.parquet"
    pq.write_table(LEDGER_SCHEMA.empty_table(), empty)
    every_column = dict.fromkeys(column_paths(pq.ParquetFile(empty).metadata), "zstd")
    for codec in ("zstd", "lz4", "none"):
        path = scratch / f"codec-{codec}.parquet"
        compression = every_column | {"key": codec}
        writes, reads = [], []
        for run in range(runs + 1):
            took = write(data, path, False, compression)
            read = read_keys(path)
            if run:
                writes.append(took)
                reads.append(read)
        if not pq.read_table(path, columns=["key"]).column("key").equals(data.column("key")):
            raise SystemExit(f"key codec {codec}: the keys read back differ from those written")
        found[codec] = (statistics.median(writes), statistics.median(reads),
                        path.stat().st_size, key_bytes(path))
    base = found["zstd"]
    for codec, (took, read, size, keys) in found.items():
        ratios = ("baseline" if codec == "zstd" else
                  f"{took / base[0]:.2f}x, {read / base[1]:.2f}x, {size / base[2]:.2f}x, "
                  f"{keys / base[3]:.2f}x")
        print(f"{'':26} {codec:12} {took * 1e3:9.1f} {read * 1e3:8.1f} {size / 1e6:6.2f} "
              f"{keys / 1e6:7.2f}  {ratios}", flush=True)


def read_keys(path: Path) -> float:
    began = time.perf_counter()
    handle = pq.ParquetFile(path)
    for index in range(handle.metadata.num_row_groups):
        handle.read_row_group(index, columns=["key", "offset"])
    handle.close()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--runs", type=int, default=11)
    args = parser.parse_args()
    info = machine_info()
    print(f"key encoding bench, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
          f"commit {commit()}; {info['cpu']}, {info['cores']} cores, {info['memory']}; "
          f"pyarrow {pa.__version__}; {args.rows:,} rows; median of {args.runs} runs; "
          "engine: pyarrow's Parquet writer and reader, one thread")
    header = (f"{'workload':26} {'key column':12} {'write ms':>9} {'read ms':>8} "
              f"{'MB':>6}  ratio plain/dictionary (write, read, size)")
    print(header)
    with tempfile.TemporaryDirectory(prefix="key-encoding-") as scratch:
        for label, keys in [("ledger: distinct keys", None), ("segment: 1,000,000 keys", 10**6),
                            ("segment: 10,000 keys", 10**4), ("segment: 100 keys", 100)]:
            data = table(args.rows, keys, seed=1)
            found: dict[bool, tuple[float, float, int]] = {}
            for key_dictionary in (True, False):
                path = Path(scratch) / f"{key_dictionary}.parquet"
                writes, reads = [], []
                for run in range(args.runs + 1):
                    took = write(data, path, key_dictionary)
                    read = read_keys(path)
                    if run:
                        writes.append(took)
                        reads.append(read)
                checked = pq.read_table(path, columns=["key"]).column("key")
                if not checked.equals(data.column("key")):
                    raise SystemExit(f"{label}: the keys read back differ from those written")
                found[key_dictionary] = (statistics.median(writes), statistics.median(reads),
                                         path.stat().st_size)
            for key_dictionary in (True, False):
                took, read, size = found[key_dictionary]
                base = found[True]
                ratios = (f"{took / base[0]:.2f}x, {read / base[1]:.2f}x, {size / base[2]:.2f}x"
                          if not key_dictionary else "baseline")
                name = "dictionary" if key_dictionary else "plain"
                print(f"{label:26} {name:12} {took * 1e3:9.1f} {read * 1e3:8.1f} "
                      f"{size / 1e6:6.2f}  {ratios}", flush=True)
        codec_table(table(args.rows, None, seed=1), Path(scratch), args.runs)


if __name__ == "__main__":
    main()
