"""`read_topic`: a topic or its compacted view as a DataFrame, read mostly by Spark's own
Parquet reader.

The `compactlog` data source moves every row from a Python worker into the JVM as Arrow
batches, which costs more than reading the files: measured at 0.37 of
`spark.read.parquet` on a full scan, and a Python source that reads nothing at all gets
only 0.48 (docs/benchmarks.md). So this function plans the same read as the data source
(spark/read_plan.py, one snapshot of each partition's manifest) and splits it:

- the sealed segments and ledger files go to `spark.read.parquet`, one scan per partition
  and kind, with the partition number as a constant and the row condition the data
  source's tasks apply (storage/view_rows.py: offset bounds, DeleteRecords, retention.ms
  on compact,delete) as a SQL filter; Spark prunes columns and verifies every page's
  checksum (`parquet.page.verify-checksum.enabled`, sealed files are written with
  them); the ledger rows that deletion vectors delete, and expired tombstones (found on
  the driver from narrow columns), are taken out by a broadcast anti-join;
- the unsealed tail of each partition, [sealed end, log end) at planning, goes through a
  small Python source (`compactlog-tail`) over the store's read API, which finds those
  records wherever they are by then (still in the log, or sealed meanwhile).

The result has the data source's schema and the same rows.

On an s3:// location, Spark's Parquet reader cannot read the files (pip's PySpark has
no s3a connector), so `read_topic` reads through the `compactlog` data source, whose
tasks fetch each file with Python (spark/read.py): the same rows, at the data source's
speed, of the sealed part only (spark/read_plan.py).
One difference: the data source proves each whole file against the manifest's CRC32C
before parsing it; here Spark checks page checksums, so damage outside the pages (a
footer) fails the Parquet reader with its own error rather than ours.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from compactlog.backend import Location
from compactlog.errors import UserError
from compactlog.spark.kafka_schema import CREATE_TIME, PARQUET_SCHEMA, SPARK_SCHEMA
from compactlog.spark.options import VIEWS, ReadOptions
from compactlog.spark.read import read_tail
from compactlog.spark.read_plan import FilePart, TailPart, plan_read
from compactlog.spark.source import NAME, CompactlogDataSource
from compactlog.storage import LogStore, read_deletion_vector

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

TAIL_SOURCE = "compactlog-tail"


def read_topic(spark: SparkSession, path: str, topic: str, view: str = "raw",
               partitions: list[int] | None = None,
               clock: Callable[[], float] = time.time) -> DataFrame:
    """Every record of `topic` (view "raw") or its compacted view ("compacted"), with
    Spark's Kafka source's columns (spark/kafka_schema.py): the same rows as
    `spark.read.format("compactlog")` with these options, read faster. The view's time
    rules (retention.ms on compact,delete, delete.retention.ms) are evaluated at
    `clock()`, when the read is planned."""
    from pyspark.sql import functions as F

    if view not in VIEWS:
        raise UserError(f"unknown view {view!r}: use 'raw' or 'compacted'")
    if Location.parse(path).is_s3:
        # No S3 connector in Spark's Parquet reader: the data source's tasks read the
        # files with Python (see the module's docstring).
        spark.dataSource.register(CompactlogDataSource)
        reader = (spark.read.format(NAME).option("path", path).option("topic", topic)
                  .option("view", view))
        if partitions is not None:
            reader = reader.option("partitions", ",".join(map(str, partitions)))
        return reader.load()
    parts = plan_read(ReadOptions(path, topic, "raw" if view == "raw" else "compacted",
                                  tuple(partitions) if partitions is not None else None),
                      clock)
    frames: list[DataFrame] = []
    tails: list[TailPart] = []
    files: dict[tuple[int, bool], list[FilePart]] = {}
    for part in parts:
        if isinstance(part, TailPart):
            tails.append(part)
        elif isinstance(part, FilePart):
            files.setdefault((part.partition, part.is_ledger), []).append(part)
    for (partition, _), group in files.items():
        frame = (spark.read.schema(PARQUET_SCHEMA)
                 .option("parquet.page.verify-checksum.enabled", "true")
                 .parquet(*(_local(part) for part in group)))
        # One condition for every file of the partition and kind, without the bounds
        # that all of them meet: a filter makes even count() read its columns.
        condition = group[0].group_condition.within(
            min(part.info.base_offset for part in group),
            max(part.info.last_offset for part in group),
            min(part.info.min_timestamp for part in group))
        bounds = condition.bounds_sql()
        if bounds is not None:
            frame = frame.where(bounds)
        excluded = [offsets for part in group for offsets in _excluded(part)]
        if excluded:
            # Ledger rows that deletion vectors deleted (storage/deletion.py) and expired
            # tombstones are not in the view: a broadcast anti-join on their offsets.
            gone = spark.createDataFrame(pa.table({"offset": np.concatenate(excluded)}))
            frame = frame.join(F.broadcast(gone), on="offset", how="left_anti")
        # Spark's Kafka source's columns (spark/kafka_schema.py), from the files' ms timestamps.
        frame = frame.select(
            "key", "value", F.lit(topic).alias("topic"),
            F.lit(partition).cast("int").alias("partition"), "offset",
            F.timestamp_millis("timestamp").alias("timestamp"),
            F.lit(CREATE_TIME).cast("int").alias("timestampType"), "headers")
        frames.append(frame)
    if tails:
        spark.dataSource.register(TailSource)
        ranges = [[t.partition, t.start_offset, t.end_offset] for t in tails]
        frames.append(spark.read.format(TAIL_SOURCE).option("path", path)
                      .option("topic", topic).option("ranges", json.dumps(ranges)).load())
    if not frames:
        return spark.createDataFrame([], SPARK_SCHEMA)
    result = frames[0]
    for other in frames[1:]:
        result = result.unionByName(other)
    return result


def _local(part: FilePart) -> str:
    path = part.local_path
    assert path is not None, "a local data directory plans local files"
    return path


def _excluded(part: FilePart) -> Iterator[np.ndarray]:
    """The offsets of `part`'s file that are not in the view though its bounds hold: its
    deletion vector's, and its tombstones past delete.retention.ms (read here, on the
    driver, from narrow columns: RowCondition.tombstone_columns)."""
    info = part.info
    if info.dv_file:
        yield read_deletion_vector(Path(_local(part)).parent / info.dv_file,
                                   info.dv_size_bytes, info.dv_crc32c)
    condition = part.rows.condition
    if condition.tombstone_cutoff_ms is not None:
        narrow = pq.read_table(_local(part), columns=["offset", *condition.tombstone_columns])
        yield part.rows.expired_tombstones(narrow)


class TailSource(DataSource):
    """Offset ranges of partitions' raw logs, read through the store (internal)."""

    @classmethod
    def name(cls) -> str:
        return TAIL_SOURCE

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> TailReader:
        return TailReader(dict(self.options))


class TailReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.topic = options["topic"]
        self.ranges: list[list[int]] = json.loads(options["ranges"])

    def partitions(self) -> list[InputPartition]:
        with LogStore.open(self.path, read_only=True) as store:
            topic = store.topic(self.topic)
            return [
                TailPart(self.topic, index, str(topic.partition(index).directory),
                         topic.config, start, end)
                for index, start, end in self.ranges
            ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, TailPart):
            return iter(())
        return read_tail(partition)
