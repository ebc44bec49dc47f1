"""`compactlog.spark.read_topic`: the fast read (Spark's Parquet reader for sealed files,
the store's read API for the tail) gives exactly the rows of the data source and of the
Reader API."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compactlog.spark import read_topic
from compactlog.storage.store import LogStore
from support.spark_source import TOPIC, frame_rows, load, reader_rows


@pytest.mark.parametrize("view", ["raw", "compacted"])
def test_read_topic_equals_the_reader_and_the_data_source(
        spark: SparkSession, data_dir: Path, view: str) -> None:
    fast = read_topic(spark, str(data_dir), TOPIC, view)
    # The same names and types (Parquet scans report every column nullable).
    assert fast.schema.simpleString() == load(spark, data_dir, view=view).schema.simpleString()
    rows = frame_rows(fast)
    assert rows == reader_rows(data_dir, view)
    assert rows == frame_rows(load(spark, data_dir, view=view))


def test_read_topic_of_chosen_partitions(spark: SparkSession, data_dir: Path) -> None:
    rows = frame_rows(read_topic(spark, str(data_dir), TOPIC, "compacted", partitions=[2, 0]))
    assert rows == sorted(reader_rows(data_dir, "compacted", iter([0, 2])))


def test_read_topic_of_an_empty_topic_and_bad_arguments(
        spark: SparkSession, tmp_path: Path) -> None:
    with LogStore.open(tmp_path / "data") as store:
        store.create_topic("empty", partitions=2)
    assert read_topic(spark, str(tmp_path / "data"), "empty").count() == 0
    with pytest.raises(Exception, match="unknown view 'latest'"):
        read_topic(spark, str(tmp_path / "data"), "empty", "latest")
    with pytest.raises(Exception, match="unknown topic 'nope'"):
        read_topic(spark, str(tmp_path / "data"), "nope")
