"""Soak: three producers and a group of two consumers against one server for two minutes,
with automatic compaction on (Spark, as deployed). Afterwards nothing acknowledged is
lost, the compacted view holds the latest acknowledged value of every key, and no
consumer ever saw a partition's offsets go backwards."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from compactlog import LogStore
from compactlog.client.reader import Reader
from support.admin import Servers, create_topic, get, metrics, sample, server_config, wait_until
from support.spark import SPARK_TEST_CONF

pytestmark = pytest.mark.slow

SOAK_S = 120.0
PARTITIONS = 4
KEYS = 400
RATE_PER_PRODUCER = 150  # records/s: leaves the 2 cores room for Spark and the clients
TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.bytes": "65536",
    "min.compaction.lag.ms": "0",
    "min.cleanable.dirty.ratio": "0.2",
    "delete.retention.ms": "0",
}


class Acked:
    """Every acknowledged record, by (partition, offset)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: dict[tuple[int, int], tuple[bytes, bytes | None]] = {}

    def add(self, partition: int, offset: int, key: bytes, value: bytes | None) -> None:
        with self.lock:
            self.records[(partition, offset)] = (key, value)

    def latest(self) -> dict[bytes, bytes | None]:
        """Each key's value at its highest acknowledged offset (a key has one partition)."""
        with self.lock:
            ordered = sorted(self.records.items())
        return {key: value for _, (key, value) in ordered}


def producer_loop(bootstrap: str, number: int, acked: Acked, stop: threading.Event,
                  errors: list[str]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "acks": "all", "linger.ms": 10})
    rng = random.Random(number)

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(f"producer {number}: {error}")
            return
        acked.add(message.partition(), message.offset(), message.key(), message.value())

    sequence = 0
    began = time.monotonic()
    while not stop.is_set():
        key = b"key-%03d" % rng.randrange(KEYS)
        value = None if rng.random() < 0.05 else b"p%d-%08d" % (number, sequence)
        producer.produce("state", value, key, on_delivery=delivered)
        sequence += 1
        producer.poll(0)
        ahead = sequence / RATE_PER_PRODUCER - (time.monotonic() - began)
        if ahead > 0:
            time.sleep(ahead)
    if producer.flush(60) != 0:
        errors.append(f"producer {number}: records still unacknowledged after 60 s")


