"""TLS on the Kafka listeners and the admin API, against a real `compactlog serve`:
mutual TLS with the client certificate's subject as the principal; clients with a
certificate from another CA, an expired one, or none refused; TLS 1.2 minimum; the
certificate reloaded on SIGHUP while open connections carry on.
"""

from __future__ import annotations

import signal
import socket
import ssl
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from compactlog.server.security.tls import certificate_principal
from support.security_support import Issued, Pki, SecuredServer, secured_server
from support.wire import request_frame

API_VERSIONS, METADATA, ALTER_SCRAM = 18, 3, 51


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def mtls(tmp_path: Path, pki: Pki) -> Iterator[SecuredServer]:
    with secured_server(tmp_path, pki, "SSL://127.0.0.1:0",
                        client_auth="required") as secured:
        yield secured


class TlsWire:
    """A raw Kafka connection over TLS."""

    def __init__(self, address: str, pki: Pki, client: Issued | None = None,
                 ca: Path | None = None, maximum: ssl.TLSVersion | None = None) -> None:
        context = ssl.create_default_context(cafile=str(ca or pki.ca.path))
        if client is not None:
            context.load_cert_chain(client.cert, client.key)
        if maximum is not None:
            context.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
            context.maximum_version = maximum
            context.set_ciphers("ALL:@SECLEVEL=0")
        host, port = address.rsplit(":", 1)
        raw = socket.create_connection((host, int(port)), timeout=10)
        self.sock = context.wrap_socket(raw, server_hostname=host)

    def close(self) -> None:
        self.sock.close()

    def call(self, api_key: int, version: int, fields: dict[str, object]) -> bytes:
        """The response frame (without its length), or ConnectionError/SSLError."""
        self.sock.sendall(request_frame(api_key, version, fields))
        size = int.from_bytes(self._read(4), "big")
        return self._read(size)

    def _read(self, size: int) -> bytes:
        data = b""
        while len(data) < size:
            chunk = self.sock.recv(size - len(data))
            if not chunk:
                raise ConnectionError("closed by the server")
            data += chunk
        return data


def api_versions(wire: TlsWire) -> bytes:
    return wire.call(API_VERSIONS, 0, {})


def test_the_certificate_subject_is_the_principal(pki: Pki) -> None:
    from cryptography import x509

    der = x509.load_pem_x509_certificate(pki.alice.cert.read_bytes()).public_bytes(
        __import__("cryptography.hazmat.primitives.serialization",
                   fromlist=["Encoding"]).Encoding.DER)
    assert certificate_principal(der) == "User:CN=alice,O=acme"
    assert certificate_principal(None) is None


def test_mutual_tls_client_is_its_certificate(mtls: SecuredServer, pki: Pki) -> None:
    mark = mtls.server.mark()
    wire = TlsWire(mtls.address("SSL"), pki, client=pki.alice)
    try:
        assert api_versions(wire)
        # Not User:ANONYMOUS: it may change credentials (an anonymous client may not).
        frame = wire.call(ALTER_SCRAM, 0, {"upsertions": [], "deletions": [
            {"name": "ghost", "mechanism": 1}]})
        assert ErrorCode.resource_not_found.value.to_bytes(2, "big") in frame
    finally:
        wire.close()
    mtls.server.wait_for_log(r"TLS client certificate from 127\.0\.0\.1 on listener SSL: "
                             r"User:CN=alice,O=acme", mark)


@pytest.mark.parametrize("who", ["other CA", "expired", "none"])
def test_clients_without_a_trusted_certificate_are_refused(
        mtls: SecuredServer, pki: Pki, who: str) -> None:
    client = {"other CA": pki.stranger, "expired": pki.expired, "none": None}[who]
    mark = mtls.server.mark()
    with pytest.raises((ssl.SSLError, ConnectionError)):
        wire = TlsWire(mtls.address("SSL"), pki, client=client)
        try:  # TLS 1.3: the server's verdict on the certificate comes after the handshake
            api_versions(wire)
        finally:
            wire.close()
    wire = TlsWire(mtls.address("SSL"), pki, client=pki.alice)  # others still served
    try:
        assert api_versions(wire)
    finally:
        wire.close()
    line = mtls.server.wait_for_log(
        r"TLS handshake from 127\.0\.0\.1 on listener SSL failed: ", mark)
    reason = {"other CA": "unable to get local issuer certificate",
              "expired": "certificate has expired", "none": "certificate"}[who]
    assert reason in line, line
    mtls.server.assert_running()


