"""Fixtures of the Spark data source tests (test_spark_source.py, test_spark_fast.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compactlog.compaction.spark_service import SparkCompactionService
from compactlog.storage.store import LogStore
from support.spark_source import CONFIG, PARTITIONS, TOPIC, produce


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Path:
    """One topic, built once for each module that takes it: three partitions with several
    sealed segments, overwritten keys, tombstones and headers, compacted by the Spark
    service, then more records sealed above the horizon and an unsealed tail."""
    path = tmp_path_factory.mktemp("spark-source") / "data"
    with LogStore.open(path) as store:
        store.create_topic(TOPIC, partitions=PARTITIONS, config=CONFIG)
        produce(store, 0, 300)
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
    with LogStore.open(path, read_only=True) as store:
        service = SparkCompactionService(store, TOPIC, {"spark.session": spark})
        service.compact()
    with LogStore.open(path) as store:
        produce(store, 300, 20)  # keys 20..39 again: the next run's DVs delete their old records
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
    with LogStore.open(path, read_only=True) as store:
        SparkCompactionService(store, TOPIC, {"spark.session": spark}).compact()
    with LogStore.open(path) as store:
        produce(store, 320, 130, keys=60)  # sealed above the horizon (segment.bytes rolls)
        for partition in store.topic(TOPIC).partitions:
            partition.auto_seal = False  # from here on, rolled log segments stay unsealed
        produce(store, 450, 120, keys=60)
    return path
