"""Read throughput of the `compactlog` Spark data source against `spark.read.parquet`.

One generated topic (N records, V-byte random values over K keys, P partitions) is
appended through the store API and every record sealed into Parquet. Then, in one
Spark session (`local[2]` by default, compactlog's default settings, which verify
Parquet page checksums in both readers), two queries run on the same files:

- `count()`
- a full scan, `selectExpr("sum(length(value))")`

once through the data source (`format("compactlog")`, raw view) and once through
`spark.read.parquet` on the sealed files the manifests list. Each query runs once to
warm up (JVM, Python workers), then `--repeats` times; the best time is reported, with
records/s and the ratio data source / parquet (the issue's target: 0.8 or better).
Both readers must return the same count and sum, or the run stops with exit status 1.

Note what differs: Spark's Parquet reader prunes columns (a count reads no column
pages, the scan reads only `value`); the Python Data Source API has no column-pruning
hook, so the data source reads every record column, and verifies each file's CRC32C
first.

    .venv/bin/python bench/spark_source.py                      # 2 M records, 100 B values
    .venv/bin/python bench/spark_source.py --records 200000     # a quick check
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from compactlog.compaction.spark_session import start_session
from compactlog.spark import register
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import machine_info

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TOPIC = "bench"
APPEND_CHUNK = 10_000


def generate(path: Path, records: int, keys: int, value_bytes: int, partitions: int,
             segment_bytes: int) -> list[str]:
    """Append the topic through the store API, seal everything; the sealed files' paths."""
    rng = np.random.default_rng(6)
    with LogStore.open(path) as store:
        config = {"segment.bytes": str(segment_bytes), "flush.messages": "1000000"}
        store.create_topic(TOPIC, partitions=partitions, config=config)
        for start in range(0, records, APPEND_CHUNK):
            count = min(APPEND_CHUNK, records - start)
            key_ids = rng.integers(0, keys, count)
            payload = rng.bytes(count * value_bytes)
            store.append(TOPIC, [
                ProducerRecord(b"key-%d" % key_id,
                               payload[i * value_bytes:(i + 1) * value_bytes])
                for i, key_id in enumerate(key_ids.tolist())
            ])
        files: list[str] = []
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
            files += [str(partition.segment_dir / info.file)
                      for info in partition.manifest.segments]
            assert partition.log_end_offset == partition.manifest.sealed_end_offset
    return files


def best_of(repeats: int, query: Callable[[], int]) -> tuple[float, int]:
    """(best seconds, result) over `repeats` timed runs after one warm-up run."""
    result = query()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        again = query()
        times.append(time.perf_counter() - start)
        if again != result:
            sys.exit(f"query gave {again}, then {result}")
    return min(times), result


def value_bytes_sum(frame: DataFrame) -> int:
    return int(frame.selectExpr("sum(length(value)) AS n").collect()[0]["n"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--segment-bytes", type=int, default=32 * 1024 * 1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--data-dir", type=Path, help="keep the topic here (default: a temp dir)")
    args = parser.parse_args()

    for name, value in machine_info().items():
        print(f"{name}: {value}")
    print(f"date: {datetime.date.today()}, load average: {os.getloadavg()[0]:.2f}")
    base = args.data_dir or Path(tempfile.mkdtemp(prefix="bench-spark-source-"))
    path = base / "data"
    shutil.rmtree(path, ignore_errors=True)
    start = time.perf_counter()
    files = generate(path, args.records, args.keys, args.value_bytes, args.partitions,
                     args.segment_bytes)
    size = sum(os.path.getsize(f) for f in files)
    print(f"generated {args.records:,} records in {len(files)} sealed files "
          f"({size / 1e6:.1f} MB) in {time.perf_counter() - start:.1f} s")

    start = time.perf_counter()
    spark: SparkSession = start_session(args.master)
    register(spark)
    print(f"Spark session ({args.master}) ready in {time.perf_counter() - start:.1f} s")
    source = (spark.read.format("compactlog").option("path", str(path))
              .option("topic", TOPIC).load())
    parquet = spark.read.parquet(*files)

    print("\n| query | reader | best s | records/s | data source / parquet |")
    print("|---|---|---:|---:|---:|")
    queries: list[tuple[str, Callable[[DataFrame], int]]] = [
        ("count()", lambda frame: frame.count()), ("sum(length(value))", value_bytes_sum)]
    for label, query in queries:
        results: dict[str, tuple[float, int]] = {}
        for reader, frame in (("parquet", parquet), ("data source", source)):
            results[reader] = best_of(args.repeats, partial(query, frame))
        (p_time, p_result), (d_time, d_result) = results["parquet"], results["data source"]
        if p_result != d_result:
            sys.exit(f"{label}: parquet gave {p_result}, the data source {d_result}")
        for reader, (seconds, _) in results.items():
            ratio = f"{p_time / d_time:.2f}" if reader == "data source" else ""
            print(f"| {label} | {reader} | {seconds:.2f} | {args.records / seconds:,.0f} "
                  f"| {ratio} |")
    spark.stop()
    if args.data_dir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
