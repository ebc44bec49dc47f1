"""ACLs with real principals: two SASL users (and a super user) against a real
`compactlog serve` whose authorizer is on, through confluent-kafka and kafka-python over
a SASL_PLAINTEXT listener (PLAIN; TLS is the security tests' subject). Each user reads,
writes and commits only what its ACLs grant; the other user's topics are not even
listed; a DENY of one user overrides a wildcard ALLOW; only the super user (or a user
granted ALTER on the cluster) manages ACLs; and an anonymous client on the PLAINTEXT
listener gets only what `User:*` grants. And the admin API over HTTPS, whose principal
is a client certificate's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaAdminClient
from kafka import errors as kp_errors
from kafka.admin import (
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KpResourceType

from support.security_support import PASSWORD, Pki, SecuredServer, add_user, secured_server

LISTENER = "SASL_PLAINTEXT"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SecuredServer]:
    config = tmp_path / "server.toml"
    config.write_text("group_initial_rebalance_delay_s = 0.1\n"
                      '[authorization]\nenabled = true\nsuper_users = ["User:admin"]\n')
    with secured_server(tmp_path, Pki(tmp_path / "pki"), f"{LISTENER}://127.0.0.1:0",
                        extra=("--config", str(config))) as secured:
        for user in ("admin", "alice", "bob"):
            add_user(secured.data_dir, user)
        yield secured


def settings(server: SecuredServer, user: str) -> dict[str, Any]:
    return {"bootstrap.servers": server.address(LISTENER), "security.protocol": LISTENER,
            "sasl.mechanism": "PLAIN", "sasl.username": user, "sasl.password": PASSWORD}


def acl(principal: str, kind: ResourceType, name: str, op: AclOperation,
        permission: AclPermissionType = AclPermissionType.ALLOW,
        pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    return AclBinding(kind, name, pattern, principal, "*", op, permission)


def produce(server: SecuredServer, user: str, topic: str) -> KafkaError | None:
    """The delivery error of one record, or None."""
    errors: list[KafkaError | None] = []
    producer = Producer({**settings(server, user), "acks": "all", "retries": 0,
                         "message.timeout.ms": 20000})
    producer.produce(topic, b"from " + user.encode(), b"k",
                     on_delivery=lambda error, _: errors.append(error))
    producer.flush(30)
    assert len(errors) == 1
    return errors[0]


def consume_and_commit(server: SecuredServer, user: str, topic: str, group: str) -> list[bytes]:
    consumer = Consumer({**settings(server, user), "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        values: list[bytes] = []
        for _ in range(300):
            message = consumer.poll(0.1)
            if message is None:
                continue
            assert message.error() is None, message.error()
            values.append(message.value())
            consumer.commit(message, asynchronous=False)
            break
        return values
    finally:
        consumer.close()


def test_two_users_see_and_do_what_their_acls_grant(server: SecuredServer) -> None:
    admin = AdminClient(settings(server, "admin"))
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in (
            "alice-orders", "shared")]).values():
        future.result(30)
    alice, bob = "User:alice", "User:bob"
    grants = [
        acl(alice, ResourceType.TOPIC, "alice-", AclOperation.ALL,
            pattern=ResourcePatternType.PREFIXED),
        acl(alice, ResourceType.GROUP, "alice-", AclOperation.READ,
            pattern=ResourcePatternType.PREFIXED),
        acl("User:*", ResourceType.TOPIC, "shared", AclOperation.READ),
        acl(alice, ResourceType.TOPIC, "shared", AclOperation.WRITE),
        acl(bob, ResourceType.GROUP, "bob-g", AclOperation.READ),
        # Everyone may read "shared"; bob may not (DENY over the wildcard ALLOW)...
        acl(bob, ResourceType.TOPIC, "shared", AclOperation.READ, AclPermissionType.DENY),
    ]
    for future in admin.create_acls(grants).values():
        future.result(30)

    # alice: her prefix, her groups, and "shared".
    assert produce(server, "alice", "alice-orders") is None
    assert produce(server, "alice", "shared") is None
    assert consume_and_commit(server, "alice", "alice-orders", "alice-g") == [b"from alice"]
    assert set(AdminClient(settings(server, "alice")).list_topics(timeout=30).topics) == {
        "alice-orders", "shared"}

    # bob: "shared" is listed (the wildcard READ implies DESCRIBE; his DENY is of READ
    # only), alice's topic is not, and he may neither read it nor write "shared".
    bob_admin = AdminClient(settings(server, "bob"))
    assert set(bob_admin.list_topics(timeout=30).topics) == {"shared"}
    hidden = bob_admin.list_topics(topic="alice-orders", timeout=30).topics["alice-orders"]
    assert hidden.error is not None
    assert hidden.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    refused = produce(server, "bob", "shared")
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    consumer = Consumer({**settings(server, "bob"), "group.id": "bob-g",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe(["shared"])
        error = None
        for _ in range(300):
            message = consumer.poll(0.1)
            if message is not None:
                assert message.error() is not None, "bob read a record he is denied"
                error = message.error()
                break
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        consumer.close()

    # Only the super user manages ACLs. librdkafka drops DescribeAcls' top-level error
    # (rd_kafka_DescribeAclsResponse_parse returns no error whatever the code), so bob's
    # refused listing arrives empty; CreateAcls' per-creation error does arrive.
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None,
                                  None, AclOperation.ANY, AclPermissionType.ANY)
    assert bob_admin.describe_acls(everything).result(timeout=30) == []
    assert len(admin.describe_acls(everything).result(timeout=30)) == len(grants)
    (future,) = bob_admin.create_acls([acl(bob, ResourceType.TOPIC, "alice-orders",
                                           AclOperation.READ)]).values()
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=30)
    assert raised.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED

    # An anonymous client on the PLAINTEXT listener is User:ANONYMOUS, which `User:*`
    # covers too, as in Kafka: it sees "shared" and nothing else.
    anonymous = AdminClient({"bootstrap.servers": server.server.bootstrap})
    assert set(anonymous.list_topics(timeout=30).topics) == {"shared"}


def kp_admin(server: SecuredServer, user: str) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=server.address(LISTENER),
                            security_protocol=LISTENER, sasl_mechanism="PLAIN",
                            sasl_plain_username=user, sasl_plain_password=PASSWORD)


def test_kafka_python_users_and_acl_administration(server: SecuredServer) -> None:
    every = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                      ResourcePatternFilter(KpResourceType.ANY, None,
                                            ACLResourcePatternType.ANY))
    bob = kp_admin(server, "bob")
    try:
        with pytest.raises(kp_errors.ClusterAuthorizationFailedError):
            bob.describe_acls(every)
    finally:
        bob.close()
    admin = kp_admin(server, "admin")
    try:
        topic = f"t-{uuid.uuid4().hex[:6]}"
        from kafka.admin import ACL, NewTopic, ResourcePattern

        admin.create_topics([NewTopic(topic, 1, 1)])
        grant = ACL("User:bob", "*", ACLOperation.ALTER, ACLPermissionType.ALLOW,
                    ResourcePattern(KpResourceType.CLUSTER, "kafka-cluster"))
        assert admin.create_acls([grant])["failed"] == []
        acls, error = admin.describe_acls(every)
        assert error is kp_errors.NoError and grant in acls
    finally:
        admin.close()
    # ALTER on the cluster lets bob administer ACLs (and implies DESCRIBE).
    bob = kp_admin(server, "bob")
    try:
        acls, error = bob.describe_acls(every)
        assert error is kp_errors.NoError and len(acls) == 1
        ((_, removed, error),) = bob.delete_acls([every])
        assert error is kp_errors.NoError and len(removed) == 1
        with pytest.raises(kp_errors.ClusterAuthorizationFailedError):
            bob.describe_acls(every)
    finally:
        bob.close()


def test_admin_api_principal_from_a_client_certificate(tmp_path: Path) -> None:
    """The admin API over HTTPS takes a client certificate's principal, named as the
    Kafka listeners name it, and checks it against the ACLs."""
    import json
    import ssl
    import urllib.error
    import urllib.request

    from compactlog.server.security.acl_model import AclBinding as Binding
    from compactlog.server.security.acl_model import Operation, PatternType, Permission
    from compactlog.server.security.acl_model import ResourceType as Kind
    from compactlog.server.security.authorizer import AuthorizationConfig, Authorizer
    from compactlog.storage.store import LogStore

    pki = Pki(tmp_path / "pki")
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic("orders", 1)
        store.create_topic("secret", 1)
    Authorizer(data, AuthorizationConfig()).create([Binding(
        Kind.TOPIC, "orders", PatternType.LITERAL, "User:CN=alice,O=acme", "*",
        Operation.DESCRIBE, Permission.ALLOW)])
    config = tmp_path / "server.toml"
    config.write_text("admin_tls = true\n[authorization]\nenabled = true\n")
    with secured_server(tmp_path, pki, "SSL://127.0.0.1:0", client_auth="requested",
                        extra=("--admin-listen", "127.0.0.1:0", "--config",
                               str(config))) as secured:
        url = secured.server.admin_url
        assert url is not None and url.startswith("https://")

        def get(path: str, with_cert: bool) -> tuple[int, Any]:
            context = ssl.create_default_context(cafile=str(pki.ca.path))
            if with_cert:
                context.load_cert_chain(str(pki.alice.cert), str(pki.alice.key))
            try:
                with urllib.request.urlopen(f"{url}{path}", context=context,
                                            timeout=30) as got:
                    return got.status, json.loads(got.read())
            except urllib.error.HTTPError as error:
                return error.code, json.loads(error.read())

        status, body = get("/v1/topics", with_cert=True)
        assert status == 200 and [t["topic"] for t in body["topics"]] == ["orders"]
        status, body = get("/v1/topics/secret", with_cert=True)
        assert status == 403 and "User:CN=alice,O=acme" in body["error"]
        # No certificate (and no tokens file): User:ANONYMOUS, which no ACL names.
        status, body = get("/v1/topics/orders", with_cert=False)
        assert status == 403 and "User:ANONYMOUS" in body["error"]
        assert get("/v1/health", with_cert=False)[0] == 200  # open by default
