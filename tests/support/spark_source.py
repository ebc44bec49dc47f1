"""The topic the Spark data source tests read (the `data_dir` fixture of
tests/spark/conftest.py builds it once per module), and its rows as the store's Reader and
as a DataFrame give them."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from compactlog.client.reader import Reader
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore

Row = tuple[int, int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]


TOPIC = "prices"


PARTITIONS = 3


# Deletion vectors on, never a rewrite: the second compaction leaves DVs on the ledger.
CONFIG = {"cleanup.policy": "compact", "segment.bytes": "2048", "min.compaction.lag.ms": "0",
          "compaction.deletion.vectors": "true",
          "compaction.ledger.rewrite.live.fraction": "0"}


def produce(store: LogStore, start: int, count: int, keys: int = 40) -> None:
    for i in range(start, start + count):
        value = None if i % 23 == 7 else b"price-%d" % i  # every 23rd record a tombstone
        headers = (("source", b"feed-%d" % (i % 3)),) if i % 4 == 0 else ()
        store.append(TOPIC, [ProducerRecord(b"sym-%d" % (i % keys), value, headers)])


def reader_rows(path: Path, view: str, partitions: Iterator[int] | None = None) -> list[Row]:
    rows: list[Row] = []
    with LogStore.open(path, read_only=True) as store:
        for index in partitions if partitions is not None else range(PARTITIONS):
            reader = Reader(store, TOPIC, index, read_compacted=view == "compacted")
            while batch := reader.poll(max_records=1000):
                rows += [(index, r.offset, r.timestamp, r.key, r.value, r.headers)
                         for r in batch]
    return rows


def frame_rows(frame: DataFrame) -> list[Row]:
    table = frame.orderBy("partition", "offset").toArrow()
    return [
        (r["partition"], r["offset"], millis(r["timestamp"]), r["key"], r["value"],
         tuple((h["key"], h["value"]) for h in r["headers"] or ()))
        for r in table.to_pylist()
    ]


def millis(at: datetime) -> int:
    """A `timestamp` of the data source (Spark's timestamp type, UTC) as the store's ms."""
    return (at - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def load(spark: SparkSession, path: Path | str, **options: str) -> DataFrame:
    reader = spark.read.format("compactlog").option("path", str(path))
    for name, value in {"topic": TOPIC, **options}.items():
        reader = reader.option(name, value)
    return reader.load()
