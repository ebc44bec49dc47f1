"""The `compactlog` Spark data source, on real Spark and real files.

One topic is built once for the module: three partitions with several sealed segments,
overwritten keys, tombstones and headers, compacted by the Spark service, then more
records sealed above the horizon and an unsealed tail (rolled but unsealed log segments
and the active one). Every read through the data source is compared, record for record,
with what the Reader API returns for the same view.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from compactlog.client.reader import Reader
from compactlog.errors import UserError
from compactlog.spark import register
from compactlog.spark.options import parse_read_options
from compactlog.spark.read import read_part
from compactlog.spark.read_plan import TailPart, plan_read
from compactlog.storage.logfile import log_file_name
from compactlog.storage.partitioner import partition_for_key
from compactlog.storage.store import LogStore
from support.spark_source import (
    PARTITIONS,
    TOPIC,
    Row,
    frame_rows,
    load,
    produce,
    reader_rows,
)

# -- the views, against the Reader API --------------------------------------------------


def test_the_fixture_has_every_kind_of_data(data_dir: Path) -> None:
    with LogStore.open(data_dir, read_only=True) as store:
        for partition in store.topic(TOPIC).partitions:
            manifest = partition.manifest
            horizon = manifest.horizon
            assert horizon is not None and manifest.ledger
            assert any(info.dv_file for info in manifest.ledger)
            assert any(s.base_offset > horizon for s in manifest.segments)
            assert len(partition.logs) > 1  # rolled, unsealed, and the active segment
            assert partition.log_end_offset > manifest.sealed_end_offset


def test_the_compacted_view_keeps_one_record_per_key_below_the_horizon(
        data_dir: Path) -> None:
    """With deletion vectors applied: each key's latest record as of the horizon."""
    compacted = reader_rows(data_dir, "compacted")
    raw = reader_rows(data_dir, "raw")
    with LogStore.open(data_dir, read_only=True) as store:
        horizons = [p.manifest.horizon for p in store.topic(TOPIC).partitions]
    for index, horizon in enumerate(horizons):
        assert horizon is not None
        latest: dict[bytes | None, Row] = {}
        for row in raw:
            if row[0] == index and row[1] <= horizon:
                latest[row[3]] = row
        below = [row for row in compacted if row[0] == index and row[1] <= horizon]
        assert below == sorted(latest.values(), key=lambda row: row[1])


@pytest.mark.parametrize("view", ["raw", "compacted"])
def test_a_view_equals_the_reader_record_for_record(
    spark: SparkSession, data_dir: Path, view: str
) -> None:
    expected = reader_rows(data_dir, view)
    got = frame_rows(load(spark, data_dir, view=view))
    assert got == expected
    assert any(r[4] is None for r in got) and any(r[5] for r in got)  # tombstones, headers
    if view == "raw":
        assert len(got) == 570


def test_the_compacted_view_keeps_one_record_per_key_up_to_the_horizon(
    spark: SparkSession, data_dir: Path
) -> None:
    frame = load(spark, data_dir, view="compacted")
    with LogStore.open(data_dir, read_only=True) as store:
        horizons = [p.manifest.horizon
                    for p in store.topic(TOPIC).partitions]
    clean = frame_rows(frame)
    for index, horizon in enumerate(horizons):
        keys = [r[3] for r in clean if r[0] == index and r[1] <= horizon]
        assert len(keys) == len(set(keys)) > 0


def test_explicit_register_and_chosen_partitions(spark: SparkSession, data_dir: Path) -> None:
    register(spark)  # also found by itself through the pyspark_compactlog module
    got = frame_rows(load(spark, data_dir, view="compacted", partitions="2,0"))
    assert got == reader_rows(data_dir, "compacted", iter([0, 2]))
    # Spark's Kafka source's columns, names and types (KafkaRecordToRowConverter).
    frame = load(spark, data_dir)
    assert frame.schema.simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int,headers:array<struct<key:string,value:binary>>>"
    )
    assert {tuple(r) for r in frame.select("topic", "timestampType").distinct().collect()} \
        == {(TOPIC, 0)}


