"""What a client without a credential learns and costs during SASL (issue 25, items 8
and 9), against a real `compactlog serve` with a SASL_PLAINTEXT listener: no S3 request
per login attempt, and an unknown user indistinguishable from a real one, by the
server's CPU per failed PLAIN attempt and by SCRAM's server-first message.

Each test names the numbers measured before its fix in its docstring.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode
from scramp import ScramClient

from support.hostile_support import SASL_AUTHENTICATE, SASL_HANDSHAKE, hostile_server
from support.kafka_server import COMPACTLOG, logged_server
from support.process_usage import cpu_seconds
from support.s3_faults import S3Proxy
from support.security_support import PASSWORD, _listeners
from support.wire import Wire

NO_DELAY = "sasl_failure_delay_s = 0.0\n"


def server_first(address: tuple[str, int], user: str,
                 mechanism: str = "SCRAM-SHA-256") -> dict[str, str]:
    """The attributes of the server-first message the server answers `user`'s
    client-first with (r: nonce, s: salt, i: iterations)."""
    client = ScramClient([mechanism], user, "any password")
    with Wire(address) as wire:
        assert wire.call(SASL_HANDSHAKE, 1, {"mechanism": mechanism}).error_code == 0
        answer = wire.call(SASL_AUTHENTICATE, 2,
                           {"auth_bytes": client.get_client_first().encode()})
        assert answer.error_code == ErrorCode.none, answer
        text = bytes(answer.auth_bytes).decode()
    return dict(part.split("=", 1) for part in text.split(","))


def plain_fails(address: tuple[str, int], user: str, password: str) -> None:
    with Wire(address) as wire:
        assert wire.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
        answer = wire.call(SASL_AUTHENTICATE, 2, {
            "auth_bytes": b"\0" + user.encode() + b"\0" + password.encode()})
        assert answer.error_code == ErrorCode.sasl_authentication_failed, answer


def scram_succeeds(address: tuple[str, int], user: str, password: str) -> bool:
    client = ScramClient(["SCRAM-SHA-256"], user, password)
    with Wire(address) as wire:
        wire.call(SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-256"})
        first = wire.call(SASL_AUTHENTICATE, 2,
                          {"auth_bytes": client.get_client_first().encode()})
        client.set_server_first(bytes(first.auth_bytes).decode())
        final = wire.call(SASL_AUTHENTICATE, 2,
                          {"auth_bytes": client.get_client_final().encode()})
        return bool(final.error_code == ErrorCode.none)


# -- item 9: no user enumeration ---------------------------------------------------------


def test_a_failed_plain_login_costs_the_same_for_an_unknown_user(tmp_path: Path) -> None:
    """PLAIN checks a password by PBKDF2 (8192 iterations of SHA-512 for a user made
    with the defaults); an unknown user must cost the same, or the server's time to
    fail tells who exists. Measured as server CPU over 40 failed logins each. Before:
    0.04 s for unknown users against 0.23 s for alice (no PBKDF2 ran for them); now
    0.21 s for both."""
    with hostile_server(tmp_path, NO_DELAY, sasl=True) as hostile:
        address = hostile.address("SASL_PLAINTEXT")
        cost: dict[str, float] = {}
        for user in ("alice", "nobody", "alice", "nobody"):  # twice, interleaved
            before = cpu_seconds(hostile.pid)
            for attempt in range(20):
                plain_fails(address, user if user == "alice" else f"{user}{attempt}",
                            "wrong password")
            cost[user] = cost.get(user, 0.0) + cpu_seconds(hostile.pid) - before
        print(f"server CPU for 40 failed PLAIN logins: alice {cost['alice']:.2f} s, "
              f"unknown users {cost['nobody']:.2f} s")
        assert cost["alice"] > 0.05, cost  # PBKDF2 ran
        assert cost["nobody"] > 0.6 * cost["alice"], cost


def test_scram_answers_an_unknown_user_as_a_real_one(tmp_path: Path) -> None:
    """SCRAM's server-first names the user's salt and iteration count. An unknown user
    gets the iteration count most real users have (here every user was made with
    16384) and a salt of the same length that stays the same for that name, across
    attempts and across a restart of the server, as a real user's does. Before: unknown
    users got 8192 whatever the real users had, and a new salt after each restart."""
    data = tmp_path / "data"
    for number, user in enumerate(("alice", "bob", "carol")):
        iterations = "4096" if number == 2 else "16384"
        _add(data, user, "--iterations", iterations)
    seen: list[dict[str, dict[str, str]]] = []
    for restart in range(2):
        with logged_server(data, tmp_path / f"server-{restart}.log",
                           "--listener", "SASL_PLAINTEXT://127.0.0.1:0"):
            host, port = _listeners(data)["SASL_PLAINTEXT"].rsplit(":", 1)
            address = (host, int(port))
            seen.append({user: server_first(address, user)
                         for user in ("alice", "bob", "mallory", "trudy")})
            again = server_first(address, "mallory")
            assert again["s"] == seen[-1]["mallory"]["s"]
            assert again["r"] != seen[-1]["mallory"]["r"]  # a fresh nonce all the same
    first, second = seen
    for user in ("mallory", "trudy"):
        assert first[user]["i"] == first["alice"]["i"] == "16384", first
        assert len(first[user]["s"]) == len(first["alice"]["s"]), first
        assert second[user]["s"] == first[user]["s"], "an unknown user's salt changed"
    assert first["mallory"]["s"] != first["trudy"]["s"]
    assert second["alice"]["s"] == first["alice"]["s"]


def _add(data: Path | str, user: str, *options: str, env: dict[str, str] | None = None) -> None:
    result = subprocess.run([COMPACTLOG, "--data-dir", str(data), "users", "add", user,
                             "--password-stdin", *options], input=PASSWORD + "\n",
                            text=True, capture_output=True, timeout=60, env=env)
    assert result.returncode == 0, result.stderr


# -- item 8: credential lookups never wait for S3 on the event loop ----------------------


@pytest.fixture
def s3_sasl_server(tmp_path: Path, s3_proxy: S3Proxy) -> Iterator[tuple[S3Proxy, tuple[
        str, int], dict[str, str], str]]:
    """A server on S3 (through the fault proxy, which counts requests) with a
    SASL_PLAINTEXT listener and user alice; upkeep every 2 s."""
    where = str(s3_proxy.server.location("sasl"))
    local = tmp_path / "local"
    env = {**s3_proxy.env, "COMPACTLOG_LOCAL_DIR": str(local)}
    _add(where, "alice", env={**env, "COMPACTLOG_LOCAL_DIR": str(tmp_path / "cli")})
    config = tmp_path / "server.toml"
    config.write_text("upkeep_interval_s = 2.0\n" + NO_DELAY)
    with logged_server(where, tmp_path / "server.log", "--config", str(config),
                       "--listener", "SASL_PLAINTEXT://127.0.0.1:0", env=env):
        host, port = _listeners(local)["SASL_PLAINTEXT"].rsplit(":", 1)
        yield s3_proxy, (host, int(port)), env, where


def test_scram_client_first_makes_no_s3_request(
        s3_sasl_server: tuple[S3Proxy, tuple[str, int], dict[str, str], str],
        tmp_path: Path) -> None:
    """On S3, each SCRAM client-first looked its user up with a HEAD of the credential
    document, on the event loop: four unauthenticated loops raised another client's
    latency a hundredfold. Now the server answers from a copy in memory that upkeep
    refreshes (one HEAD per round, off the loop), as it does the ACLs. Before: 40
    client-firsts, 40 requests for the credential document; now none (upkeep's one
    per round aside)."""
    proxy, address, env, where = s3_sasl_server
    mark = proxy.mark()
    began = time.monotonic()
    for attempt in range(20):
        for user in ("alice", f"nobody{attempt}"):
            assert server_first(address, user)["i"] == "8192"
    rounds = (time.monotonic() - began) / 2.0
    asked = proxy.requests(key=r"security/scram", since=mark)
    print(f"40 SCRAM client-firsts in {rounds * 2:.1f} s: {len(asked)} requests for the "
          f"credential document")
    assert len(asked) <= rounds + 2, [(s.method, s.key) for s in asked]
    # A user added meanwhile can log in once upkeep has read the change.
    _add(where, "bob", env={**env, "COMPACTLOG_LOCAL_DIR": str(tmp_path / "cli2")})
    deadline = time.monotonic() + 10
    while not scram_succeeds(address, "bob", PASSWORD):
        assert time.monotonic() < deadline, "bob never could log in"
        time.sleep(0.2)
