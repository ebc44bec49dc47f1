"""Every handler checks the operation Kafka's KafkaApis checks, and answers with Kafka's
authorization codes: Requests carrying a principal are handed to the broker's own
handlers (as the connection would after SASL or mutual TLS), on a broker whose
authorizer is on and whose ACLs the test sets. Also: the ACL APIs, super users, the
authorizer off (everything allowed, ACL APIs SECURITY_DISABLED), and the allow-list of
`function:` strategies, which holds with or without the authorizer and imports nothing.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode

from compactlog.server.broker import Broker
from compactlog.server.handlers import register_all
from compactlog.server.protocol.messages import Request, build
from compactlog.server.security.acl_model import (
    AclBinding,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from compactlog.server.security.authorizer import AuthorizationConfig
from compactlog.storage.records import ProducerRecord, encode_batch
from compactlog.storage.store import LogStore

ALICE, BOB, ADMIN = "User:alice", "User:bob", "User:admin"
TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
L, P = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY
TOPIC_DENIED = ErrorCode.topic_authorization_failed
GROUP_DENIED = ErrorCode.group_authorization_failed
CLUSTER_DENIED = ErrorCode.cluster_authorization_failed


def ms(value: int) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def make_broker(root: Path, enabled: bool = True,
                functions: frozenset[str] = frozenset()) -> Broker:
    store = LogStore.open(root / "data")
    for name in ("orders", "orders-eu", "secret"):
        if name not in store.list_topics():
            store.create_topic(name, 1, {"cleanup.policy": "delete"})
    broker = Broker(store, "127.0.0.1", 9092, initial_rebalance_delay_s=0.0,
                    authorization=AuthorizationConfig(enabled=enabled,
                                                      super_users=[ADMIN]),
                    allowed_functions=functions)
    register_all(broker)
    return broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    made = make_broker(tmp_path)
    yield made
    made.close()
    made.store.close()


def grant(broker: Broker, kind: ResourceType, name: str, op: Operation,
          principal: str = ALICE, permission: Permission = ALLOW,
          pattern: PatternType = L) -> None:
    broker.authorizer.create([AclBinding(kind, name, pattern, principal, "*", op,
                                         permission)])


def call(broker: Broker, api_key: int, version: int, fields: dict[str, Any],
         principal: str = ALICE) -> dict[str, Any]:
    body = build(load_request_schema(api_key, version), fields)
    request = Request(api_key, version, 1, "test", body, "127.0.0.1", principal)
    response = asyncio.run(broker.apis[api_key].handler(broker, request))
    assert response is not None
    return response


def batch() -> bytes:
    return bytes(encode_batch([ProducerRecord(b"k", b"v")], 0))


def produce(broker: Broker, topic: str, principal: str = ALICE) -> ErrorCode:
    answer = call(broker, 0, 9, {"acks": 1, "timeout": ms(5000), "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch()}]}]}, principal)
    code: ErrorCode = answer["responses"][0]["partition_responses"][0]["error_code"]
    return code


def fetch(broker: Broker, topic: str, principal: str = ALICE) -> ErrorCode:
    answer = call(broker, 1, 12, {"max_wait": ms(0), "min_bytes": 1, "max_bytes": 1 << 20,
                                  "replica_id": -1, "session_epoch": -1, "topics": [
                                      {"topic": topic, "partitions": [
                                          {"partition": 0, "fetch_offset": 0,
                                           "partition_max_bytes": 1 << 20,
                                           "current_leader_epoch": -1,
                                           "last_fetched_epoch": -1,
                                           "log_start_offset": -1}]}]}, principal)
    code: ErrorCode = answer["responses"][0]["partitions"][0]["error_code"]
    return code


def metadata(broker: Broker, topics: list[str] | None,
             principal: str = ALICE) -> dict[str | None, ErrorCode]:
    answer = call(broker, 3, 12, {"topics": None if topics is None else [
        {"name": t, "topic_id": None} for t in topics],
        "include_topic_authorized_operations": False}, principal)
    return {t["name"]: t["error_code"] for t in answer["topics"]}


# -- topics --------------------------------------------------------------------------

def test_produce_needs_write_and_fetch_needs_read(broker: Broker) -> None:
    assert produce(broker, "orders") is TOPIC_DENIED
    assert broker.store.topic("orders").partition(0).log_end_offset == 0  # nothing appended
    grant(broker, TOPIC, "orders", Operation.WRITE)
    assert produce(broker, "orders") is ErrorCode.none
    assert fetch(broker, "orders") is TOPIC_DENIED
    grant(broker, TOPIC, "orders", Operation.READ)
    assert fetch(broker, "orders") is ErrorCode.none
    assert fetch(broker, "orders", BOB) is TOPIC_DENIED
    assert fetch(broker, "orders", ADMIN) is ErrorCode.none  # a super user


def test_metadata_lists_only_describable_topics(broker: Broker) -> None:
    grant(broker, TOPIC, "orders", Operation.READ, pattern=P)  # READ implies DESCRIBE
    assert set(metadata(broker, None)) == {"orders", "orders-eu"}
    assert metadata(broker, ["orders", "secret", "missing", "orders-new"]) == {
        "orders": ErrorCode.none, "secret": TOPIC_DENIED, "missing": TOPIC_DENIED,
        # DESCRIBE allowed and no such topic: unknown, as in Kafka (no auto-creation).
        "orders-new": ErrorCode.unknown_topic_or_partition}
    assert set(metadata(broker, None, ADMIN)) == {"orders", "orders-eu", "secret"}
    answer = call(broker, 3, 12, {"topics": [{"name": "orders", "topic_id": None}],
                                  "include_topic_authorized_operations": True})
    bits = answer["topics"][0]["topic_authorized_operations"]
    assert bits == (1 << Operation.READ) | (1 << Operation.DESCRIBE)


def test_prefixed_acls_and_deny_over_allow(broker: Broker) -> None:
    grant(broker, TOPIC, "orders", Operation.ALL, pattern=P)
    grant(broker, TOPIC, "orders-eu", Operation.READ, permission=DENY)
    assert fetch(broker, "orders") is ErrorCode.none
    assert fetch(broker, "orders-eu") is TOPIC_DENIED
    assert produce(broker, "orders-eu") is ErrorCode.none  # only READ is denied


def test_list_offsets_delete_records_and_producers(broker: Broker) -> None:
    def list_offsets() -> ErrorCode:
        answer = call(broker, 2, 7, {"replica_id": -1, "topics": [
            {"name": "orders", "partitions": [{"partition_index": 0, "timestamp": -1,
                                               "current_leader_epoch": -1}]}]})
        code: ErrorCode = answer["topics"][0]["partitions"][0]["error_code"]
        return code

    def delete_records() -> ErrorCode:
        answer = call(broker, 21, 2, {"timeout": ms(1000), "topics": [
            {"name": "orders", "partitions": [{"partition_index": 0, "offset": 0}]}]})
        code: ErrorCode = answer["topics"][0]["partitions"][0]["error_code"]
        return code

    def producers() -> ErrorCode:
        answer = call(broker, 61, 0, {"topics": [{"name": "orders",
                                                  "partition_indexes": [0]}]})
        code: ErrorCode = answer["topics"][0]["partitions"][0]["error_code"]
        return code

    assert (list_offsets(), delete_records(), producers()) == (TOPIC_DENIED,) * 3
    grant(broker, TOPIC, "orders", Operation.DESCRIBE)
    assert (list_offsets(), delete_records(), producers()) == (
        ErrorCode.none, TOPIC_DENIED, TOPIC_DENIED)
    grant(broker, TOPIC, "orders", Operation.DELETE)
    grant(broker, TOPIC, "orders", Operation.READ)
    assert (delete_records(), producers()) == (ErrorCode.none, ErrorCode.none)


def test_create_delete_and_alter_topics(broker: Broker) -> None:
    def create(name: str) -> ErrorCode:
        answer = call(broker, 19, 7, {"timeout": ms(5000), "validate_only": False, "topics": [
            {"name": name, "num_partitions": 1, "replication_factor": 1,
             "assignments": [], "configs": []}]})
        code: ErrorCode = answer["topics"][0]["error_code"]
        return code

    def delete(name: str) -> ErrorCode:
        answer = call(broker, 20, 6, {"timeout": ms(5000), "topics": [
            {"name": name, "topic_id": None}]})
        code: ErrorCode = answer["responses"][0]["error_code"]
        return code

    def partitions(name: str) -> ErrorCode:
        answer = call(broker, 37, 3, {"timeout": ms(5000), "validate_only": True, "topics": [
            {"name": name, "count": 2, "assignments": None}]})
        code: ErrorCode = answer["results"][0]["error_code"]
        return code

    assert create("new-a") is TOPIC_DENIED
    grant(broker, TOPIC, "new-", Operation.CREATE, pattern=P)
    assert create("new-a") is ErrorCode.none
    assert create("other") is TOPIC_DENIED
    grant(broker, CLUSTER, "kafka-cluster", Operation.CREATE)
    assert create("other") is ErrorCode.none
    assert delete("other") is TOPIC_DENIED
    assert partitions("other") is TOPIC_DENIED
    grant(broker, TOPIC, "other", Operation.DELETE)
    grant(broker, TOPIC, "other", Operation.ALTER)
    assert partitions("other") is ErrorCode.invalid_partitions  # past authorization
    assert delete("other") is ErrorCode.none


def test_configs_need_describe_configs_and_alter_configs(broker: Broker) -> None:
    def describe(kind: int, name: str) -> ErrorCode:
        answer = call(broker, 32, 4, {"resources": [
            {"resource_type": kind, "resource_name": name, "configuration_keys": None}]})
        code: ErrorCode = answer["results"][0]["error_code"]
        return code

    def alter(api: int, name: str, value: str) -> ErrorCode:
        config = {"name": "retention.ms", "value": value, "config_operation": 0}
        answer = call(broker, api, 1, {"validate_only": False, "resources": [
            {"resource_type": 2, "resource_name": name, "configs": [config]}]})
        code: ErrorCode = answer["responses"][0]["error_code"]
        return code

    assert describe(2, "orders") is TOPIC_DENIED
    assert describe(4, "0") is CLUSTER_DENIED
    assert alter(33, "orders", "1000") is TOPIC_DENIED
    assert alter(44, "orders", "1000") is TOPIC_DENIED
    grant(broker, TOPIC, "orders", Operation.ALTER_CONFIGS)  # implies DESCRIBE_CONFIGS
    assert describe(2, "orders") is ErrorCode.none
    assert alter(33, "orders", "1000") is ErrorCode.none
    assert alter(44, "orders", "2000") is ErrorCode.none
    assert broker.store.topic("orders").config["retention.ms"] == 2000


def test_idempotent_producers_need_idempotent_write_or_some_write(broker: Broker) -> None:
    def init() -> ErrorCode:
        answer = call(broker, 22, 4, {"transactional_id": None, "transaction_timeout": ms(0),
                                      "producer_id": -1, "producer_epoch": -1})
        code: ErrorCode = answer["error_code"]
        return code

    assert init() is CLUSTER_DENIED
    grant(broker, TOPIC, "orders", Operation.WRITE, pattern=P)
    assert init() is ErrorCode.none
    broker.authorizer.delete([])  # no filter: nothing removed
    grant(broker, TOPIC, "orders", Operation.WRITE, permission=DENY, pattern=P)
    assert init() is CLUSTER_DENIED
    grant(broker, CLUSTER, "kafka-cluster", Operation.IDEMPOTENT_WRITE)
    assert init() is ErrorCode.none


# -- groups -----------------------------------------------------------------------------

def test_group_apis_need_read_on_the_group(broker: Broker) -> None:
    def find() -> ErrorCode:
        code: ErrorCode = call(broker, 10, 3, {"key": "g", "key_type": 0})["error_code"]
        return code

    def join() -> ErrorCode:
        code: ErrorCode = call(broker, 11, 5, {
            "group_id": "g", "session_timeout": ms(10000), "rebalance_timeout": ms(10000),
            "member_id": "", "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}]})["error_code"]
        return code

    def heartbeat() -> ErrorCode:
        code: ErrorCode = call(broker, 12, 4, {"group_id": "g", "generation_id": 1,
                                               "member_id": "m"})["error_code"]
        return code

    def commit() -> ErrorCode:
        answer = call(broker, 8, 8, {
            "group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
            "topics": [{"name": "orders", "partitions": [
                {"partition_index": 0, "committed_offset": 0, "committed_leader_epoch": -1,
                 "committed_metadata": ""}]}]})
        code: ErrorCode = answer["topics"][0]["partitions"][0]["error_code"]
        return code

    def offsets() -> ErrorCode:
        code: ErrorCode = call(broker, 9, 7, {"group_id": "g", "topics": None})["error_code"]
        return code

    assert (find(), join(), heartbeat(), commit(), offsets()) == (GROUP_DENIED,) * 5
    grant(broker, GROUP, "g", Operation.READ)
    assert find() is ErrorCode.none  # READ implies DESCRIBE
    assert heartbeat() is not GROUP_DENIED
    assert commit() is TOPIC_DENIED  # and READ on the topic
    grant(broker, TOPIC, "orders", Operation.READ)
    assert commit() is ErrorCode.none
    assert offsets() is ErrorCode.none


def test_group_admin_apis(broker: Broker) -> None:
    grant(broker, GROUP, "g", Operation.READ)
    grant(broker, TOPIC, "orders", Operation.READ)
    call(broker, 8, 8, {"group_id": "g", "generation_id_or_member_epoch": -1,
                        "member_id": "", "topics": [{"name": "orders", "partitions": [
                            {"partition_index": 0, "committed_offset": 0,
                             "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
    listed = call(broker, 16, 4, {"states_filter": []}, BOB)["groups"]
    assert listed == []
    assert [g["group_id"] for g in call(broker, 16, 4, {"states_filter": []})["groups"]] == [
        "g"]
    described = call(broker, 15, 5, {"groups": ["g"],
                                      "include_authorized_operations": False}, BOB)
    assert described["groups"][0]["error_code"] is GROUP_DENIED
    deleted = call(broker, 42, 2, {"groups_names": ["g"]})
    assert deleted["results"][0]["error_code"] is GROUP_DENIED
    grant(broker, GROUP, "g", Operation.DELETE)
    deleted = call(broker, 42, 2, {"groups_names": ["g"]})
    assert deleted["results"][0]["error_code"] is ErrorCode.none


# -- the cluster ----------------------------------------------------------------------

def test_cluster_apis_need_the_cluster(broker: Broker) -> None:
    assert call(broker, 35, 4, {"topics": None})["error_code"] is CLUSTER_DENIED
    assert call(broker, 46, 0, {"timeout": ms(1000), "topics": None})["error_code"] is (
        CLUSTER_DENIED)
    assert call(broker, 45, 0, {"timeout": ms(1000), "topics": []})["error_code"] is (
        CLUSTER_DENIED)
    assert call(broker, 43, 2, {"election_type": 0, "timeout": ms(1000),
                                "topic_partitions": None})["error_code"] is CLUSTER_DENIED
    grant(broker, CLUSTER, "kafka-cluster", Operation.DESCRIBE)
    assert call(broker, 35, 4, {"topics": None})["error_code"] is ErrorCode.none


def acl_creation(name: str, op: Operation, principal: str = BOB) -> dict[str, Any]:
    return {"resource_type": 2, "resource_name": name, "resource_pattern_type": 3,
            "principal": principal, "host": "*", "operation": int(op),
            "permission_type": 3}


def test_acl_apis(broker: Broker) -> None:
    creations = [acl_creation("orders", Operation.READ),
                 acl_creation("orders", Operation.WRITE, principal="bob")]
    refused = call(broker, 30, 3, {"creations": creations})
    assert [r["error_code"] for r in refused["results"]] == [CLUSTER_DENIED] * 2
    created = call(broker, 30, 3, {"creations": creations}, ADMIN)
    assert [r["error_code"] for r in created["results"]] == [
        ErrorCode.none, ErrorCode.invalid_request]
    assert "Could not parse principal" in created["results"][1]["error_message"]
    assert fetch(broker, "orders", BOB) is ErrorCode.none
    match = {"resource_type_filter": 2, "resource_name_filter": "orders",
             "pattern_type_filter": 2, "principal_filter": None, "host_filter": None,
             "operation": 1, "permission_type": 1}
    assert call(broker, 29, 3, match)["error_code"] is CLUSTER_DENIED
    described = call(broker, 29, 3, match, ADMIN)
    assert described["error_code"] is ErrorCode.none
    assert [(r["resource_name"], [a["principal"] for a in r["acls"]])
            for r in described["resources"]] == [("orders", [BOB])]
    grant(broker, CLUSTER, "kafka-cluster", Operation.ALTER)  # alice may now alter
    deleted = call(broker, 31, 3, {"filters": [match]})
    (result,) = deleted["filter_results"]
    assert [(a["resource_name"], a["principal"]) for a in result["matching_acls"]] == [
        ("orders", BOB)]
    assert fetch(broker, "orders", BOB) is TOPIC_DENIED
    unknown = dict(match, operation=0)
    assert call(broker, 29, 3, unknown, ADMIN)["error_code"] is ErrorCode.invalid_request


def test_with_the_authorizer_off_everything_is_allowed(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, enabled=False)
    try:
        grant(broker, TOPIC, "orders", Operation.ALL, principal="User:*", permission=DENY)
        assert produce(broker, "orders") is ErrorCode.none
        assert fetch(broker, "orders") is ErrorCode.none
        assert set(metadata(broker, None)) == {"orders", "orders-eu", "secret"}
        answer = call(broker, 30, 3, {"creations": [acl_creation("x", Operation.READ)]})
        assert answer["results"][0]["error_code"] is ErrorCode.security_disabled
    finally:
        broker.close()
        broker.store.close()


# -- function: strategies ---------------------------------------------------------------

@pytest.mark.parametrize("enabled", [False, True])
def test_function_strategies_need_the_servers_allow_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, enabled: bool) -> None:
    marker = tmp_path / "imported"
    module = "compactlog_sidefx_strategy"
    (tmp_path / f"{module}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "def keep(previous, current):\n    return False\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    broker = make_broker(tmp_path, enabled=enabled,
                         functions=frozenset({"user_strategies:keep_larger_value"}))
    try:
        strategy = f"function:{module}:keep"
        created = call(broker, 19, 7, {"timeout": ms(5000), "validate_only": False, "topics": [
            {"name": "fn", "num_partitions": 1, "replication_factor": 1, "assignments": [],
             "configs": [{"name": "compaction.strategy", "value": strategy}]}]}, ADMIN)
        (topic,) = created["topics"]
        assert topic["error_code"] is ErrorCode.invalid_config
        assert "compaction.allowed_strategy_functions" in topic["error_message"]
        assert "fn" not in broker.store.list_topics()
        for api, operation in ((33, None), (44, 0)):
            config: dict[str, Any] = {"name": "compaction.strategy", "value": strategy}
            if operation is not None:
                config["config_operation"] = operation
            answer = call(broker, api, 1, {"validate_only": False, "resources": [
                {"resource_type": 2, "resource_name": "orders", "configs": [config]}]},
                ADMIN)
            assert answer["responses"][0]["error_code"] is ErrorCode.invalid_config
            assert module in answer["responses"][0]["error_message"]
        assert broker.store.topic("orders").config["compaction.strategy"] == "latest"
        # Nothing named was imported.
        assert not marker.exists()
        assert module not in sys.modules
        # One the server lists is accepted.
        answer = call(broker, 44, 1, {"validate_only": False, "resources": [
            {"resource_type": 2, "resource_name": "orders", "configs": [
                {"name": "compaction.strategy", "config_operation": 0,
                 "value": "function:user_strategies:keep_larger_value"}]}]}, ADMIN)
        assert answer["responses"][0]["error_code"] is ErrorCode.none
    finally:
        broker.close()
        broker.store.close()


def test_scram_credential_apis_need_the_cluster(broker: Broker) -> None:
    upsert = {"deletions": [], "upsertions": [
        {"name": "carol", "mechanism": 2, "iterations": 8192, "salt": b"salt" * 4,
         "salted_password": b"p" * 64}]}
    refused = call(broker, 51, 0, upsert)
    assert refused["results"][0]["error_code"] is CLUSTER_DENIED
    assert call(broker, 50, 0, {"users": None})["error_code"] is CLUSTER_DENIED
    grant(broker, CLUSTER, "kafka-cluster", Operation.ALTER)  # implies DESCRIBE
    assert call(broker, 51, 0, upsert)["results"][0]["error_code"] is ErrorCode.none
    described = call(broker, 50, 0, {"users": None})
    assert [r["user"] for r in described["results"]] == ["carol"]


def test_authorized_operations_fields(broker: Broker) -> None:
    def cluster_bits() -> int:
        answer = call(broker, 60, 1, {"include_cluster_authorized_operations": True,
                                      "endpoint_type": 1})
        bits: int = answer["cluster_authorized_operations"]
        return bits

    assert cluster_bits() == 0  # no DESCRIBE on the cluster: none shown
    grant(broker, CLUSTER, "kafka-cluster", Operation.ALTER)  # implies DESCRIBE
    assert cluster_bits() == (1 << Operation.ALTER) | (1 << Operation.DESCRIBE)
    grant(broker, GROUP, "g", Operation.READ)
    described = call(broker, 15, 5, {"groups": ["g"], "include_authorized_operations": True})
    assert described["groups"][0]["authorized_operations"] == (
        (1 << Operation.READ) | (1 << Operation.DESCRIBE))
    # A topic created without DESCRIBE_CONFIGS on it: made, its configs not shown.
    grant(broker, TOPIC, "made", Operation.CREATE)
    answer = call(broker, 19, 7, {"timeout": ms(5000), "validate_only": False, "topics": [
        {"name": "made", "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": []}]})
    (made,) = answer["topics"]
    assert made["error_code"] is ErrorCode.none and made["configs"] == []
    assert made["topic_config_error_code"] is TOPIC_DENIED
    assert "made" in broker.store.list_topics()


def test_with_the_authorizer_off_every_operation_is_shown(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, enabled=False)
    try:
        answer = call(broker, 60, 1, {"include_cluster_authorized_operations": True,
                                      "endpoint_type": 1})
        assert answer["cluster_authorized_operations"] == sum(
            1 << op for op in (Operation.CREATE, Operation.CLUSTER_ACTION,
                               Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS,
                               Operation.IDEMPOTENT_WRITE, Operation.ALTER,
                               Operation.DESCRIBE))
    finally:
        broker.close()
        broker.store.close()


def test_bad_security_settings_stop_the_server_at_start(tmp_path: Path) -> None:
    from compactlog.errors import UserError
    from compactlog.server.cleaner import CleanerConfig
    from compactlog.server.server_config import ServerConfig

    config = ServerConfig(tmp_path)
    config.compaction = CleanerConfig(allowed_strategy_functions=["mod.only"])
    with pytest.raises(UserError, match=r"'mod\.only' is not MODULE:NAME"):
        config.check()
    config.compaction = CleanerConfig(allowed_strategy_functions=["mod.sub:fn"])
    config.authorization = AuthorizationConfig(super_users=["admin"])
    with pytest.raises(UserError, match="super_users"):
        config.check()
    config.authorization = AuthorizationConfig(super_users=["User:admin"])
    config.check()


def test_metadata_lists_exactly_what_the_rule_allows(tmp_path: Path) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from compactlog.server.security.acl_model import AclFilter, decide

    made = make_broker(tmp_path)
    names = ["orders", "orders-eu", "secret"]
    bindings = st.builds(
        AclBinding, st.just(TOPIC), st.sampled_from(["orders", "orders-", "o", "*", "secret"]),
        st.sampled_from([L, P]), st.sampled_from([ALICE, BOB, "User:*"]), st.just("*"),
        st.sampled_from([Operation.READ, Operation.DESCRIBE, Operation.WRITE,
                         Operation.ALL, Operation.CREATE]),
        st.sampled_from([ALLOW, DENY]))
    everything = AclFilter(ResourceType.ANY, None, PatternType.ANY, None, None,
                           Operation.ANY, Permission.ANY)

    @settings(max_examples=60, deadline=None)
    @given(acls=st.lists(bindings, max_size=6))
    def check(acls: list[AclBinding]) -> None:
        made.authorizer.delete([everything])
        made.authorizer.create(acls)
        expected = {n for n in names if decide(acls, ALICE, "127.0.0.1", Operation.DESCRIBE,
                                               TOPIC, n, frozenset(), False)}
        assert set(metadata(made, None)) == expected
        asked = metadata(made, names)
        assert {n for n, code in asked.items() if code is not TOPIC_DENIED} == expected

    try:
        check()
    finally:
        made.close()
        made.store.close()


def test_refusals_are_logged_and_listings_are_not(broker: Broker,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.INFO, logger="compactlog.authorizer")
    carol = "User:carol-logged"  # the throttle is per process: a principal of its own
    assert set(metadata(broker, None, carol)) == set()  # leaves topics out: no denial
    assert not [r for r in caplog.records if "Denied" in r.getMessage()]
    for _ in range(3):
        assert fetch(broker, "secret", carol) is TOPIC_DENIED
    lines = [r.getMessage() for r in caplog.records if "Denied" in r.getMessage()]
    # Once a minute per principal, host, operation and resource type.
    assert lines == ["Principal = User:carol-logged is Denied Operation = READ from host = "
                     "127.0.0.1 on resource = TOPIC:secret"]
