"""Append and read throughput of the log store, through the Python API.

For each value size (100 B, 1 KiB) and partition count (1, 4) it measures:
- append: `LogStore.append` of keyed batches (murmur2 partitioning, v2 batch encoding,
  rolling and sealing into Parquet included), with flushing left to the OS, and again
  with an fsync per batch (flush.messages=1, the default);
- read: every record from the sealed Parquet segments, through `Partition.read` as
  Python `Record` objects, and through `Partition.read_table` as Arrow tables.

Baselines, measured in the same run on the same data:
- append: encoding the same batches with aiokafka's codec and writing them to one plain
  file with no index, no partitioning and no sealing: the floor for this format;
- read: `pyarrow.parquet.read_table` of the same sealed files, plus (for records)
  conversion of the same columns to Python tuples: the floors for each kind of read.

    .venv/bin/python bench/store_bench.py [--records 1000000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from compactlog import LogStore, ProducerRecord
from compactlog.storage.records import encode_batch

BATCH = 1000
SEGMENT_BYTES = 16 * 1024 * 1024
NO_FSYNC = str(2**63 - 1)


@dataclass
class Result:
    case: str
    value_bytes: int
    partitions: int
    records: int
    seconds: float
    baseline_seconds: float | None

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.records * (self.value_bytes + 12) / self.seconds / 1e6

    @property
    def ratio(self) -> float | None:
        return None if self.baseline_seconds is None else self.baseline_seconds / self.seconds


def make_batches(count: int, value_bytes: int, seed: int = 1) -> list[list[ProducerRecord]]:
    rng = random.Random(seed)
    keys = [b"key-%08d" % i for i in range(max(1, count // 10))]
    payload = rng.randbytes(value_bytes * 64)
    records = [
        ProducerRecord(rng.choice(keys), payload[(i % 64) * value_bytes:][:value_bytes])
        for i in range(count)
    ]
    return [records[i:i + BATCH] for i in range(0, count, BATCH)]


def bench_append(root: Path, batches: list[list[ProducerRecord]], partitions: int,
                 flush_messages: str) -> tuple[float, Path]:
    data_dir = Path(tempfile.mkdtemp(dir=root))
    with LogStore.open(data_dir) as store:
        store.create_topic("bench", partitions, {
            "segment.bytes": str(SEGMENT_BYTES), "flush.messages": flush_messages,
        })
        started = time.perf_counter()
        for batch in batches:
            store.append("bench", batch)
        store.flush()
        elapsed = time.perf_counter() - started
        for partition in store.topic("bench").partitions:
            partition.roll()  # seal the rest, so that reads below come from Parquet
    return elapsed, data_dir


def bench_append_floor(root: Path, batches: list[list[ProducerRecord]]) -> float:
    path = root / "floor.log"
    started = time.perf_counter()
    offset = 0
    with open(path, "wb", buffering=0) as out:
        for batch in batches:
            out.write(encode_batch(batch, offset))
            offset += len(batch)
    elapsed = time.perf_counter() - started
    path.unlink()
    return elapsed


def bench_read(data_dir: Path, columnar: bool) -> tuple[float, int]:
    with LogStore.open(data_dir, read_only=True) as store:
        started = time.perf_counter()
        count = 0
        for partition in store.topic("bench").partitions:
            offset = 0
            while True:
                if columnar:
                    table = partition.read_table(offset, max_records=10_000, max_bytes=64 << 20)
                    if not table.num_rows:
                        break
                    count += table.num_rows
                    offset = table.column("offset")[-1].as_py() + 1
                else:
                    records = partition.read(offset, max_records=10_000, max_bytes=64 << 20)
                    if not records:
                        break
                    count += len(records)
                    offset = records[-1].offset + 1
        return time.perf_counter() - started, count


def bench_read_floor(data_dir: Path, columnar: bool) -> tuple[float, int]:
    files = sorted(data_dir.glob("topics/bench/*/segments/*.parquet"))
    columns = ["offset", "timestamp", "key", "value", "headers"]
    started = time.perf_counter()
    count = 0
    for path in files:
        table: pa.Table = pq.read_table(path, columns=columns)
        if columnar:
            count += table.num_rows
            continue
        for batch in table.to_batches(max_chunksize=10_000):
            rows = list(zip(*(batch.column(c).to_pylist() for c in columns), strict=True))
            count += len(rows)
    return time.perf_counter() - started, count


def run(records: int, root: Path) -> list[Result]:
    results = []
    for value_bytes in (100, 1024):
        count = records if value_bytes == 100 else max(BATCH, records // 4)
        batches = make_batches(count, value_bytes)
        floor = bench_append_floor(root, batches)
        for partitions in (1, 4):
            seconds, data_dir = bench_append(root, batches, partitions, NO_FSYNC)
            results.append(Result("append, fsync left to the OS", value_bytes, partitions,
                                  count, seconds, floor))
            for columnar, case in ((False, "read sealed, Python records"),
                                   (True, "read sealed, Arrow tables")):
                read_s, read_count = bench_read(data_dir, columnar)
                assert read_count == count, (read_count, count)
                floor_s, floor_count = bench_read_floor(data_dir, columnar)
                assert floor_count == count
                results.append(Result(case, value_bytes, partitions, count, read_s, floor_s))
            shutil.rmtree(data_dir)
            seconds, data_dir = bench_append(root, batches, partitions, "1")
            results.append(Result("append, fsync per batch", value_bytes, partitions,
                                  count, seconds, floor))
            shutil.rmtree(data_dir)
            for result in results[-4:]:
                print_row(result)
    return results


def print_row(result: Result) -> None:
    ratio = "" if result.ratio is None else f"{result.ratio:6.2f}"
    print(f"{result.case:30} {result.value_bytes:6} B {result.partitions:2} p "
          f"{result.records:9,} rec {result.records_per_s:12,.0f} rec/s "
          f"{result.mb_per_s:8.1f} MB/s  ratio vs floor {ratio}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000,
                        help="records per 100-byte case (1 KiB cases use a quarter)")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument("--json", type=Path, default=None, help="write results here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(dir=args.dir))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, pyarrow {pa.__version__}; scratch {root}")
    try:
        results = run(args.records, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(
            [{**asdict(r), "records_per_s": r.records_per_s, "mb_per_s": r.mb_per_s,
              "ratio": r.ratio} for r in results], indent=2))


if __name__ == "__main__":
    main()
