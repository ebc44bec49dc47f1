"""CreateTopics, DeleteTopics and CreatePartitions.

Topic configs travel as strings under Kafka's names (cleanup.policy, segment.bytes,
delete.retention.ms, ...) plus compactlog's own keys; every value is checked by the
same declarations the CLI uses (configs.py has the config APIs), and a bad one is
refused with INVALID_CONFIG and a message naming the key, the value and what is
allowed. A CreateTopics that would hold more partitions open than the open-file limit
allows is refused with POLICY_VIOLATION before anything is written (store.py,
PartitionBudgetError).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.config import TopicConfig
from compactlog.errors import TopicExistsError
from compactlog.server.broker import Broker
from compactlog.server.handlers.configs import config_entries
from compactlog.server.handlers.metadata import TopicIds
from compactlog.server.protocol.error_codes import error_code, error_message
from compactlog.server.protocol.messages import Request
from compactlog.server.security import access
from compactlog.server.security.acl_model import Operation
from compactlog.server.security.code_allowlist import check_configs
from compactlog.storage import PartitionBudgetError

CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 19, 20, 37
log = logging.getLogger("compactlog.server")


def register(broker: Broker) -> None:
    broker.register(CREATE_TOPICS, (2, 7), create_topics)
    broker.register(DELETE_TOPICS, (1, 6), delete_topics)
    broker.register(CREATE_PARTITIONS, (0, 3), create_partitions)


async def create_topics(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    # Kafka: CREATE on the cluster, or else on each topic.
    on_cluster = access.cluster(broker, request, Operation.CREATE)
    results = []
    for spec in body.topics:
        if not on_cluster and not access.topic(broker, request, Operation.CREATE, spec.name):
            results.append({"name": spec.name, "topic_id": uuid.UUID(int=0),
                            "error_code": access.TOPIC_DENIED,
                            "error_message": access.TOPIC_MESSAGE, "num_partitions": -1,
                            "replication_factor": -1})
            continue
        result = await broker.run_io(_create_one, broker, spec, body.validate_only)
        if not access.topic(broker, request, Operation.DESCRIBE_CONFIGS, spec.name):
            # Kafka: the topic is made, its configs are not shown (v5+ say why).
            result = {**result, "configs": [], "topic_config_error_code": access.TOPIC_DENIED}
        results.append(result)
    return {"topics": results}


def _create_one(broker: Broker, spec: Any, validate_only: bool) -> dict[str, Any]:
    partitions = spec.num_partitions if spec.num_partitions != -1 else 1
    answer: dict[str, Any] = {"name": spec.name, "topic_id": uuid.UUID(int=0),
                              "num_partitions": partitions, "replication_factor": 1}
    try:
        # Before any other check: a strategy naming code the server does not allow.
        check_configs({entry.name: entry.value for entry in spec.configs},
                      broker.allowed_functions)
        if spec.replication_factor not in (-1, 1):
            return {**answer, "error_code": ErrorCode.invalid_replication_factor,
                    "error_message": "compactlog runs a single broker: replication factor "
                                     f"must be 1 (or -1 for the default), got "
                                     f"{spec.replication_factor}"}
        if spec.assignments:
            return {**answer, "error_code": ErrorCode.invalid_request,
                    "error_message": "manual replica assignments are not supported"}
        configs = {entry.name: entry.value for entry in spec.configs}
        if validate_only:
            config = TopicConfig.from_strings(configs)
            if spec.name in broker.store.list_topics():
                raise TopicExistsError(spec.name)
            broker.store.check_partition_budget(partitions, creating=spec.name)
            return {**answer, "error_code": ErrorCode.none, "configs": config_entries(config)}
        topic = broker.store.create_topic(spec.name, partitions, configs)
        log.info("created topic %s with %d partitions, config %s", spec.name, partitions,
                 configs)
        return {**answer, "error_code": ErrorCode.none,
                "topic_id": uuid.UUID(hex=topic.meta.topic_id),
                "configs": config_entries(topic.config)}
    except PartitionBudgetError as error:
        # Refused before anything was written. Kafka's controller answers a request for
        # more partitions than it takes with POLICY_VIOLATION.
        return {**answer, "error_code": ErrorCode.policy_violation,
                "error_message": str(error)}
    except Exception as error:
        return {**answer, "error_code": error_code(error), "error_message": error_message(error)}


async def delete_topics(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    names: list[str | None] = list(getattr(body, "topic_names", ()) or ())
    entries = list(getattr(body, "topics", ()) or ())
    if any(entry.name is None for entry in entries):
        ids = TopicIds(broker)  # one map for the request's ids
        names += await broker.run_io(lambda: [entry.name if entry.name is not None
                                              else ids.name(entry.topic_id)
                                              for entry in entries])
    else:
        names += [entry.name for entry in entries]
    results: list[dict[str, Any]] = []
    for name in names:
        if name is None:
            results.append({"name": None, "error_code": ErrorCode.unknown_topic_id,
                            "error_message": "no topic has this id"})
            continue
        if not access.topic(broker, request, Operation.DELETE, name):
            results.append({"name": name, "error_code": access.TOPIC_DENIED,
                            "error_message": access.TOPIC_MESSAGE})
            continue
        try:
            await broker.run_io(broker.store.delete_topic, name)
            log.info("deleted topic %s", name)
            results.append({"name": name, "error_code": ErrorCode.none})
        except Exception as error:
            results.append({"name": name, "error_code": error_code(error),
                            "error_message": error_message(error)})
    return {"responses": results}


async def create_partitions(broker: Broker, request: Request) -> dict[str, Any]:
    """Kafka's checks and answers (ReplicationControlManager.createPartitions), except
    that an increase is refused: the store cannot add partitions to a topic yet."""
    # Counted once: a count per entry made a request of many names quadratic.
    named = Counter(spec.name for spec in request.body.topics)
    results = []
    for spec in request.body.topics:
        code: ErrorCode
        message: str | None
        if named[spec.name] > 1:
            code, message = ErrorCode.invalid_request, "Duplicate topic in request."
        elif not access.topic(broker, request, Operation.ALTER, spec.name):
            code, message = access.TOPIC_DENIED, access.TOPIC_MESSAGE
        else:
            code, message = await broker.run_io(_partition_increase, broker, spec)
        results.append({"name": spec.name, "error_code": code, "error_message": message})
    return {"results": results}


def _partition_increase(broker: Broker, spec: Any) -> tuple[ErrorCode, str | None]:
    try:
        current = broker.store.topic(spec.name).meta.partitions
    except Exception as error:
        return error_code(error), error_message(error)
    if spec.count == current:
        return ErrorCode.invalid_partitions, f"Topic already has {current} partition(s)."
    if spec.count < current:
        return ErrorCode.invalid_partitions, (
            f"The topic {spec.name} currently has {current} partition(s); {spec.count} "
            "would not be an increase.")
    added = spec.count - current
    if spec.assignments is not None and len(spec.assignments) != added:
        return ErrorCode.invalid_replica_assignment, (
            f"Attempted to add {added} additional partition(s), but only "
            f"{len(spec.assignments)} assignment(s) were specified.")
    # Adding partitions moves keys to other partitions (Kafka allows it all the same);
    # the store has no way to add them to an existing topic yet.
    return ErrorCode.invalid_partitions, (
        f"compactlog cannot add partitions to an existing topic: {spec.name} keeps its "
        f"{current} partition(s). Create a new topic with {spec.count} partitions and "
        "copy the records into it.")
