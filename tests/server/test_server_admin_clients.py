"""The admin work of real, unmodified clients against `compactlog serve`: kafka-python,
aiokafka, confluent-kafka (librdkafka) and kcat. Each lists all topics, alters a config
with every API it has, deletes records (a consumer from the earliest offset then starts
at the new low watermark, on a plain topic and on a compacted one) and deletes a group
(refused while it has members; then gone from ListGroups). kafka-python and
confluent-kafka also call the cluster APIs they have.

The data directory is prepared once and copied for each test: `plain` holds 20 records
in partition 0; `table` (compact,delete) was compacted by the local engine, so its
first 40 records (keys k0..k9, four times over) are in the ledger as offsets 30..39,
followed by 5 live records n0..n4 (offsets 40..44). Deleting below 35 leaves the view
k5..k9, n0..n4.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource as AioConfigResource
from aiokafka.admin.config_resource import ConfigResourceType as AioConfigResourceType
from aiokafka.protocol.admin import DeleteGroupsRequest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    ConsumerGroupTopicPartitions,
    ElectionType,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
)
from kafka import KafkaAdminClient, KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kafka.admin import ConfigResource as KpConfigResource
from kafka.admin import ConfigResourceType as KpConfigResourceType
from kafka.admin import NewPartitions as KpNewPartitions
from kafka.errors import InvalidPartitionsError

from compactlog.compaction import load_factory
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.kafka_server import LoggedServer, logged_server

KCAT = shutil.which("kcat")
needs_kcat = pytest.mark.skipif(KCAT is None,
                                reason="kcat is not installed (scripts/setup.sh --dev)")
TIMEOUT_S = 60.0
TOPICS = {"plain", "table"}
TABLE = {"cleanup.policy": "compact,delete", "min.compaction.lag.ms": "0",
         "delete.retention.ms": "0"}
PLAIN = {"retention.ms": "86400000", "segment.bytes": "65536"}
# After deleting below these, what a consumer from the earliest offset reads.
PLAIN_CUT, TABLE_CUT = 12, 35
TABLE_VIEW = [(35 + i, b"k%d" % (5 + i)) for i in range(5)] + [
    (40 + i, b"n%d" % i) for i in range(5)]
T = TypeVar("T")


# -- the data and the server -------------------------------------------------------------

@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("admin-clients") / "data"
    with LogStore.open(data) as store:
        store.create_topic("plain", 2, PLAIN)
        store.append("plain", [ProducerRecord(b"p%d" % i, b"%d" % i) for i in range(20)],
                     partition=0)
        store.create_topic("table", 1, TABLE)
        store.append("table", [ProducerRecord(b"k%d" % (i % 10), b"%d" % i)
                               for i in range(40)])
        partition = store.topic("table").partition(0)
        partition.roll()
        load_factory("local_engine:LocalCompactionServiceFactory").new_service(
            store, "table", {}).compact()
        assert partition.stats()["horizon"] == 39
        store.append("table", [ProducerRecord(b"n%d" % i, b"live") for i in range(5)])
    return data


@pytest.fixture
def server(template: Path, tmp_path: Path) -> Iterator[LoggedServer]:
    shutil.copytree(template, tmp_path / "data")
    config = tmp_path / "server.toml"
    config.write_text("group_initial_rebalance_delay_s = 0.1\n")
    with logged_server(tmp_path / "data", tmp_path / "server.log",
                       "--config", str(config)) as running:
        yield running


def wait_for(check: Callable[[], T | None], what: str) -> T:
    deadline = time.monotonic() + TIMEOUT_S
    while (result := check()) is None or result is False:
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return result


# -- what every client's scenario checks, through kafka-python ---------------------------

def overrides(bootstrap: str, topic: str) -> dict[str, str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        described = admin.describe_configs(
            [KpConfigResource(KpConfigResourceType.TOPIC, topic)], config_filter="all")
    finally:
        admin.close()
    return {name: entry["value"] for name, entry in described["topic"][topic].items()
            if entry["config_source"] == "DYNAMIC_TOPIC_CONFIG"}


def groups(bootstrap: str) -> dict[str, str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return {g["group_id"]: g["group_state"] for g in admin.list_groups()}
    finally:
        admin.close()


def committed(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return {(tp.topic, tp.partition): meta.offset
                for tp, meta in admin.list_group_offsets(group)[group].items()}
    finally:
        admin.close()


def stable(bootstrap: str, group: str) -> bool:
    return groups(bootstrap).get(group) == "Stable"


# -- kafka-python ---------------------------------------------------------------------------

def kafka_python_earliest(bootstrap: str, topic: str, end: int) -> list[tuple[int, bytes]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=5000)
    tp = KpTopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    seen = []
    for message in consumer:
        seen.append((message.offset, message.key))
        if message.offset == end - 1:
            break
    consumer.close()
    return seen


def test_kafka_python_admin_work(server: LoggedServer) -> None:
    bootstrap = server.bootstrap
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        assert set(admin.list_topics()) == TOPICS
        # AlterConfigs: kafka-python itself sends the other keys the topic has, since
        # AlterConfigs resets what it does not name.
        plain = KpConfigResource(KpConfigResourceType.TOPIC, "plain",
                                 configs={"retention.ms": "5000"})
        assert admin.alter_configs([plain], incremental=False) == {"topic": {"plain": "OK"}}
        assert overrides(bootstrap, "plain") == {**PLAIN, "retention.ms": "5000"}
        plain = KpConfigResource(KpConfigResourceType.TOPIC, "plain",
                                 configs={"segment.bytes": "131072"})
        assert admin.alter_configs([plain], incremental=True) == {"topic": {"plain": "OK"}}
        assert overrides(bootstrap, "plain") == {"retention.ms": "5000",
                                                 "segment.bytes": "131072"}
        bad = KpConfigResource(KpConfigResourceType.TOPIC, "plain",
                               configs={"retention.ms": "soon"})
        refused = admin.alter_configs([bad], incremental=False)["topic"]["plain"]
        assert "InvalidConfigurationError" in refused and "'retention.ms'" in refused

        deleted = admin.delete_records({KpTopicPartition("plain", 0): PLAIN_CUT,
                                        KpTopicPartition("table", 0): TABLE_CUT})
        assert {tp.topic: r["low_watermark"] for tp, r in deleted.items()} == {
            "plain": PLAIN_CUT, "table": TABLE_CUT}
        assert kafka_python_earliest(bootstrap, "plain", 20)[0][0] == PLAIN_CUT
        assert kafka_python_earliest(bootstrap, "table", 45) == TABLE_VIEW

        consumer = KafkaConsumer("plain", bootstrap_servers=bootstrap, group_id="kp",
                                 auto_offset_reset="earliest")
        wait_for(lambda: consumer.poll(timeout_ms=100) is not None and consumer.assignment(),
                 "an assignment")
        wait_for(lambda: stable(bootstrap, "kp"), "a stable group")
        assert admin.delete_groups(["kp", "nope"]) == {"kp": "NonEmptyGroupError",
                                                       "nope": "GroupIdNotFoundError"}
        consumer.close()  # leaves the group
        wait_for(lambda: groups(bootstrap).get("kp") == "Empty", "an empty group")
        assert admin.delete_groups(["kp"]) == {"kp": "OK"}
        assert "kp" not in groups(bootstrap)

        # The cluster APIs kafka-python has.
        (dirs,) = admin.describe_log_dirs()
        sizes = {(t["name"], p["partition_index"]): p["partition_size"]
                 for d in dirs["log_dirs"] for t in d["topics"] for p in t["partitions"]}
        assert set(sizes) == {("plain", 0), ("plain", 1), ("table", 0)}
        assert sizes[("plain", 0)] > 0 and sizes[("plain", 1)] == 0
        cluster = admin.describe_cluster()
        assert (cluster["controller_id"], [b["broker_id"] for b in cluster["brokers"]]) == (
            0, [0])
        elected = admin.elect_leaders(0, {"plain": [0, 1]})
        assert {p.error_code for r in elected.replica_election_results
                for p in r.partition_result} == {84}  # ELECTION_NOT_NEEDED
        assert admin.list_partition_reassignments() == {}
        with pytest.raises(InvalidPartitionsError, match="cannot add partitions"):
            admin.create_partitions({"plain": KpNewPartitions(3)})
    finally:
        admin.close()


# -- aiokafka ---------------------------------------------------------------------------------

async def aiokafka_earliest(bootstrap: str, topic: str, end: int) -> list[tuple[int, bytes]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        tp = AioTopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        seen: list[tuple[int, bytes]] = []
        while not seen or seen[-1][0] < end - 1:
            for messages in (await consumer.getmany(timeout_ms=500)).values():
                seen += [(m.offset, m.key) for m in messages]
        return seen
    finally:
        await consumer.stop()


async def aiokafka_admin_work(bootstrap: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        assert set(await admin.list_topics()) == TOPICS
        # AlterConfigs is aiokafka's only way to change a config: what it does not name
        # goes back to its default, as in Kafka.
        (altered,) = await admin.alter_configs([AioConfigResource(
            AioConfigResourceType.TOPIC, "plain", configs={"retention.ms": "5000"})])
        assert [r[0] for r in altered.resources] == [0]
        assert overrides(bootstrap, "plain") == {"retention.ms": "5000"}
        (refused,) = await admin.alter_configs([AioConfigResource(
            AioConfigResourceType.TOPIC, "plain", configs={"segment.bytes": "tiny"})])
        ((code, message, *_),) = refused.resources
        assert code == 40 and "'segment.bytes'" in message  # INVALID_CONFIG

        assert await admin.delete_records({
            AioTopicPartition("plain", 0): RecordsToDelete(PLAIN_CUT),
            AioTopicPartition("table", 0): RecordsToDelete(TABLE_CUT)}) == {
            AioTopicPartition("plain", 0): PLAIN_CUT, AioTopicPartition("table", 0): TABLE_CUT}
        assert (await aiokafka_earliest(bootstrap, "plain", 20))[0][0] == PLAIN_CUT
        assert await aiokafka_earliest(bootstrap, "table", 45) == TABLE_VIEW

        # aiokafka has DeleteGroups in its protocol module but no admin method for it.
        async def delete_group(group: str) -> int:
            node = await admin.find_coordinator(group)
            response = await admin._client.send(node, DeleteGroupsRequest([group]))
            ((_, code),) = response.results
            return int(code)

        consumer = AIOKafkaConsumer("plain", bootstrap_servers=bootstrap, group_id="aio",
                                    auto_offset_reset="earliest")
        await consumer.start()
        while not consumer.assignment():
            await consumer.getmany(timeout_ms=100)
        while not stable(bootstrap, "aio"):
            await asyncio.sleep(0.1)
        assert await delete_group("aio") == 68  # NON_EMPTY_GROUP
        await consumer.stop()
        while groups(bootstrap).get("aio") != "Empty":
            await asyncio.sleep(0.1)
        assert await delete_group("aio") == 0
        assert await delete_group("aio") == 69  # GROUP_ID_NOT_FOUND
        assert "aio" not in groups(bootstrap)
        assert [b["node_id"] for b in (await admin.describe_cluster())["brokers"]] == [0]
    finally:
        await admin.close()


def test_aiokafka_admin_work(server: LoggedServer) -> None:
    asyncio.run(asyncio.wait_for(aiokafka_admin_work(server.bootstrap), TIMEOUT_S))


# -- confluent-kafka ----------------------------------------------------------------------------

def confluent_earliest(bootstrap: str, topic: str, end: int) -> list[tuple[int, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    seen: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + TIMEOUT_S
    while not seen or seen[-1][0] < end - 1:
        assert time.monotonic() < deadline, seen
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            seen.append((message.offset(), message.key()))
    consumer.close()
    return seen


def result(future: Any) -> Any:
    return future.result(TIMEOUT_S)


def test_confluent_kafka_admin_work(server: LoggedServer) -> None:
    bootstrap = server.bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap})
    assert set(admin.list_topics(timeout=10).topics) == TOPICS
    with pytest.warns(DeprecationWarning):  # AlterConfigs is deprecated in the client
        (future,) = admin.alter_configs([ConfigResource(
            "topic", "plain", set_config={"retention.ms": "5000"})]).values()
    result(future)
    assert overrides(bootstrap, "plain") == {"retention.ms": "5000"}
    (future,) = admin.incremental_alter_configs([ConfigResource(
        "topic", "plain", incremental_configs=[
            ConfigEntry("segment.bytes", "131072",
                        incremental_operation=AlterConfigOpType.SET)])]).values()
    result(future)
    assert overrides(bootstrap, "plain") == {"retention.ms": "5000",
                                             "segment.bytes": "131072"}
    (future,) = admin.incremental_alter_configs([ConfigResource(
        "topic", "plain", incremental_configs=[
            ConfigEntry("retention.ms", "-7",
                        incremental_operation=AlterConfigOpType.SET)])]).values()
    with pytest.raises(KafkaException, match=r"'retention\.ms'"):
        result(future)

    futures = admin.delete_records([TopicPartition("plain", 0, PLAIN_CUT),
                                    TopicPartition("table", 0, TABLE_CUT)])
    assert {tp.topic: result(f).low_watermark for tp, f in futures.items()} == {
        "plain": PLAIN_CUT, "table": TABLE_CUT}
    assert confluent_earliest(bootstrap, "plain", 20)[0][0] == PLAIN_CUT
    assert confluent_earliest(bootstrap, "table", 45) == TABLE_VIEW

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ck",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe(["plain"])
    wait_for(lambda: consumer.poll(0.1) is not None or consumer.assignment(), "an assignment")
    wait_for(lambda: stable(bootstrap, "ck"), "a stable group")
    (future,) = admin.delete_consumer_groups(["ck"]).values()
    with pytest.raises(KafkaException, match="NON_EMPTY_GROUP"):
        result(future)
    consumer.close()
    wait_for(lambda: groups(bootstrap).get("ck") == "Empty", "an empty group")
    assert {g.group_id for g in result(admin.list_consumer_groups()).valid} >= {"ck"}
    (future,) = admin.delete_consumer_groups(["ck"]).values()
    result(future)
    assert "ck" not in {g.group_id for g in result(admin.list_consumer_groups()).valid}

    # The cluster and group-offset APIs librdkafka has.
    cluster = result(admin.describe_cluster())
    assert (cluster.controller.id, [n.id for n in cluster.nodes]) == (0, [0])
    elected = result(admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("plain", 0)]))
    assert [e.code() for e in elected.values()] == [84]  # ELECTION_NOT_NEEDED
    offsets = ConsumerGroupTopicPartitions("ops", [TopicPartition("plain", 0, 15)])
    (future,) = admin.alter_consumer_group_offsets([offsets]).values()
    result(future)
    (future,) = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("ops")]).values()
    assert [(tp.topic, tp.partition, tp.offset) for tp in result(future).topic_partitions] == [
        ("plain", 0, 15)]
    (future,) = admin.create_partitions([NewPartitions("plain", 3)]).values()
    with pytest.raises(KafkaException, match="cannot add partitions"):
        result(future)


# -- kcat ---------------------------------------------------------------------------------------

def kcat(*args: str) -> subprocess.CompletedProcess[str]:
    assert KCAT is not None
    done = subprocess.run([KCAT, *args], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, (args, done.stderr)
    return done


@needs_kcat
def test_kcat_lists_topics_and_reads_from_the_new_low_watermark(server: LoggedServer,
                                                                tmp_path: Path) -> None:
    """kcat has no admin API: records and groups are deleted with kafka-python, and kcat
    lists the topics, reads from the beginning, and is a group's member meanwhile."""
    assert KCAT is not None
    bootstrap = server.bootstrap
    listed = kcat("-b", bootstrap, "-L", "-J").stdout
    assert {t["topic"] for t in json.loads(listed)["topics"]} == TOPICS
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_records({KpTopicPartition("plain", 0): PLAIN_CUT,
                              KpTopicPartition("table", 0): TABLE_CUT})
        for topic, first in (("plain", PLAIN_CUT), ("table", TABLE_CUT)):
            read = kcat("-b", bootstrap, "-C", "-t", topic, "-p", "0", "-o", "beginning",
                        "-e", "-f", "%o %k\\n").stdout.split()
            assert int(read[0]) == first, read
        read = kcat("-b", bootstrap, "-C", "-t", "table", "-o", "beginning", "-e",
                    "-f", "%o %k\\n").stdout.splitlines()
        assert [tuple(line.split()) for line in read] == [
            (str(o), k.decode()) for o, k in TABLE_VIEW]

        # kcat is stopped only once it has read plain/0, so that closing it commits
        # offsets before its LeaveGroup: a group left Empty without committed offsets
        # is forgotten at the server's next upkeep round (within 1 s; Kafka at its next
        # offsets.retention.check.interval.ms), after which ListGroups never shows it
        # Empty and DeleteGroups finds no group. That was this test's timeout: kcat,
        # stopped 40 ms after its group was stable, had read nothing and so committed
        # nothing; its LeaveGroup was answered, the group went Empty, then was gone.
        # (kcat's -X auto.commit.interval.ms sets the topic-level property, not the
        # consumer's, so waiting for an auto-commit would take librdkafka's 5 s.)
        # Kafka's minimum session (6 s) bounds a LeaveGroup ever lost.
        printed = tmp_path / "kcat.out"
        with printed.open("w") as out:
            member = subprocess.Popen([KCAT, "-b", bootstrap, "-G", "kc", "plain", "-q",
                                       "-X", "auto.offset.reset=earliest",
                                       "-X", "session.timeout.ms=6000",
                                       "-u", "-f", "%p %o\\n"],
                                      stdout=out, stderr=subprocess.PIPE, text=True)
        try:
            wait_for(lambda: stable(bootstrap, "kc"), "kcat's group to be stable")
            assert admin.delete_groups(["kc"]) == {"kc": "NonEmptyGroupError"}
            wait_for(lambda: "0 19" in printed.read_text().splitlines(),
                     "kcat to read plain/0")
        finally:
            member.send_signal(signal.SIGTERM)  # kcat commits, leaves the group, exits
            member.wait(TIMEOUT_S)
        wait_for(lambda: groups(bootstrap).get("kc") == "Empty", "kcat to leave")
        assert committed(bootstrap, "kc") == {("plain", 0): 20}
        assert admin.delete_groups(["kc"]) == {"kc": "OK"}
        assert "kc" not in groups(bootstrap)
    finally:
        admin.close()


def test_a_replication_factor_above_one_gets_kafkas_error(server: LoggedServer) -> None:
    """One broker: CreateTopics with replication factor 3 gets INVALID_REPLICATION_FACTOR
    (Kafka's answer when a cluster has fewer brokers), 1 and the default (-1) create."""
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    futures = admin.create_topics([NewTopic("three", 1, replication_factor=3),
                                   NewTopic("one", 1, replication_factor=1),
                                   NewTopic("default", 1)])
    with pytest.raises(KafkaException) as refused:
        result(futures["three"])
    assert refused.value.args[0].code() == KafkaError.INVALID_REPLICATION_FACTOR
    assert "replication factor must be 1" in refused.value.args[0].str()
    result(futures["one"])
    result(futures["default"])
