"""Every topic config Kafka defines is accepted, validated, stored and described, over the
wire (confluent-kafka's AdminClient, raw Fetch) and on the CLI; those that act here act
as in Kafka: compression.type recompresses produced batches, LogAppendTime stamps them
with the server's clock (seen by a consumer and in the ProduceResponse), and
message.timestamp.*.max.ms refuses records too far from it with INVALID_TIMESTAMP.
docs/configuration.md's table lists exactly Kafka's topic configs."""

from __future__ import annotations

import datetime
import json
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaError, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from kio.schema.errors import ErrorCode

from compactlog.config import TOPIC_KEYS, TOPIC_KEYS_BY_NAME
from compactlog.errors import InvalidTimestampError
from compactlog.kafka_topic_configs import KAFKA_TOPIC_CONFIGS
from compactlog.storage.records import (
    CODEC_MASK,
    TIMESTAMP_TYPE_MASK,
    ProducerRecord,
    iter_batches,
)
from compactlog.storage.store import LogStore
from support.cli import ok, run
from support.kafka_server import LoggedServer, logged_server
from support.paths import ROOT
from support.wire import Wire

FETCH = 1
UNCOMPRESSED, GZIP, ZSTD = 0, 1, 4
HOUR_MS = 3_600_000
# Kafka's own names and values, as Kafka Streams and operators set them.
KAFKA_SETTINGS = {
    "compression.type": "zstd",
    "compression.zstd.level": "9",
    "message.timestamp.type": "LogAppendTime",
    "message.timestamp.before.max.ms": "86400000",
    "min.insync.replicas": "2",
    "unclean.leader.election.enable": "true",
    "segment.jitter.ms": "1000",
    "preallocate": "true",
    "leader.replication.throttled.replicas": "0:1,1:2",
    "remote.storage.enable": "false",
    "local.retention.ms": "-2",
}


SEALED = {"sealed-zstd": {"compression.type": "zstd"},
          "sealed-producer": {},
          "sealed-appended": {"message.timestamp.type": "LogAppendTime"}}
# Incompressible, so that each batch is over segment.bytes in any codec.
SEALED_VALUES = [random.Random(seed).randbytes(1500) for seed in range(3)]


def prepare(store: LogStore) -> None:
    """Topics whose first two batches are in sealed Parquet segments (segment.bytes at
    its minimum rolls one per batch), appended with the library: Fetch rebuilds those."""
    for name, config in SEALED.items():
        # retention.ms=-1: the records are stamped 1970 (on CreateTime topics).
        store.create_topic(name, 1, {**config, "segment.bytes": "1024", "retention.ms": "-1"})
        partition = store.topic(name).partition(0)
        for value in SEALED_VALUES:
            partition.append([ProducerRecord(b"k", value, timestamp=1000)])
        assert partition.stats()["sealed_segments"] == 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    root = tmp_path_factory.mktemp("kafka-configs")
    with LogStore.open(root / "data") as store:
        prepare(store)
    with logged_server(root / "data", root / "server.log") as running:
        yield running


def admin(server: LoggedServer) -> AdminClient:
    return AdminClient({"bootstrap.servers": server.bootstrap})


def create(server: LoggedServer, name: str, config: dict[str, str]) -> None:
    client = admin(server)  # held until the future is done: its handle serves it
    futures = client.create_topics([NewTopic(name, 1, 1, config=config)],
                                   operation_timeout=10)
    futures[name].result(timeout=10)


def described(server: LoggedServer, name: str) -> dict[str, str]:
    client = admin(server)
    (future,) = client.describe_configs([ConfigResource("topic", name)]).values()
    return {key: entry.value for key, entry in future.result(timeout=10).items()}


def produce(server: LoggedServer, topic: str, records: list[tuple[bytes, int | None]],
            **settings: Any) -> list[Any]:
    """Produce (value, timestamp) records one batch each; the delivery reports."""
    producer = Producer({"bootstrap.servers": server.bootstrap, "linger.ms": 0,
                         "partitioner": "murmur2_random", **settings})
    reports: list[Any] = []
    for value, timestamp in records:
        extra = {} if timestamp is None else {"timestamp": timestamp}
        producer.produce(topic, value, key=b"k",
                         on_delivery=lambda err, msg: reports.append((err, msg)), **extra)
        producer.flush(10)
    assert len(reports) == len(records)
    return reports


def consume_all(server: LoggedServer, topic: str, count: int) -> list[Any]:
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    messages: list[Any] = []
    deadline = time.monotonic() + 20
    while len(messages) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            messages.append(message)
    consumer.close()
    assert len(messages) == count
    return messages


def fetched_batches(server: LoggedServer, topic: str) -> list[tuple[int, int, int]]:
    """(base offset, codec, timestamp type bit) of each batch a raw Fetch v12 returns."""
    with Wire(server.address) as wire:
        body = wire.call(FETCH, 12, {
            "replica_id": -1, "max_wait": datetime.timedelta(0), "min_bytes": 1,
            "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                 "current_leader_epoch": -1, "log_start_offset": -1}]}],
            "forgotten_topics_data": [], "rack_id": ""})
    part = body.responses[0].partitions[0]
    assert part.error_code is ErrorCode.none
    return [(header.base_offset, header.attributes & CODEC_MASK,
             header.attributes & TIMESTAMP_TYPE_MASK)
            for _, header in iter_batches(bytes(part.records or b""))]


