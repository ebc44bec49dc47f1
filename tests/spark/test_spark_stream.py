"""Streaming reads through the `compactlog` data source, on real Spark and real files.

Each query runs with trigger(availableNow=True) into foreachBatch, with its checkpoint
under tmp_path; a "restart" is a new query on the same checkpoint. What each run reads
is compared, record for record, with the Reader API from the positions the previous
run stopped at: nothing lost, nothing read twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession

from compactlog.client.reader import Reader
from compactlog.compaction import load_factory
from compactlog.errors import UserError
from compactlog.spark.options import parse_stream_options
from compactlog.spark.read import read_part
from compactlog.spark.read_plan import FilePart, plan_range
from compactlog.spark.stream import _capped
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.spark_source import millis

Row = tuple[int, int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]
TOPIC = "ticks"
PARTITIONS = 2
SMALL_SEGMENTS = {"segment.bytes": "2048", "min.compaction.lag.ms": "0"}
QUERY_TIMEOUT_S = 240


def produce(path: Path, start: int, count: int, keys: int = 30) -> None:
    with LogStore.open(path) as store:
        for i in range(start, start + count):
            value = None if i % 17 == 5 else b"tick-%d" % i
            headers = (("n", b"%d" % i),) if i % 5 == 0 else ()
            store.append(TOPIC, [ProducerRecord(b"k%d" % (i % keys), value, headers)])


def make_topic(path: Path, count: int, **config: str) -> None:
    with LogStore.open(path) as store:
        store.create_topic(TOPIC, partitions=PARTITIONS, config={**SMALL_SEGMENTS, **config})
    produce(path, 0, count)


def reader_rows(path: Path, view: str, start: dict[int, int] | None = None) -> list[Row]:
    """The view's records from `start` (per partition; default earliest), as the Reader
    API returns them."""
    rows: list[Row] = []
    with LogStore.open(path, read_only=True) as store:
        for index in range(PARTITIONS):
            position = (start or {}).get(index, "earliest")
            reader = Reader(store, TOPIC, index, position, read_compacted=view == "compacted")
            while batch := reader.poll(max_records=1000):
                rows += [(index, r.offset, r.timestamp, r.key, r.value, r.headers)
                         for r in batch]
    return rows


def rows_of(frame: DataFrame) -> list[Row]:
    return [
        (r["partition"], r["offset"], millis(r["timestamp"]), r["key"], r["value"],
         tuple((h["key"], h["value"]) for h in r["headers"] or ()))
        for r in frame.toArrow().to_pylist()
    ]


def run(spark: SparkSession, path: Path, checkpoint: Path, **options: str) -> list[list[Row]]:
    """One availableNow run of a streaming query: the rows of each micro-batch."""
    batches: list[list[Row]] = []

    def collect(frame: DataFrame, batch_id: int) -> None:
        batches.append(rows_of(frame))

    reader = spark.readStream.format("compactlog").option("path", str(path))
    for name, value in {"topic": TOPIC, **options}.items():
        reader = reader.option(name, value)
    query = (reader.load().writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    # Bounded: a query that never ends fails this test with its status, not the run.
    if not query.awaitTermination(QUERY_TIMEOUT_S):
        status = query.status
        query.stop()
        raise AssertionError(f"the availableNow query did not end in {QUERY_TIMEOUT_S} s: "
                             f"{status}, last progress {query.lastProgress}")
    return batches


def flat(batches: list[list[Row]]) -> list[Row]:
    return sorted(row for batch in batches for row in batch)


def ends_of(rows: list[Row], before: dict[int, int] | None = None) -> dict[int, int]:
    ends = dict(before or {})
    for row in rows:
        ends[row[0]] = max(ends.get(row[0], 0), row[1] + 1)
    return ends


def error_of(action: Any) -> str:
    with pytest.raises(Exception) as caught:  # Spark wraps the Python error
        action()
    return str(caught.value)


def test_a_restarted_query_reads_exactly_the_new_records(
    spark: SparkSession, tmp_path: Path
) -> None:
    data, checkpoint = tmp_path / "data", tmp_path / "checkpoint"
    make_topic(data, 200)
    first = flat(run(spark, data, checkpoint))
    assert first == sorted(reader_rows(data, "raw")) and len(first) == 200
    assert any(r[4] is None for r in first) and any(r[5] for r in first)

    produce(data, 200, 120)  # seals more segments, and leaves a new unsealed tail
    second = flat(run(spark, data, checkpoint))
    assert second == sorted(reader_rows(data, "raw", ends_of(first)))
    assert len(second) == 120 and not set(first) & set(second)

    assert flat(run(spark, data, checkpoint)) == []  # nothing new: nothing read


def test_starting_offsets_latest_and_json(spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_topic(data, 100)
    with LogStore.open(data, read_only=True) as store:
        ends = {p.index: p.log_end_offset for p in store.topic(TOPIC).partitions}

    latest = tmp_path / "latest"
    assert flat(run(spark, data, latest, startingOffsets="latest")) == []
    produce(data, 100, 30)
    assert flat(run(spark, data, latest, startingOffsets="latest")) == sorted(
        reader_rows(data, "raw", ends))

    # A JSON start: partition 0 from offset 7, partition 1 (not named) from the earliest.
    got = flat(run(spark, data, tmp_path / "json", startingOffsets='{"0": 7}'))
    assert got == sorted(reader_rows(data, "raw", {0: 7}))
    assert min(r[1] for r in got if r[0] == 0) == 7


def test_max_offsets_per_trigger_splits_an_available_now_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    make_topic(data, 200)
    batches = [b for b in run(spark, data, tmp_path / "ck", maxOffsetsPerTrigger="60") if b]
    assert len(batches) == 4 and all(len(b) <= 60 for b in batches)
    assert flat(batches) == sorted(reader_rows(data, "raw"))


def test_the_compacted_view_resumes_across_a_compaction(
    spark: SparkSession, tmp_path: Path
) -> None:
    data, checkpoint = tmp_path / "data", tmp_path / "checkpoint"
    make_topic(data, 200, **{"cleanup.policy": "compact"})
    compact(data)
    first = flat(run(spark, data, checkpoint, view="compacted"))
    assert first == sorted(reader_rows(data, "compacted"))
    assert len(first) < 200  # the ledger kept one record per key below the horizon

    # More records, then a compaction whose horizon passes where the query stopped.
    produce(data, 200, 200)
    horizons = compact(data)
    stopped = ends_of(first)
    assert all(horizons[index] >= stopped[index] for index in range(PARTITIONS))
    produce(data, 400, 20)  # and a tail above the new horizon

    second = flat(run(spark, data, checkpoint, view="compacted"))
    assert second == sorted(reader_rows(data, "compacted", stopped))
    assert not {r[:2] for r in first} & {r[:2] for r in second}
    for index in range(PARTITIONS):  # the ledger part: one record per key
        keys = [r[3] for r in second if r[0] == index and r[1] <= horizons[index]]
        assert len(keys) == len(set(keys)) > 0


def compact(path: Path) -> dict[int, int]:
    """Seal what there is and compact it; the new horizons."""
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    with LogStore.open(path) as store:
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
        factory.new_service(store, TOPIC, {}).compact()
        return {p.index: p.manifest.horizon
                for p in store.topic(TOPIC).partitions}


def test_records_deleted_by_retention_before_they_were_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    make_topic(data, 200, **{"retention.bytes": "3000"})
    with LogStore.open(data) as store:
        for partition in store.topic(TOPIC).partitions:
            partition.apply_retention()
        starts = {p.index: p.log_start_offset for p in store.topic(TOPIC).partitions}
    assert starts[0] > 0

    message = error_of(lambda: run(spark, data, tmp_path / "a", startingOffsets='{"0": 0}'))
    assert f"{TOPIC}/0: offsets 0..{starts[0] - 1} were deleted by retention" in message
    assert "failOnDataLoss" in message

    got = flat(run(spark, data, tmp_path / "b", startingOffsets='{"0": 0}',
                   failOnDataLoss="false"))
    assert got == sorted(reader_rows(data, "raw"))  # from the log start on
    assert min(r[1] for r in got if r[0] == 0) == starts[0]


@pytest.mark.parametrize(("options", "message"), [
    ({"startingOffsets": "yesterday"}, "must be 'earliest', 'latest' or a JSON object"),
    ({"startingOffsets": '{"0": "x"}'}, "is not a partition and an offset"),
    ({"startingOffsets": '{"5": 0}'}, "names partition 5, which this query does not read"),
    ({"startingOffsets": '{"0": 100000}'}, "offset 100000 of ticks/0 is past its log end"),
    ({"maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be a whole number >= 1"),
    ({"failOnDataLoss": "maybe"}, "'failOnDataLoss' must be 'true' or 'false'"),
    ({"view": "latest"}, "unknown view 'latest'"),
    ({"topic": "nope"}, "unknown topic 'nope'"),
    ({"startingOffset": "latest"}, "unknown option(s) 'startingoffset'"),
])
def test_bad_stream_options_name_what_is_wrong(
    spark: SparkSession, tmp_path: Path, options: dict[str, str], message: str
) -> None:
    data = tmp_path / "data"
    make_topic(data, 10)
    assert message in error_of(lambda: run(spark, data, tmp_path / "ck", **options))


def test_a_batch_read_refuses_streaming_options(spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_topic(data, 10)
    message = error_of(lambda: spark.read.format("compactlog").option("path", str(data))
                       .option("topic", TOPIC).option("startingOffsets", "latest").load()
                       .count())
    assert "option 'startingOffsets' is for streaming reads (spark.readStream)" in message


def test_the_record_cap_is_shared_by_backlog() -> None:
    assert _capped({"0": 0, "1": 0}, {"0": 10, "1": 20}, 100) == {"0": 10, "1": 20}
    # backlogs 30 and 10: shares 7 and 2, and the one left over to the larger backlog
    assert _capped({"0": 0, "1": 5}, {"0": 30, "1": 15}, 10) == {"0": 8, "1": 7}
    capped = _capped({"0": 0, "1": 0, "2": 0}, {"0": 1, "1": 1, "2": 1}, 2)
    assert sum(capped.values()) == 2


def test_a_range_ending_inside_a_sealed_file_stops_there(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_topic(data, 200)
    with LogStore.open(data, read_only=True) as store:
        topic = store.topic(TOPIC)
        partition = topic.partitions[0]
        first = partition.manifest.segments[0]
        start, end = first.base_offset + 1, first.last_offset + 3  # into the next file
        parts = list(plan_range(partition, topic.config, "raw", start, end))
    files = [p for p in parts if isinstance(p, FilePart)]
    assert len(files) == len(parts) == 2
    assert [p.end_offset for p in files] == [None, end]
    offsets = [o for part in files for batch in read_part(part)
               for o in batch.column("offset").to_pylist()]
    assert offsets == list(range(start, end))


@pytest.mark.parametrize(("options", "expected"), [
    ({"maxOffsetsPerTrigger": "60"}, 60),
    ({"maxoffsetspertrigger": "60"}, 60),  # Spark's options are case-insensitive
    ({"maxRecordsPerTrigger": "60"}, 60),  # the deprecated alias, with a warning
    ({}, None),
])
def test_max_offsets_per_trigger_is_kafkas_name_and_the_old_one_still_works(
    options: dict[str, str], expected: int | None, caplog: pytest.LogCaptureFixture
) -> None:
    parsed = parse_stream_options({"path": "/d", "topic": "t", **options})
    assert parsed.max_records_per_trigger == expected
    deprecated = "deprecated: use 'maxOffsetsPerTrigger'" in caplog.text
    assert deprecated == ("maxRecordsPerTrigger" in options)


def test_both_names_of_the_trigger_limit_are_refused() -> None:
    with pytest.raises(UserError, match="both set: keep 'maxOffsetsPerTrigger'"):
        parse_stream_options({"path": "/d", "topic": "t", "maxOffsetsPerTrigger": "1",
                              "maxRecordsPerTrigger": "2"})
