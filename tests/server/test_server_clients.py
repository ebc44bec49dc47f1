"""Real, unmodified Kafka clients against `compactlog serve` on an ephemeral port."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import InvalidRecordError, TopicAlreadyExistsError

from compactlog import LogStore
from compactlog.compaction import load_factory
from compactlog.storage.records import ProducerRecord
from support.kafka_server import create_topic, running_server

COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0",
             "segment.bytes": "4096", "delete.retention.ms": "0"}


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    with running_server(tmp_path / "data") as bootstrap:
        yield bootstrap


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int,
                **settings: object) -> list[tuple[int, int, bytes | None, bytes | None]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, consumer_timeout_ms=3000,
                             **settings)  # type: ignore[arg-type]
    assigned = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(assigned)
    consumer.seek_to_beginning(*assigned)
    seen = []
    for message in consumer:
        seen.append((message.partition, message.offset, message.key, message.value))
        if len(seen) >= expected:
            break
    consumer.close()
    return seen


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_produce_and_consume(server: str, codec: str | None) -> None:
    create_topic(server, "plain", 3, {})
    producer = KafkaProducer(bootstrap_servers=server, acks="all", compression_type=codec,
                             enable_idempotence=False, linger_ms=5)
    futures = [producer.send("plain", key=b"k%d" % (i % 17), value=b"v%d" % i)
               for i in range(300)]
    producer.flush()
    metadata = [f.get(timeout=10) for f in futures]
    producer.close()
    assert {m.partition for m in metadata} == {0, 1, 2}
    seen = consume_all(server, "plain", 3, 300)
    assert sorted(v for _, _, _, v in seen) == sorted(b"v%d" % i for i in range(300))
    for partition in range(3):
        offsets = [o for p, o, _, _ in seen if p == partition]
        assert offsets == list(range(len(offsets)))
    by_key: dict[bytes, list[int]] = {}
    for _, _, key, value in sorted(seen, key=lambda r: (r[0], r[1])):
        assert key is not None and value is not None
        by_key.setdefault(key, []).append(int(value[1:]))
    assert all(values == sorted(values) for values in by_key.values())


def test_compacted_topic_reads_the_view_then_the_live_log(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running_server(data) as bootstrap:
        create_topic(bootstrap, "prices", 1, COMPACTED)
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1,
                                 enable_idempotence=False, batch_size=512, linger_ms=0)
        for i in range(400):
            producer.send("prices", key=b"k%d" % (i % 10), value=b"%d" % i)
        producer.send("prices", key=b"k3", value=None)
        producer.flush()
        producer.close()
    # Compact in another process' manner: the server is down, the data dir is ours.
    with LogStore.open(data) as store:
        partition = store.topic("prices").partition(0)
        partition.roll()
        load_factory("local_engine:LocalCompactionServiceFactory").new_service(
            store, "prices", {}).compact()
        horizon = partition.stats()["horizon"]
    assert horizon is not None
    with running_server(data) as bootstrap:
        producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
        producer.send("prices", key=b"k1", value=b"live").get(timeout=10)
        producer.close()
        seen = consume_all(bootstrap, "prices", 1, 10)
    latest = {b"k%d" % k: b"%d" % max(i for i in range(400) if i % 10 == k) for k in range(10)}
    del latest[b"k3"]
    view = {key: value for _, offset, key, value in seen if offset <= horizon}
    assert view == latest, "the compacted view holds the latest value per key"
    assert [o for _, o, _, _ in seen] == sorted(o for _, o, _, _ in seen)
    assert seen[-1][2:] == (b"k1", b"live") and seen[-1][1] == horizon + 1


def test_fetch_of_the_compacted_view_applies_deletion_vectors(tmp_path: Path) -> None:
    """Two incremental runs with deletion vectors: Fetch serves each key once below
    the horizon, its latest record, never one a DV deleted."""
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic("prices", 1, {**COMPACTED, "compaction.deletion.vectors": "true",
                                         "compaction.ledger.rewrite.live.fraction": "0"})
        partition = store.topic("prices").partition(0)
        service = load_factory("local_engine:LocalCompactionServiceFactory").new_service(
            store, "prices", {"engine": "arrow"})
        for start, count in ((0, 400), (400, 30), (430, 25)):
            store.append("prices", [ProducerRecord(b"k%d" % (i % 40), b"%d" % i)
                                    for i in range(start, start + count)])
            partition.roll()
            service.compact()
        assert any(info.dv_file for info in partition.manifest.ledger)
        horizon = partition.manifest.horizon
    assert horizon == 454
    with running_server(data) as bootstrap:
        seen = consume_all(bootstrap, "prices", 1, 1000)  # all there is (3 s idle)
    keys = [key for _, _, key, _ in seen]
    assert len(keys) == len(set(keys)) == 40
    latest = {b"k%d" % k: b"%d" % max(i for i in range(455) if i % 40 == k) for k in range(40)}
    assert {key: value for _, _, key, value in seen} == latest
    assert [o for _, o, _, _ in seen] == sorted(o for _, o, _, _ in seen)


def test_null_key_to_a_compacted_topic_is_refused(server: str) -> None:
    create_topic(server, "strict", 1, {"cleanup.policy": "compact"})
    producer = KafkaProducer(bootstrap_servers=server, enable_idempotence=False, retries=0)
    future = producer.send("strict", key=None, value=b"no key")
    with pytest.raises(InvalidRecordError):
        future.get(timeout=10)
    producer.close()


def test_admin_configs_round_trip(server: str) -> None:
    create_topic(server, "cfg", 2, {"cleanup.policy": "compact", "segment.bytes": "65536"})
    admin = KafkaAdminClient(bootstrap_servers=server)
    try:
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("cfg", 1, 1)])
        described = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, "cfg")], config_filter="all")
        configs = described["topic"]["cfg"]
        assert configs["cleanup.policy"]["value"] == "compact"
        assert configs["segment.bytes"]["value"] == "65536"
        assert configs["delete.retention.ms"]["value"] == "86400000"
        modified = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "cfg")])
        assert set(modified["topic"]["cfg"]) == {"cleanup.policy", "segment.bytes"}
        admin.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, "cfg", configs={"delete.retention.ms": "0"})],
            incremental=True)
        altered = admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, "cfg")], config_filter="all")
        assert altered["topic"]["cfg"]["delete.retention.ms"]["value"] == "0"
        admin.delete_topics(["cfg"])
        assert "cfg" not in admin.list_topics()
    finally:
        admin.close()


def fast_groups_config(tmp_path: Path) -> list[str]:
    path = tmp_path / "server.toml"
    path.write_text("group_initial_rebalance_delay_s = 0.2\n")
    return ["--config", str(path)]


def produce_numbers(bootstrap: str, topic: str, start: int, count: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False)
    for i in range(start, start + count):
        producer.send(topic, key=b"k%d" % i, value=b"%d" % i)
    producer.flush()
    producer.close()


def test_group_consumers_share_partitions_commit_and_resume_after_restart(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    config = fast_groups_config(tmp_path)
    with running_server(data, *config) as bootstrap:
        create_topic(bootstrap, "events", 4, {})
        produce_numbers(bootstrap, "events", 0, 200)
        settings = {"bootstrap_servers": bootstrap, "group_id": "g",
                    "auto_offset_reset": "earliest", "enable_auto_commit": True,
                    "auto_commit_interval_ms": 200}
        seen: dict[int, int] = {}
        owners: list[set[int]] = [set(), set()]
        done = threading.Event()

        def consume(number: int) -> None:
            consumer = KafkaConsumer("events", **settings)  # type: ignore[arg-type]
            deadline = time.monotonic() + 60
            while not done.is_set() and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=100).values():
                    for record in records:
                        seen[int(record.value)] = record.partition
                        owners[number].add(record.partition)
                if len(seen) == 200 and all(owners):
                    done.set()
            consumer.close()  # commits what it consumed (auto commit)

        threads = [threading.Thread(target=consume, args=(n,)) for n in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(seen) == 200
        assert owners[0] and owners[1], owners
    with running_server(data, *config) as bootstrap:
        produce_numbers(bootstrap, "events", 200, 50)
        resumed = KafkaConsumer("events", consumer_timeout_ms=4000, **{
            **settings, "bootstrap_servers": bootstrap})  # type: ignore[arg-type]
        later = [int(r.value) for r in resumed]
        resumed.close()
    assert sorted(later) == list(range(200, 250)), "resumed from the committed offsets"


def test_list_and_describe_groups(tmp_path: Path) -> None:
    with running_server(tmp_path / "data", *fast_groups_config(tmp_path)) as bootstrap:
        create_topic(bootstrap, "watched", 2, {})
        produce_numbers(bootstrap, "watched", 0, 10)
        consumer = KafkaConsumer("watched", bootstrap_servers=bootstrap, group_id="watchers",
                                 auto_offset_reset="earliest", client_id="watcher-1")
        deadline = time.monotonic() + 30
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(timeout_ms=100)
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            listed = admin.list_groups()
            assert [(g["group_id"], g["group_state"]) for g in listed] == [
                ("watchers", "Stable")]
            described = admin.describe_groups(["watchers"])["watchers"]
            assert described["group_state"] == "Stable"
            assert described["protocol_type"] == "consumer"
            (member,) = described["members"]
            assert member["client_id"] == "watcher-1"
            assert member["client_host"] == "127.0.0.1"
        finally:
            admin.close()
            consumer.close()


def test_sigterm_while_producing_keeps_every_acknowledged_record(tmp_path: Path) -> None:
    data = tmp_path / "data"
    acknowledged: list[int] = []
    with running_server(data) as bootstrap:
        create_topic(bootstrap, "busy", 2, {})
        producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=False,
                                 acks="all", linger_ms=1, retries=0,
                                 reconnect_backoff_max_ms=100)
        def send(numbers: range) -> None:
            for i in numbers:
                producer.send("busy", key=b"k%d" % i, value=b"%d" % i).add_callback(
                    lambda _meta, i=i: acknowledged.append(i))

        # Some acknowledged first (on a loaded machine the first sends may still be
        # queued when the server stops, and the test would prove nothing), then more.
        send(range(100))
        deadline = time.monotonic() + 30
        while not acknowledged and time.monotonic() < deadline:
            time.sleep(0.01)
        send(range(100, 3000))
        # Leaving the block sends SIGTERM while these are still in flight.
    try:
        producer.close(timeout=5)
    except Exception:
        # kafka-python's close() raises from its flush while records are pending, before
        # it force-closes its sender thread: stop that thread here, or it keeps retrying
        # the stopped server (and logging) for the rest of the test run.
        producer._sender.force_close()
    with LogStore.open(data, read_only=True) as store:
        stored = {int(r.value) for p in store.topic("busy").partitions
                  for r in p.read(0, 10_000, 1 << 30) if r.value is not None}
    assert acknowledged, "nothing was acknowledged before the shutdown"
    assert set(acknowledged) <= stored, "an acknowledged record was lost"


def test_acks_zero_gets_no_response_and_still_stores(server: str) -> None:
    create_topic(server, "fire", 1, {})
    producer = KafkaProducer(bootstrap_servers=server, acks=0, enable_idempotence=False)
    for i in range(50):
        producer.send("fire", key=b"k", value=b"%d" % i)
    producer.flush()
    # A request after the acks=0 produces gets its own answer: responses were not
    # misaligned by a response the server should not have sent.
    admin = KafkaAdminClient(bootstrap_servers=server)
    try:
        assert "fire" in admin.list_topics()
    finally:
        admin.close()
    producer.close()
    seen = consume_all(server, "fire", 1, 50)
    assert [v for _, _, _, v in seen] == [b"%d" % i for i in range(50)]


def test_list_offsets_earliest_latest_and_by_timestamp(server: str) -> None:
    create_topic(server, "timed", 1, {})
    base = int(time.time() * 1000) - 100_000
    producer = KafkaProducer(bootstrap_servers=server, enable_idempotence=False)
    for i in range(10):
        producer.send("timed", key=b"k", value=b"%d" % i, timestamp_ms=base + 1000 * i)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=server)
    tp = TopicPartition("timed", 0)
    try:
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        found = consumer.offsets_for_times({tp: base + 4500})[tp]
        assert (found.offset, found.timestamp) == (5, base + 5000)
        assert consumer.offsets_for_times({tp: base + 20_000})[tp] is None
    finally:
        consumer.close()
