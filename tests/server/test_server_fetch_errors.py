"""A partition the server cannot read, and upkeep that fails on one partition.

Kafka answers a partition it cannot serve with the error code and an empty record set
(MemoryRecords.EMPTY), never a null one: librdkafka takes a null record set for a
protocol parse failure ("invalid MessageSetSize -1") and retries at once, tens of
thousands of times a second. A storage failure (a corrupt file, an OSError such as EIO
or EMFILE) is KAFKA_STORAGE_ERROR, which clients retry after a backoff. The server logs
such a failure once per partition per minute, however fast consumers retry.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.schema.errors import ErrorCode

from compactlog.errors import CorruptionError, UnknownTopicError
from compactlog.server.protocol.error_codes import error_code
from compactlog.server.upkeep import Upkeep
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.admin import metrics, sample
from support.kafka_server import LoggedServer, logged_server
from support.wire import Wire, fetch

TOPIC = "t"


def damage(segment: Path) -> None:
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LoggedServer]:
    """Two partitions with a sealed segment each and a few records after it; the sealed
    segment of partition 0 is damaged before the server starts."""
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic(TOPIC, 2)
        store.append(TOPIC, [ProducerRecord(b"k%d" % i, b"v%d" % i) for i in range(40)])
        for partition in store.topic(TOPIC).partitions:
            partition.roll()
        store.append(TOPIC, [ProducerRecord(b"k%d" % i, b"w%d" % i) for i in range(10)])
    [segment] = (data / "topics" / TOPIC / "0" / "segments").glob("*.parquet")
    damage(segment)
    with logged_server(data, tmp_path / "server.log", "--admin-listen", "127.0.0.1:0") as up:
        yield up


def test_storage_errors_are_kafka_storage_error() -> None:
    for error in [OSError(errno.EIO, "Input/output error"),
                  OSError(errno.EMFILE, "Too many open files"),
                  PermissionError(errno.EACCES, "Permission denied"),
                  FileNotFoundError(errno.ENOENT, "No such file"),
                  CorruptionError("/x.parquet", "CRC32C mismatch")]:
        assert error_code(error) is ErrorCode.kafka_storage_error, error
    # Not storage: a timeout is a timeout (TimeoutError is an OSError in Python).
    assert error_code(TimeoutError()) is ErrorCode.request_timed_out
    assert error_code(UnknownTopicError("x")) is ErrorCode.unknown_topic_or_partition
    assert error_code(RuntimeError("bug")) is ErrorCode.unknown_server_error


@pytest.mark.parametrize("version", [4, 11, 12])
def test_a_partition_that_cannot_be_read_gets_storage_error_and_empty_records(
        server: LoggedServer, version: int) -> None:
    mark = server.mark()
    with Wire(server.address) as wire:
        for _ in range(20):  # a consumer retrying fast
            results = fetch(wire, version, [(TOPIC, 0, 0), (TOPIC, 1, 0),
                                            ("no-such-topic", 0, 0)])
            broken = results[TOPIC, 0]
            assert broken.error_code is ErrorCode.kafka_storage_error
            # Zero bytes of records, not a null record set (length -1 on the wire).
            assert broken.records == b""
            assert broken.high_watermark == -1
            # The other partition of the same request is served as usual.
            assert results[TOPIC, 1].error_code is ErrorCode.none and results[TOPIC, 1].records
            far = fetch(wire, version, [(TOPIC, 1, 10**6)])[TOPIC, 1]
            assert far.error_code is ErrorCode.offset_out_of_range and far.records == b""
            unknown = results["no-such-topic", 0]
            assert unknown.error_code is ErrorCode.unknown_topic_or_partition
            assert unknown.records == b""
    server.assert_running()
    logged = [line for line in server.log_since(mark).splitlines() if "t/0" in line]
    assert len(logged) == 1, logged  # once per partition per minute, not per request
    assert "KAFKA_STORAGE_ERROR" in logged[0] and "corrupt file" in logged[0], logged
    assert "Traceback" not in server.log_since(mark)


def test_librdkafka_backs_off_on_a_partition_that_cannot_be_read(
        server: LoggedServer) -> None:
    """librdkafka reports the error (in its log) and retries after its fetch backoff,
    rather than in a tight loop, while it reads the healthy partition."""
    logs: list[str] = []
    lock = threading.Lock()

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            with lock:
                logs.append(record.getMessage())

    logger = logging.getLogger("test-librdkafka")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(Capture())
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "g",
                         "enable.auto.commit": False, "debug": "fetch",
                         "fetch.wait.max.ms": 100}, logger=logger)
    before = sample(metrics(server), "compactlog_server_requests_total", api="Fetch")
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0), TopicPartition(TOPIC, 1, 0)])
        seen: list[Any] = []
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                seen.append((message.partition(), message.offset()))
        fetches = sample(metrics(server), "compactlog_server_requests_total",
                         api="Fetch") - before
    finally:
        consumer.close()
    with lock:
        text = "\n".join(logs)
    assert "KAFKA_STORAGE_ERROR" in text, text[-3000:]
    assert "MessageSetSize" not in text and "parse failure" not in text.lower()
    # The healthy partition is read whole.
    assert sorted(offset for partition, offset in seen if partition == 1) == list(
        range(len([o for p, o in seen if p == 1])))
    assert len([1 for partition, _ in seen if partition == 1]) >= 20
    # With a null record set librdkafka sent ~37,000 fetches in 4 s; with the error code
    # it backs off (fetch.error.backoff.ms, 500 ms). A generous bound:
    assert fetches < 400, fetches
    server.assert_running()


# -- upkeep survives one failing partition ---------------------------------------------


def test_upkeep_goes_on_past_a_failing_partition(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    with LogStore.open(tmp_path / "data") as store:
        store.auto_seal = False
        store.create_topic("a", 3)
        store.create_topic("b", 1)
        for name in ("a", "b"):
            store.append(name, [ProducerRecord(b"k%d" % i, b"v") for i in range(30)])
            for partition in store.topic(name).partitions:
                partition.roll()  # rolled, not sealed: upkeep seals it
        broken = store.topic("a").partition(0)

        def fail() -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(broken, "seal_rolled", fail)
        monkeypatch.setattr(broken, "refresh", fail)
        upkeep = Upkeep(store)
        with caplog.at_level(logging.WARNING, logger="compactlog.server"):
            upkeep.run_once()
            upkeep.run_once()  # a second failure within the minute is not logged
        for name, index in [("a", 1), ("a", 2), ("b", 0)]:
            stats = store.topic(name).partition(index).stats()
            assert stats["sealed_segments"] == 1, (name, index, stats)
        # compactlog's own lines only: a Kafka client that an earlier test left behind may
        # still log (kafka-python's "No node available..." was seen in a full run).
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("compactlog")]
        assert len(lines) == 2, lines  # seal and refresh of a/0, once each
        assert all("a/0" in line and "Input/output error" in line for line in lines), lines