# -- the list and its table -----------------------------------------------------------

def test_the_docs_table_lists_exactly_kafkas_topic_configs() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("# Kafka's topic configs", 1)[1].split("\n# ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9.]+)` \| `[^`]*` \| (.+) \|$", section, re.MULTILINE)
    assert [name for name, _ in rows] == list(KAFKA_TOPIC_CONFIGS)
    for name, what in rows:
        assert name in TOPIC_KEYS_BY_NAME, name
        assert what.startswith(("implemented", "stored, no effect: ")), (name, what)
    stored = {name for name, what in rows if what.startswith("stored")}
    assert {"min.insync.replicas", "unclean.leader.election.enable",
            "leader.replication.throttled.replicas"} <= stored
    assert not {"compression.type", "message.timestamp.type",
                "message.timestamp.before.max.ms", "message.timestamp.after.max.ms"} & stored
    # A key that Kafka does not define says that it is compactlog's own.
    for key in TOPIC_KEYS:
        if key.name not in KAFKA_TOPIC_CONFIGS:
            assert key.doc.startswith("compactlog:"), key.name


# -- over the wire ----------------------------------------------------------------------

def test_admin_client_creates_and_describes_topics_with_kafkas_configs(
        server: LoggedServer) -> None:
    create(server, "streams-internal", KAFKA_SETTINGS)
    configs = described(server, "streams-internal")
    assert set(KAFKA_TOPIC_CONFIGS) <= set(configs)
    for name, value in KAFKA_SETTINGS.items():
        assert configs[name] == value, name
    assert configs["compression.gzip.level"] == "-1"
    assert configs["message.format.version"] == "3.0-IV1"

    # IncrementalAlterConfigs with Kafka's names.
    resource = ConfigResource("topic", "streams-internal", incremental_configs=[
        _set("min.insync.replicas", "1"), _set("compression.type", "producer")])
    client = admin(server)
    (future,) = client.incremental_alter_configs([resource]).values()
    future.result(timeout=10)
    configs = described(server, "streams-internal")
    assert configs["min.insync.replicas"] == "1" and configs["compression.type"] == "producer"


def _set(name: str, value: str) -> Any:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry
    return ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)


@pytest.mark.parametrize(("name", "value"), [
    ("compression.type", "brotli"),
    ("min.insync.replicas", "0"),
    ("message.timestamp.type", "EventTime"),
    ("compression.gzip.level", "10"),
    ("compression.zstd.level", "23"),
    ("message.format.version", "latest"),
    ("leader.replication.throttled.replicas", "0-1"),
    ("local.retention.ms", "-3"),
])
def test_values_kafka_refuses_are_refused_with_invalid_config(
        server: LoggedServer, name: str, value: str) -> None:
    topic = f"bad-{name}".replace(".", "-")
    client = admin(server)
    futures = client.create_topics([NewTopic(topic, 1, 1, config={name: value})],
                                   operation_timeout=10)
    with pytest.raises(Exception) as raised:
        futures[topic].result(timeout=10)
    error = raised.value.args[0]
    assert error.code() == KafkaError.INVALID_CONFIG
    assert name in error.str() and value in error.str()


def test_compression_type_recompresses_produced_batches(server: LoggedServer) -> None:
    create(server, "zstd-topic", {"compression.type": "zstd"})
    create(server, "as-produced", {})
    values = [(bytes([65 + i]) * 1500, None) for i in range(3)]
    for topic in ("zstd-topic", "as-produced"):
        reports = produce(server, topic, values, **{"compression.type": "gzip"})
        assert all(err is None for err, _ in reports)
    assert [(base, codec) for base, codec, _ in fetched_batches(server, "zstd-topic")] == [
        (0, ZSTD), (1, ZSTD), (2, ZSTD)]
    # compression.type=producer keeps the producer's codec, as Kafka does.
    assert {codec for _, codec, _ in fetched_batches(server, "as-produced")} == {GZIP}
    assert [m.value() for m in consume_all(server, "zstd-topic", 3)] == [
        v for v, _ in values]


def test_batches_rebuilt_from_parquet_carry_the_topics_codec_and_timestamp_type(
        server: LoggedServer) -> None:
    # Offsets 0 and 1 are in sealed Parquet segments, 2 in the log segment.
    assert [(codec, kind) for _, codec, kind in fetched_batches(server, "sealed-zstd")] == [
        (ZSTD, 0)] * 3
    # `producer`: Parquet holds decoded records, rebuilt uncompressed.
    assert [codec for _, codec, _ in fetched_batches(server, "sealed-producer")] == [
        UNCOMPRESSED] * 3
    assert [kind for _, _, kind in fetched_batches(server, "sealed-appended")] == [
        TIMESTAMP_TYPE_MASK] * 3
    for name in SEALED:
        consumed = consume_all(server, name, 3)
        assert [m.value() for m in consumed] == SEALED_VALUES
        if name == "sealed-appended":
            assert {m.timestamp()[0] for m in consumed} == {TIMESTAMP_LOG_APPEND_TIME}
            assert all(m.timestamp()[1] > 1000 for m in consumed)
        else:
            assert {m.timestamp()[1] for m in consumed} == {1000}