def test_a_client_trusting_another_ca_refuses_the_server(mtls: SecuredServer,
                                                         pki: Pki) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        TlsWire(mtls.address("SSL"), pki, client=pki.alice, ca=pki.other_ca.path)


def test_tls_below_1_2_is_refused(mtls: SecuredServer, pki: Pki) -> None:
    with pytest.raises((ssl.SSLError, ConnectionError)):
        TlsWire(mtls.address("SSL"), pki, client=pki.alice, maximum=ssl.TLSVersion.TLSv1_1)


def test_sighup_reloads_the_certificate_and_keeps_connections(
        mtls: SecuredServer, pki: Pki) -> None:
    old = TlsWire(mtls.address("SSL"), pki, client=pki.alice)
    try:
        before = old.sock.getpeercert(binary_form=True)
        fresh = pki.ca.issue("server2", x509_name("127.0.0.1"), server=True)
        # The files the server was started with now hold the new certificate and key.
        Path(str(pki.server.cert)).write_bytes(fresh.cert.read_bytes())
        Path(str(pki.server.key)).write_bytes(fresh.key.read_bytes())
        mark = mtls.server.mark()
        mtls.server.process.send_signal(signal.SIGHUP)
        mtls.server.wait_for_log("TLS certificate reloaded", mark)
        new = TlsWire(mtls.address("SSL"), pki, client=pki.alice)
        try:
            assert new.sock.getpeercert(binary_form=True) != before
            assert api_versions(new)  # mutual TLS still checked and passing
        finally:
            new.close()
        assert api_versions(old)  # the connection opened before the reload carries on
        assert old.sock.getpeercert(binary_form=True) == before
    finally:
        old.close()
    with pytest.raises((ssl.SSLError, ConnectionError)):  # still refused without a cert
        wire = TlsWire(mtls.address("SSL"), pki)
        try:
            api_versions(wire)
        finally:
            wire.close()


def x509_name(common_name: str) -> object:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def test_admin_api_over_https(tmp_path: Path, pki: Pki) -> None:
    config = tmp_path / "server.toml"
    config.write_text("admin_tls = true\n")
    with secured_server(tmp_path, pki, "SSL://127.0.0.1:0",
                        extra=("--admin-listen", "127.0.0.1:0", "--config",
                               str(config))) as secured:
        url = secured.server.admin_url
        assert url is not None and url.startswith("https://")
        context = ssl.create_default_context(cafile=str(pki.ca.path))
        with urllib.request.urlopen(f"{url}/v1/health", context=context, timeout=10) as got:
            assert got.status == 200
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"{url}/v1/health", timeout=10,
                                   context=ssl.create_default_context(
                                       cafile=str(pki.other_ca.path)))


def test_a_failed_reload_keeps_the_certificate_in_use(mtls: SecuredServer, pki: Pki) -> None:
    before = TlsWire(mtls.address("SSL"), pki, client=pki.alice)
    try:
        served = before.sock.getpeercert(binary_form=True)
    finally:
        before.close()
    key = Path(str(pki.server.key))
    good = key.read_bytes()
    key.write_bytes(b"not a key\n")
    try:
        mark = mtls.server.mark()
        mtls.server.process.send_signal(signal.SIGHUP)
        line = mtls.server.wait_for_log("TLS reload failed, keeping the certificate in use", mark)
        assert str(key) in line
    finally:
        key.write_bytes(good)
    after = TlsWire(mtls.address("SSL"), pki, client=pki.alice)
    try:
        assert after.sock.getpeercert(binary_form=True) == served
        assert api_versions(after)
    finally:
        after.close()


def test_confluent_kafka_over_mutual_tls(mtls: SecuredServer, pki: Pki) -> None:
    """librdkafka with a client certificate: produces to a compacted topic and consumes
    it with a group; its principal is the certificate's subject."""
    from support.security_support import RECORDS, confluent_round_trip

    mark = mtls.server.mark()
    settings = {"bootstrap.servers": mtls.address("SSL"), "security.protocol": "SSL",
                "ssl.ca.location": str(pki.ca.path),
                "ssl.certificate.location": str(pki.alice.cert),
                "ssl.key.location": str(pki.alice.key)}
    assert confluent_round_trip(settings) == RECORDS
    mtls.server.wait_for_log(r"on listener SSL: User:CN=alice,O=acme", mark)
