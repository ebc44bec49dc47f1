"""The SASL exchange on the wire, against a real `compactlog serve` with a
SASL_PLAINTEXT listener: Kafka's answers to wrong passwords, unknown users, replayed
SCRAM exchanges, requests out of turn and unknown mechanisms; the raw tokens of
SaslHandshake v0; the SCRAM credential APIs; and hypothesis fuzzing of the tokens.

Every refusal leaves the server serving others, and no log line holds the password.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from scramp import ScramClient

from compactlog.server.security.sasl_mechanisms import FailureDelay
from support.security_support import PASSWORD, Pki, SecuredServer, add_user, secured_server
from support.wire import Wire, request_frame

HANDSHAKE, AUTHENTICATE, METADATA, API_VERSIONS = 17, 36, 3, 18
DESCRIBE_SCRAM, ALTER_SCRAM = 50, 51


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredServer]:
    root = tmp_path_factory.mktemp("sasl")
    pki = Pki(root / "pki")
    config = root / "server.toml"
    # No failure delay here (the fuzzing fails thousands of times from one address);
    # test_failure_delay checks the delay itself.
    config.write_text("sasl_failure_delay_s = 0.0\n")
    with secured_server(root, pki, "SASL_PLAINTEXT://127.0.0.1:0",
                        extra=("--config", str(config))) as secured:
        add_user(secured.data_dir, "alice")
        yield secured


def address(server: SecuredServer) -> tuple[str, int]:
    host, port = server.address("SASL_PLAINTEXT").rsplit(":", 1)
    return host, int(port)


def handshake(wire: Wire, mechanism: str, version: int = 1) -> Any:
    return wire.call(HANDSHAKE, version, {"mechanism": mechanism})


def authenticate(wire: Wire, token: bytes, version: int = 2) -> Any:
    return wire.call(AUTHENTICATE, version, {"auth_bytes": token})


def plain(user: str, password: str) -> bytes:
    return b"\0" + user.encode() + b"\0" + password.encode()


def assert_serves_alice(server: SecuredServer) -> None:
    with Wire(address(server)) as wire:
        assert handshake(wire, "PLAIN").error_code == ErrorCode.none
        assert authenticate(wire, plain("alice", PASSWORD)).error_code == ErrorCode.none
        assert wire.call(METADATA, 1, {"topics": []}).brokers[0].port == address(server)[1]


def scram_login(wire: Wire, mechanism: str, user: str, password: str,
                ) -> tuple[list[str], Any]:
    """A SCRAM exchange; the client's two messages and the final answer."""
    client = ScramClient([mechanism], user, password)
    assert handshake(wire, mechanism).error_code == ErrorCode.none
    first = client.get_client_first()
    answer = authenticate(wire, first.encode())
    assert answer.error_code == ErrorCode.none, answer.error_message
    client.set_server_first(answer.auth_bytes.decode())
    final = client.get_client_final()
    return [first, final], authenticate(wire, final.encode())


def test_plain_and_metadata_advertise_the_listener_reached(server: SecuredServer) -> None:
    assert_serves_alice(server)
    host, port = server.server.address
    with Wire((host, port)) as wire:  # the PLAINTEXT listener advertises itself
        assert wire.call(METADATA, 1, {"topics": []}).brokers[0].port == port


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_login(server: SecuredServer, mechanism: str) -> None:
    with Wire(address(server)) as wire:
        _, final = scram_login(wire, mechanism, "alice", PASSWORD)
        assert final.error_code == ErrorCode.none
        assert wire.call(METADATA, 1, {"topics": []}).brokers


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", PASSWORD)])
def test_wrong_password_and_unknown_user_fail_as_kafka_answers(
        server: SecuredServer, user: str, password: str) -> None:
    mark = server.server.mark()
    with Wire(address(server)) as wire:
        handshake(wire, "PLAIN")
        answer = authenticate(wire, plain(user, password))
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        assert answer.error_message == "Authentication failed: Invalid username or password"
        assert wire.is_closed_by_server()
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        with Wire(address(server)) as wire:
            _, final = scram_login(wire, mechanism, user, password)
            assert final.error_code == ErrorCode.sasl_authentication_failed
            assert mechanism in final.error_message
            assert wire.is_closed_by_server()
    server.server.wait_for_log("SASL/SCRAM-SHA-512 authentication failed", mark)
    assert PASSWORD not in server.server.log()
    assert_serves_alice(server)


def test_a_replayed_scram_exchange_fails(server: SecuredServer) -> None:
    with Wire(address(server)) as wire:
        messages, final = scram_login(wire, "SCRAM-SHA-256", "alice", PASSWORD)
        assert final.error_code == ErrorCode.none
    with Wire(address(server)) as wire:  # an eavesdropper replays both messages
        assert handshake(wire, "SCRAM-SHA-256").error_code == ErrorCode.none
        assert authenticate(wire, messages[0].encode()).error_code == ErrorCode.none
        replayed = authenticate(wire, messages[1].encode())
        assert replayed.error_code == ErrorCode.sasl_authentication_failed
        assert wire.is_closed_by_server()
    assert_serves_alice(server)


