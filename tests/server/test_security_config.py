"""Security settings: listeners as Kafka's `listeners` (with the old single `listen`
still the default PLAINTEXT listener), TLS settings, and `compactlog users` without a
server. A bad setting stops `compactlog serve` with one line naming it."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from compactlog.cli.serve import build_listeners, load_settings
from compactlog.errors import UserError
from compactlog.server.security.credentials import CredentialStore
from support.kafka_server import COMPACTLOG


def names(listeners: list[object]) -> list[tuple[str, str, str, int]]:
    return [(lis.name, lis.protocol, lis.host, lis.port)  # type: ignore[attr-defined]
            for lis in listeners]


def test_the_old_listen_is_the_default_plaintext_listener() -> None:
    assert names(build_listeners({}, None, ())) == [("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092)]
    assert names(build_listeners({"listen": "0.0.0.0:1"}, None, ())) == [
        ("PLAINTEXT", "PLAINTEXT", "0.0.0.0", 1)]


def test_listeners_replace_it_unless_listen_is_set() -> None:
    assert names(build_listeners({"listeners": ["SASL_SSL://0.0.0.0:9094"]}, None, ())) == [
        ("SASL_SSL", "SASL_SSL", "0.0.0.0", 9094)]
    assert names(build_listeners({"listeners": ["SSL://:9093"]}, "127.0.0.1:9092",
                                 ("SASL_PLAINTEXT://[::1]:0",))) == [
        ("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9092), ("SSL", "SSL", "0.0.0.0", 9093),
        ("SASL_PLAINTEXT", "SASL_PLAINTEXT", "::1", 0)]


def test_named_listeners_and_their_settings(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text('listeners = ["INTERNAL://127.0.0.1:0", "SASL_SSL://0.0.0.0:9094"]\n'
                    '[listener.INTERNAL]\nsecurity_protocol = "SASL_PLAINTEXT"\n'
                    'sasl_mechanisms = ["SCRAM-SHA-512"]\n'
                    '[listener.SASL_SSL]\nadvertised = "kafka.example.com:19094"\n')
    listeners = build_listeners(load_settings(path), None, ())
    internal, public = listeners
    assert (internal.protocol, internal.sasl_mechanisms) == ("SASL_PLAINTEXT",
                                                             ("SCRAM-SHA-512",))
    assert public.advertised == ("kafka.example.com", 19094)


@pytest.mark.parametrize(("text", "message"), [
    ("INTERNAL://h:1", "INTERNAL is not a security protocol"),
    ("SASL_SSL:/h:1", "a listener is NAME://HOST:PORT"),
    ("SSL://h:x", "the address must be HOST:PORT"),
    ("SSL://h:70000", "port 70000 is not in 0..65535"),
])
def test_bad_listeners_are_named(text: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        build_listeners({}, None, (text,))


def serve(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([COMPACTLOG, "--data-dir", str(data_dir), "serve",
                           "--no-auto-compaction", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("args", "message"), [
    (("--listener", "SSL://127.0.0.1:0"), "listener SSL (SSL) needs TLS"),
    (("--listener", "SSL://127.0.0.1:0", "--tls-cert", "missing.pem", "--tls-key", "k"),
     "TLS: cannot load the certificate missing.pem"),
    (("--tls-cert", "c.pem"), "TLS needs both a certificate and a key"),
    (("--listener", "PLAINTEXT://127.0.0.1:0"), "two listeners are named PLAINTEXT"),
])
def test_bad_security_settings_stop_the_server_with_one_line(
        tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    extra = ("--listen", "127.0.0.1:0") if "PLAINTEXT://" in " ".join(args) else ()
    result = serve(tmp_path / "data", *extra, *args)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr


def test_mechanisms_of_a_listener_are_checked(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text('listeners = ["SASL_PLAINTEXT://127.0.0.1:0"]\n'
                    '[listener.SASL_PLAINTEXT]\nsasl_mechanisms = ["GSSAPI"]\n')
    result = serve(tmp_path / "data", "--config", str(path))
    assert result.returncode == 1
    assert "unknown SASL mechanism 'GSSAPI'" in result.stderr


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str  # the one-line error `compactlog` prints


def users(data_dir: Path, *args: str, stdin: str | None = None) -> Ran:
    """`compactlog users ...`, in this process (click's runner): as the CLI, faster."""
    from click.testing import CliRunner

    from compactlog.cli import cli
    from compactlog.errors import CompactlogError

    result = CliRunner().invoke(cli, ["--data-dir", str(data_dir), "users", *args],
                                input=stdin)
    error = result.exception
    if isinstance(error, CompactlogError):
        return Ran(1, result.stdout, f"error: {error}")
    assert error is None or isinstance(error, SystemExit), error
    return Ran(result.exit_code, result.stdout, "")


def test_users_cli_without_a_server(tmp_path: Path) -> None:
    data = tmp_path / "data"
    assert users(data, "list").stdout.strip() == "no users"
    added = users(data, "add", "alice", "--password-stdin", stdin="pw-alice-1\n")
    assert added.returncode == 0, added.stderr
    added = users(data, "add", "bob", "--mechanism", "SCRAM-SHA-512", "--iterations", "4096",
                  "--password-stdin", stdin="pw-bob-1\n")
    assert added.returncode == 0, added.stderr
    listed = users(data, "list").stdout
    assert "alice\tSCRAM-SHA-256 (8192 iterations), SCRAM-SHA-512 (8192 iterations)" in listed
    assert "bob\tSCRAM-SHA-512 (4096 iterations)" in listed
    stored = (data / "security" / "scram" / "current.json").read_text()
    assert "pw-alice-1" not in stored and "pw-bob-1" not in stored
    body = json.loads(stored)["body"]["users"]["alice"]["SCRAM-SHA-256"]
    assert set(body) == {"salt", "iterations", "stored_key", "server_key"}
    store = CredentialStore(data)
    assert store.verify_password("alice", "pw-alice-1")
    assert not store.verify_password("alice", "pw-bob-1")
    assert users(data, "delete", "bob", "--mechanism", "SCRAM-SHA-256").returncode == 1
    assert users(data, "delete", "alice").returncode == 0
    assert "alice" not in users(data, "list").stdout
    bad = users(data, "add", "carol", "--iterations", "10", "--password-stdin", stdin="x\n")
    assert bad.returncode == 1 and "iterations must be in [4096, 16384]" in bad.stderr


def test_cli_writes_need_a_plaintext_listener_of_a_running_server(tmp_path: Path) -> None:
    import os
    import subprocess
    import time

    data = tmp_path / "data"
    only_sasl = tmp_path / "only.toml"
    only_sasl.write_text('listeners = ["SASL_PLAINTEXT://127.0.0.1:0"]\n')

    process = subprocess.Popen([COMPACTLOG, "--data-dir", str(data), "serve",
                                "--no-auto-compaction", "--config", str(only_sasl)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        assert "serving on" in process.stdout.readline()
        deadline = time.monotonic() + 30
        while not (data / "server.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        result = subprocess.run([COMPACTLOG, "--data-dir", str(data), "topics", "create", "t"],
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        assert "the server has no PLAINTEXT listener" in result.stderr, result.stderr
    finally:
        process.terminate()
        process.wait(60)
    assert process.returncode == 0
