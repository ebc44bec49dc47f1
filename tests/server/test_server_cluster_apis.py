"""The single-node cluster APIs on the wire, every served version, against a real
server: ApiVersions advertises exactly what is served; DescribeCluster, DescribeLogDirs,
ElectLeaders, the partition reassignment APIs, CreatePartitions and DescribeProducers
answer as Kafka's broker and controller answer for one node that leads every
partition."""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from kio.schema.errors import ErrorCode

from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.admin_wire import API_VERSIONS, serve
from support.kafka_server import LoggedServer, logged_server
from support.wire import Wire

(DESCRIBE_LOG_DIRS, CREATE_PARTITIONS, ELECT_LEADERS, ALTER_REASSIGNMENTS,
 LIST_REASSIGNMENTS, DESCRIBE_CLUSTER, DESCRIBE_PRODUCERS) = 35, 37, 43, 45, 46, 60, 61
NEW_APIS = {21: (0, 2), 33: (0, 2), 35: (1, 4), 37: (0, 3), 42: (0, 2), 43: (0, 2),
            45: (0, 1), 46: (0, 0), 47: (0, 0), 60: (0, 2), 61: (0, 0)}
# Asked for by clients, and not served (docs/server.md says why).
NOT_SERVED = [23, 34, 48, 49, 55, 57, 65, 66, 68, 69, 74, 75]
TIMEOUT = datetime.timedelta(seconds=5)


