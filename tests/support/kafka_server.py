"""Start `compactlog serve` on 127.0.0.1 and an ephemeral port, as a real subprocess."""

from __future__ import annotations

import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafka import KafkaAdminClient
from kafka.admin import NewTopic

COMPACTLOG = shutil.which("compactlog", path=str(Path(sys.executable).parent)) or "compactlog"


# -- the server, with a log that can be read while it runs ----------------------------

class LoggedServer:
    """`compactlog serve` on 127.0.0.1 and an ephemeral port; stderr goes to a file."""

    def __init__(self, process: subprocess.Popen[str], host: str, port: int,
                 log_path: Path, admin_url: str | None = None) -> None:
        self.process = process
        self.host = host
        self.port = port
        self.log_path = log_path
        self.admin_url = admin_url  # with --admin-listen

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def mark(self) -> int:
        """A position in the log; `log_since` reads what came after it."""
        return self.log_path.stat().st_size

    def log_since(self, mark: int) -> str:
        with self.log_path.open("rb") as file:
            file.seek(mark)
            return file.read().decode(errors="replace")

    def wait_for_log(self, pattern: str, mark: int, timeout: float = 10.0) -> str:
        """The first log line after `mark` that matches `pattern`; fail after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            for line in self.log_since(mark).splitlines():
                if re.search(pattern, line):
                    return line
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no log line matching {pattern!r}; the log since the test began:\n"
                    f"{self.log_since(mark)}")
            time.sleep(0.02)

    def assert_running(self) -> None:
        assert self.process.poll() is None, (
            f"the server exited with {self.process.returncode}:\n{self.log()}")


@contextmanager
def logged_server(data_dir: Path | str, log_path: Path, *extra: str,
                  env: dict[str, str] | None = None,
                  open_files: int | None = None) -> Iterator[LoggedServer]:
    """Start the server; stop it with SIGTERM and check that it exits 0. Automatic
    compaction is off unless `extra` holds --auto-compaction (a Spark run starting
    behind a test's back would race the test's own compactions). `open_files` sets the
    server's RLIMIT_NOFILE (as `ulimit -n` would)."""
    if "--auto-compaction" not in extra:
        extra = ("--no-auto-compaction", *extra)
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [COMPACTLOG, "--data-dir", str(data_dir), "--log-level", "info", "serve",
             "--listen", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE, stderr=log_file, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=None if open_files is None else lambda: resource.setrlimit(
                resource.RLIMIT_NOFILE, (open_files, open_files)),
        )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"serving on ([\d.]+):(\d+)", line)
    if not match:
        process.kill()
        process.wait(30)
        raise RuntimeError(f"the server did not start: {line!r}\n{log_path.read_text()}")
    admin_url = None
    if any(arg.startswith("--admin-listen") for arg in extra):
        admin = re.search(r"admin on (https?://\S+)", process.stdout.readline())
        assert admin, log_path.read_text()
        admin_url = admin.group(1)
    server = LoggedServer(process, match.group(1), int(match.group(2)), log_path, admin_url)
    try:
        yield server
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        finally:
            process.stdout.close()
        assert process.returncode == 0, server.log()


@contextmanager
def running_server(data_dir: Path, *extra: str) -> Iterator[str]:
    """Yield the bootstrap address; stop the server with SIGTERM and check it exits 0.
    The log goes to a file beside the data directory."""
    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir.parent / f"server-{os.getpid()}-{time.monotonic_ns()}.log"
    with logged_server(data_dir, log_path, *extra) as server:
        yield server.bootstrap


def create_topic(bootstrap: str, name: str, partitions: int, config: dict[str, str]) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config)])
    finally:
        admin.close()
