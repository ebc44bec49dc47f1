"""Start `compactlog serve` on 127.0.0.1 and an ephemeral port, as a real subprocess."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

COMPACTLOG = shutil.which("compactlog", path=str(Path(sys.executable).parent)) or "compactlog"


@contextmanager
def running_server(data_dir: Path, *extra: str) -> Iterator[str]:
    """Yield the bootstrap address; stop the server with SIGTERM and check it exits 0."""
    data_dir.mkdir(parents=True, exist_ok=True)
    # The log goes to a file: a pipe nobody reads would fill up and block the server.
    log_path = data_dir.parent / f"server-{os.getpid()}-{time.monotonic_ns()}.log"
    log_file = log_path.open("w")
    process = subprocess.Popen(
        [COMPACTLOG, "--data-dir", str(data_dir), "--log-level", "info", "serve",
         "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE, stderr=log_file, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"serving on ([\d.]+):(\d+)", line)
    if not match:
        process.kill()
        process.communicate(timeout=30)
        log_file.close()
        raise RuntimeError(f"the server did not start: {line!r} {log_path.read_text()}")
    try:
        yield f"{match.group(1)}:{match.group(2)}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        finally:
            log_file.close()
        assert process.returncode == 0, log_path.read_text()[-5000:]
