"""The cluster APIs of a single-node cluster: DescribeCluster, DescribeLogDirs,
ElectLeaders, ListPartitionReassignments and AlterPartitionReassignments.

Invariant: the answers describe what Metadata describes. One node (node 0) is the
controller and leads every partition, whose only replica it is; so leaders are always
the preferred ones (ElectLeaders answers ELECTION_NOT_NEEDED, as Kafka's controller
does for a partition whose preferred replica leads), no reassignment is ever in
progress, and the only assignment a partition can be given is the one it has. The data
directory is the one log directory, each partition's size the bytes of its log and
sealed segments and its compacted ledger.
"""

from __future__ import annotations

import logging
import shutil
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.errors import UnknownTopicError
from compactlog.server.broker import Broker
from compactlog.server.protocol.error_codes import error_code, error_message
from compactlog.server.protocol.messages import Request
from compactlog.server.security import access
from compactlog.server.security.acl_model import Operation

(DESCRIBE_LOG_DIRS, ELECT_LEADERS, ALTER_PARTITION_REASSIGNMENTS,
 LIST_PARTITION_REASSIGNMENTS, DESCRIBE_CLUSTER) = 35, 43, 45, 46, 60
BROKER_ENDPOINT, CONTROLLER_ENDPOINT = 1, 2  # DescribeCluster's endpoint types
PREFERRED, UNCLEAN = 0, 1  # ElectLeaders' election types
NOT_REQUESTED = -2147483648  # authorized operations: as Metadata answers them
log = logging.getLogger("compactlog.server")


def register(broker: Broker) -> None:
    # DescribeLogDirs v5 (is_cordoned, Kafka 4.3) is left out: kafka-python takes a
    # broker offering it for Kafka 4.3 and would change what it sends.
    broker.register(DESCRIBE_LOG_DIRS, (1, 4), describe_log_dirs)
    broker.register(ELECT_LEADERS, (0, 2), elect_leaders)
    broker.register(ALTER_PARTITION_REASSIGNMENTS, (0, 1), alter_partition_reassignments)
    broker.register(LIST_PARTITION_REASSIGNMENTS, (0, 0), list_partition_reassignments)
    broker.register(DESCRIBE_CLUSTER, (0, 2), describe_cluster)


async def describe_cluster(broker: Broker, request: Request) -> dict[str, Any]:
    answer: dict[str, Any] = {"endpoint_type": BROKER_ENDPOINT,
                              "cluster_id": broker.cluster_id, "brokers": []}
    endpoint = getattr(request.body, "endpoint_type", BROKER_ENDPOINT)  # v1+
    if endpoint != BROKER_ENDPOINT:
        # Kafka's AuthHelper.computeDescribeClusterResponse: this is a broker endpoint.
        if endpoint == CONTROLLER_ENDPOINT:
            code = ErrorCode.mismatched_endpoint_type
            message = ("The request was sent to an endpoint of type BROKER, but we wanted "
                       "an endpoint of type CONTROLLER")
        else:
            code = ErrorCode.unsupported_endpoint_type
            message = f"Unsupported endpoint type {endpoint}"
        return {**answer, "error_code": code, "error_message": message, "controller_id": -1}
    return {**answer, "error_code": ErrorCode.none, "error_message": None,
            "controller_id": broker.node_id,
            "brokers": [{"broker_id": broker.node_id, "host": broker.host,
                         "port": broker.port, "rack": None, "is_fenced": False}],
            "cluster_authorized_operations": (
                access.cluster_operations(broker, request)
                if request.body.include_cluster_authorized_operations else NOT_REQUESTED)}


async def describe_log_dirs(broker: Broker, request: Request) -> dict[str, Any]:
    if not access.cluster(broker, request, Operation.DESCRIBE):
        return {"error_code": access.CLUSTER_DENIED, "results": []}  # as Kafka
    return await broker.run_io(_describe_log_dirs, broker, request.body.topics)


def _describe_log_dirs(broker: Broker, asked: Any) -> dict[str, Any]:
    directory = broker.store.data_dir.resolve()
    wanted: dict[str, set[int] | None] = {}
    if asked is None:  # null: every partition
        wanted = dict.fromkeys(broker.store.list_topics())
    else:
        for entry in asked:
            indexes = wanted.setdefault(entry.topic, set())
            assert indexes is not None
            indexes.update(entry.partitions)
    result: dict[str, Any] = {"log_dir": str(directory), "topics": []}
    try:
        usage = shutil.disk_usage(directory)
        result.update(total_bytes=usage.total, usable_bytes=usage.free)
        for name, indexes in wanted.items():
            try:
                topic = broker.store.topic(name)
            except UnknownTopicError:
                continue  # as Kafka: partitions the broker does not have are left out
            partitions = [{"partition_index": p.index, "partition_size": _size(p.stats()),
                           "offset_lag": 0, "is_future_key": False}
                          for p in topic.partitions if indexes is None or p.index in indexes]
            if partitions:
                result["topics"].append({"name": name, "partitions": partitions})
    except Exception as error:
        # As Kafka's ReplicaManager.describeLogDirs: a directory that cannot be
        # described is answered with its error and no partitions.
        log.warning("DescribeLogDirs: cannot describe %s: %s", directory, error)
        result.update(error_code=error_code(error), topics=[])
        return {"error_code": ErrorCode.none, "results": [result]}
    return {"error_code": ErrorCode.none,
            "results": [{**result, "error_code": ErrorCode.none}]}