def consumer_loop(bootstrap: str, number: int, stop: threading.Event,
                  seen: dict[int, list[int]], errors: list[str]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak",
                         "auto.offset.reset": "earliest", "enable.auto.commit": True,
                         "auto.commit.interval.ms": 1000, "session.timeout.ms": 10000,
                         "fetch.queue.backoff.ms": 10})

    def revoked(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Commit what this member consumed before another takes the partitions over, so
        # that the next owner starts where this one stopped.
        try:
            consumer.commit(asynchronous=False)
        except KafkaException as error:
            if "NO_OFFSET" not in str(error):
                errors.append(f"consumer {number}: commit on revoke: {error}")

    consumer.subscribe(["state"], on_revoke=revoked)
    try:
        while not stop.is_set():
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error() is not None:
                errors.append(f"consumer {number}: {message.error()}")
                continue
            offsets = seen.setdefault(message.partition(), [])
            if offsets and message.offset() <= offsets[-1]:
                errors.append(f"consumer {number}: partition {message.partition()} went from "
                              f"offset {offsets[-1]} back to {message.offset()}")
            offsets.append(message.offset())
    finally:
        consumer.close()  # commits, and leaves the group


def read_view(bootstrap: str, ends: dict[int, int]) -> dict[bytes, bytes | None]:
    """Every partition from offset 0 to its end, as a new reader gets it over Kafka."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "soak-check",
                         "enable.auto.commit": False, "fetch.queue.backoff.ms": 10})
    consumer.assign([TopicPartition("state", p, 0) for p in ends if ends[p] > 0])
    view: dict[bytes, bytes | None] = {}
    pending = {p for p, end in ends.items() if end > 0}
    deadline = time.monotonic() + 120
    while pending and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            view[message.key()] = message.value()
        # By position: the last record of each partition sits in its active segment, which
        # is never compacted, so every partition's position reaches its end.
        for tp in consumer.position([TopicPartition("state", p) for p in list(pending)]):
            if tp.offset >= ends[tp.partition]:
                pending.discard(tp.partition)
    consumer.close()
    assert not pending, f"partitions {pending} not read to their end"
    return {key: value for key, value in view.items() if value is not None}


def test_soak_producers_consumers_and_automatic_compaction(tmp_path: Path) -> None:
    servers = Servers(tmp_path)
    server = servers.start(*server_config(
        tmp_path, enabled=True, check_interval_s=2.0, max_concurrent_runs=1,
        backoff_initial_s=5.0, spark_master="local[1]", spark_conf=SPARK_TEST_CONF,
    ), "--auto-compaction")
    try:
        create_topic(server, "state", PARTITIONS, TOPIC_CONFIG)
        acked = Acked()
        errors: list[str] = []
        stop_producing, stop_consuming = threading.Event(), threading.Event()
        seen: list[dict[int, list[int]]] = [{}, {}]
        producers = [threading.Thread(target=producer_loop, args=(
            server.bootstrap, n, acked, stop_producing, errors)) for n in range(3)]
        consumers = [threading.Thread(target=consumer_loop, args=(
            server.bootstrap, n, stop_consuming, seen[n], errors)) for n in range(2)]
        for thread in [*producers, *consumers]:
            thread.start()
        time.sleep(SOAK_S)
        stop_producing.set()
        for thread in producers:
            thread.join(120)
        # Let the group catch up with the end of the log, then stop it.
        ends = {p["partition"]: p["log_end_offset"]
                for p in get(server, "/v1/topics/state")["partitions"]}
        committed_lag = "compactlog_consumer_group_lag"
        wait_until(lambda: all(
            sample(metrics(server), committed_lag, group="soak", topic="state",
                   partition=str(p)) == 0 for p in ends if ends[p] > 0),
            "the group to commit the end of every partition", 120)
        stop_consuming.set()
        for thread in consumers:
            thread.join(60)
        assert not errors, errors[:10]
        assert sum(len(offsets) for s in seen for offsets in s.values()) > 0

        # Compaction ran during the soak, on its own, and never failed.
        scraped = metrics(server)
        runs = sample(scraped, "compactlog_compaction_runs_total", topic="state",
                      result="success", trigger="scheduler")
        assert runs >= 2, f"only {runs} automatic compaction run(s)"
        assert sample(scraped, "compactlog_compaction_records_removed_total",
                      topic="state") > 0
        assert ("compactlog_compaction_runs_total", (("result", "error"), ("topic", "state"),
                                                     ("trigger", "scheduler"))) not in scraped
        assert sample(scraped, "compactlog_compaction_uncleanable_partitions") == 0

        # The compacted view, read over Kafka from offset 0: the latest acknowledged value
        # of every key, and nothing else.
        latest = acked.latest()
        expected = {key: value for key, value in latest.items() if value is not None}
        assert read_view(server.bootstrap, ends) == expected
        history = get(server, "/v1/compactions")["runs"]
        report = {"runs": len(history), "acked": len(acked.records)}
    finally:
        servers.stop()

    # Nothing acknowledged was lost: every acknowledged record is in the raw log, as sent.
    with LogStore.open(tmp_path / "data", read_only=True) as store:
        raw: dict[tuple[int, int], tuple[bytes | None, bytes | None]] = {}
        for partition in range(PARTITIONS):
            reader = Reader(store, "state", partition, read_compacted=False)
            while batch := reader.poll(max_records=10_000):
                for record in batch:
                    raw[(partition, record.offset)] = (record.key, record.value)
    missing = [(where, record) for where, record in acked.records.items()
               if raw.get(where) != record]
    assert not missing, f"{len(missing)} acknowledged records lost or changed: {missing[:5]}"
    print(json.dumps(report))
