"""Every read path of a topic's views, each reduced to the same rows, so that tests can
say "all of them serve the same records" (DESIGN.md, contract item 14).

A row is (partition, offset, key, value). The paths:
  - reader:   the Reader API (`Partition.read_compacted` / `read`);
  - fetch:    Kafka Fetch's bytes (server/protocol/record_batches.py `read_batches`),
              decoded as a consumer does: records below its position skipped, the
              position moved to each batch's last offset + 1;
  - duckdb, polars: `compactlog.tables.view_dataset` scanned by DuckDB and by Polars
              (the sealed part of the view only, see tables.py);
  - spark:    `spark.read.format("compactlog")`;
  - read_topic: `compactlog.spark.read_topic`, Spark's own Parquet reader.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StructType

from compactlog.client.reader import Reader
from compactlog.server.protocol.record_batches import read_batches
from compactlog.spark.source import CompactlogDataSource, CompactlogReader
from compactlog.storage.records import decode_batch, iter_batches
from compactlog.storage.store import LogStore
from compactlog.tables import view_dataset

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from compactlog.storage.partition import Partition

Row = tuple[int, int, bytes | None, bytes | None]
Clock = Callable[[], float]


def reader_rows(store: LogStore, topic: str, view: str = "compacted") -> list[Row]:
    rows: list[Row] = []
    for index in range(len(store.topic(topic).partitions)):
        reader = Reader(store, topic, index, read_compacted=view == "compacted")
        while batch := reader.poll(max_records=7):  # small reads: every resume point
            rows += [(index, r.offset, r.key, r.value) for r in batch]
    return rows


def fetch_partition(partition: Partition, view: str = "compacted",
                    max_bytes: int = 300) -> list[Row]:
    """A consumer's Fetch loop over one partition, from the earliest position to the
    high watermark (small max_bytes: many fetches, each resuming where one stopped)."""
    position, rows = 0, []
    for _ in range(100_000):
        read = read_batches(partition, position, max_bytes, view == "compacted")
        # Below the view's start a consumer is reset to it (OFFSET_OUT_OF_RANGE, then
        # ListOffsets earliest): the records before it in a whole batch are not its.
        position = max(position, read.log_start_offset)
        if not read.records:
            assert position >= read.high_watermark or read.next_offset >= read.high_watermark, (
                f"{partition.name}: no records at {position} below the high watermark "
                f"{read.high_watermark}")
            return rows
        for _, header in iter_batches(read.records):
            start = _position_in(read.records, header)
            batch = read.records[start : start + header.size]
            rows += [(partition.index, r.offset, r.key, r.value)
                     for r in decode_batch(batch) if r.offset >= position]
            position = max(position, header.last_offset + 1)
        assert read.next_offset == position
    raise AssertionError(f"{partition.name}: the consumer never reached the high watermark")


def _position_in(data: bytes, header: Any) -> int:
    for position, found in iter_batches(data):
        if found.base_offset == header.base_offset:
            return position
    raise AssertionError("batch not found")


def fetch_rows(store: LogStore, topic: str, view: str = "compacted") -> list[Row]:
    rows: list[Row] = []
    for partition in store.topic(topic).partitions:
        partition.refresh()
        rows += fetch_partition(partition, view)
    return rows


def sealed_part(rows: list[Row], store: LogStore, topic: str) -> list[Row]:
    """`rows` below each partition's sealed end: what the table paths hold."""
    ends = [p.manifest.sealed_end_offset for p in store.topic(topic).partitions]
    return [row for row in rows if row[1] < ends[row[0]]]


def duckdb_rows(path: Path | str, topic: str, view: str = "compacted",
                clock: Clock | None = None) -> list[Row]:
    import duckdb

    dataset = view_dataset(path, topic, view, **_clocked(clock))  # noqa: F841  (DuckDB scans it)
    found = duckdb.sql('SELECT partition, "offset", key, value FROM dataset '
                       'ORDER BY partition, "offset"').fetchall()
    return [(p, o, k, v) for p, o, k, v in found]


def polars_rows(path: Path | str, topic: str, view: str = "compacted",
                clock: Clock | None = None) -> list[Row]:
    import polars as pl

    dataset = view_dataset(path, topic, view, **_clocked(clock))
    frame = pl.scan_pyarrow_dataset(dataset).select(
        "partition", "offset", "key", "value").sort("partition", "offset").collect()
    return [(r["partition"], r["offset"], r["key"], r["value"]) for r in frame.to_dicts()]


def frame_rows(frame: DataFrame) -> list[Row]:
    table = frame.select("partition", "offset", "key", "value").toArrow()
    return sorted((r["partition"], r["offset"], r["key"], r["value"])
                  for r in table.to_pylist())


def spark_rows(spark: SparkSession, path: Path | str, topic: str,
               view: str = "compacted", source: str = "compactlog",
               **options: str) -> list[Row]:
    reader = (spark.read.format(source).option("path", str(path)).option("topic", topic)
              .option("view", view))
    for name, value in options.items():
        reader = reader.option(name, value)
    return frame_rows(reader.load())


class FixedClock:
    """A clock that stays at `now` (seconds), picklable for Spark's Python workers."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class ClockedSource(CompactlogDataSource):
    """The `compactlog` data source planning at the instant of option `clock` (seconds):
    for tests whose store runs on a fake clock. Spark's workers import it from tests/
    (conftest.py puts the folder on their PYTHONPATH)."""

    @classmethod
    def name(cls) -> str:
        return "compactlog-clocked"

    def reader(self, schema: StructType) -> CompactlogReader:
        options = dict(self.options)
        now = float(options.pop("clock"))
        reader = CompactlogReader(options)
        reader.clock = FixedClock(now)
        return reader


def clocked_spark_rows(spark: SparkSession, path: Path | str, topic: str, now: float,
                       view: str = "compacted") -> list[Row]:
    """`spark_rows` through the data source's own planner and tasks, at instant `now`."""
    spark.dataSource.register(ClockedSource)
    return spark_rows(spark, path, topic, view, ClockedSource.name(), clock=repr(now))


def read_topic_rows(spark: SparkSession, path: Path | str, topic: str,
                    view: str = "compacted", clock: Clock | None = None) -> list[Row]:
    from compactlog.spark import read_topic

    return frame_rows(read_topic(spark, str(path), topic, view, **_clocked(clock)))


def _clocked(clock: Clock | None) -> dict[str, Clock]:
    # Only when a test moves time itself: the default is the current time.
    return {} if clock is None else {"clock": clock}


def by_partition(rows: Sequence[Row]) -> list[Row]:
    return sorted(rows, key=lambda row: (row[0], row[1]))
