"""`compactlog serve` processes on one s3:// URL, each with a local directory of its own,
for the fail-over tests."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support.paths import ROOT

COMPACTLOG = str(ROOT / ".venv" / "bin" / "compactlog")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    def __init__(self, process: subprocess.Popen[str], log_path: Path) -> None:
        self.process = process
        self.log_path = log_path
        self.serving = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if re.search(r"serving on", line):
                self.serving.set()

    def log(self) -> str:
        return self.log_path.read_text()


@contextmanager
def serve(where: str, local: Path, port: int, config: Path, log_path: Path,
          env: dict[str, str]) -> Iterator[Served]:
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [COMPACTLOG, "--data-dir", where, "--log-level", "info", "serve",
             "--listen", f"127.0.0.1:{port}", "--no-auto-compaction", "--config", str(config)],
            stdout=subprocess.PIPE, stderr=log_file, text=True,
            env={**os.environ, **env, "COMPACTLOG_LOCAL_DIR": str(local),
                 "PYTHONUNBUFFERED": "1"})
    try:
        yield Served(process, log_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(30)
        assert process.stdout is not None
        process.stdout.close()
