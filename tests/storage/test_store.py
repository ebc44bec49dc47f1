"""The log store: topics, appends, the writer lock, reads, timestamps, retention, Parquet."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from compactlog.errors import (
    DataDirLockedError,
    InvalidConfigError,
    InvalidRecordError,
    InvalidTopicNameError,
    ReadOnlyStoreError,
    TopicExistsError,
    UnknownConfigError,
    UnknownPartitionError,
    UnknownTopicError,
    UserError,
)
from compactlog.storage.manifest import SegmentInfo
from compactlog.storage.partition import Partition
from compactlog.storage.partitioner import partition_for_key
from compactlog.storage.records import ProducerRecord, Record, encode_batch
from compactlog.storage.store import MAX_PARTITIONS, LogStore
from support.fakes import T0, FakeClock


def read_all(partition: Partition, offset: int = 0) -> list[Record]:
    return partition.read(offset, max_records=1_000_000, max_bytes=1 << 40)


def key_for(partition: int, partitions: int, start: int = 0) -> bytes:
    for i in range(start, start + 10_000):
        key = b"key-%d" % i
        if partition_for_key(key, partitions) == partition:
            return key
    raise AssertionError("no key found")


# -- topics ---------------------------------------------------------------------------


def test_create_list_describe_alter_delete(store: LogStore, tmp_path: Path) -> None:
    assert store.list_topics() == []
    topic = store.create_topic("orders", partitions=3, config={"cleanup.policy": "delete,compact"})
    store.create_topic("alpha")
    assert store.list_topics() == ["alpha", "orders"]

    # describe: what `topics describe` shows.
    assert topic.name == "orders"
    assert topic.meta.partitions == 3 and len(topic.partitions) == 3
    assert len(topic.meta.topic_id) == 32
    assert topic.meta.created_ms == int(T0 * 1000)
    assert topic.config.cleanup_policy == "compact,delete"
    assert topic.config.effective()["segment.bytes"] == 128 * 1024 * 1024
    assert dict(topic.config.overrides) == {"cleanup.policy": "compact,delete"}
    for index, partition in enumerate(topic.partitions):
        assert partition.index == index
        assert partition.stats()["log_start_offset"] == 0
        assert partition.stats()["log_end_offset"] == 0
    assert all(report.clean for report in store.recovery_reports("orders"))

    # alter, and the change is durable and visible to readers.
    new_config = store.alter_topic("orders", {"retention.ms": "1000"}, delete=["cleanup.policy"])
    assert new_config["retention.ms"] == 1000
    assert new_config.cleanup_policy == "delete"
    assert store.topic("orders").config["retention.ms"] == 1000
    with LogStore.open(tmp_path / "data", read_only=True) as reader:
        assert reader.topic("orders").config["retention.ms"] == 1000
        store.alter_topic("orders", {"retention.ms": "2000"})
        assert reader.topic("orders").config["retention.ms"] == 2000
    with pytest.raises(InvalidConfigError):
        store.alter_topic("orders", {"retention.ms": "soon"})
    with pytest.raises(UnknownConfigError):
        store.alter_topic("orders", {"retention.msec": "1"})
    assert store.topic("orders").config["retention.ms"] == 2000

    # delete, then the name is free again and the new topic starts empty.
    store.append("orders", [ProducerRecord(b"k", b"v")])
    store.delete_topic("orders")
    assert store.list_topics() == ["alpha"]
    with pytest.raises(UnknownTopicError):
        store.topic("orders")
    recreated = store.create_topic("orders", partitions=1)
    assert recreated.meta.topic_id != topic.meta.topic_id
    assert recreated.partitions[0].log_end_offset == 0
    assert read_all(recreated.partitions[0]) == []


def test_topics_survive_reopen(tmp_path: Path, clock: FakeClock) -> None:
    with LogStore.open(tmp_path, clock=clock) as store:
        store.create_topic("t", partitions=2, config={"segment.bytes": "2048"})
        store.alter_topic("t", {"retention.bytes": 10_000})
        store.append("t", [ProducerRecord(b"a", b"1"), ProducerRecord(b"b", b"2")])
    with LogStore.open(tmp_path, clock=clock) as store:
        topic = store.topic("t")
        assert store.list_topics() == ["t"]
        assert topic.meta.partitions == 2
        assert topic.config["segment.bytes"] == 2048
        assert topic.config["retention.bytes"] == 10_000
        assert sum(p.log_end_offset for p in topic.partitions) == 2


def test_duplicate_create_raises(store: LogStore) -> None:
    store.create_topic("t", partitions=2)
    with pytest.raises(TopicExistsError, match="'t'"):
        store.create_topic("t", partitions=2)
    with pytest.raises(TopicExistsError):
        store.create_topic("t", partitions=5, config={"cleanup.policy": "compact"})
    assert store.topic("t").meta.partitions == 2
    assert store.topic("t").config.cleanup_policy == "delete"


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "a b", "x" * 250, "ünïcode", "tab\t", "../escape", "a\x00b"]
)
def test_bad_topic_names(store: LogStore, name: str) -> None:
    with pytest.raises(InvalidTopicNameError) as error:
        store.create_topic(name)
    assert repr(name) in str(error.value)
    assert store.list_topics() == []


@pytest.mark.parametrize("name", ["a", "A.b_c-9", "x" * 200, "__internal"])
def test_good_topic_names(store: LogStore, name: str) -> None:
    store.create_topic(name)
    assert store.list_topics() == [name]


@pytest.mark.parametrize("length", [236, 237, 249])
def test_longest_topic_names(store: LogStore, length: int) -> None:
    """Names of up to 249 characters are valid (Kafka's limit), so create and delete work."""
    name = "x" * length
    store.create_topic(name)
    store.append(name, [ProducerRecord(b"k", b"v")])
    assert store.list_topics() == [name]
    store.delete_topic(name)
    assert store.list_topics() == []


@pytest.mark.parametrize("name", ["...", ".hidden", ".creating-x", ".deleting-y"])
def test_topic_names_with_a_leading_dot(tmp_path: Path, clock: FakeClock, name: str) -> None:
    """A name the store accepts is a topic like any other: listed, kept across reopen.
    (Refusing such names up front with InvalidTopicNameError would also be consistent.)"""
    with LogStore.open(tmp_path, clock=clock) as store:
        try:
            store.create_topic(name)
        except InvalidTopicNameError:
            assert store.list_topics() == []
            return
        store.append(name, [ProducerRecord(b"k", b"v")])
    with LogStore.open(tmp_path, clock=clock) as store:
        # Reopening must not take the topic for a leftover of an interrupted create/delete.
        assert [r.value for r in read_all(store.topic(name).partitions[0])] == [b"v"]
        assert store.list_topics() == [name]


def test_unknown_topic(store: LogStore) -> None:
    for call in (
        lambda: store.topic("nope"),
        lambda: store.append("nope", [ProducerRecord(b"k", b"v")]),
        lambda: store.alter_topic("nope", {"retention.ms": "1"}),
        lambda: store.delete_topic("nope"),
        lambda: store.topic("../data"),
    ):
        with pytest.raises(UnknownTopicError):
            call()


@pytest.mark.parametrize("count", [0, -1, MAX_PARTITIONS + 1])
def test_partition_count_out_of_range(store: LogStore, count: int) -> None:
    with pytest.raises(UserError, match="partitions"):
        store.create_topic("t", partitions=count)
    assert store.list_topics() == []


def test_partition_index_out_of_range(store: LogStore) -> None:
    store.create_topic("t", partitions=3)
    for index in (-1, 3, 100):
        with pytest.raises(UnknownPartitionError, match=r"0\.\.2"):
            store.append("t", [ProducerRecord(b"k", b"v")], partition=index)
        with pytest.raises(UnknownPartitionError):
            store.topic("t").partition(index)
    assert [p.log_end_offset for p in store.topic("t").partitions] == [0, 0, 0]


# -- appends --------------------------------------------------------------------------


def test_keyed_records_go_to_kafkas_partition(store: LogStore) -> None:
    store.create_topic("t", partitions=5)
    keys = [b"key-%d" % i for i in range(40)]
    results = store.append("t", [ProducerRecord(k, b"v") for k in keys])
    assert sorted(r.partition for r in results) == sorted({partition_for_key(k, 5) for k in keys})
    for partition in store.topic("t").partitions:
        got = [r.key for r in read_all(partition)]
        assert got == [k for k in keys if partition_for_key(k, 5) == partition.index]
        assert [r.offset for r in read_all(partition)] == list(range(len(got)))


def test_keyless_batches_stay_together(store: LogStore) -> None:
    store.create_topic("t", partitions=3)
    for _ in range(3):
        results = store.append("t", [ProducerRecord(None, b"%d" % i) for i in range(4)])
        assert len(results) == 1 and results[0].last_offset - results[0].base_offset == 3
    assert sorted(p.log_end_offset for p in store.topic("t").partitions) == [4, 4, 4]


def test_null_key_refused_on_compacted_topic(store: LogStore) -> None:
    store.create_topic("c", partitions=3, config={"cleanup.policy": "compact"})
    records = [ProducerRecord(key_for(p, 3), b"v") for p in range(3)]
    records.insert(2, ProducerRecord(None, b"orphan"))
    with pytest.raises(InvalidRecordError, match=r"null\.key\.policy=reject"):
        store.append("c", records)
    with pytest.raises(InvalidRecordError):
        store.append("c", [ProducerRecord(None, b"x")], partition=1)
    with pytest.raises(InvalidRecordError):
        store.topic("c").partitions[0].append([ProducerRecord(None, b"x")])
    assert [p.log_end_offset for p in store.topic("c").partitions] == [0, 0, 0]
    # Tombstones (null values) with keys are fine on a compacted topic.
    store.append("c", [ProducerRecord(b"k", None)])


@pytest.mark.parametrize("policy", ["keep", "drop"])
def test_null_keys_accepted_under_keep_and_drop(store: LogStore, policy: str) -> None:
    store.create_topic(
        "c", partitions=1, config={"cleanup.policy": "compact", "null.key.policy": policy}
    )
    store.append("c", [ProducerRecord(None, b"x"), ProducerRecord(b"k", b"y")])
    got = read_all(store.topic("c").partitions[0])
    assert [(r.key, r.value) for r in got] == [(None, b"x"), (b"k", b"y")]


def test_null_keys_accepted_on_delete_topic(store: LogStore) -> None:
    store.create_topic("d")
    store.append("d", [ProducerRecord(None, None)])
    assert read_all(store.topic("d").partitions[0])[0][2:4] == (None, None)


def test_max_message_bytes(store: LogStore) -> None:
    store.create_topic("t", partitions=1, config={"max.message.bytes": "2000"})
    store.append("t", [ProducerRecord(b"k", b"x" * 1000)])
    with pytest.raises(InvalidRecordError, match=r"max\.message\.bytes=2000"):
        store.append("t", [ProducerRecord(b"k", b"x" * 3000)])
    with pytest.raises(InvalidRecordError):
        store.append("t", [ProducerRecord(b"k", b"x" * 500)] * 5)
    partition = store.topic("t").partitions[0]
    assert partition.log_end_offset == 1
    store.append("t", [ProducerRecord(b"k", b"y")])
    assert [r.offset for r in read_all(partition)] == [0, 1]


def test_oversized_record_in_multi_partition_append_leaves_nothing_appended(
    store: LogStore,
) -> None:
    """store.append checks "the whole request first, so that a refused record leaves
    nothing appended": an oversized record for one partition must not let another
    partition's records in, or a retrying producer duplicates them."""
    store.create_topic("t", partitions=2, config={"max.message.bytes": "2000"})
    small = ProducerRecord(key_for(0, 2), b"small")
    huge = ProducerRecord(key_for(1, 2), b"x" * 5000)
    with pytest.raises(InvalidRecordError):
        store.append("t", [small, huge])
    assert [p.log_end_offset for p in store.topic("t").partitions] == [0, 0]


def test_empty_append_to_partition_is_refused(store: LogStore) -> None:
    store.create_topic("t")
    with pytest.raises(InvalidRecordError):
        store.append("t", [], partition=0)


# -- writer lock and read-only stores ------------------------------------------------


LOCK_PROBE = textwrap.dedent(
    """
    import sys
    from compactlog.errors import DataDirLockedError
    from compactlog.storage.store import LogStore
    try:
        LogStore.open(sys.argv[1]).close()
    except DataDirLockedError as error:
        print("locked:", error)
        sys.exit(3)
    with LogStore.open(sys.argv[1], read_only=True) as reader:
        print("topics:", reader.list_topics())
    """
)


def test_writer_lock(tmp_path: Path) -> None:
    writer = LogStore.open(tmp_path)
    writer.create_topic("t")
    writer.append("t", [ProducerRecord(b"k", b"v")])
    with pytest.raises(DataDirLockedError) as error:
        LogStore.open(tmp_path)
    assert str(tmp_path) in str(error.value)
    assert "pid" in str(error.value)

    # Another process is refused too, and can still read.
    probe = subprocess.run(
        [sys.executable, "-c", LOCK_PROBE, str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert probe.returncode == 3, probe.stderr
    assert "locked:" in probe.stdout

    with LogStore.open(tmp_path, read_only=True) as reader:
        assert reader.list_topics() == ["t"]
        partition = reader.topic("t").partitions[0]
        assert [r.value for r in read_all(partition)] == [b"v"]
        with pytest.raises(ReadOnlyStoreError):
            reader.append("t", [ProducerRecord(b"k", b"v")])
        with pytest.raises(ReadOnlyStoreError):
            reader.create_topic("u")
        with pytest.raises(ReadOnlyStoreError):
            reader.delete_topic("t")
        with pytest.raises(ReadOnlyStoreError):
            partition.seal_rolled()
        with pytest.raises(ReadOnlyStoreError):
            partition.apply_retention()

    writer.close()
    probe = subprocess.run(
        [sys.executable, "-c", LOCK_PROBE, str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )
    assert probe.returncode == 0, probe.stdout + probe.stderr
    with LogStore.open(tmp_path) as again:
        assert [r.value for r in read_all(again.topic("t").partitions[0])] == [b"v"]


def test_read_only_needs_a_data_dir(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no compactlog data directory"):
        LogStore.open(tmp_path / "missing", read_only=True)


def test_read_only_store_sees_new_topics_and_records(tmp_path: Path, clock: FakeClock) -> None:
    with LogStore.open(tmp_path, clock=clock) as writer, LogStore.open(
        tmp_path, read_only=True
    ) as reader:
        writer.create_topic("t", config={"segment.bytes": "1024"})
        assert reader.list_topics() == ["t"]
        partition = reader.topic("t").partitions[0]
        for i in range(40):
            writer.append("t", [ProducerRecord(b"k%d" % i, b"v" * 60)])
        partition.refresh()
        assert partition.log_end_offset == 40
        assert read_all(partition) == read_all(writer.topic("t").partitions[0])
        assert writer.topic("t").partitions[0].manifest.segments, "segments should have sealed"


# -- rolling, sealing, reading -------------------------------------------------------


def test_rolled_segments_read_before_and_after_sealing(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config={"segment.bytes": "1024"})
    partition = store.topic("t").partitions[0]
    partition.auto_seal = False
    for i in range(30):
        store.append("t", [ProducerRecord(b"k%d" % i, b"v" * 50, (("i", b"%d" % i),))])
    assert len(partition.logs) > 2
    assert partition.manifest.segments == ()
    before = read_all(partition)
    assert [r.offset for r in before] == list(range(30))
    sealed = partition.seal_rolled()
    assert sealed and len(partition.logs) == 1
    sealed_bases: list[int] = [info.base_offset for info in sealed]
    listed: list[SegmentInfo] = list(partition.manifest.segments)
    assert sealed_bases == [info.base_offset for info in listed]
    assert read_all(partition) == before
    for offset in range(30):
        assert partition.read(offset, 1)[0] == before[offset]


def test_roll_if_due_follows_segment_ms(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config={"segment.ms": "60000"})
    partition = store.topic("t").partitions[0]
    assert not partition.roll_if_due()  # empty: nothing to roll
    store.append("t", [ProducerRecord(b"k", b"v")])
    clock.advance_ms(59_999)
    assert not partition.roll_if_due()
    clock.advance_ms(1)
    assert partition.roll_if_due()
    assert [s.last_offset for s in partition.manifest.segments] == [0]
    assert not partition.roll_if_due()
    assert read_all(partition)[0].value == b"v"


def test_compacted_topic_rolls_by_max_compaction_lag(store: LogStore, clock: FakeClock) -> None:
    # Kafka's LogConfig.maxSegmentMs: otherwise the lag could not be kept for records
    # that sit in the active segment.
    store.create_topic("t", config={"cleanup.policy": "compact", "segment.ms": "600000",
                                    "max.compaction.lag.ms": "60000"})
    store.create_topic("d", config={"segment.ms": "600000", "max.compaction.lag.ms": "60000"})
    store.append("t", [ProducerRecord(b"k", b"v")])
    store.append("d", [ProducerRecord(b"k", b"v")])
    clock.advance_ms(59_999)
    assert not store.topic("t").partitions[0].roll_if_due()
    clock.advance_ms(1)
    assert store.topic("t").partitions[0].roll_if_due()
    assert not store.topic("d").partitions[0].roll_if_due()  # not compacted: segment.ms


def test_read_limits(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config={"segment.bytes": "1024"})
    partition = store.topic("t").partitions[0]
    for _ in range(50):
        store.append("t", [ProducerRecord(b"k", b"v" * 40), ProducerRecord(b"k", b"w" * 40)])
    assert partition.manifest.segments
    for offset in (0, 7, 50, 99):
        assert len(partition.read(offset, 1)) == 1
        assert len(partition.read(offset, 5, max_bytes=1)) >= 1
        expected = list(range(offset, min(offset + 3, 100)))
        assert [r.offset for r in partition.read(offset, 3)] == expected
    assert partition.read(100, 10) == []
    assert partition.read(1000, 10) == []


def test_read_stopped_by_max_bytes_skips_nothing(store: LogStore, clock: FakeClock) -> None:
    """A read that max_bytes cuts inside a sealed segment must stop there, not go on with
    the next segment and leave a gap in the offsets."""
    store.create_topic("t", config={"segment.bytes": "1024"})
    partition = store.topic("t").partitions[0]
    for i in range(20):
        store.append("t", [ProducerRecord(b"k", b"%d" % i + b"v" * 100)])
    assert len(partition.manifest.segments) >= 3
    everything = read_all(partition)
    for max_bytes in (1, 150, 300, 450, 700, 1000, 2000):
        for offset in range(20):
            got = partition.read(offset, 100, max_bytes)
            assert got == everything[offset : offset + len(got)], (offset, max_bytes)
            table = partition.read_table(offset, 100, max_bytes)
            expected = list(range(offset, offset + table.num_rows))
            assert table.column("offset").to_pylist() == expected, (offset, max_bytes)


def test_reader_whose_view_retention_overtook(tmp_path: Path, clock: FakeClock) -> None:
    """A read-only store refreshes, then the writer's retention deletes segments, then it
    reads (a consumer's poll racing the writer). The segments are gone, not corrupt: the
    read must return true records, not raise CorruptionError."""
    with LogStore.open(tmp_path, clock=clock) as writer:
        writer.create_topic("t", config={"segment.bytes": "1024", "retention.bytes": "0"})
        for i in range(20):
            writer.append("t", [ProducerRecord(b"k", b"%d" % i + b"v" * 100)])
        everything = read_all(writer.topic("t").partitions[0])
        with LogStore.open(tmp_path, read_only=True) as reader:
            partition = reader.topic("t").partitions[0]
            partition.refresh()
            assert partition.manifest.segments
            assert writer.topic("t").partitions[0].apply_retention()
            got = partition.read(0, 100)  # raises CorruptionError: "the file is missing"
            assert got
            first = got[0].offset
            assert got == everything[first : first + len(got)]
            partition.refresh()
            assert read_all(partition) == everything[partition.log_start_offset :]


def test_offset_for_timestamp(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config={"segment.bytes": "1024"})
    partition = store.topic("t").partitions[0]
    assert partition.offset_for_timestamp(0) is None
    # Producer timestamps close to the clock (older ones would roll every append on
    # segment.ms), with one out of order, as producer timestamps may be.
    timestamps = [clock.ms + 1000 + 10 * i for i in range(40)]
    timestamps[20] = clock.ms + 5000
    for ts in timestamps:
        store.append("t", [ProducerRecord(b"k", b"v" * 60, (), ts)])
    assert partition.manifest.segments and len(partition.logs) == 1

    def expected(target: int) -> int | None:
        return next((o for o, ts in enumerate(timestamps) if ts >= target), None)

    for target in [0, clock.ms, clock.ms + 1000]:
        assert partition.offset_for_timestamp(target) == expected(target), target
    targets = sorted(set(timestamps)) + [t + 1 for t in timestamps] + [t - 1 for t in timestamps]
    for target in targets:
        assert partition.offset_for_timestamp(target) == expected(target), target
    assert partition.offset_for_timestamp(clock.ms + 5001) is None
    # None-timestamp records get the append time.
    clock.advance_ms(10_000)
    store.append("t", [ProducerRecord(b"k", b"now")])
    assert partition.offset_for_timestamp(clock.ms) == len(timestamps)


def test_wait_for_data_wakes_on_append_from_another_thread(
    store: LogStore, tmp_path: Path
) -> None:
    store.create_topic("t")
    partition = store.topic("t").partitions[0]
    assert partition.wait_for_data(0, timeout=0) is False
    results: dict[str, bool] = {}
    started = threading.Event()

    def waiter() -> None:
        started.set()
        results["woke"] = partition.wait_for_data(0, timeout=60)

    thread = threading.Thread(target=waiter)
    thread.start()
    started.wait(10)
    time.sleep(0.05)  # let it block; the result does not depend on this
    store.append("t", [ProducerRecord(b"k", b"v")])
    thread.join(60)
    assert not thread.is_alive()
    assert results["woke"] is True
    assert partition.wait_for_data(0, timeout=0) is True

    # A read-only instance polls the files and wakes too.
    with LogStore.open(tmp_path / "data", read_only=True) as reader:
        remote = reader.topic("t").partitions[0]
        remote_results: dict[str, bool] = {}

        def remote_waiter() -> None:
            remote_results["woke"] = remote.wait_for_data(1, timeout=60)

        thread = threading.Thread(target=remote_waiter)
        thread.start()
        store.append("t", [ProducerRecord(b"k", b"w")])
        thread.join(60)
        assert remote_results["woke"] is True
        assert [r.value for r in read_all(remote)] == [b"v", b"w"]


# -- retention ------------------------------------------------------------------------


def fill(store: LogStore, topic: str, clock: FakeClock, count: int, step_ms: int = 1000) -> None:
    for i in range(count):
        store.append(topic, [ProducerRecord(b"k%d" % (i % 5), b"v" * 80)])
        clock.advance_ms(step_ms)


def segment_files(partition: Partition) -> set[str]:
    return {p.name for p in partition.segment_dir.glob("*.parquet")}


def check_after_retention(partition: Partition, before: list[Record]) -> None:
    start = partition.log_start_offset
    assert start in {s.base_offset for s in partition.manifest.segments} or (
        start == partition.manifest.sealed_end_offset
    )
    assert read_all(partition) == [r for r in before if r.offset >= start]
    assert read_all(partition, 0) == read_all(partition, start)
    # Retired files stay for file.delete.delay.ms (readers in other processes may hold
    # the older manifest), then the sweep deletes them.
    listed = {s.file for s in partition.manifest.segments}
    retired = {Path(item.path).name for item in partition.manifest.retired}
    assert segment_files(partition) == listed | retired
    clock = partition.clock
    assert isinstance(clock, FakeClock)
    clock.advance_ms(partition.config["file.delete.delay.ms"])
    assert partition.sweeps.due
    partition.sweep()
    assert segment_files(partition) == listed


def test_retention_by_bytes(store: LogStore, clock: FakeClock, tmp_path: Path) -> None:
    store.create_topic("t", config={"segment.bytes": "1024", "retention.ms": "-1"})
    partition = store.topic("t").partitions[0]
    fill(store, "t", clock, 60)
    segments = partition.manifest.segments
    assert len(segments) >= 4
    before = read_all(partition)
    log_files = sorted(p.name for p in partition.log_dir.iterdir())
    assert partition.apply_retention() == []  # retention.bytes=-1: unlimited

    # Like Kafka, the limit counts the whole partition, the active log segment included.
    keep_bytes = sum(s.size_bytes for s in segments[-2:]) + partition.active.size
    store.alter_topic("t", {"retention.bytes": keep_bytes})
    deleted = partition.apply_retention()
    assert deleted == list(segments[:-2])
    assert partition.manifest.segments == segments[-2:]
    assert partition.log_start_offset == segments[-2].base_offset
    assert sorted(p.name for p in partition.log_dir.iterdir()) == log_files
    check_after_retention(partition, before)
    assert partition.apply_retention() == []

    store.alter_topic("t", {"retention.bytes": 0})
    assert partition.apply_retention() == list(segments[-2:])
    assert partition.manifest.segments == ()
    assert partition.log_start_offset == segments[-1].last_offset + 1
    check_after_retention(partition, before)
    assert partition.log_end_offset == 60  # the active segment is never deleted
    assert read_all(partition)[-1].offset == 59

    store.close()
    with LogStore.open(tmp_path / "data", clock=clock) as reopened:
        again = reopened.topic("t").partitions[0]
        assert again.log_start_offset == segments[-1].last_offset + 1
        assert read_all(again) == [r for r in before if r.offset >= again.log_start_offset]
        reopened.append("t", [ProducerRecord(b"k", b"after")])
        assert again.log_end_offset == 61


def test_retention_by_time(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config={"segment.bytes": "1024", "retention.ms": "100000"})
    partition = store.topic("t").partitions[0]
    fill(store, "t", clock, 60, step_ms=1000)
    segments = partition.manifest.segments
    assert len(segments) >= 4
    before = read_all(partition)
    for info in segments:
        in_segment = [r for r in before if info.base_offset <= r.offset <= info.last_offset]
        assert info.max_timestamp == max(r.timestamp for r in in_segment)
    assert partition.apply_retention() == []

    # Make exactly the first two segments older than retention.ms.
    clock.now = (segments[1].max_timestamp + 100_000 + 1) / 1000
    assert partition.apply_retention() == list(segments[:2])
    assert partition.log_start_offset == segments[2].base_offset
    check_after_retention(partition, before)
    assert partition.offset_for_timestamp(0) == segments[2].base_offset

    # A segment exactly retention.ms old stays (Kafka deletes only when strictly older).
    clock.now = (segments[2].max_timestamp + 100_000) / 1000
    assert partition.apply_retention() == []

    clock.advance_ms(10**9)
    assert partition.apply_retention() == list(segments[2:])
    assert partition.manifest.segments == ()
    check_after_retention(partition, before)
    assert partition.log_end_offset == 60


def test_retention_infinite_time(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config={"segment.bytes": "1024", "retention.ms": "-1"})
    partition = store.topic("t").partitions[0]
    fill(store, "t", clock, 30)
    clock.advance_ms(10**12)
    assert partition.apply_retention() == []
    assert partition.log_start_offset == 0


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_retention_on_compacted_topic_deletes_nothing(
    store: LogStore, clock: FakeClock, policy: str
) -> None:
    store.create_topic(
        "c",
        config={
            "cleanup.policy": policy,
            "segment.bytes": "1024",
            "retention.ms": "1",
            "retention.bytes": "0",
        },
    )
    partition = store.topic("c").partitions[0]
    fill(store, "c", clock, 40)
    segments = partition.manifest.segments
    assert segments
    before = read_all(partition)
    clock.advance_ms(10**9)
    assert partition.apply_retention() == []
    assert partition.manifest.segments == segments
    assert partition.log_start_offset == 0
    assert read_all(partition) == before
    store.tick()
    assert partition.log_start_offset == 0


def test_tick_applies_retention(store: LogStore, clock: FakeClock) -> None:
    store.create_topic("t", config={"segment.bytes": "1024", "retention.ms": "5000"})
    partition = store.topic("t").partitions[0]
    fill(store, "t", clock, 30)
    clock.advance_ms(10**7)
    store.tick()
    assert partition.manifest.segments == ()
    assert partition.log_start_offset > 0
    assert partition.log_end_offset == 30


# -- sealed Parquet -------------------------------------------------------------------


def test_sealed_parquet_is_a_plain_table(store: LogStore, clock: FakeClock) -> None:
    store.create_topic(
        "t",
        config={
            "segment.bytes": str(600_000),
            "parquet.row.group.bytes": str(64 * 1024),
            "parquet.compression": "snappy",
        },
    )
    partition = store.topic("t").partitions[0]
    written: list[ProducerRecord] = []
    for i in range(400):
        record = ProducerRecord(
            None if i % 7 == 0 else b"key-%d" % (i % 13),
            None if i % 11 == 0 else bytes([i % 256]) * 1000,
            (("i", b"%d" % i), ("none", None)) if i % 3 == 0 else (),
            clock.ms + i,
        )
        store.append("t", [record])
        written.append(record)
    assert partition.roll()
    assert partition.log_end_offset == 400
    files = sorted(partition.segment_dir.glob("*.parquet"))
    assert [f.name for f in files] == sorted(s.file for s in partition.manifest.segments)
    rows: list[dict[str, object]] = []
    for path in files:
        table = pq.read_table(path)
        assert {"offset", "timestamp", "key", "value", "headers"} <= set(table.column_names)
        offsets = table.column("offset").to_pylist()
        assert offsets == sorted(offsets)
        rows.extend(table.select(["offset", "timestamp", "key", "value", "headers"]).to_pylist())

        metadata = pq.ParquetFile(path).metadata
        assert metadata.num_row_groups >= 1
        offset_index = metadata.schema.to_arrow_schema().get_field_index("offset")
        position = 0
        for group_index in range(metadata.num_row_groups):
            group = metadata.row_group(group_index)
            stats = group.column(offset_index).statistics
            assert stats is not None and stats.has_min_max
            group_offsets = offsets[position : position + group.num_rows]
            assert (stats.min, stats.max) == (group_offsets[0], group_offsets[-1])
            position += group.num_rows
        assert position == len(offsets)
        kv = {k.decode(): v.decode() for k, v in (metadata.metadata or {}).items()}
        assert kv["compactlog.base_offset"] == str(offsets[0])
        assert kv["compactlog.last_offset"] == str(offsets[-1])
    assert sum(pq.ParquetFile(p).metadata.num_row_groups for p in files) > len(files), (
        "small parquet.row.group.bytes should give several row groups per file"
    )
    assert [row["offset"] for row in rows] == list(range(400))
    for row, record in zip(rows, written, strict=True):
        assert row["timestamp"] == record.timestamp
        assert row["key"] == record.key
        assert row["value"] == record.value
        expected_headers = [{"key": k, "value": v} for k, v in record.headers] or None
        assert row["headers"] == expected_headers
    # And the store reads the same through its row-group seeks.
    for offset in (0, 1, 63, 64, 65, 199, 200, 399):
        got = partition.read(offset, 1)[0]
        record = written[offset]
        assert (got.offset, got.key, got.value) == (offset, record.key, record.value)


@pytest.mark.parametrize("codec", ["none", "zstd", "gzip"])
def test_row_groups_hold_about_row_group_bytes_of_records(
    store: LogStore, clock: FakeClock, codec: str
) -> None:
    """parquet.row.group.bytes is documented in uncompressed record bytes, so batches that
    a Kafka producer compressed must not make row groups many times larger."""
    target = 64 * 1024
    store.create_topic("t", config={"parquet.row.group.bytes": str(target)})
    partition = store.topic("t").partitions[0]
    batch_records = [ProducerRecord(b"k%03d" % i, b"x" * 1000) for i in range(20)]
    batch_bytes = sum(16 + len(r.key or b"") + len(r.value or b"") for r in batch_records)
    for _ in range(40):
        partition.append_batch(encode_batch(batch_records, 0, clock.ms, codec=codec))
    assert partition.roll()
    (path,) = partition.segment_dir.glob("*.parquet")
    table = pq.read_table(path)
    metadata = pq.ParquetFile(path).metadata
    assert metadata.num_rows == 800
    position = 0
    for index in range(metadata.num_row_groups):
        rows = metadata.row_group(index).num_rows
        group = table.slice(position, rows)
        record_bytes = sum(
            16 + len(k or b"") + len(v or b"")
            for k, v in zip(group.column("key").to_pylist(), group.column("value").to_pylist(),
                            strict=True)
        )
        assert record_bytes < target + batch_bytes, (index, rows, record_bytes)
        position += rows