def test_an_empty_topic_reads_as_no_rows(spark: SparkSession, tmp_path: Path) -> None:
    with LogStore.open(tmp_path) as store:
        store.create_topic(TOPIC, partitions=2)
    assert load(spark, tmp_path).count() == 0
    assert load(spark, tmp_path, view="compacted").count() == 0


def test_a_tail_sealed_after_planning_is_read_from_its_parquet_file(tmp_path: Path) -> None:
    with LogStore.open(tmp_path) as store:
        store.create_topic(TOPIC)  # segment.bytes 128 MiB: nothing rolls by itself
        produce(store, 0, 30)
    (tail,) = plan_read(parse_read_options({"path": str(tmp_path), "topic": TOPIC}))
    assert isinstance(tail, TailPart) and (tail.start_offset, tail.end_offset) == (0, 30)
    with LogStore.open(tmp_path) as store:
        store.topic(TOPIC).partitions[0].roll()  # sealed, and its log file deleted
        produce(store, 30, 5)  # past the planned end: not read
        assert not (tmp_path / "topics" / TOPIC / "0" / "log" / log_file_name(0)).exists()
    offsets = [o for batch in read_part(tail) for o in batch.column("offset").to_pylist()]
    assert offsets == list(range(30))


# -- bad input ---------------------------------------------------------------------------


def error_of(frame_action: Any) -> str:
    with pytest.raises(Exception) as caught:  # Spark wraps the Python error
        frame_action()
    return str(caught.value)


@pytest.mark.parametrize(("options", "message"), [
    ({"topic": ""}, "needs option 'topic'"),
    ({"view": "latest"}, "unknown view 'latest'"),
    ({"topic": "nope"}, "unknown topic 'nope'"),
    ({"partitions": "0,x"}, "comma-separated list of partition numbers"),
    ({"partitions": "7"}, "has no partition 7"),
    ({"startingOffset": "5"}, "unknown option(s) 'startingoffset'"),
])
def test_bad_options_name_what_is_wrong(
    spark: SparkSession, data_dir: Path, options: dict[str, str], message: str
) -> None:
    assert message in error_of(lambda: load(spark, data_dir, **options).count())


def test_a_missing_path_or_data_dir_is_named(spark: SparkSession, tmp_path: Path) -> None:
    missing = error_of(lambda: spark.read.format("compactlog").option("topic", TOPIC)
                       .load().count())
    assert "needs option 'path'" in missing
    assert f"no compactlog data directory at {tmp_path}" in error_of(
        lambda: load(spark, tmp_path).count())


