"""Certificates and secured servers for the security tests.

A `Pki` is a CA made with `cryptography`, a server certificate for 127.0.0.1 signed by
it, client certificates (good, expired), and a second CA that signs nothing the server
trusts. `secured_server` starts a real `compactlog serve` with a PLAINTEXT listener and
the secured listeners asked for, on ephemeral ports, and reads their ports from
<data dir>/server.json.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from support.kafka_server import COMPACTLOG, LoggedServer, logged_server

PASSWORD = "s3cret-Pa55word-never-logged"
NOW = datetime.datetime.now(datetime.UTC)


def _name(**parts: str) -> x509.Name:
    oids = {"O": NameOID.ORGANIZATION_NAME, "CN": NameOID.COMMON_NAME}
    return x509.Name([x509.NameAttribute(oids[k], v) for k, v in parts.items()])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


@dataclass
class Issued:
    cert: Path
    key: Path


class Ca:
    def __init__(self, directory: Path, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = _name(O="compactlog-tests", CN=name)
        self.cert = (x509.CertificateBuilder().subject_name(self.name).issuer_name(self.name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(NOW - datetime.timedelta(days=1))
                     .not_valid_after(NOW + datetime.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                  False, False), True)
                     .sign(self.key, hashes.SHA256()))
        self.path = directory / f"{name}.pem"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.directory = directory

    def issue(self, file_name: str, subject: x509.Name, server: bool = False,
              expired: bool = False) -> Issued:
        key = ec.generate_private_key(ec.SECP256R1())
        start = NOW - datetime.timedelta(days=10 if expired else 1)
        end = NOW - datetime.timedelta(days=2) if expired else NOW + datetime.timedelta(days=30)
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(self.name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), True))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                 x509.DNSName("localhost")]), False).add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
        else:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.directory / f"{file_name}.pem", self.directory / f"{file_name}.key")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(issued.key, key)
        return issued


class Pki:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = Ca(directory, "ca")
        self.other_ca = Ca(directory, "other-ca")
        self.server = self.ca.issue("server", _name(O="compactlog-tests", CN="127.0.0.1"),
                                    server=True)
        self.alice = self.ca.issue("alice", _name(O="acme", CN="alice"))
        self.expired = self.ca.issue("expired", _name(O="acme", CN="old"), expired=True)
        self.stranger = self.other_ca.issue("stranger", _name(O="evil", CN="mallory"))


@dataclass
class SecuredServer:
    server: LoggedServer
    listeners: dict[str, str]  # name -> host:port
    data_dir: Path

    def address(self, name: str) -> str:
        return self.listeners[name]


def add_user(data_dir: Path, name: str, password: str = PASSWORD) -> None:
    """`compactlog users add`, as an operator would run it."""
    result = subprocess.run([COMPACTLOG, "--data-dir", str(data_dir), "users", "add", name,
                             "--password-stdin"], input=password + "\n", text=True,
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr


def _listeners(data_dir: Path) -> dict[str, str]:
    deadline = time.monotonic() + 30
    while True:
        try:
            body = json.loads((data_dir / "server.json").read_text())
            return {name: entry["address"] for name, entry in body["listeners"].items()}
        except (OSError, ValueError, KeyError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def secured_server(tmp_path: Path, pki: Pki, *listeners: str, extra: tuple[str, ...] = (),
                   client_auth: str | None = None) -> Iterator[SecuredServer]:
    """`compactlog serve` with PLAINTEXT and `listeners` (NAME://127.0.0.1:0), TLS from
    `pki`; stopped (and checked to exit 0) at the end."""
    data_dir = tmp_path / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    args: list[str] = []
    for listener in listeners:
        args += ["--listener", listener]
    args += ["--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key),
             "--tls-ca", str(pki.ca.path)]
    if client_auth is not None:
        args += ["--tls-client-auth", client_auth]
    log_path = tmp_path / f"server-{os.getpid()}-{time.monotonic_ns()}.log"
    with logged_server(data_dir, log_path, *args, *extra) as server:
        yield SecuredServer(server, _listeners(data_dir), data_dir)


COMPACTED = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
RECORDS = {f"k{i}".encode(): f"v{i}".encode() for i in range(20)}


def confluent_round_trip(settings: dict[str, Any]) -> dict[bytes, bytes]:
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"t-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(settings)
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=COMPACTED)]).values():
        future.result(30)
    producer = Producer({**settings, "acks": "all"})
    for key, value in RECORDS.items():
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0
    consumer = Consumer({**settings, "group.id": f"g-{topic}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        seen: dict[bytes, bytes] = {}
        for _ in range(600):
            message = consumer.poll(0.1)
            if message is None:
                continue
            assert message.error() is None, message.error()
            seen[message.key()] = message.value()
            if len(seen) == len(RECORDS):
                consumer.commit(asynchronous=False)
                break
    finally:
        consumer.close()
    return seen