def test_requests_before_authentication_close_the_connection(server: SecuredServer) -> None:
    mark = server.server.mark()
    with Wire(address(server)) as wire:
        assert wire.call(API_VERSIONS, 3, {"client_software_name": "t",
                                           "client_software_version": "1"}).api_keys
        wire.send(request_frame(METADATA, 1, {"topics": []}))
        assert wire.is_closed_by_server()
    server.server.wait_for_log("before SASL authentication", mark)
    with Wire(address(server)) as wire:  # SaslAuthenticate before SaslHandshake
        answer = authenticate(wire, plain("alice", PASSWORD))
        assert answer.error_code == ErrorCode.illegal_sasl_state
        assert wire.is_closed_by_server()
    assert_serves_alice(server)


def test_an_unknown_mechanism_is_refused_with_the_enabled_ones(server: SecuredServer) -> None:
    with Wire(address(server)) as wire:
        answer = handshake(wire, "GSSAPI")
        assert answer.error_code == ErrorCode.unsupported_sasl_mechanism
        assert set(answer.mechanisms) == {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
        assert wire.is_closed_by_server()


def raw_token(wire: Wire, token: bytes) -> bytes:
    wire.send(struct.pack(">i", len(token)) + token)
    (size,) = struct.unpack(">i", wire.read_exactly(4))
    return wire.read_exactly(size)


def test_handshake_v0_takes_raw_tokens(server: SecuredServer) -> None:
    """Before KIP-152 the tokens after SaslHandshake v0 go without a request header."""
    with Wire(address(server)) as wire:
        assert handshake(wire, "PLAIN", version=0).error_code == ErrorCode.none
        assert raw_token(wire, plain("alice", PASSWORD)) == b""
        assert wire.call(METADATA, 1, {"topics": []}).brokers
    with Wire(address(server)) as wire:
        client = ScramClient(["SCRAM-SHA-512"], "alice", PASSWORD)
        assert handshake(wire, "SCRAM-SHA-512", version=0).error_code == ErrorCode.none
        client.set_server_first(raw_token(wire, client.get_client_first().encode()).decode())
        client.set_server_final(raw_token(wire, client.get_client_final().encode()).decode())
        assert wire.call(METADATA, 1, {"topics": []}).brokers
    with Wire(address(server)) as wire:  # a failure closes without an answer, as Kafka
        handshake(wire, "PLAIN", version=0)
        token = plain("alice", "bad")
        wire.send(struct.pack(">i", len(token)) + token)
        assert wire.is_closed_by_server()


def test_credentials_are_described_and_altered_over_the_wire(server: SecuredServer) -> None:
    from compactlog.server.security.credentials import salted_password

    with Wire(address(server)) as wire:
        _, final = scram_login(wire, "SCRAM-SHA-512", "alice", PASSWORD)
        assert final.error_code == ErrorCode.none
        salt = b"0123456789abcdef"
        salted = salted_password("SCRAM-SHA-256", "bob-password", salt, 4096)
        altered = wire.call(ALTER_SCRAM, 0, {"deletions": [], "upsertions": [
            {"name": "bob", "mechanism": 1, "iterations": 4096, "salt": salt,
             "salted_password": salted}]})
        assert [(r.user, r.error_code) for r in altered.results] == [("bob", ErrorCode.none)]
        described = wire.call(DESCRIBE_SCRAM, 0, {"users": [{"name": "bob"},
                                                            {"name": "nobody"}]})
        assert [(r.user, r.error_code, [(c.mechanism, c.iterations)
                                        for c in r.credential_infos])
                for r in described.results] == [
            ("bob", ErrorCode.none, [(1, 4096)]),
            ("nobody", ErrorCode.resource_not_found, [])]
        bad = wire.call(ALTER_SCRAM, 0, {"deletions": [{"name": "carol", "mechanism": 1}],
                                         "upsertions": [
            {"name": "dave", "mechanism": 1, "iterations": 100, "salt": salt,
             "salted_password": salted}]})
        assert {r.user: r.error_code for r in bad.results} == {
            "carol": ErrorCode.resource_not_found, "dave": ErrorCode.unacceptable_credential}
    with Wire(address(server)) as wire:
        _, final = scram_login(wire, "SCRAM-SHA-256", "bob", "bob-password")
        assert final.error_code == ErrorCode.none
        deleted = wire.call(ALTER_SCRAM, 0, {"upsertions": [], "deletions": [
            {"name": "bob", "mechanism": 1}]})
        assert deleted.results[0].error_code == ErrorCode.none
    with Wire(address(server)) as wire:
        _, final = scram_login(wire, "SCRAM-SHA-256", "bob", "bob-password")
        assert final.error_code == ErrorCode.sasl_authentication_failed


def test_anonymous_clients_cannot_alter_credentials(server: SecuredServer) -> None:
    with Wire(server.server.address) as wire:  # PLAINTEXT: User:ANONYMOUS
        answer = wire.call(ALTER_SCRAM, 0, {"deletions": [{"name": "alice", "mechanism": 1}],
                                            "upsertions": []})
        assert answer.results[0].error_code == ErrorCode.cluster_authorization_failed
        assert wire.call(HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == (
            ErrorCode.illegal_sasl_state)
    assert_serves_alice(server)


def test_failure_delay_grows_per_address_and_memory_is_bounded() -> None:
    delay = FailureDelay(base_s=0.1, max_s=1.0, free=1, window_s=60, max_hosts=3)
    assert [delay.failed("a", now=t) for t in range(6)] == [0.0, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert delay.failed("b", now=6) == 0.0  # another address is not slowed
    assert delay.failed("a", now=100) == 0.0  # forgotten after the window
    for host in ("c", "d", "e", "f"):
        delay.failed(host, now=101)
    assert len(delay) == 3


TOKENS = st.one_of(
    st.binary(max_size=300),
    st.binary(min_size=70_000, max_size=70_000),
    st.sampled_from([b"n,,n=alice,r=", b"n,,n=alice", b"p=tls-unique,,n=alice,r=x", b"\0\0",
                     b"\0alice\0", b"x\0alice\0" + PASSWORD.encode(), b"n,,", b"c=biws"]),
    st.builds(lambda head, tail: head[:len(head) // 2] + tail,
              st.sampled_from([b"n,,n=alice,r=abcdef", plain("alice", PASSWORD)]),
              st.binary(max_size=20)),
)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mechanism=st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]),
       tokens=st.lists(TOKENS, min_size=1, max_size=3))
def test_fuzzed_tokens_get_a_clear_refusal(server: SecuredServer, mechanism: str,
                                           tokens: list[bytes]) -> None:
    with Wire(address(server)) as wire:
        assert handshake(wire, mechanism).error_code == ErrorCode.none
        for token in tokens:
            answer = authenticate(wire, token)
            if answer.error_code != ErrorCode.none:
                assert answer.error_code == ErrorCode.sasl_authentication_failed
                assert answer.error_message
                assert wire.is_closed_by_server()
                break
    server.server.assert_running()


def test_after_fuzzing_the_server_serves_and_never_logged_a_secret(
        server: SecuredServer) -> None:
    assert_serves_alice(server)
    log = server.server.log()
    assert PASSWORD not in log
    assert "Traceback" not in log and "internal error" not in log


def test_users_added_and_deleted_by_the_cli_while_the_server_runs(
        server: SecuredServer) -> None:
    import subprocess

    from support.kafka_server import COMPACTLOG

    add_user(server.data_dir, "erin", "erin-password")
    with Wire(address(server)) as wire:
        _, final = scram_login(wire, "SCRAM-SHA-256", "erin", "erin-password")
        assert final.error_code == ErrorCode.none
        deleted = subprocess.run([COMPACTLOG, "--data-dir", str(server.data_dir), "users",
                                  "delete", "erin"], capture_output=True, text=True, timeout=60)
        assert deleted.returncode == 0, deleted.stderr
        assert wire.call(METADATA, 1, {"topics": []}).brokers  # an open connection stays
    with Wire(address(server)) as wire:
        handshake(wire, "PLAIN")
        answer = authenticate(wire, plain("erin", "erin-password"))
        assert answer.error_code == ErrorCode.sasl_authentication_failed


def test_an_oversized_token_before_authentication_closes_the_connection(
        server: SecuredServer) -> None:
    """Kafka's sasl.server.max.receive.size (512 KiB): an anonymous client cannot make
    the server buffer a request of max_request_bytes."""
    mark = server.server.mark()
    with Wire(address(server)) as wire:
        assert handshake(wire, "PLAIN").error_code == ErrorCode.none
        # The server may close before it has all of it.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            wire.send(request_frame(AUTHENTICATE, 2, {"auth_bytes": b"x" * (600 * 1024)}))
        assert wire.is_closed_by_server()
    server.server.wait_for_log("before SASL authentication is over the limit of 524288", mark)
    assert_serves_alice(server)


def test_a_scram_authorization_id_other_than_the_user_is_refused(
        server: SecuredServer) -> None:
    """No acting as another user (Kafka refuses an authzid other than the user; scramp,
    and so compactlog, any authzid: no client tested sends one)."""
    with Wire(address(server)) as wire:
        assert handshake(wire, "SCRAM-SHA-256").error_code == ErrorCode.none
        answer = authenticate(wire, b"n,a=admin,n=alice,r=abcdefghijklmnop")
        assert answer.error_code == ErrorCode.sasl_authentication_failed
        assert "authzid" in answer.error_message
