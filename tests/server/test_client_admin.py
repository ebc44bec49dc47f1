"""The admin calls of the four clients against `compactlog serve`: each lists all topics,
alters a topic config with every API it has (AlterConfigs, IncrementalAlterConfigs),
deletes records and deletes a consumer group, where the client has a call for it
(tests/support/compat.py lists what each lacks). Their produce/consume/compaction scenarios are
in test_server_scenarios.py.

The clients check the server's ApiVersions answer before they send, so each call here
also shows that the server advertises the API the client picks for it.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
)
from confluent_kafka.admin import ConfigResource as CkConfigResource
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import ConfigResource, ConfigResourceType

from support.apps_support import create_topic, produce, run_isolated, server_config, topic_configs
from support.kafka_server import LoggedServer, logged_server

TIMEOUT_S = 30
TOPICS: dict[str, dict[str, str]] = {"plain": {}, "compacted": {"cleanup.policy": "compact"}}
KCAT = shutil.which("kcat")

@pytest.fixture
def server(tmp_path: Path) -> Iterator[LoggedServer]:
    with logged_server(tmp_path / "data", tmp_path / "server.log",
                       *server_config(tmp_path)) as running:
        for name, config in TOPICS.items():
            create_topic(running.bootstrap, name, 2, config)
        yield running
        closed = [line for line in running.log().splitlines() if "closing connection" in line]
        assert closed == [], closed


def numbered(count: int) -> list[tuple[str, str | None]]:
    return [(f"k{i}", f"v{i}") for i in range(count)]


def one_partition_topic(server: LoggedServer, name: str = "trimmed") -> None:
    """A topic of one partition (cleanup.policy delete) holding offsets 0-9."""
    create_topic(server.bootstrap, name, 1, {})
    produce(server.bootstrap, name, numbered(10))


def low_watermark_and_first(server: LoggedServer, topic: str) -> tuple[int, int]:
    """The earliest offset (ListOffsets), and the first offset a consumer from the
    earliest gets, asked with kafka-python (a neutral referee)."""
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, fetch_max_wait_ms=100)
    try:
        tp = KpTopicPartition(topic, 0)
        consumer.assign([tp])
        low = consumer.beginning_offsets([tp])[tp]
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            assert time.monotonic() < deadline, "nothing to read"
            for messages in consumer.poll(timeout_ms=200).values():
                return low, messages[0].offset
    finally:
        consumer.close()


def kafka_python_group(server: LoggedServer, group: str, topic: str = "plain") -> None:
    """A group that consumed and committed, and is empty again (DeleteGroups refuses
    groups with members)."""
    consumer = KafkaConsumer(topic, bootstrap_servers=server.bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             fetch_max_wait_ms=100)
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not consumer.poll(timeout_ms=200):
            assert time.monotonic() < deadline, "the group read nothing"
        consumer.commit()
    finally:
        consumer.close()


def group_offsets(server: LoggedServer, group: str) -> dict[int, int]:
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        offsets = admin.list_group_offsets(group)[group]
    finally:
        admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items()}


# -- kafka-python --------------------------------------------------------------------------


@pytest.fixture
def kp_admin(server: LoggedServer) -> Iterator[KafkaAdminClient]:
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=30000)
    try:
        yield admin
    finally:
        admin.close()


@pytest.mark.compat("kafka-python", "list-topics")
def test_kafka_python_lists_topics(kp_admin: KafkaAdminClient) -> None:
    assert sorted(kp_admin.list_topics()) == sorted(TOPICS)


@pytest.mark.compat("kafka-python", "alter-config-AlterConfigs")
def test_kafka_python_alter_configs(server: LoggedServer, kp_admin: KafkaAdminClient) -> None:
    kp_admin.alter_configs([ConfigResource(
        ConfigResourceType.TOPIC, "compacted",
        configs={"cleanup.policy": "compact", "delete.retention.ms": "1000"})],
        incremental=False)
    assert topic_configs(server.bootstrap, "compacted")["delete.retention.ms"] == "1000"


@pytest.mark.compat("kafka-python", "alter-config-IncrementalAlterConfigs")
def test_kafka_python_incremental_alter_configs(server: LoggedServer,
                                                kp_admin: KafkaAdminClient) -> None:
    kp_admin.alter_configs([ConfigResource(
        ConfigResourceType.TOPIC, "compacted", configs={"delete.retention.ms": "2000"})],
        incremental=True)
    configs = topic_configs(server.bootstrap, "compacted")
    assert (configs["delete.retention.ms"], configs["cleanup.policy"]) == ("2000", "compact")


@pytest.mark.compat("kafka-python", "delete-records")
def test_kafka_python_delete_records(server: LoggedServer,
                                     kp_admin: KafkaAdminClient) -> None:
    one_partition_topic(server)
    kp_admin.delete_records({KpTopicPartition("trimmed", 0): 4})
    assert low_watermark_and_first(server, "trimmed") == (4, 4)


@pytest.mark.compat("kafka-python", "delete-group")
def test_kafka_python_delete_group(server: LoggedServer, kp_admin: KafkaAdminClient) -> None:
    produce(server.bootstrap, "plain", numbered(5))
    kafka_python_group(server, "doomed")
    assert group_offsets(server, "doomed")
    kp_admin.delete_groups(["doomed"])
    assert "doomed" not in [g["group_id"] for g in kp_admin.list_groups()]
    assert group_offsets(server, "doomed") == {}


# -- aiokafka ------------------------------------------------------------------------------


def aio(server: LoggedServer, work: Any) -> Any:
    """Run `work(admin)` with a started AIOKafkaAdminClient."""
    async def run() -> Any:
        admin = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap,
                                    request_timeout_ms=30000)
        await admin.start()
        try:
            return await work(admin)
        finally:
            await admin.close()

    return asyncio.run(asyncio.wait_for(run(), 2 * TIMEOUT_S))


@pytest.mark.compat("aiokafka", "list-topics")
def test_aiokafka_lists_topics(server: LoggedServer) -> None:
    assert sorted(aio(server, lambda admin: admin.list_topics())) == sorted(TOPICS)


@pytest.mark.compat("aiokafka", "alter-config-AlterConfigs")
def test_aiokafka_alter_configs(server: LoggedServer) -> None:
    responses = aio(server, lambda admin: admin.alter_configs([AioConfigResource(
        AioConfigResourceType.TOPIC, "compacted",
        configs={"cleanup.policy": "compact", "delete.retention.ms": "3000"})]))
    for response in responses:
        assert all(resource[0] == 0 for resource in response.resources), response
    assert topic_configs(server.bootstrap, "compacted")["delete.retention.ms"] == "3000"


@pytest.mark.compat("aiokafka", "delete-records")
def test_aiokafka_delete_records(server: LoggedServer) -> None:
    one_partition_topic(server)
    low = aio(server, lambda admin: admin.delete_records(
        {AioTopicPartition("trimmed", 0): RecordsToDelete(4)}))
    assert low == {AioTopicPartition("trimmed", 0): 4}

    async def first_offset() -> tuple[int, int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=server.bootstrap,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        try:
            tp = AioTopicPartition("trimmed", 0)
            consumer.assign([tp])
            beginning = (await consumer.beginning_offsets([tp]))[tp]
            return beginning, (await consumer.getone()).offset
        finally:
            await consumer.stop()

    assert asyncio.run(asyncio.wait_for(first_offset(), TIMEOUT_S)) == (4, 4)


# -- confluent-kafka -----------------------------------------------------------------------
# Each in a child process (run_isolated): librdkafka can abort the interpreter when an
# admin call the server does not support fails.


def ck_admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def ck_describe(admin: AdminClient, topic: str) -> dict[str, str]:
    resource = CkConfigResource("topic", topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)
    return {name: entry.value for name, entry in entries.items()}


def ck_list_topics(bootstrap: str) -> list[str]:
    return sorted(ck_admin(bootstrap).list_topics(timeout=TIMEOUT_S).topics)


@pytest.mark.compat("confluent-kafka", "list-topics")
def test_confluent_kafka_lists_topics(server: LoggedServer) -> None:
    assert run_isolated(ck_list_topics, server.bootstrap) == sorted(TOPICS)


def ck_alter_configs(bootstrap: str) -> dict[str, str]:
    admin = ck_admin(bootstrap)
    resource = CkConfigResource("topic", "compacted", set_config={
        "cleanup.policy": "compact", "delete.retention.ms": "4000"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "use incremental_alter_configs"
        admin.alter_configs([resource])[resource].result(timeout=TIMEOUT_S)
    return ck_describe(admin, "compacted")


@pytest.mark.compat("confluent-kafka", "alter-config-AlterConfigs")
def test_confluent_kafka_alter_configs(server: LoggedServer) -> None:
    configs = run_isolated(ck_alter_configs, server.bootstrap)
    assert (configs["delete.retention.ms"], configs["cleanup.policy"]) == ("4000", "compact")


def ck_incremental_alter_configs(bootstrap: str) -> dict[str, str]:
    admin = ck_admin(bootstrap)
    resource = CkConfigResource("topic", "compacted", incremental_configs=[
        ConfigEntry("delete.retention.ms", "5000",
                    incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT_S)
    return ck_describe(admin, "compacted")


@pytest.mark.compat("confluent-kafka", "alter-config-IncrementalAlterConfigs")
def test_confluent_kafka_incremental_alter_configs(server: LoggedServer) -> None:
    configs = run_isolated(ck_incremental_alter_configs, server.bootstrap)
    assert (configs["delete.retention.ms"], configs["cleanup.policy"]) == ("5000", "compact")


def ck_delete_records(bootstrap: str) -> tuple[int, int, int]:
    """DeleteRecords up to offset 4; the low watermark it reports, then the earliest
    offset and the first offset read by a consumer."""
    admin = ck_admin(bootstrap)  # kept referenced: a collected client never completes its futures
    (future,) = admin.delete_records([CkTopicPartition("trimmed", 0, 4)]).values()
    reported = future.result(timeout=TIMEOUT_S).low_watermark
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        low, _high = consumer.get_watermark_offsets(CkTopicPartition("trimmed", 0),
                                                    timeout=TIMEOUT_S)
        consumer.assign([CkTopicPartition("trimmed", 0, 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while (message := consumer.poll(0.2)) is None or message.error() is not None:
            assert time.monotonic() < deadline, "nothing to read"
        return reported, low, message.offset()
    finally:
        consumer.close()


@pytest.mark.compat("confluent-kafka", "delete-records")
def test_confluent_kafka_delete_records(server: LoggedServer) -> None:
    one_partition_topic(server)
    assert run_isolated(ck_delete_records, server.bootstrap) == (4, 4, 4)


def ck_group(bootstrap: str, group: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in numbered(5):
        producer.produce("plain", key=key, value=value)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "group.protocol": "classic", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe(["plain"])
        deadline = time.monotonic() + TIMEOUT_S
        while (message := consumer.poll(0.2)) is None or message.error() is not None:
            assert time.monotonic() < deadline, "the group read nothing"
        consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()


def ck_delete_group(bootstrap: str, group: str) -> list[str]:
    """DeleteGroups; then the groups listed."""
    admin = ck_admin(bootstrap)
    (future,) = admin.delete_consumer_groups([group]).values()
    future.result(timeout=TIMEOUT_S)
    listed = admin.list_consumer_groups().result(timeout=TIMEOUT_S)
    return sorted(g.group_id for g in listed.valid)


@pytest.mark.compat("confluent-kafka", "delete-group")
def test_confluent_kafka_delete_group(server: LoggedServer) -> None:
    run_isolated(ck_group, server.bootstrap, "doomed")
    assert group_offsets(server, "doomed")
    assert "doomed" not in run_isolated(ck_delete_group, server.bootstrap, "doomed")
    assert group_offsets(server, "doomed") == {}


# -- kcat ------------------------------------------------------------------------------------


@pytest.mark.compat("kcat", "list-topics")
@pytest.mark.skipif(KCAT is None, reason="kcat is not installed (scripts/setup.sh --dev)")
def test_kcat_lists_topics(server: LoggedServer) -> None:
    assert KCAT is not None
    done = subprocess.run([KCAT, "-b", server.bootstrap, "-L", "-J"], capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr
    listed = json.loads(done.stdout)
    assert sorted(t["topic"] for t in listed["topics"]) == sorted(TOPICS)
    assert all(len(t["partitions"]) == 2 for t in listed["topics"])
