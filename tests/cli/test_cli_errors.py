"""Errors that name the thing and the place (issue 24, item 5): a missing data
directory, the directory or bucket an unknown topic was looked for in, a port in use,
S3 errors on `topics list` as the other commands give them; the README's wait for a
server that fails to start ends; `serve` says when it stops."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
from pathlib import Path

from support.cli import ok, run
from support.kafka_server import COMPACTLOG
from support.paths import ROOT
from support.s3_support import S3Server


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 1, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "unexpected" not in lines[0] and "Traceback" not in result.stderr
    return lines[0]


def test_topics_list_refuses_a_missing_data_directory(tmp_path: Path) -> None:
    missing = tmp_path / "mistyped"
    line = one_error_line(run(missing, "topics", "list"))
    assert f"no compactlog data directory at {missing}" in line
    assert line == one_error_line(run(missing, "consume", "t"))  # as every command


def test_an_unknown_topic_names_the_data_directory(tmp_path: Path) -> None:
    ok(run(tmp_path, "topics", "create", "prices"))
    for args in (["consume", "pricse"], ["topics", "describe", "pricse"],
                 ["produce", "pricse"], ["compaction-status", "pricse"]):
        line = one_error_line(run(tmp_path, *args, stdin="k\tv\n"))
        assert f"unknown topic 'pricse' in the data directory {tmp_path}" in line, line


def test_an_unknown_topic_on_s3_names_the_bucket(s3: S3Server, tmp_path: Path) -> None:
    where = str(s3.location("data"))
    env = {**s3.env, "COMPACTLOG_DATA_DIR": where, "HOME": str(tmp_path),
           "COMPACTLOG_LOCAL_DIR": str(tmp_path / "local")}
    ok(run(tmp_path, "topics", "create", "prices", env=env))
    line = one_error_line(run(tmp_path, "consume", "pricse", env=env))
    assert f"unknown topic 'pricse' in {where}" in line, line


def test_topics_list_on_s3_gives_the_documented_errors(s3: S3Server, tmp_path: Path) -> None:
    env = {**s3.env, "COMPACTLOG_DATA_DIR": "s3://no-such-bucket/data", "HOME": str(tmp_path),
           "COMPACTLOG_LOCAL_DIR": str(tmp_path / "local")}
    line = one_error_line(run(tmp_path, "topics", "list", env=env))
    # docs/object-storage.md, "Errors a user sees": the bucket does not exist.
    assert "bucket 'no-such-bucket' does not exist at" in line, line
    assert "s3://no-such-bucket/data" in line and "botocore" not in line


def busy_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


def test_a_port_in_use_is_one_line_naming_the_address(tmp_path: Path) -> None:
    with busy_port() as sock:
        port = sock.getsockname()[1]
        line = one_error_line(run(tmp_path / "data", "serve", "--listen", f"127.0.0.1:{port}",
                                  "--no-auto-compaction", timeout=60))
        assert f"127.0.0.1:{port}" in line and "in use" in line, line
        admin = one_error_line(run(tmp_path / "data", "serve", "--listen", "127.0.0.1:0",
                                   "--admin-listen", f"127.0.0.1:{port}",
                                   "--no-auto-compaction", timeout=60))
        assert f"127.0.0.1:{port}" in admin and "in use" in admin, admin


def wait_loops() -> list[str]:
    """Every shell loop in the docs that waits for a server to write server.json."""
    found = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        found += [line.strip() for line in page.read_text().splitlines()
                  if re.match(r"\s*until \[ -f .*server\.json \]", line)]
    assert found, "no wait loop found in the docs"
    return found


def test_the_docs_wait_for_a_server_stops_when_it_fails_to_start(tmp_path: Path) -> None:
    bin_dir = str(Path(COMPACTLOG).parent)
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ["PATH"]}
    with busy_port() as sock:
        port = sock.getsockname()[1]
        for number, loop in enumerate(sorted(set(wait_loops()))):
            # The loop as written, on a data directory of this test's.
            server_json = re.search(r"-f (\S+server\.json)", loop).group(1)  # type: ignore[union-attr]
            data = tmp_path / f"data-{number}"
            loop = loop.replace(server_json, f"{data}/server.json")
            script = (f"compactlog --data-dir {data} serve --listen 127.0.0.1:{port} & "
                      f"server=$!\n{loop}\necho waited\n")
            done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env,
                                  capture_output=True, text=True, timeout=60)
            assert "waited" in done.stdout, (loop, done.stderr)
            assert "in use" in done.stderr


def test_serve_says_when_it_stops(tmp_path: Path) -> None:
    process = subprocess.Popen([COMPACTLOG, "--data-dir", str(tmp_path / "data"), "serve",
                                "--listen", "127.0.0.1:0", "--no-auto-compaction"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert "compactlog serving on" in process.stdout.readline()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "compactlog stopped" in out, out