def _size(stats: dict[str, Any]) -> int:
    return int(stats["sealed_bytes"]) + int(stats["log_bytes"]) + int(stats["ledger_bytes"])


async def elect_leaders(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    election = getattr(body, "election_type", PREFERRED)  # v1+
    if election not in (PREFERRED, UNCLEAN):
        return {"error_code": ErrorCode.invalid_request, "replica_election_results": []}
    if not access.cluster(broker, request, Operation.ALTER):
        # Kafka: the top-level error, and each partition asked for gets it too.
        return {"error_code": access.CLUSTER_DENIED, "replica_election_results": [
            {"topic": entry.topic, "partition_result": [
                {"partition_id": index, "error_code": access.CLUSTER_DENIED,
                 "error_message": access.CLUSTER_MESSAGE} for index in entry.partitions]}
            for entry in body.topic_partitions or ()]}
    return {"error_code": ErrorCode.none, "replica_election_results":
            await broker.run_io(_elect, broker, body.topic_partitions)}


def _elect(broker: Broker, asked: Any) -> list[dict[str, Any]]:
    """Kafka's ReplicationControlManager.electLeaders on a partition whose preferred
    replica leads: ELECTION_NOT_NEEDED; when asked for every partition (null), those
    are left out of the answer, so every topic is listed with no partitions."""
    if asked is None:
        return [{"topic": name, "partition_result": []} for name in broker.store.list_topics()]
    results = []
    for entry in asked:
        partitions = []
        for index in entry.partitions:
            code, message = _exists(broker, entry.topic, index)
            if code is ErrorCode.none:
                code = ErrorCode.election_not_needed
                message = "Leader election not needed for topic partition."
            partitions.append({"partition_id": index, "error_code": code,
                               "error_message": message})
        results.append({"topic": entry.topic, "partition_result": partitions})
    return results


def _exists(broker: Broker, topic: str, index: int) -> tuple[ErrorCode, str | None]:
    try:
        broker.store.topic(topic).partition(index)
        return ErrorCode.none, None
    except Exception as error:
        return error_code(error), error_message(error)


async def list_partition_reassignments(broker: Broker, request: Request) -> dict[str, Any]:
    # Nothing is ever being reassigned, so every answer is empty (Kafka lists only
    # partitions with a reassignment in progress, and skips unknown topics).
    if not access.cluster(broker, request, Operation.DESCRIBE):
        return {"error_code": access.CLUSTER_DENIED, "error_message": access.CLUSTER_MESSAGE,
                "topics": []}
    return {"error_code": ErrorCode.none, "error_message": None, "topics": []}


async def alter_partition_reassignments(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    if not access.cluster(broker, request, Operation.ALTER):
        return {"error_code": access.CLUSTER_DENIED, "error_message": access.CLUSTER_MESSAGE,
                "allow_replication_factor_change": getattr(
                    body, "allow_replication_factor_change", True), "responses": []}
    return {"error_code": ErrorCode.none, "error_message": None,
            "allow_replication_factor_change": getattr(
                body, "allow_replication_factor_change", True),
            "responses": await broker.run_io(_reassign, broker, body.topics)}


def _reassign(broker: Broker, topics: Any) -> list[dict[str, Any]]:
    """Kafka's ReplicationControlManager.alterPartitionReassignment with one broker:
    the partition's own assignment, [node 0], is the only valid one and changes nothing;
    a cancellation (null replicas) finds no reassignment in progress."""
    answer = []
    for topic in topics:
        partitions = []
        for part in topic.partitions:
            code, message = _exists(broker, topic.name, part.partition_index)
            replicas = part.replicas
            if code is not ErrorCode.none:
                pass
            elif replicas is None:
                code = ErrorCode.no_reassignment_in_progress
                message = "No partition reassignment is in progress."
            elif not replicas:
                code = ErrorCode.invalid_replica_assignment
                message = "The manual partition assignment includes an empty replica list."
            else:
                message = _assignment_problem(broker, list(replicas))
                code = (ErrorCode.none if message is None
                        else ErrorCode.invalid_replica_assignment)
            partitions.append({"partition_index": part.partition_index, "error_code": code,
                               "error_message": message})
        answer.append({"name": topic.name, "partitions": partitions})
    return answer


def _assignment_problem(broker: Broker, replicas: list[int]) -> str | None:
    """Kafka's validateManualPartitionAssignment, with one registered broker."""
    previous = None
    for node in sorted(replicas):
        if node != broker.node_id:
            return (f"The manual partition assignment includes broker {node}, but no such "
                    "broker is registered.")
        if node == previous:
            return (f"The manual partition assignment includes the broker {node} more "
                    "than once.")
        previous = node
    return None
