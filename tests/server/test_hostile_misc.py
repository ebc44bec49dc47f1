"""The lower findings of issue 25, item 14, against a real `compactlog serve`: what a
refusal, a log line, a file mode or the metrics page tell someone who should not know,
and what a broken setting lets through.

Each test names what happened before its fix in its docstring.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path

from kio.schema.errors import ErrorCode

from support.hostile_support import TOPIC, fetch_frame, hostile_server, plain_login, read_response
from support.kafka_server import COMPACTLOG, logged_server
from support.security_support import Pki, secured_server
from support.wire import Wire, request_frame

CREATE_TOPICS, API_VERSIONS = 19, 18


def create_topic(wire: Wire, name: str, configs: dict[str, str]) -> object:
    wire.send(request_frame(CREATE_TOPICS, 5, {
        "topics": [{"name": name, "num_partitions": 1, "replication_factor": 1,
                    "assignments": [],
                    "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
        "timeout": timedelta(seconds=30), "validate_only": False}))
    _, body = wire.response(CREATE_TOPICS, 5)
    return body.topics[0]


def test_a_refused_function_strategy_does_not_echo_the_allow_list(tmp_path: Path) -> None:
    """A client that names a function: strategy the server does not allow gets
    INVALID_CONFIG saying so and which setting allows it, but not what the server
    allows: the allow-list names the code the server runs, which is the operator's.
    Before: the message listed every allowed MODULE:NAME."""
    settings = ('[compaction]\nallowed_strategy_functions = '
                '["acme_internal.billing:latest_invoice"]\n')
    with hostile_server(tmp_path, settings) as hostile, Wire(hostile.address()) as wire:
        answer = create_topic(wire, "x", {"cleanup.policy": "compact",
                                          "compaction.strategy": "function:os:system"})
        assert answer.error_code == ErrorCode.invalid_config, answer
        assert "compaction.allowed_strategy_functions" in answer.error_message
        assert "acme_internal" not in answer.error_message, answer.error_message
        assert not (hostile.data_dir / "topics" / "x").exists()


# -- the admin API's tokens file fails closed ----------------------------------------------


def admin_get(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def test_a_missing_or_unreadable_tokens_file_revokes_every_token(tmp_path: Path) -> None:
    """The admin API's bearer tokens live in a file read again when it changes.
    Deleting it, or putting something unreadable in its place, must revoke the tokens
    (fail closed) as emptying it does, with a log line saying why; restoring it
    restores them. Before: the tokens read earlier stayed valid ("keeping the tokens
    read before")."""
    tokens = tmp_path / "admin-tokens"
    tokens.write_text("User:ops ops-token-0123456789\n")
    settings = f'[authorization]\nadmin_tokens_file = "{tokens}"\n'
    with hostile_server(tmp_path, settings, admin=True) as hostile:
        url = f"{hostile.server.admin_url}/v1/topics"
        assert admin_get(url, "ops-token-0123456789") == 200
        assert admin_get(url, None) == 401
        mark = hostile.server.mark()
        tokens.unlink()
        assert admin_get(url, "ops-token-0123456789") == 401
        hostile.server.wait_for_log(r"admin tokens file .*: .*no token is valid", mark)
        tokens.mkdir()  # unreadable as a file, even to root
        assert admin_get(url, "ops-token-0123456789") == 401
        tokens.rmdir()
        tokens.write_text("User:ops ops-token-0123456789\n")
        assert admin_get(url, "ops-token-0123456789") == 200
        assert "ops-token-0123456789" not in hostile.server.log()


# -- names: full matches, and group ids as file names ----------------------------------------

OFFSET_COMMIT, OFFSET_FETCH = 8, 9


def commit(wire: Wire, group_id: str, offset: int) -> ErrorCode:
    answer = wire.call(OFFSET_COMMIT, 2, {
        "group_id": group_id, "generation_id_or_member_epoch": -1, "member_id": "",
        "retention_time_ms": -1, "topics": [{"name": TOPIC, "partitions": [
            {"partition_index": 0, "committed_offset": offset,
             "committed_metadata": None}]}]})
    code: ErrorCode = answer.topics[0].partitions[0].error_code
    return code


def committed(wire: Wire, group_id: str) -> int:
    answer = wire.call(OFFSET_FETCH, 1, {"group_id": group_id, "topics": [
        {"name": TOPIC, "partition_indexes": [0]}]})
    offset: int = answer.topics[0].partitions[0].committed_offset
    return offset


def test_a_topic_name_ending_in_a_newline_is_refused(tmp_path: Path) -> None:
    """Topic names are checked with a full match: `$` also matches before a final
    newline, so "orders\\n" passed the check and became a directory whose name ends in a
    newline, and log lines that named it were split. Before: created."""
    with hostile_server(tmp_path) as hostile, Wire(hostile.address()) as wire:
        answer = create_topic(wire, "orders\n", {})
        assert answer.error_code == ErrorCode.invalid_topic_exception, answer
        assert not (hostile.data_dir / "topics" / "orders\n").exists()


def test_group_ids_that_look_like_temp_files_or_are_long_keep_their_offsets(
        tmp_path: Path) -> None:
    """Committed offsets live in one file per group, named after the group id. A group
    named ".tmp-orders" had the name of a temporary file, which the next start deletes;
    a group id of 300 characters made a file name longer than the file system allows.
    Both now commit, and find their offsets again after a restart. Before: ".tmp-orders"
    lost its offsets at the restart, and the long id could never commit
    (KAFKA_STORAGE_ERROR, file name too long)."""
    groups = {".tmp-orders": 5, "g" * 300: 7, "é" * 200: 9, "plain": 11}
    with hostile_server(tmp_path) as hostile, Wire(hostile.address()) as wire:
        for group_id, offset in groups.items():
            assert commit(wire, group_id, offset) == ErrorCode.none, group_id[:20]
        data = hostile.data_dir
    with logged_server(data, tmp_path / "again.log") as server, \
            Wire(server.address) as wire:
        assert {g: committed(wire, g) for g in groups} == groups


def test_a_group_file_written_under_its_old_name_is_replaced(tmp_path: Path) -> None:
    """A group id starting with '.' was written under its plain quoted name before; the
    first write under the new name removes that file, so no restart loads both."""
    from compactlog.server.coordinator.offset_files import LocalOffsetFiles

    files = LocalOffsetFiles(tmp_path)
    old = {"group_id": ".orders", "offsets": []}
    (tmp_path / "groups" / ".orders.json").write_text(json.dumps(old))
    assert files.load() == [old]
    new = {"group_id": ".orders", "offsets": [{"topic": "t", "partition": 0, "offset": 3}]}
    files.write(".orders", new)
    assert [p.name for p in (tmp_path / "groups").iterdir()] == ["%2Eorders.json"]
    assert files.load() == [new]


# -- SIGHUP with a FIFO at the certificate path ------------------------------------------


def test_sighup_with_a_fifo_at_the_certificate_path_does_not_hang(tmp_path: Path) -> None:
    """SIGHUP reads the certificate files again. Someone who can write the certificate
    directory puts a FIFO at the certificate's path: opening it for reading waits for a
    writer that never comes. The reload now refuses what is not a regular file, and
    reads the files off the event loop, so every listener keeps answering; the
    certificate in use stays. Before: the event loop blocked in open(), and every
    listener (and SIGTERM) hung until a writer opened the FIFO."""
    pki = Pki(tmp_path / "pki")
    with secured_server(tmp_path, pki, "SSL://127.0.0.1:0") as secured:
        server = secured.server
        cert = Path(str(pki.server.cert))
        saved = cert.read_bytes()
        cert.unlink()
        os.mkfifo(cert)
        mark = server.mark()
        try:
            server.process.send_signal(signal.SIGHUP)
            server.wait_for_log("TLS reload failed", mark)
            with Wire(server.address, timeout=5) as wire:
                assert wire.call(API_VERSIONS, 3, {"client_software_name": "t",
                                                   "client_software_version": "1"}
                                 ).error_code == ErrorCode.none
        finally:
            with contextlib.suppress(OSError):  # a reader hangs on it before the fix
                os.close(os.open(cert, os.O_WRONLY | os.O_NONBLOCK))
            cert.unlink()
            cert.write_bytes(saved)
        assert "not a regular file" in server.log_since(mark)


# -- the credential files: private, and no deleted user's keys -----------------------------


def modes(root: Path) -> dict[str, int]:
    """Every directory and file under `root` (itself included), by relative path: its
    permission bits."""
    found = {".": root.stat().st_mode & 0o777}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = path.stat().st_mode & 0o777
    return found


def test_credential_files_are_private_and_forget_deleted_users(tmp_path: Path) -> None:
    """`<data>/security/` holds the SCRAM keys (which let their holder impersonate the
    server to a client, and be attacked offline) and the decoy secret: it is made
    0700, its files 0600, whatever the umask. A deleted user's keys leave every file,
    the audit copies of earlier versions included. Before: 0755 and 0644 (world
    readable under the usual umask), and the last 8 versions kept every deleted
    user's StoredKey and ServerKey."""
    with hostile_server(tmp_path, sasl=True) as hostile:
        security = hostile.data_dir / "security"
        document = json.loads((security / "scram" / "current.json").read_text())
        keys = document["body"]["users"]["alice"]["SCRAM-SHA-256"]
        found = modes(security)
        assert {path: mode for path, mode in found.items()
                if mode not in (0o700, 0o600)} == {}, found
        assert all(mode == 0o700 for path, mode in found.items()
                   if (security / path).is_dir())
        result = subprocess.run([COMPACTLOG, "--data-dir", str(hostile.data_dir), "users",
                                 "delete", "alice"], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stderr
        for path in (security / "scram").iterdir():
            if path.is_file():
                text = path.read_text()
                assert keys["stored_key"] not in text and keys["server_key"] not in text, \
                    f"{path.name} still holds alice's keys"
        assert {p: m for p, m in modes(security).items() if m not in (0o700, 0o600)} == {}


# -- client strings in the server's log --------------------------------------------------

FORGED = "\n2026-01-01 00:00:00,000 INFO compactlog.server: SASL/PLAIN authenticated User:root"
FETCH = 1


def test_client_strings_cannot_forge_log_lines(tmp_path: Path) -> None:
    """Names a client chooses reach the server's log: a topic denied by the authorizer,
    a group id. Control characters in them are escaped, so no line of the log is the
    client's. And AlterUserScramCredentials refuses the user names the CLI refuses
    (control characters, over 255 characters) with UNACCEPTABLE_CREDENTIAL. Before: a
    newline in a name started a line of the client's own making, and such a user could
    be made, then logged on every login."""
    settings = "[authorization]\nenabled = true\nsuper_users = [\"User:alice\"]\n"
    with hostile_server(tmp_path, settings, sasl=True) as hostile:
        mark = hostile.server.mark()
        with Wire(hostile.address()) as wire:  # User:ANONYMOUS: no ACL, denied
            wire.send(fetch_frame([("made-up" + FORGED, 0, 0)]))
            read_response(wire, FETCH, 12)
        with Wire(hostile.address("SASL_PLAINTEXT")) as wire:
            plain_login(wire)
            answer = wire.call(51, 0, {"deletions": [], "upsertions": [
                {"name": "mallory" + FORGED, "mechanism": 1, "iterations": 4096,
                 "salt": b"salt" * 6, "salted_password": b"k" * 32}]})
            assert answer.results[0].error_code == ErrorCode.unacceptable_credential, answer
            wire.call(11, 5, {"group_id": "g" + FORGED, "member_id": "",
                              "group_instance_id": None,
                              "session_timeout": timedelta(seconds=10),
                              "rebalance_timeout": timedelta(seconds=10),
                              "protocol_type": "consumer",
                              "protocols": [{"name": "range", "metadata": b"\0" * 10}]})
        hostile.server.wait_for_log(r"made-up\\n2026", mark)
        lines = hostile.server.log_since(mark).splitlines()
        forged = [line for line in lines if line.startswith("2026-01-01")]
        assert forged == [], forged


# -- /metrics with the authorizer on ------------------------------------------------------


def scrape(url: str, token: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=30) as response:
        return str(response.read().decode())


def test_metrics_show_only_what_the_principal_may_describe(tmp_path: Path) -> None:
    """With the authorizer on, /metrics (open to anyone by default, as /v1/health)
    names topics and groups, their offsets and lag, only where the principal may
    DESCRIBE them, as Metadata and ListGroups do: an anonymous scrape sees the topic
    User:ANONYMOUS may describe and not the other; a scraper with a token for a super
    user sees both. Server-wide figures are shown to every scrape. Before: every topic,
    end offset and group lag, to anyone."""
    tokens = tmp_path / "admin-tokens"
    tokens.write_text("User:prometheus scrape-token-0123456789\n")
    settings = ("[authorization]\nenabled = true\nsuper_users = [\"User:prometheus\"]\n"
                f'admin_tokens_file = "{tokens}"\n')
    with hostile_server(tmp_path, settings, admin=True, extra_topics=1) as hostile:
        url = f"{hostile.server.admin_url}/metrics"
        granted = subprocess.run(
            [COMPACTLOG, "--data-dir", str(hostile.data_dir), "acls", "add", "--principal",
             "User:ANONYMOUS", "--operation", "describe", "--topic", TOPIC],
            capture_output=True, text=True, timeout=60)
        assert granted.returncode == 0, granted.stderr
        deadline = time.monotonic() + 10
        while f'topic="{TOPIC}"' not in (text := scrape(url)):
            assert time.monotonic() < deadline, "the ACL never took effect"
            time.sleep(0.2)
        assert 'topic="t0000"' not in text
        assert "compactlog_server_requests_total" in text
        everything = scrape(url, "scrape-token-0123456789")
        assert f'topic="{TOPIC}"' in everything and 'topic="t0000"' in everything