def prepare(store: LogStore) -> None:
    store.create_topic("a", 2)
    store.create_topic("b", 1)
    store.append("a", [ProducerRecord(b"k%d" % i, b"v" * 100) for i in range(10)], partition=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    with serve(tmp_path_factory.mktemp("cluster"), prepare) as running:
        yield running


def test_api_versions_advertise_what_is_served(server: LoggedServer) -> None:
    with Wire(server.address) as wire:
        body = wire.call(API_VERSIONS, 3, {"client_software_name": "test",
                                           "client_software_version": "1"})
    advertised = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert {key: advertised.get(key) for key in NEW_APIS} == NEW_APIS
    assert not set(NOT_SERVED) & set(advertised)


@pytest.mark.parametrize("version", [0, 1, 2])
def test_describe_cluster_is_this_node(server: LoggedServer, version: int) -> None:
    with Wire(server.address) as wire:
        body = wire.call(DESCRIBE_CLUSTER, version, {
            "include_cluster_authorized_operations": True, "endpoint_type": 1,
            "include_fenced_brokers": True})
        assert (body.error_code, body.controller_id) == (ErrorCode.none, 0)
        assert len(body.cluster_id) == 22
        assert [(b.broker_id, b.host, b.port, b.rack) for b in body.brokers] == [
            (0, "127.0.0.1", server.port, None)]
        if version >= 1:
            controllers = wire.call(DESCRIBE_CLUSTER, version, {"endpoint_type": 2})
            assert controllers.error_code is ErrorCode.mismatched_endpoint_type
            unknown = wire.call(DESCRIBE_CLUSTER, version, {"endpoint_type": 9})
            assert unknown.error_code is ErrorCode.unsupported_endpoint_type
            assert unknown.error_message == "Unsupported endpoint type 9"


def log_dirs(wire: Wire, version: int, topics: list[dict[str, Any]] | None
             ) -> tuple[Any, dict[tuple[str, int], int]]:
    body = wire.call(DESCRIBE_LOG_DIRS, version, {"topics": topics})
    (result,) = body.results
    assert result.error_code is ErrorCode.none
    return result, {(t.name, p.partition_index): p.partition_size
                    for t in result.topics for p in t.partitions}


@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_describe_log_dirs_is_the_data_directory(server: LoggedServer, version: int) -> None:
    with Wire(server.address) as wire:
        result, sizes = log_dirs(wire, version, None)
        assert Path(result.log_dir) == (server.log_path.parent / "data").resolve()
        assert set(sizes) == {("a", 0), ("a", 1), ("b", 0)}
        assert sizes[("a", 0)] > 1000 and sizes[("a", 1)] == 0
        if version >= 4:
            assert result.total_bytes >= result.usable_bytes > 0
        # Partitions the node does not have are left out, as Kafka does.
        _, some = log_dirs(wire, version, [{"topic": "a", "partitions": [1, 5]},
                                           {"topic": "missing", "partitions": [0]}])
        assert some == {("a", 1): 0}
        assert log_dirs(wire, version, [])[1] == {}


@pytest.mark.parametrize("version", [0, 1, 2])
def test_elect_leaders_is_never_needed(server: LoggedServer, version: int) -> None:
    with Wire(server.address) as wire:
        body = wire.call(ELECT_LEADERS, version, {
            "election_type": 0, "timeout": TIMEOUT,
            "topic_partitions": [{"topic": "a", "partitions": [0, 1, 9]},
                                 {"topic": "missing", "partitions": [0]}]})
        assert {(r.topic, p.partition_id): p.error_code
                for r in body.replica_election_results for p in r.partition_result} == {
            ("a", 0): ErrorCode.election_not_needed, ("a", 1): ErrorCode.election_not_needed,
            ("a", 9): ErrorCode.unknown_topic_or_partition,
            ("missing", 0): ErrorCode.unknown_topic_or_partition}
        # All partitions: those that need nothing are left out (Kafka's controller).
        every = wire.call(ELECT_LEADERS, version, {"election_type": 1, "timeout": TIMEOUT,
                                                   "topic_partitions": None})
        assert [(r.topic, r.partition_result) for r in every.replica_election_results] == [
            ("a", ()), ("b", ())]
        assert wire.call(ELECT_LEADERS, version, {"election_type": 0, "timeout": TIMEOUT,
                                                  "topic_partitions": []}
                         ).replica_election_results == ()
        if version >= 1:
            bad = wire.call(ELECT_LEADERS, version, {"election_type": 7, "timeout": TIMEOUT,
                                                     "topic_partitions": None})
            assert bad.error_code is ErrorCode.invalid_request


def test_partition_reassignments_have_one_possible_assignment(server: LoggedServer) -> None:
    with Wire(server.address) as wire:
        listed = wire.call(LIST_REASSIGNMENTS, 0, {"timeout": TIMEOUT, "topics": None})
        assert (listed.error_code, listed.topics) == (ErrorCode.none, ())
        listed = wire.call(LIST_REASSIGNMENTS, 0, {"timeout": TIMEOUT, "topics": [
            {"name": "a", "partition_indexes": [0]}]})
        assert listed.topics == ()
        for version in (0, 1):
            body = wire.call(ALTER_REASSIGNMENTS, version, {
                "timeout": TIMEOUT, "allow_replication_factor_change": True, "topics": [
                    {"name": "a", "partitions": [
                        {"partition_index": 0, "replicas": [0]},
                        {"partition_index": 1, "replicas": None},
                        {"partition_index": 0, "replicas": [0, 1]},
                        {"partition_index": 0, "replicas": [0, 0]},
                        {"partition_index": 0, "replicas": []},
                        {"partition_index": 4, "replicas": [0]}]}]})
            (topic,) = body.responses
            assert [p.error_code for p in topic.partitions] == [
                ErrorCode.none, ErrorCode.no_reassignment_in_progress,
                ErrorCode.invalid_replica_assignment, ErrorCode.invalid_replica_assignment,
                ErrorCode.invalid_replica_assignment, ErrorCode.unknown_topic_or_partition]
            assert "broker 1, but no such broker" in topic.partitions[2].error_message


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_create_partitions_checks_as_kafka_and_refuses_an_increase(
        server: LoggedServer, version: int) -> None:
    with Wire(server.address) as wire:
        body = wire.call(CREATE_PARTITIONS, version, {
            "timeout": TIMEOUT, "validate_only": version % 2 == 1, "topics": [
                {"name": "a", "count": 2, "assignments": None},
                {"name": "b", "count": 3, "assignments": [{"broker_ids": [0]}]},
                {"name": "missing", "count": 2, "assignments": None},
                {"name": "dup", "count": 2, "assignments": None},
                {"name": "dup", "count": 2, "assignments": None}]})
        answers = {r.name: (r.error_code, r.error_message) for r in body.results}
        assert answers["a"] == (ErrorCode.invalid_partitions,
                                "Topic already has 2 partition(s).")
        assert answers["b"][0] is ErrorCode.invalid_replica_assignment
        assert answers["missing"][0] is ErrorCode.unknown_topic_or_partition
        assert answers["dup"] == (ErrorCode.invalid_request, "Duplicate topic in request.")
        body = wire.call(CREATE_PARTITIONS, version, {
            "timeout": TIMEOUT, "validate_only": False, "topics": [
                {"name": "a", "count": 1, "assignments": None},
                {"name": "b", "count": 4, "assignments": None}]})
        fewer, more = body.results
        assert fewer.error_code is ErrorCode.invalid_partitions
        assert "1 would not be an increase" in fewer.error_message
        assert more.error_code is ErrorCode.invalid_partitions
        assert "cannot add partitions to an existing topic" in more.error_message
        assert log_dirs(wire, 4, [{"topic": "b", "partitions": [0, 1, 2, 3]}])[1] == {
            ("b", 0): 0}
        assert wire.call(CREATE_PARTITIONS, version, {
            "timeout": TIMEOUT, "validate_only": False, "topics": []}).results == ()


def producers(wire: Wire, wanted: dict[str, list[int]]) -> dict[tuple[str, int], Any]:
    body = wire.call(DESCRIBE_PRODUCERS, 0, {"topics": [
        {"name": name, "partition_indexes": indexes} for name, indexes in wanted.items()]})
    return {(t.name, p.partition_index): (p.error_code, [
        (s.producer_id, s.producer_epoch, s.last_sequence, s.coordinator_epoch,
         s.current_txn_start_offset) for s in p.active_producers])
        for t in body.topics for p in t.partitions}


def test_describe_producers_lists_idempotent_producers_also_after_a_restart(
        tmp_path: Path) -> None:
    def one_topic(store: LogStore) -> None:
        store.create_topic("t", 2)

    with serve(tmp_path, one_topic) as server, Wire(server.address) as wire:
        assert producers(wire, {"t": [0, 1]}) == {("t", 0): (ErrorCode.none, []),
                                                  ("t", 1): (ErrorCode.none, [])}
        assert producers(wire, {}) == {} and producers(wire, {"t": []}) == {}
        producer = KafkaProducer(bootstrap_servers=server.bootstrap, enable_idempotence=True,
                                 acks="all", linger_ms=0)
        for i in range(5):
            producer.send("t", key=b"k", value=b"%d" % i, partition=0).get(timeout=10)
        producer.close()
        found = producers(wire, {"t": [0, 1, 7], "missing": [0]})
        code, [(pid, epoch, last, coordinator_epoch, txn_start)] = found[("t", 0)]
        assert (code, epoch, last, coordinator_epoch, txn_start) == (
            ErrorCode.none, 0, 4, -1, -1)
        assert found[("t", 1)] == (ErrorCode.none, [])
        assert found[("t", 7)][0] is ErrorCode.unknown_topic_or_partition
        assert found[("missing", 0)][0] is ErrorCode.unknown_topic_or_partition
    with logged_server(tmp_path / "data", tmp_path / "again.log") as server, \
            Wire(server.address) as wire:
        assert producers(wire, {"t": [0]})[("t", 0)] == (
            ErrorCode.none, [(pid, 0, 4, -1, -1)])
