"""ACLs against a real `compactlog serve` with the authorizer on, through real clients.

No SASL yet, so every Kafka client here is User:ANONYMOUS: the data directory is
seeded (before the server starts) with ACLs that let ANONYMOUS administer ACLs (ALTER
and DESCRIBE on the cluster), and the tests grant and deny ANONYMOUS the rest with the
admin APIs of confluent-kafka and kafka-python. Shown: creating, describing (MATCH and
ANY filters) and deleting ACLs with both clients; TOPIC_AUTHORIZATION_FAILED on Fetch
and the topic missing from Metadata; GROUP_AUTHORIZATION_FAILED on a commit;
TOPIC_AUTHORIZATION_FAILED on an alteration of compaction.strategy without
ALTER_CONFIGS, and INVALID_CONFIG for a function: strategy the server does not list;
prefixed ACLs and DENY over ALLOW. And the admin HTTP API's bearer tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaAdminClient, KafkaConsumer, OffsetAndMetadata
from kafka import TopicPartition as KpTopicPartition
from kafka import errors as kp_errors
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KpResourceType

from compactlog.server.security.acl_model import AclBinding as Binding
from compactlog.server.security.acl_model import Operation, PatternType, Permission
from compactlog.server.security.acl_model import ResourceType as Kind
from compactlog.server.security.authorizer import AuthorizationConfig, Authorizer
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.kafka_server import COMPACTLOG, LoggedServer, logged_server
from support.paths import TESTS_DIR

ANON = "User:ANONYMOUS"
TOPICS = ("orders", "orders-eu", "secret")


def seed(data: Path) -> None:
    with LogStore.open(data) as store:
        for name in TOPICS:
            store.create_topic(name, 1, {"cleanup.policy": "delete"})
            store.append(name, [ProducerRecord(b"k", name.encode())], partition=0)
        store.create_topic("table", 1, {"cleanup.policy": "compact"})
    Authorizer(data, AuthorizationConfig(enabled=True)).create([
        Binding(Kind.CLUSTER, "kafka-cluster", PatternType.LITERAL, ANON, "*", op,
                Permission.ALLOW) for op in (Operation.ALTER, Operation.DESCRIBE)])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[LoggedServer]:
    data = tmp_path / "data"
    seed(data)
    config = tmp_path / "server.toml"
    config.write_text("group_initial_rebalance_delay_s = 0.1\n"
                      "[authorization]\nenabled = true\n")
    with logged_server(data, tmp_path / "server.log", "--config", str(config)) as running:
        yield running


def ck_admin(server: LoggedServer) -> AdminClient:
    return AdminClient({"bootstrap.servers": server.bootstrap})


def ck_acl(name: str, op: AclOperation, permission: AclPermissionType = AclPermissionType.ALLOW,
           pattern: ResourcePatternType = ResourcePatternType.LITERAL,
           kind: ResourceType = ResourceType.TOPIC) -> AclBinding:
    return AclBinding(kind, name, pattern, ANON, "*", op, permission)


def ck_create(admin: AdminClient, *bindings: AclBinding) -> None:
    for future in admin.create_acls(list(bindings)).values():
        future.result(timeout=30)


def ck_match(name: str | None = None) -> AclBindingFilter:
    return AclBindingFilter(ResourceType.ANY, name, ResourcePatternType.MATCH if name
                            else ResourcePatternType.ANY, None, None, AclOperation.ANY,
                            AclPermissionType.ANY)


def ck_fetch_error(server: LoggedServer, topic: str) -> KafkaError | None:
    """The first error a consumer assigned to `topic` gets, or None once it reads a
    record (librdkafka reports authorization failures as consumer errors)."""
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is None:
                return None
            error: KafkaError = message.error()
            if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                continue  # its coordinator lookup: the group is not what is tested here
            return error
        raise AssertionError(f"no record and no error from {topic} in 30 s")
    finally:
        consumer.close()


def test_confluent_kafka_acls_fetch_metadata_prefixes_and_deny(server: LoggedServer) -> None:
    admin = ck_admin(server)
    # Before any grant: ANONYMOUS sees no topic and may read none.
    assert set(admin.list_topics(timeout=30).topics) == set()
    ck_create(admin,
              ck_acl("orders", AclOperation.READ, pattern=ResourcePatternType.PREFIXED),
              ck_acl("orders-eu", AclOperation.READ, AclPermissionType.DENY))
    described = admin.describe_acls(ck_match("orders-eu")).result(timeout=30)
    assert {(b.name, b.resource_pattern_type, b.permission_type) for b in described} == {
        ("orders", ResourcePatternType.PREFIXED, AclPermissionType.ALLOW),
        ("orders-eu", ResourcePatternType.LITERAL, AclPermissionType.DENY)}
    # Metadata lists what ANONYMOUS may describe (READ implies DESCRIBE; a DENY of READ
    # does not deny DESCRIBE): not "secret", not the cluster-only "table".
    assert set(admin.list_topics(timeout=30).topics) == {"orders", "orders-eu"}
    assert ck_fetch_error(server, "orders") is None  # the prefixed ALLOW
    denied = ck_fetch_error(server, "orders-eu")  # DENY over ALLOW
    assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # No ACL at all: Metadata for it by name says TOPIC_AUTHORIZATION_FAILED (so an
    # assigned consumer never fetches it).
    secret = admin.list_topics(topic="secret", timeout=30).topics["secret"].error
    assert secret is not None and secret.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # Delete: the filter names the DENY only; then orders-eu reads.
    deleted = admin.delete_acls([AclBindingFilter(
        ResourceType.TOPIC, "orders-eu", ResourcePatternType.LITERAL, ANON, "*",
        AclOperation.ANY, AclPermissionType.DENY)])
    (gone,) = [f.result(timeout=30) for f in deleted.values()]
    assert [(b.name, b.permission_type) for b in gone] == [
        ("orders-eu", AclPermissionType.DENY)]
    assert ck_fetch_error(server, "orders-eu") is None
    remaining = admin.describe_acls(ck_match()).result(timeout=30)
    assert {(b.restype, b.name, b.operation) for b in remaining} == {
        (ResourceType.TOPIC, "orders", AclOperation.READ),
        (ResourceType.BROKER, "kafka-cluster", AclOperation.ALTER),
        (ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE)}


def test_group_commit_and_compaction_strategy(server: LoggedServer) -> None:
    admin = ck_admin(server)
    ck_create(admin, ck_acl("orders", AclOperation.ALL),
              # Enough to find the coordinator, not to commit.
              ck_acl("g", AclOperation.DESCRIBE, kind=ResourceType.GROUP))
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "g",
                         "enable.auto.commit": False})
    try:
        with pytest.raises(KafkaException) as raised:
            consumer.commit(offsets=[TopicPartition("orders", 0, 1)], asynchronous=False)
        assert raised.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
        ck_create(admin, ck_acl("g", AclOperation.READ, kind=ResourceType.GROUP))
        (committed,) = consumer.commit(offsets=[TopicPartition("orders", 0, 1)],
                                       asynchronous=False)
        assert committed.error is None and committed.offset == 1
    finally:
        consumer.close()

    def set_strategy(value: str) -> KafkaException | None:
        (future,) = admin.incremental_alter_configs([ConfigResource(
            ResourceType.TOPIC, "table", incremental_configs=[
                ConfigEntry("compaction.strategy", value,
                            incremental_operation=AlterConfigOpType.SET)])]).values()
        try:
            future.result(timeout=30)
            return None
        except KafkaException as error:
            return error

    refused = set_strategy("first")
    assert refused is not None
    assert refused.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    ck_create(admin, ck_acl("table", AclOperation.ALTER_CONFIGS))
    assert set_strategy("first") is None
    invalid = set_strategy("function:os:system")
    assert invalid is not None and invalid.args[0].code() == KafkaError.INVALID_CONFIG
    assert "allowed_strategy_functions" in invalid.args[0].str()


def test_kafka_python_acls_fetch_and_commit(server: LoggedServer) -> None:
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap)
    try:
        read_orders = ACL(ANON, "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                          ResourcePattern(KpResourceType.TOPIC, "orders",
                                          ACLResourcePatternType.PREFIXED))
        deny_eu = ACL(ANON, "*", ACLOperation.READ, ACLPermissionType.DENY,
                      ResourcePattern(KpResourceType.TOPIC, "orders-eu"))
        find_group = ACL(ANON, "*", ACLOperation.DESCRIBE, ACLPermissionType.ALLOW,
                         ResourcePattern(KpResourceType.GROUP, "kp-group"))
        created = admin.create_acls([read_orders, deny_eu, find_group])
        assert created["failed"] == [] and len(created["succeeded"]) == 3
        described, error = admin.describe_acls(ACLFilter(
            None, None, ACLOperation.ANY, ACLPermissionType.ANY,
            ResourcePatternFilter(KpResourceType.TOPIC, "orders-eu",
                                  ACLResourcePatternType.MATCH)))
        assert error is kp_errors.NoError
        assert set(described) == {read_orders, deny_eu}
        assert set(admin.list_topics()) == {"orders", "orders-eu"}

        consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id=None,
                                 enable_auto_commit=False, auto_offset_reset="earliest")
        try:
            consumer.assign([KpTopicPartition("orders-eu", 0)])
            with pytest.raises(kp_errors.TopicAuthorizationFailedError):
                for _ in range(60):
                    consumer.poll(timeout_ms=500)
            consumer.assign([KpTopicPartition("orders", 0)])
            records: list[Any] = []
            for _ in range(60):
                records += [r for rs in consumer.poll(timeout_ms=500).values() for r in rs]
                if records:
                    break
            assert [r.value for r in records] == [b"orders"]
        finally:
            consumer.close()
        # DESCRIBE on the group finds its coordinator; committing needs READ.
        member = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id="kp-group",
                               enable_auto_commit=False)
        try:
            with pytest.raises(kp_errors.GroupAuthorizationFailedError):
                member.commit({KpTopicPartition("orders", 0): OffsetAndMetadata(1, "", -1)})
        finally:
            member.close()

        results = admin.delete_acls([ACLFilter(
            ANON, None, ACLOperation.ANY, ACLPermissionType.ANY,
            ResourcePatternFilter(KpResourceType.ANY, None, ACLResourcePatternType.ANY))])
        ((_, matched, error),) = results
        assert error is kp_errors.NoError
        assert set(matched) >= {read_orders, deny_eu, find_group}
        # ANONYMOUS deleted its own right to administer ACLs too.
        with pytest.raises(kp_errors.ClusterAuthorizationFailedError):
            admin.describe_acls(ACLFilter(None, None, ACLOperation.ANY,
                                          ACLPermissionType.ANY,
                                          ResourcePatternFilter(KpResourceType.ANY, None,
                                                                ACLResourcePatternType.ANY)))
    finally:
        admin.close()


def test_acls_from_the_cli_take_effect_on_a_running_server(server: LoggedServer,
                                                           tmp_path: Path) -> None:
    admin = ck_admin(server)
    assert "orders" not in admin.list_topics(timeout=30).topics
    added = subprocess.run(
        [COMPACTLOG, "--data-dir", str(tmp_path / "data"), "acls", "add", "--principal",
         ANON, "--operation", "DESCRIBE", "--topic", "orders"],
        capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    assert "ALLOW\tUser:ANONYMOUS\t*\tDESCRIBE\tTOPIC\tLITERAL\torders" in added.stdout
    deadline = time.monotonic() + 30  # the server's upkeep reads it again (1 s rounds)
    while "orders" not in admin.list_topics(timeout=30).topics:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.2)
    described = admin.describe_acls(ck_match("orders")).result(timeout=30)
    assert [(b.name, b.operation) for b in described] == [("orders", AclOperation.DESCRIBE)]


# -- the admin HTTP API ---------------------------------------------------------------------

def http(method: str, url: str, token: str | None = None) -> tuple[int, Any]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(url, method=method, headers=headers,
                                     data=b"{}" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null") if (
                "json" in response.headers.get("Content-Type", "")) else None
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_admin_api_tokens(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seed(data)
    # A topic whose strategy names code the server does not list (set locally, as an
    # operator may): the server's cleaner must not run it.
    marker = tmp_path / "imported"
    (tmp_path / "acl_sidefx.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "def keep(previous, current):\n    return False\n")
    with LogStore.open(data) as store:
        store.create_topic("table-fn", 1, {"cleanup.policy": "compact",
                                           "compaction.strategy": "function:acl_sidefx:keep"})
    Authorizer(data, AuthorizationConfig(enabled=True)).create([
        Binding(Kind.TOPIC, "table", PatternType.PREFIXED, "User:ops", "*", Operation.ALTER,
                Permission.ALLOW),
        Binding(Kind.TOPIC, "orders", PatternType.LITERAL, "User:viewer", "*",
                Operation.DESCRIBE, Permission.ALLOW)])
    tokens = tmp_path / "admin-tokens"
    ops_token, viewer_token = "ops-" + "a" * 40, "viewer-" + "b" * 40
    tokens.write_text(f"# principal token\nUser:ops {ops_token}\n"
                      f"User:viewer {viewer_token}\n")
    tokens.chmod(0o600)
    config = tmp_path / "server.toml"
    config.write_text(
        "[authorization]\nenabled = true\n"
        f"admin_tokens_file = {json.dumps(str(tokens))}\n"
        '[compaction]\nservice = "local_engine:LocalCompactionServiceFactory"\n'
        # Two runs asked for back to back: both may go (admin runs count against it).
        "keep_warm_s = 0\nmax_concurrent_runs = 2\n")
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR), str(tmp_path),
                                                       os.environ.get("PYTHONPATH")]))}
    with logged_server(data, tmp_path / "server.log", "--config", str(config),
                       "--admin-listen", "127.0.0.1:0", env=env) as running:
        url = running.admin_url
        assert http("GET", f"{url}/v1/health")[0] == 200  # open by default
        assert http("GET", f"{url}/metrics")[0] == 200
        compaction = f"{url}/v1/topics/table/compaction"
        status, body = http("POST", compaction)
        assert status == 401 and "bearer token is required" in body["error"]
        assert http("POST", compaction, "not-a-token")[0] == 401
        status, body = http("POST", compaction, viewer_token)
        assert status == 403 and "User:viewer" in body["error"]
        status, body = http("POST", compaction, ops_token)
        assert status == 202, body
        # Listings show what the principal may describe (ALTER implies DESCRIBE).
        status, body = http("GET", f"{url}/v1/topics", viewer_token)
        assert [t["topic"] for t in body["topics"]] == ["orders"]
        assert http("GET", f"{url}/v1/topics/secret", viewer_token)[0] == 403
        status, body = http("GET", f"{url}/v1/topics/orders", viewer_token)
        assert status == 200 and "config" not in body  # no DESCRIBE_CONFIGS
        status, body = http("GET", f"{url}/v1/compactions", viewer_token)
        assert body["runs"] == []
        status, body = http("POST", f"{url}/v1/topics/table-fn/compaction", ops_token)
        assert status == 202, body
        run = f"{url}/v1/compactions/{body['id']}"
        deadline = time.monotonic() + 60
        while body["state"] == "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.1)
            body = http("GET", run, ops_token)[1]
        assert body["state"] == "ERROR"
        assert "allowed_strategy_functions" in body["error"]
        assert not marker.exists()
        status, body = http("GET", f"{url}/v1/compactions", ops_token)
        assert sorted(r["topic"] for r in body["runs"]) == ["table", "table-fn"]
        log = running.log()
        assert ops_token not in log and viewer_token not in log and "not-a-token" not in log
