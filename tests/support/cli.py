"""The `compactlog` command, run as users run it (the installed console script), for the CLI
tests and every test that drives a server or a store through the command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from support.paths import TESTS_DIR

COMPACTLOG = shutil.which("compactlog", path=str(Path(sys.executable).parent)) or "compactlog"


def run(
    data_dir: Path, *args: str, stdin: str = "", env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("COMPACTLOG_DATA_DIR", None)
    if env and "COMPACTLOG_DATA_DIR" in env:
        full_env["COMPACTLOG_DATA_DIR"] = env["COMPACTLOG_DATA_DIR"]
        prefix: list[str] = []
    else:
        prefix = ["--data-dir", str(data_dir)]
    return subprocess.run(
        [COMPACTLOG, *prefix, *args], input=stdin, capture_output=True, text=True, timeout=timeout,
        env=full_env,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


def consume_json(data_dir: Path, topic: str, *extra: str) -> list[dict[str, object]]:
    out = ok(run(data_dir, "consume", topic, "--format", "json", *extra))
    return [json.loads(line) for line in out.splitlines()]


# Compaction by tests/local_engine.py, which the command imports from the PYTHONPATH in ENV.
LOCAL = ["--service", "local_engine:LocalCompactionServiceFactory"]
ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR),
                                                   os.environ.get("PYTHONPATH")]))}
TOPIC_CONFIG = ["-c", "cleanup.policy=compact", "-c", "segment.bytes=2048",
                "-c", "min.compaction.lag.ms=0", "-c", "delete.retention.ms=0"]


def assert_fits(text: str, *whole: str) -> None:
    for line in text.splitlines():
        assert len(line) <= 80, f"{len(line)} columns: {line!r}"
    assert "…" not in text, text
    for value in whole:
        assert value in text, f"{value!r} not shown whole:\n{text}"
