"""AlterConfigs and IncrementalAlterConfigs on the wire, every served version, against a
real server: AlterConfigs replaces a topic's whole config (keys it does not name go
back to their defaults), IncrementalAlterConfigs changes only what it names; bad
requests get Kafka's per-resource errors, and a refused change commits nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from compactlog.storage.store import LogStore
from support.admin_wire import (
    ALTER_CONFIGS,
    BROKER,
    INCREMENTAL_ALTER_CONFIGS,
    TOPIC,
    overrides,
    serve,
)
from support.kafka_server import LoggedServer
from support.wire import Wire

ALTER_VERSIONS = [0, 1, 2]
INCREMENTAL_VERSIONS = [0, 1]
START = {"retention.ms": "100000", "segment.bytes": "65536"}
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def prepare(store: LogStore) -> None:
    for version in ALTER_VERSIONS:
        for use in ("replace", "errors"):
            store.create_topic(f"{use}{version}", 1, START)
    for version in INCREMENTAL_VERSIONS:
        store.create_topic(f"incremental{version}", 1, START)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoggedServer]:
    with serve(tmp_path_factory.mktemp("configs"), prepare) as running:
        yield running


def resource(name: str, configs: dict[str, str | None],
             resource_type: int = TOPIC) -> dict[str, Any]:
    return {"resource_type": resource_type, "resource_name": name,
            "configs": [{"name": key, "value": value} for key, value in configs.items()]}


def alter(wire: Wire, version: int, resources: list[dict[str, Any]],
          validate_only: bool = False) -> list[tuple[str, ErrorCode, str | None]]:
    body = wire.call(ALTER_CONFIGS, version, {"resources": resources,
                                              "validate_only": validate_only})
    return [(r.resource_name, r.error_code, r.error_message) for r in body.responses]


@pytest.mark.parametrize("version", ALTER_VERSIONS)
def test_alter_configs_replaces_the_whole_topic_config(server: LoggedServer,
                                                       version: int) -> None:
    name = f"replace{version}"
    new = {"retention.ms": "5000", "cleanup.policy": "compact,delete"}
    with Wire(server.address) as wire:
        assert overrides(wire, name) == START
        # validate_only checks and changes nothing.
        assert alter(wire, version, [resource(name, new)], validate_only=True) == [
            (name, ErrorCode.none, None)]
        assert overrides(wire, name) == START
        assert alter(wire, version, [resource(name, new)]) == [(name, ErrorCode.none, None)]
        # segment.bytes was not named: back to its default, as in Kafka.
        assert overrides(wire, name) == new
        assert alter(wire, version, [resource(name, {})]) == [(name, ErrorCode.none, None)]
        assert overrides(wire, name) == {}


@pytest.mark.parametrize("version", ALTER_VERSIONS)
def test_alter_configs_answers_each_resource_as_kafka_does(server: LoggedServer,
                                                           version: int) -> None:
    name = f"errors{version}"
    with Wire(server.address) as wire:
        (bad_value,) = alter(wire, version, [resource(name, {"retention.ms": "soon"})])
        (null,) = alter(wire, version, [resource(name, {"retention.ms": None})])
        answers = alter(wire, version, [
            resource("missing", {"retention.ms": "5"}),
            resource("dup", {"retention.ms": "5"}),
            resource("dup", {"retention.ms": "6"}),
            resource("", {"log.retention.ms": "5"}, BROKER),
            resource("0", {}, BROKER),
            resource("3", {}, BROKER),
            resource("x", {}, BROKER),
            resource("root", {"level": "DEBUG"}, 8),  # BROKER_LOGGER
        ])
        missing, dup1, dup2, broker, broker0, other, not_a_node, logger = answers
        assert bad_value[1] is ErrorCode.invalid_config
        assert "'retention.ms'" in bad_value[2] and "must be a long" in bad_value[2]
        assert missing[1] is ErrorCode.unknown_topic_or_partition
        assert null[1:] == (ErrorCode.invalid_request,
                            "Null value not supported for : retention.ms")
        assert dup1[1:] == dup2[1:] == (ErrorCode.invalid_request,
                                        "Each resource must appear at most once.")
        assert broker[1] is ErrorCode.invalid_request
        assert "Cannot update these configs dynamically: log.retention.ms" in broker[2]
        assert broker0 == ("0", ErrorCode.none, None)
        assert other[1:] == (ErrorCode.invalid_request,
                             "Unexpected broker id, expected 0, but received 3")
        assert not_a_node[1:] == (ErrorCode.invalid_request,
                                  "Node id must be an integer, but it is: x")
        assert logger[1] is ErrorCode.invalid_request
        # An unknown key names the keys there are; a key twice is refused.
        ((_, code, message),) = alter(wire, version, [resource(name, {"retention.msx": "1"})])
        assert code is ErrorCode.invalid_config and "known keys:" in message
        assert "retention.ms," in message and "cleanup.policy" in message
        twice = {"resources": [{"resource_type": TOPIC, "resource_name": name, "configs": [
            {"name": "retention.ms", "value": "1"}, {"name": "retention.ms", "value": "2"}]}],
            "validate_only": False}
        body = wire.call(ALTER_CONFIGS, version, twice)
        assert [(r.error_code, r.error_message) for r in body.responses] == [
            (ErrorCode.invalid_request, "Error due to duplicate config keys")]
        # Nothing refused was committed; a good resource beside a bad one is.
        assert overrides(wire, name) == START
        assert alter(wire, version, [resource("missing", {}),
                                     resource(name, {"retention.ms": "7"})])[1] == (
            name, ErrorCode.none, None)
        assert overrides(wire, name) == {"retention.ms": "7"}
        assert wire.call(ALTER_CONFIGS, version, {"resources": [],
                                                  "validate_only": False}).responses == ()


def incremental(wire: Wire, version: int, name: str,
                changes: list[tuple[str, int, str | None]], resource_type: int = TOPIC,
                validate_only: bool = False) -> tuple[ErrorCode, str | None]:
    body = wire.call(INCREMENTAL_ALTER_CONFIGS, version, {"resources": [
        {"resource_type": resource_type, "resource_name": name, "configs": [
            {"name": key, "config_operation": op, "value": value}
            for key, op, value in changes]}], "validate_only": validate_only})
    ((answer),) = body.responses
    return answer.error_code, answer.error_message


@pytest.mark.parametrize("version", INCREMENTAL_VERSIONS)
def test_incremental_alter_configs_changes_only_what_it_names(server: LoggedServer,
                                                              version: int) -> None:
    name = f"incremental{version}"
    with Wire(server.address) as wire:
        assert incremental(wire, version, name, [("retention.ms", SET, "5000")]) == (
            ErrorCode.none, None)
        assert overrides(wire, name) == {**START, "retention.ms": "5000"}
        assert incremental(wire, version, name, [("cleanup.policy", APPEND, "compact")],
                           validate_only=True) == (ErrorCode.none, None)
        assert "cleanup.policy" not in overrides(wire, name)
        assert incremental(wire, version, name, [("cleanup.policy", APPEND, "compact")]) == (
            ErrorCode.none, None)
        assert overrides(wire, name)["cleanup.policy"] == "compact,delete"
        assert incremental(wire, version, name, [("cleanup.policy", SUBTRACT, "delete"),
                                                 ("segment.bytes", DELETE, None)]) == (
            ErrorCode.none, None)
        assert overrides(wire, name) == {"retention.ms": "5000", "cleanup.policy": "compact"}
        # Refused as Kafka refuses them, and nothing of a refused request is committed.
        code, message = incremental(wire, version, name, [
            ("retention.ms", SET, "1"), ("segment.bytes", APPEND, "1")])
        assert code is ErrorCode.invalid_config and "only list keys" in (message or "")
        assert incremental(wire, version, name, [("retention.ms", SET, "1"),
                                                 ("retention.ms", DELETE, None)]) == (
            ErrorCode.invalid_request, "Error due to duplicate config keys")
        assert incremental(wire, version, name, [("retention.ms", 9, "1")])[0] is (
            ErrorCode.invalid_request)
        code, message = incremental(wire, version, "0", [("log.retention.ms", SET, "1")],
                                    BROKER)
        assert code is ErrorCode.invalid_request
        assert "Cannot update these configs dynamically" in (message or "")
        assert overrides(wire, name) == {"retention.ms": "5000", "cleanup.policy": "compact"}


def test_config_changes_are_in_the_store_after_the_server_stops(tmp_path: Path) -> None:
    def one_topic(store: LogStore) -> None:
        store.create_topic("kept", 1, START)

    with serve(tmp_path, one_topic) as server, Wire(server.address) as wire:
        assert alter(wire, 2, [resource("kept", {"retention.ms": "42"})])[0][1] is (
            ErrorCode.none)
    with LogStore.open(tmp_path / "data", read_only=True) as store:
        assert dict(store.topic("kept").config.overrides) == {"retention.ms": 42}
