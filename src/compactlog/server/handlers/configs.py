"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs: topic configs by Kafka's names.

Invariant: every config change goes through `_change_topic`, which computes the topic's
new overrides from its current ones, validates the whole result with the declarations
the CLI uses (config.py) and commits it with `LogStore.alter_topic`, under one lock: a
change is all or nothing, and two requests never interleave a read-modify-write. A bad
value is refused with INVALID_CONFIG and a message naming the key, the value and what
is allowed.

The two alter APIs differ as in Kafka (ConfigAdminManager): AlterConfigs replaces a
resource's dynamic config, so keys it does not name go back to their defaults;
IncrementalAlterConfigs changes only the keys it names (SET, DELETE, APPEND, SUBTRACT).
Broker settings are static here (the server's config file), so a BROKER resource may
be named but nothing in it can be changed: INVALID_REQUEST, as Kafka answers a broker
config that is not dynamically updatable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

from kio.schema.errors import ErrorCode

from compactlog.config import TOPIC_KEYS, TopicConfig, lookup
from compactlog.errors import InvalidConfigError, UnknownTopicError, UserError
from compactlog.server.broker import Broker
from compactlog.server.protocol.error_codes import error_code, error_message
from compactlog.server.protocol.messages import Request
from compactlog.server.security import access
from compactlog.server.security.acl_model import Operation
from compactlog.server.security.code_allowlist import check_configs
from compactlog.storage import Topic

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
# Kafka's ConfigResource.Type ids.
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
# DescribeConfigs config_source values.
DYNAMIC_TOPIC_CONFIG, DEFAULT_CONFIG = 1, 5
# DescribeConfigs v3+ config_type values, by compactlog's declared types.
CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "long": 5, "double": 6, "list": 7}
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

# Serializes config changes of this process (there is one broker per data directory),
# so that AlterConfigs' "every other key back to its default" and APPEND/SUBTRACT read
# the config they replace.
_CHANGES = threading.Lock()

# From the current config, the keys to set and the keys to drop back to their defaults.
Change = Callable[[TopicConfig], tuple[dict[str, str], list[str]]]


def register(broker: Broker) -> None:
    broker.register(DESCRIBE_CONFIGS, (1, 4), describe_configs)
    broker.register(ALTER_CONFIGS, (0, 2), alter_configs)
    broker.register(INCREMENTAL_ALTER_CONFIGS, (0, 1), incremental_alter_configs)


def config_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_entries(config: TopicConfig) -> list[dict[str, Any]]:
    """Every topic key with its effective value, as DescribeConfigs and CreateTopics
    answer them."""
    effective = config.effective()
    return [{"name": key.name, "value": config_text(effective[key.name]), "read_only": False,
             "config_source": (DYNAMIC_TOPIC_CONFIG if key.name in config.overrides
                               else DEFAULT_CONFIG),
             "is_sensitive": False}
            for key in TOPIC_KEYS]


# -- DescribeConfigs --------------------------------------------------------------------

async def describe_configs(broker: Broker, request: Request) -> dict[str, Any]:
    return await broker.run_io(_describe_configs, broker, request)


def _describe_configs(broker: Broker, request: Request) -> dict[str, Any]:
    results = []
    for resource in request.body.resources:
        answer = {"resource_type": resource.resource_type,
                  "resource_name": resource.resource_name}
        denied = _denied(broker, request, resource, Operation.DESCRIBE_CONFIGS)
        if denied is not None:
            results.append({**answer, **denied, "configs": []})
            continue
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
             "config_type": CONFIG_TYPES.get(lookup(entry["name"]).type, 0),
             "documentation": lookup(entry["name"]).doc}
            for entry in config_entries(topic.config)
            if keys is None or entry["name"] in keys
        ]
        results.append({**answer, "error_code": ErrorCode.none, "configs": entries})
    return {"results": results}


# -- AlterConfigs and IncrementalAlterConfigs -------------------------------------------

async def alter_configs(broker: Broker, request: Request) -> dict[str, Any]:
    return await _alter(broker, request, _replacement)


async def incremental_alter_configs(broker: Broker, request: Request) -> dict[str, Any]:
    return await _alter(broker, request, _increments)


async def _alter(broker: Broker, request: Request,
                 change_of: Callable[[Any], Change]) -> dict[str, Any]:
    body = request.body
    repeated = _repeated((r.resource_type, r.resource_name) for r in body.resources)
    results = []
    for resource in body.resources:
        answer = {"resource_type": resource.resource_type,
                  "resource_name": resource.resource_name}
        denied = _denied(broker, request, resource, Operation.ALTER_CONFIGS)
        if denied is not None:
            results.append({**answer, **denied})
            continue
        try:
            if (resource.resource_type, resource.resource_name) in repeated:
                # Kafka's wording (ConfigAdminManager.preprocess); both copies are refused.
                raise UserError("Each resource must appear at most once.")
            _check_keys_once(c.name for c in resource.configs)
            if resource.resource_type == BROKER_RESOURCE:
                _check_broker(broker, resource)
            elif resource.resource_type != TOPIC_RESOURCE:
                raise UserError(f"resource type {resource.resource_type} has no configs "
                                "here: only topic configs can be altered")
            else:
                # A function: strategy the server does not list: nothing imported.
                check_configs({c.name: c.value for c in resource.configs
                               if getattr(c, "config_operation", SET) in (SET, APPEND)},
                              broker.allowed_functions)
                await broker.run_io(_change_topic, broker, resource.resource_name,
                                    change_of(resource), body.validate_only)
            results.append({**answer, "error_code": ErrorCode.none})
        except Exception as error:
            results.append({**answer, "error_code": error_code(error),
                            "error_message": error_message(error)})
    return {"responses": results}


