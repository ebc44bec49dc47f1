"""Real Kafka clients over SASL_SSL (and SASL_PLAINTEXT) against `compactlog serve`: each
produces to a compacted topic and consumes it with a group, authenticated with a SCRAM
user made by `compactlog users add`.

The clients and mechanisms are the ones issue 15 asks for: confluent-kafka with PLAIN,
SCRAM-SHA-256 and SCRAM-SHA-512; kafka-python with PLAIN and SCRAM-SHA-512; aiokafka
with SCRAM-SHA-256; Debian's kcat (librdkafka 2.0.2) with PLAIN, and with SCRAM, whose
client-final nonce compactlog accepts (server/security/sasl_mechanisms.py).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.security_support import (
    COMPACTED,
    PASSWORD,
    RECORDS,
    Pki,
    SecuredServer,
    add_user,
    confluent_round_trip,
    secured_server,
)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def server(tmp_path: Path, pki: Pki) -> Iterator[SecuredServer]:
    config = tmp_path / "server.toml"
    config.write_text("group_initial_rebalance_delay_s = 0.2\n")
    with secured_server(tmp_path, pki, "SASL_SSL://127.0.0.1:0",
                        "SASL_PLAINTEXT://127.0.0.1:0",
                        extra=("--config", str(config))) as secured:
        add_user(secured.data_dir, "alice")
        yield secured


def confluent_settings(server: SecuredServer, pki: Pki, mechanism: str) -> dict[str, Any]:
    return {"bootstrap.servers": server.address("SASL_SSL"),
            "security.protocol": "SASL_SSL", "sasl.mechanism": mechanism,
            "sasl.username": "alice", "sasl.password": PASSWORD,
            "ssl.ca.location": str(pki.ca.path)}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_kafka_sasl_ssl(server: SecuredServer, pki: Pki, mechanism: str) -> None:
    assert confluent_round_trip(confluent_settings(server, pki, mechanism)) == RECORDS
    log = server.server.log()
    assert f"SASL/{mechanism} authenticated User:alice" in log
    assert PASSWORD not in log


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_kafka_python_sasl_ssl(server: SecuredServer, pki: Pki, mechanism: str) -> None:
    import ssl

    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic

    context = ssl.create_default_context(cafile=str(pki.ca.path))
    settings: dict[str, Any] = {
        "bootstrap_servers": server.address("SASL_SSL"), "security_protocol": "SASL_SSL",
        "sasl_mechanism": mechanism, "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD, "ssl_context": context}
    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(**settings)
    try:
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs=COMPACTED)])
    finally:
        admin.close()
    producer = KafkaProducer(acks="all", **settings)
    for key, value in RECORDS.items():
        producer.send(topic, key=key, value=value)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(topic, group_id=f"g-{topic}", auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=20000, **settings)
    seen: dict[bytes, bytes] = {}
    try:
        for message in consumer:
            seen[message.key] = message.value
            if len(seen) == len(RECORDS):
                consumer.commit()
                break
    finally:
        consumer.close()
    assert seen == RECORDS
    assert f"SASL/{mechanism} authenticated User:alice" in server.server.log()


def test_aiokafka_scram_sha_256(server: SecuredServer, pki: Pki) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.helpers import create_ssl_context

    settings: dict[str, Any] = {
        "bootstrap_servers": server.address("SASL_SSL"), "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": "alice",
        "sasl_plain_password": PASSWORD,
        "ssl_context": create_ssl_context(cafile=str(pki.ca.path))}
    topic = f"t-{uuid.uuid4().hex[:8]}"

    async def run() -> dict[bytes, bytes]:
        admin = AIOKafkaAdminClient(**settings)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 1, 1, topic_configs=COMPACTED)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(acks="all", **settings)
        await producer.start()
        try:
            for key, value in RECORDS.items():
                await producer.send_and_wait(topic, value, key=key)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, group_id=f"g-{topic}", auto_offset_reset="earliest",
                                    enable_auto_commit=False, **settings)
        await consumer.start()
        seen: dict[bytes, bytes] = {}
        try:
            async with asyncio.timeout(30):
                async for message in consumer:
                    assert message.key is not None and message.value is not None
                    seen[message.key] = message.value
                    if len(seen) == len(RECORDS):
                        await consumer.commit()
                        break
        finally:
            await consumer.stop()
        return seen

    assert asyncio.run(run()) == RECORDS
    assert "SASL/SCRAM-SHA-256 authenticated User:alice" in server.server.log()


KCAT = shutil.which("kcat")


def kcat(server: SecuredServer, pki: Pki, mechanism: str, *args: str,
         stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KCAT or "kcat", "-b", server.address("SASL_SSL"), "-X", "security.protocol=SASL_SSL",
         "-X", f"sasl.mechanisms={mechanism}", "-X", "sasl.username=alice",
         "-X", f"sasl.password={PASSWORD}", "-X", f"ssl.ca.location={pki.ca.path}", *args],
        input=stdin, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(KCAT is None, reason="kcat is not installed")
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_kcat_sasl_ssl(server: SecuredServer, pki: Pki, mechanism: str) -> None:
    """Debian's kcat (librdkafka 2.0.2). With SCRAM it sends its client nonce twice in
    its final message (librdkafka < 2.6.1); compactlog accepts exactly that form."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=server.server.bootstrap)  # PLAINTEXT
    try:
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs=COMPACTED)])
    finally:
        admin.close()
    lines = "".join(f"{k.decode()}:{v.decode()}\n" for k, v in RECORDS.items())
    produced = kcat(server, pki, mechanism, "-t", topic, "-P", "-K:", stdin=lines)
    assert produced.returncode == 0, produced.stderr
    consumed = kcat(server, pki, mechanism, "-G", f"g-{topic}", "-X",
                    "auto.offset.reset=earliest", "-c", str(len(RECORDS)), "-f", "%k:%s\n",
                    topic)
    assert consumed.returncode == 0, consumed.stderr
    seen = dict(line.encode().split(b":", 1) for line in consumed.stdout.splitlines() if line)
    assert seen == RECORDS
    assert f"SASL/{mechanism} authenticated User:alice" in server.server.log()
    if mechanism.startswith("SCRAM"):
        assert "client-final nonce of librdkafka < 2.6.1" in server.server.log()


def test_confluent_kafka_manages_scram_credentials(server: SecuredServer, pki: Pki) -> None:
    """AdminClient.alter/describe_user_scram_credentials (AlterUserScramCredentials and
    DescribeUserScramCredentials v0): a user made this way logs in; deleted, it cannot."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient(confluent_settings(server, pki, "SCRAM-SHA-512"))
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    for future in admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("bob", info, b"bob-password")]).values():
        future.result(30)
    described = admin.describe_user_scram_credentials(["bob"])
    [(user, future)] = described.items()
    description = future.result(30)
    assert user == "bob"
    assert [(c.mechanism, c.iterations) for c in description.scram_credential_infos] == [
        (ScramMechanism.SCRAM_SHA_256, 4096)]
    bob = {**confluent_settings(server, pki, "SCRAM-SHA-256"), "sasl.username": "bob",
           "sasl.password": "bob-password"}
    assert AdminClient(bob).list_topics(timeout=30).brokers
    for future in admin.alter_user_scram_credentials(
            [UserScramCredentialDeletion("bob", ScramMechanism.SCRAM_SHA_256)]).values():
        future.result(30)
    with pytest.raises(KafkaException):
        AdminClient(bob).list_topics(timeout=2)
    assert "SASL/SCRAM-SHA-256 authentication failed" in server.server.log()