def test_log_append_time_is_the_servers_clock_for_producer_and_consumer(
        server: LoggedServer) -> None:
    create(server, "appended", {"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    # Timestamps of 1970 and of next year: LogAppendTime replaces them, unchecked.
    # Idempotent, so the append goes through the producer state (server/producers.py).
    reports = produce(server, "appended", [(b"x", 1000), (b"y", None),
                                           (b"z", before + 365 * 24 * HOUR_MS)],
                      **{"enable.idempotence": True})
    after = int(time.time() * 1000)
    for err, message in reports:
        assert err is None
        # librdkafka takes the delivery timestamp from the ProduceResponse's
        # log_append_time_ms.
        kind, stamp = message.timestamp()
        assert kind == TIMESTAMP_LOG_APPEND_TIME and before <= stamp <= after
    consumed = consume_all(server, "appended", 3)
    assert [m.timestamp() for m in consumed] == [m.timestamp() for _, m in reports]
    assert {kind for _, _, kind in fetched_batches(server, "appended")} == {
        TIMESTAMP_TYPE_MASK}


@pytest.mark.parametrize(("config", "offset_ms", "refused"), [
    ({"message.timestamp.before.max.ms": str(HOUR_MS)}, -2 * HOUR_MS, True),
    ({"message.timestamp.before.max.ms": str(HOUR_MS)}, -HOUR_MS // 2, False),
    ({"message.timestamp.after.max.ms": str(HOUR_MS)}, 2 * HOUR_MS, True),
    ({"message.timestamp.after.max.ms": str(HOUR_MS)}, -100 * HOUR_MS, False),
    # The deprecated limit applies either way while the new ones are left at Long.MAX.
    ({"message.timestamp.difference.max.ms": str(HOUR_MS)}, -2 * HOUR_MS, True),
    ({"message.timestamp.difference.max.ms": str(HOUR_MS)}, 2 * HOUR_MS, True),
])
def test_create_time_out_of_range_is_invalid_timestamp(
        server: LoggedServer, config: dict[str, str], offset_ms: int, refused: bool) -> None:
    topic = f"ts-{next(iter(config))}{offset_ms}"
    create(server, topic, config)
    mark = server.mark()
    reports = produce(server, topic, [(b"v", int(time.time() * 1000) + offset_ms)],
                      retries=0)
    (err, _), = reports
    if refused:
        assert err is not None and err.code() == KafkaError.INVALID_TIMESTAMP  # 32
        # librdkafka reports the code only; the server's log has the message.
        server.wait_for_log(rf"{topic}/0: record timestamp \d+ is out of range", mark)
    else:
        assert err is None


# -- the CLI and the Python API ---------------------------------------------------------

def test_cli_creates_alters_and_describes_kafkas_configs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ok(run(data, "topics", "create", "events", "--config", "compression.type=lz4",
           "--config", "message.timestamp.type=LogAppendTime",
           "--config", "min.insync.replicas=2"))
    ok(run(data, "topics", "alter", "events", "--config", "message.timestamp.after.max.ms=60000",
           "--config", "unclean.leader.election.enable=true"))
    shown = json.loads(ok(run(data, "topics", "describe", "events", "--json")))
    assert shown["config"]["compression.type"] == "lz4"
    assert shown["config"]["min.insync.replicas"] == 2
    assert shown["config"]["message.timestamp.after.max.ms"] == 60000
    assert shown["config"]["unclean.leader.election.enable"] is True
    refused = run(data, "topics", "alter", "events", "--config", "compression.type=brotli")
    assert refused.returncode != 0
    assert "compression.type" in refused.stderr and "brotli" in refused.stderr


def test_library_appends_follow_the_topics_timestamp_and_codec_rules(tmp_path: Path) -> None:
    with LogStore.open(tmp_path / "data") as store:
        store.create_topic("stamped", 1, {"message.timestamp.type": "LogAppendTime",
                                          "compression.type": "snappy"})
        store.create_topic("checked", 1, {"message.timestamp.before.max.ms": str(HOUR_MS)})
        stamped = store.topic("stamped").partition(0)
        now = int(time.time() * 1000)
        stamped.append([ProducerRecord(b"k", b"v", timestamp=1000)])
        (record,) = stamped.read(0)
        assert now <= record.timestamp <= int(time.time() * 1000)
        (_, header), = iter_batches(stamped.active.read_raw(0, 1 << 20))
        assert header.codec == 2 and header.attributes & TIMESTAMP_TYPE_MASK
        checked = store.topic("checked").partition(0)
        with pytest.raises(InvalidTimestampError, match=r"checked/0: record timestamp 1000"):
            checked.append([ProducerRecord(b"k", b"v", timestamp=1000)])
        checked.append([ProducerRecord(b"k", b"v")])
        assert checked.log_end_offset == 1
