"""Start `compactlog serve` on 127.0.0.1 and an ephemeral port, as a real subprocess."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

COMPACTLOG = shutil.which("compactlog", path=str(Path(sys.executable).parent)) or "compactlog"


@contextmanager
def running_server(data_dir: Path, *extra: str) -> Iterator[str]:
    """Yield the bootstrap address; stop the server with SIGTERM and check it exits 0."""
    process = subprocess.Popen(
        [COMPACTLOG, "--data-dir", str(data_dir), "--log-level", "info", "serve",
         "--listen", "127.0.0.1:0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    match = re.search(r"serving on ([\d.]+):(\d+)", line)
    if not match:
        process.kill()
        _, err = process.communicate(timeout=30)
        raise RuntimeError(f"the server did not start: {line!r} {err}")
    try:
        yield f"{match.group(1)}:{match.group(2)}"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            _, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        assert process.returncode == 0, err
