"""Read throughput of the `compactlog` Spark data source against `spark.read.parquet`.

One generated topic (N records, V-byte random values over K keys, P partitions) is
appended through the store API and every record sealed into Parquet. Then, in one
Spark session (`local[2]` by default, compactlog's default settings, which verify
Parquet page checksums in both readers), two queries run on the same files:

- `count()`
- a full scan, `selectExpr("sum(length(value))")`

through the data source (`format("compactlog")`, raw view), through
`compactlog.spark.read_topic` (Spark's Parquet reader on the files the manifests list,
the store's read API for the unsealed tail; none here, as every record is sealed), through
`spark.read.parquet` on the sealed files the manifests list, and through a Python data
source that yields the same number of rows, of the same schema and sizes, from batches
built in memory: no file is read, so it shows what the Python Data Source API itself
costs on this machine (moving Arrow batches from the Python worker into the JVM), the
ceiling for any source built on it. Each query runs once to warm up (JVM, Python
workers), then `--repeats` times; the best time is reported, with records/s and the
ratio to `spark.read.parquet` (the issue's target for the data source: 0.8 or better).
All three must return the same count and sum, or the run stops with exit status 1.

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
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from compactlog.compaction.spark_session import start_session
from compactlog.spark import read_topic, register
from compactlog.spark.kafka_schema import ARROW_SCHEMA, SPARK_SCHEMA, spark_batches
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


class MemorySource(DataSource):
    """Rows like the topic's, from memory: the Python Data Source API's own cost.

    Defined in the bench's __main__, so Spark ships the class to its workers by value.
    """

    @classmethod
    def name(cls) -> str:
        return "compactlog-bench-memory"

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> MemoryReader:
        options = self.options
        return MemoryReader(int(options["records"]), int(options["value_bytes"]),
                            int(options["tasks"]))


class MemoryReader(DataSourceReader):
    BATCH_ROWS = 32_768

    def __init__(self, records: int, value_bytes: int, tasks: int) -> None:
        self.records, self.value_bytes, self.tasks = records, value_bytes, tasks

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(index) for index in range(self.tasks)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        rows = self.records // self.tasks + (partition.value < self.records % self.tasks)
        n = min(rows, self.BATCH_ROWS)
        records = pa.table({
            "offset": pa.array(np.arange(n)), "timestamp": pa.array(np.arange(n)),
            "key": pa.array([b"key-123456"] * n, pa.binary()),
            "value": pa.array([b"v" * self.value_bytes] * n, pa.binary()),
            "headers": pa.nulls(n, ARROW_SCHEMA.field("headers").type),
        })
        # The data source's own conversion to Spark's columns (topic, timestamp type...).
        batch = next(iter(spark_batches(records, "bench", 0)), None)
        if batch is None:
            return
        full, rest = divmod(rows, n) if n else (0, 0)
        for _ in range(full):
            yield batch
        if rest:
            yield batch.slice(0, rest)


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
    spark.dataSource.register(MemorySource)
    print(f"Spark session ({args.master}) ready in {time.perf_counter() - start:.1f} s")
    source = (spark.read.format("compactlog").option("path", str(path))
              .option("topic", TOPIC).load())
    parquet = spark.read.parquet(*files)
    memory = (spark.read.format("compactlog-bench-memory").option("records", args.records)
              .option("value_bytes", args.value_bytes).option("tasks", len(files)).load())
    fast = read_topic(spark, str(path), TOPIC)
    readers = [("spark.read.parquet", parquet), ("compactlog data source", source),
               ("compactlog read_topic", fast), ("Python source from memory", memory)]

    print("\n| query | reader | best s | records/s | ÷ parquet |")
    print("|---|---|---:|---:|---:|")
    queries: list[tuple[str, Callable[[DataFrame], int]]] = [
        ("count()", lambda frame: frame.count()), ("sum(length(value))", value_bytes_sum)]
    for label, query in queries:
        results = {name: best_of(args.repeats, partial(query, frame)) for name, frame in readers}
        if len({result for _, result in results.values()}) != 1:
            sys.exit(f"{label}: the readers disagree: {results}")
        parquet_time = results["spark.read.parquet"][0]
        for name, (seconds, _) in results.items():
            print(f"| {label} | {name} | {seconds:.2f} | {args.records / seconds:,.0f} "
                  f"| {parquet_time / seconds:.2f} |")
    spark.stop()
    if args.data_dir is None:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
