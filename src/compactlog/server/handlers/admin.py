"""CreateTopics, DeleteTopics, DescribeConfigs and IncrementalAlterConfigs.

Topic configs travel as strings under Kafka's names (cleanup.policy, segment.bytes,
delete.retention.ms, ...) plus compactlog's own keys; every value is checked by the
same declarations the CLI uses, and a bad one is refused with INVALID_CONFIG and a
message naming the key, the value and what is allowed.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.config import TOPIC_KEYS, TopicConfig
from compactlog.errors import TopicExistsError, UnknownTopicError, UserError
from compactlog.server.broker import Broker
from compactlog.server.errors import error_code, error_message
from compactlog.server.handlers.metadata import topic_name_by_id
from compactlog.server.protocol import Request
from compactlog.storage.store import Topic

CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 19, 20, 32, 44
TOPIC_RESOURCE = 2
# DescribeConfigs config_source values.
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5
# DescribeConfigs v3+ config_type values, by compactlog's declared types.
CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7}
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
log = logging.getLogger("compactlog.server")


def register(broker: Broker) -> None:
    broker.register(CREATE_TOPICS, (2, 7), create_topics)
    broker.register(DELETE_TOPICS, (1, 6), delete_topics)
    broker.register(DESCRIBE_CONFIGS, (1, 4), describe_configs)
    broker.register(INCREMENTAL_ALTER_CONFIGS, (0, 1), incremental_alter_configs)


def config_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _config_entries(config: TopicConfig) -> list[dict[str, Any]]:
    effective = config.effective()
    return [{"name": key.name, "value": config_text(effective[key.name]), "read_only": False,
             "config_source": (DYNAMIC_TOPIC_CONFIG if key.name in config.overrides
                               else DEFAULT_CONFIG),
             "is_sensitive": False}
            for key in TOPIC_KEYS]


async def create_topics(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    results = []
    for spec in body.topics:
        results.append(await broker.run_io(_create_one, broker, spec, body.validate_only))
    return {"topics": results}


def _create_one(broker: Broker, spec: Any, validate_only: bool) -> dict[str, Any]:
    partitions = spec.num_partitions if spec.num_partitions != -1 else 1
    answer: dict[str, Any] = {"name": spec.name, "topic_id": uuid.UUID(int=0),
                              "num_partitions": partitions, "replication_factor": 1}
    try:
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
            return {**answer, "error_code": ErrorCode.none, "configs": _config_entries(config)}
        topic = broker.store.create_topic(spec.name, partitions, configs)
        log.info("created topic %s with %d partitions, config %s", spec.name, partitions,
                 configs)
        return {**answer, "error_code": ErrorCode.none,
                "topic_id": uuid.UUID(hex=topic.meta.topic_id),
                "configs": _config_entries(topic.config)}
    except Exception as error:
        return {**answer, "error_code": error_code(error), "error_message": error_message(error)}


async def delete_topics(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    names: list[str | None] = list(getattr(body, "topic_names", ()) or ())
    for entry in getattr(body, "topics", ()) or ():
        names.append(entry.name if entry.name is not None
                     else await broker.run_io(topic_name_by_id, broker, entry.topic_id))
    results: list[dict[str, Any]] = []
    for name in names:
        if name is None:
            results.append({"name": None, "error_code": ErrorCode.unknown_topic_id,
                            "error_message": "no topic has this id"})
            continue
        try:
            await broker.run_io(broker.store.delete_topic, name)
            log.info("deleted topic %s", name)
            results.append({"name": name, "error_code": ErrorCode.none})
        except Exception as error:
            results.append({"name": name, "error_code": error_code(error),
                            "error_message": error_message(error)})
    return {"responses": results}


async def describe_configs(broker: Broker, request: Request) -> dict[str, Any]:
    return await broker.run_io(_describe_configs, broker, request)


def _describe_configs(broker: Broker, request: Request) -> dict[str, Any]:
    results = []
    for resource in request.body.resources:
        answer = {"resource_type": resource.resource_type,
                  "resource_name": resource.resource_name}
        if resource.resource_type != TOPIC_RESOURCE:
            results.append({**answer, "error_code": ErrorCode.invalid_request,
                            "error_message": "only topic configs are described", "configs": []})
            continue
        try:
            topic: Topic = broker.store.topic(resource.resource_name)
        except UnknownTopicError as error:
            results.append({**answer, "error_code": error_code(error),
                            "error_message": str(error), "configs": []})
            continue
        keys = resource.configuration_keys
        entries = [
            {**entry, "synonyms": [],
             "config_type": CONFIG_TYPES.get(_key_type(entry["name"]), 0),
             "documentation": _doc(entry["name"])}
            for entry in _config_entries(topic.config)
            if keys is None or entry["name"] in keys
        ]
        results.append({**answer, "error_code": ErrorCode.none, "configs": entries})
    return {"results": results}


def _key_type(name: str) -> str:
    return next(key.type for key in TOPIC_KEYS if key.name == name)


def _doc(name: str) -> str:
    return next(key.doc for key in TOPIC_KEYS if key.name == name)


async def incremental_alter_configs(broker: Broker, request: Request) -> dict[str, Any]:
    body = request.body
    results = []
    for resource in body.resources:
        answer = {"resource_type": resource.resource_type,
                  "resource_name": resource.resource_name}
        try:
            if resource.resource_type != TOPIC_RESOURCE:
                raise UserError("only topic configs can be altered")
            await broker.run_io(_alter_one, broker, resource, body.validate_only)
            results.append({**answer, "error_code": ErrorCode.none})
        except Exception as error:
            results.append({**answer, "error_code": error_code(error),
                            "error_message": error_message(error)})
    return {"responses": results}


def _alter_one(broker: Broker, resource: Any, validate_only: bool) -> None:
    topic = broker.store.topic(resource.resource_name)
    set_values: dict[str, str] = {}
    deleted: list[str] = []
    current = topic.config.effective()
    for change in resource.configs:
        if change.config_operation == SET:
            set_values[change.name] = change.value or ""
        elif change.config_operation == DELETE:
            deleted.append(change.name)
        elif change.config_operation in (APPEND, SUBTRACT):
            # Only list-typed keys take APPEND/SUBTRACT (cleanup.policy is one).
            items = [i for i in config_text(current.get(change.name, "")).split(",") if i]
            value = change.value or ""
            if change.config_operation == APPEND and value not in items:
                items.append(value)
            elif change.config_operation == SUBTRACT:
                items = [i for i in items if i != value]
            set_values[change.name] = ",".join(items)
        else:
            raise UserError(f"unknown config operation {change.config_operation}")
    if validate_only:
        topic.config.altered(set_values, deleted)
        return
    broker.store.alter_topic(resource.resource_name, set_values, deleted)
