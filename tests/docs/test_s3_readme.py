"""The README's "Running on object storage" example runs as written against moto's S3
server on loopback: only the bucket URL, the local directory and the port change."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from support.paths import ROOT
from support.s3_support import (
    SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    S3Server,
)


def example() -> str:
    readme = (ROOT / "README.md").read_text()
    after = readme.split("<!-- s3-example:shell -->", 1)[1]
    found = re.search(r"```bash\n(.*?)```", after, re.S)
    assert found is not None
    return found.group(1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.skipif(shutil.which("kcat") is None, reason="needs kcat")
def test_the_readme_object_storage_example_works(s3: S3Server, tmp_path: Path) -> None:
    script = example()
    where = str(s3.location("readme"))
    port = str(free_port())
    script = (script.replace("s3://my-bucket/compactlog", where)
              .replace("/var/lib/compactlog", str(tmp_path / "local"))
              .replace("9092", port))
    bin_dir = str(ROOT / ".venv" / "bin")
    env = {**os.environ, **s3.env, "PATH": bin_dir + os.pathsep + os.environ["PATH"],
           "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("COMPACTLOG_DATA_DIR", None)
    env.pop("COMPACTLOG_LOCAL_DIR", None)
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env,
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    compacted = [json.loads(line) for line in lines if line.startswith("{")]
    assert sorted((r["key"], r["value"]) for r in compacted) == [
        ("AAPL", "190.1"), ("MSFT", "410.2")]
    assert {"AAPL=190.1", "MSFT=410.2"} <= set(lines)
    for secret in (SECRET_ACCESS_KEY, SESSION_TOKEN):
        assert secret not in done.stdout + done.stderr