def _denied(broker: Broker, request: Request, resource: Any,
            operation: Operation) -> dict[str, Any] | None:
    """Kafka's check of a config resource: the operation on the topic, or on the cluster
    for a BROKER resource; None when allowed (other types are refused later)."""
    if resource.resource_type == TOPIC_RESOURCE:
        if not access.topic(broker, request, operation, resource.resource_name):
            return {"error_code": access.TOPIC_DENIED, "error_message": access.TOPIC_MESSAGE}
    elif resource.resource_type == BROKER_RESOURCE and not access.cluster(
            broker, request, operation):
        return {"error_code": access.CLUSTER_DENIED, "error_message": access.CLUSTER_MESSAGE}
    return None


def _repeated(keys: Iterable[tuple[int, str]]) -> set[tuple[int, str]]:
    seen: set[tuple[int, str]] = set()
    repeated: set[tuple[int, str]] = set()
    for key in keys:
        (repeated if key in seen else seen).add(key)
    return repeated


def _check_keys_once(names: Iterable[str]) -> None:
    listed = list(names)
    if len(set(listed)) != len(listed):
        raise UserError("Error due to duplicate config keys")  # Kafka's wording


def _check_broker(broker: Broker, resource: Any) -> None:
    """As Kafka's ConfigAdminManager: the name is empty (the cluster default) or this
    node's id; then every key fails as not dynamically updatable (INVALID_REQUEST,
    Kafka's DynamicBrokerConfig.validate), since no broker setting is."""
    name = resource.resource_name
    if name:
        try:
            node = int(name)
        except ValueError:
            raise UserError(f"Node id must be an integer, but it is: {name}") from None
        if node != broker.node_id:
            raise UserError(f"Unexpected broker id, expected {broker.node_id}, but "
                            f"received {name}")
    names = sorted({c.name for c in resource.configs})
    if names:
        raise UserError(f"Cannot update these configs dynamically: {', '.join(names)} "
                        "(compactlog's broker settings are read from its config file at "
                        "start; topic settings are altered on TOPIC resources)")


def _replacement(resource: Any) -> Change:
    """AlterConfigs: the request's keys are the topic's whole dynamic config."""
    nulls = [c.name for c in resource.configs if c.value is None]
    if nulls:
        raise UserError("Null value not supported for : " + ", ".join(nulls))  # Kafka's
    values: dict[str, str] = {c.name: c.value for c in resource.configs}
    return lambda current: (values, [k for k in current.overrides if k not in values])


def _increments(resource: Any) -> Change:
    """IncrementalAlterConfigs: each operation on its key, the others unchanged."""
    changes = [(c.name, c.config_operation, c.value) for c in resource.configs]
    for name, operation, _ in changes:
        if operation not in (SET, DELETE, APPEND, SUBTRACT):
            raise UserError(f"unknown config operation {operation} for {name!r}")
        if operation in (APPEND, SUBTRACT) and lookup(name).type != "list":
            # As Kafka (ConfigAdminManager.prepareIncrementalConfigs): only list-typed
            # keys take APPEND and SUBTRACT.
            raise InvalidConfigError(name, "APPEND" if operation == APPEND else "SUBTRACT",
                                     f"only list keys take APPEND and SUBTRACT; {name} is "
                                     f"a {lookup(name).type}")

    def apply(current: TopicConfig) -> tuple[dict[str, str], list[str]]:
        effective = current.effective()
        set_values: dict[str, str] = {}
        deleted: list[str] = []
        for name, operation, value in changes:
            if operation == SET:
                set_values[name] = value or ""
            elif operation == DELETE:
                deleted.append(name)
            else:
                items = [i for i in config_text(effective[name]).split(",") if i]
                if operation == APPEND and (value or "") not in items:
                    items.append(value or "")
                elif operation == SUBTRACT:
                    items = [i for i in items if i != value]
                set_values[name] = ",".join(items)
        return set_values, deleted

    return apply


def _change_topic(broker: Broker, name: str, change: Change, validate_only: bool) -> None:
    with _CHANGES:
        topic = broker.store.topic(name)
        set_values, deleted = change(topic.config)
        # Validates every key and value first: a refused change commits nothing.
        topic.config.altered(set_values, deleted)
        if not validate_only:
            broker.store.alter_topic(name, set_values, deleted)