def test_a_corrupt_parquet_file_fails_the_read_naming_it(
    spark: SparkSession, data_dir: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "data"
    shutil.copytree(data_dir, copy)
    victim = sorted((copy / "topics" / TOPIC / "1" / "segments").glob("*.parquet"))[-1]
    damaged = bytearray(victim.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    victim.write_bytes(bytes(damaged))
    message = error_of(lambda: load(spark, copy).count())
    assert str(victim) in message and "CRC32C mismatch" in message
    # The rest stays readable.
    assert load(spark, copy, partitions="0,2").count() == len(
        reader_rows(copy, "raw", iter([0, 2])))


# -- the writer --------------------------------------------------------------------------


def test_written_rows_are_appended_in_order_and_read_back(
    spark: SparkSession, tmp_path: Path
) -> None:
    with LogStore.open(tmp_path) as store:
        store.create_topic("in", partitions=PARTITIONS)
    rows = [(b"k%d" % (i % 17), None if i % 11 == 0 else b"v%d" % i,
             1_700_000_000_000 + i, [("h", b"%d" % i)] if i % 3 == 0 else None,
             2 if i % 10 == 0 else None)
            for i in range(200)]
    # Two tasks (local[2]), each a run of consecutive rows: commit appends them in order.
    frame = spark.createDataFrame(
        rows, "key binary, value binary, timestamp bigint, "
        "headers array<struct<key:string,value:binary>>, partition int",
    )
    assert frame.rdd.getNumPartitions() > 1
    frame.write.format("compactlog").option("path", str(tmp_path)).option("topic", "in") \
        .mode("append").save()

    got = frame_rows(load(spark, tmp_path, topic="in"))
    assert got == reader_rows_of(tmp_path, "in")
    assert {r[2]: (r[3], r[4], r[5]) for r in got} == {
        ts: (key, value, tuple(headers or ())) for key, value, ts, headers, _ in rows}
    with LogStore.open(tmp_path, read_only=True) as store:
        count = len(store.topic("in").partitions)
    for key, value, ts, _, partition in rows:
        (record,) = [r for r in got if r[2] == ts]
        expected = 2 if partition is not None else partition_for_key(key, count)
        assert record[0] == expected, (key, value)
    for index in range(PARTITIONS):  # each partition kept the DataFrame's order
        stamps = [r[2] for r in got if r[0] == index]
        assert stamps == sorted(stamps)
    assert not list((tmp_path / "spark-staging").glob("*/*"))


def reader_rows_of(path: Path, topic: str) -> list[Row]:
    rows: list[Row] = []
    with LogStore.open(path, read_only=True) as store:
        for index in range(len(store.topic(topic).partitions)):
            reader = Reader(store, topic, index)
            while batch := reader.poll(max_records=1000):
                rows += [(index, r.offset, r.timestamp, r.key, r.value, r.headers)
                         for r in batch]
    return rows


def test_string_columns_and_spark_timestamps_are_accepted(
    spark: SparkSession, tmp_path: Path
) -> None:
    with LogStore.open(tmp_path) as store:
        store.create_topic("in")
    frame = spark.sql("SELECT 'a' AS key, 'x' AS value, timestamp_millis(1700000000123L) "
                      "AS timestamp")
    frame.write.format("compactlog").option("path", str(tmp_path)).option("topic", "in") \
        .mode("append").save()
    assert [r[2:5] for r in reader_rows_of(tmp_path, "in")] == [
        (1_700_000_000_123, b"a", b"x")]


def test_bad_writes_append_nothing_and_say_why(spark: SparkSession, tmp_path: Path) -> None:
    with LogStore.open(tmp_path) as store:
        store.create_topic("c", config={"cleanup.policy": "compact"})
    good = spark.createDataFrame([(b"a", b"1")], "key binary, value binary")
    keyless = spark.createDataFrame([(b"a", b"1"), (None, b"2")], "key binary, value binary")

    def save(frame: DataFrame, mode: str = "append") -> None:
        frame.write.format("compactlog").option("path", str(tmp_path)).option("topic", "c") \
            .mode(mode).save()

    assert "refuses null keys" in error_of(lambda: save(keyless))
    assert "append-only" in error_of(lambda: save(good, "overwrite"))
    assert "does not know column 'offset'" in error_of(
        lambda: save(good.selectExpr("key", "value", "0L AS offset")))
    assert "unknown topic 'nope'" in error_of(
        lambda: good.write.format("compactlog").option("path", str(tmp_path))
        .option("topic", "nope").mode("append").save())
    with LogStore.open(tmp_path):  # a writer (a server, say) holds the data directory
        assert "in use by another writer" in error_of(lambda: save(good))
    assert reader_rows_of(tmp_path, "c") == []
    assert not list((tmp_path / "spark-staging").glob("*/*"))
    save(good)
    assert [r[3:5] for r in reader_rows_of(tmp_path, "c")] == [(b"a", b"1")]


def test_options_are_checked_before_spark_runs_anything() -> None:
    with pytest.raises(UserError, match="needs option 'path'"):
        parse_read_options({"topic": TOPIC})
    assert parse_read_options({"Path": "/d", "TOPIC": "t", "view": "Compacted",
                               "partitions": "1, 0,1"}).partitions == (1, 0)
