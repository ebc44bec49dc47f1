"""A full disk, for real: the server's data directory on a small tmpfs.

A confluent-kafka producer (idempotent) writes more than the filesystem holds. Produce
requests that find the disk full get KAFKA_STORAGE_ERROR, which librdkafka retries;
nothing is lost or torn, the server keeps serving reads, seals fail and are retried.
Then space is freed (a balloon file made before the test is deleted) and produce goes
on by itself, without a restart: every record the producer saw acknowledged is read
back exactly once, with its value, and the server sealed what it had waited to seal.

Mounting a tmpfs needs root (CI runs as root here); elsewhere the test is skipped.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from compactlog.compaction import load_factory
from compactlog.errors import CompactlogError
from compactlog.storage.records import ProducerRecord, Record
from compactlog.storage.store import LogStore
from support.kafka_server import logged_server

FS_BYTES = 24 * 1024 * 1024
BALLOON_BYTES = 8 * 1024 * 1024
VALUE_BYTES = 8 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small-fs"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs",
                           str(mount)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def produce(bootstrap: str, first: int, count: int, acked: dict[int, bytes],
            failed: set[int], timeout_s: float) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": int(timeout_s * 1000),
                         "retry.backoff.ms": 100, "batch.size": 64 * 1024})

    def report(error: KafkaError | None, message: object) -> None:
        number = int(message.key())  # type: ignore[attr-defined]
        if error is None:
            acked[number] = message.value()  # type: ignore[attr-defined]
        else:
            failed.add(number)

    for number in range(first, first + count):
        value = (b"%08d:" % number) + os.urandom(VALUE_BYTES)
        while True:
            try:
                producer.produce("t", key=str(number).encode(), value=value,
                                 on_delivery=report)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    producer.flush(timeout_s + 30)


def read_back(bootstrap: str) -> list[tuple[int, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition("t", 0, OFFSET_BEGINNING)])
    found: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    return found
                raise AssertionError(message.error())
            found.append((int(message.key()), message.value()))
    finally:
        consumer.close()
    raise AssertionError("the consumer did not reach the end in 60 s")


def test_produce_until_the_disk_is_full_then_free_space_and_go_on(
    small_fs: Path, tmp_path: Path
) -> None:
    data = small_fs / "data"
    with LogStore.open(data) as store:
        store.create_topic("t", 1, {"segment.bytes": str(1024 * 1024), "retention.ms": "-1",
                                    "parquet.compression": "none"})
        # A compacted topic with a ledger, compacted again while the disk is full.
        store.create_topic("c", 1, COMPACTED)
        for round_ in range(2):
            store.append("c", [ProducerRecord(b"k%d" % k, os.urandom(2000)) for k in range(50)])
            store.topic("c").partition(0).roll()
            if round_ == 0:
                compact(store)
        old_view = view_of(store)
        old_horizon = store.topic("c").partition(0).manifest.horizon
    balloon = small_fs / "balloon"
    balloon.write_bytes(b"\0" * BALLOON_BYTES)
    acked: dict[int, bytes] = {}
    failed: set[int] = set()
    with logged_server(data, tmp_path / "server.log") as server:
        # About twice what fits: the second half finds the disk full.
        produce(server.bootstrap, 0, (FS_BYTES - BALLOON_BYTES) * 2 // VALUE_BYTES,
                acked, failed, timeout_s=8)
        assert failed, "the disk never filled up"
        assert acked, "nothing was acknowledged before the disk filled up"
        log = server.log()
        assert "No space left on device" in log
        # Reads keep working on a full disk.
        full = read_back(server.bootstrap)
        server.assert_running()
        # A compaction that runs out of space fails, removes its files and leaves the
        # old pair in force.
        with LogStore.open(data, read_only=True) as store:
            with pytest.raises((OSError, CompactlogError)) as failure:
                compact(store)
            assert "No space left on device" in str(failure.value)
            assert store.topic("c").partition(0).manifest.horizon == old_horizon
            assert view_of(store) == old_view
        assert not list((data / "topics" / "c" / "0" / "ledger").glob(".tmp-*"))
        balloon.unlink()  # space returns
        before = len(acked)
        produce(server.bootstrap, 1_000_000, 200, acked, failed, timeout_s=30)
        assert len(acked) == before + 200, "produce did not resume by itself"
        stored = read_back(server.bootstrap)
        server.assert_running()
    numbers = [number for number, _ in stored]
    assert len(numbers) == len(set(numbers)), "a record was stored twice"
    values = dict(stored)
    for number, value in acked.items():
        assert values.get(number) == value, f"acknowledged record {number} is lost or torn"
    assert [n for n, _ in full] == numbers[: len(full)]
    assert "Traceback" not in server.log()
    # After a restart (a clean one here), everything is sealed or in the active log, and
    # the same records read back.
    with LogStore.open(data, read_only=True) as store:
        partition = store.topic("t").partition(0)
        assert partition.manifest.segments, "nothing was ever sealed"
        # With space back, the compaction that failed succeeds.
        compact(store)
        assert store.topic("c").partition(0).manifest.horizon != old_horizon


COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
             "file.delete.delay.ms": "0"}


def compact(store: LogStore) -> None:
    load_factory("local_engine:LocalCompactionServiceFactory").new_service(
        store, "c", {}).compact()


def view_of(store: LogStore) -> list[Record]:
    return store.topic("c").partition(0).read_compacted(0, 10_000, 1 << 30)
