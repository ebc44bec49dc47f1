"""The README's security example runs as written: openssl makes the CA and the server
certificate, `compactlog users add` a SCRAM user, `compactlog serve` a SASL_SSL
listener beside the PLAINTEXT one, kcat and confluent-kafka produce and consume over
it; then the authorization example: ACLs on, alice granted with `compactlog acls`, an
anonymous client sees no topic. Only the ports change (free ones for 9092 and 9094)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.paths import ROOT


def blocks() -> tuple[str, str, str]:
    readme = (ROOT / "README.md").read_text()
    found = []
    for name in ("shell", "python", "end"):
        after = readme.split(f"<!-- security-example:{name} -->", 1)[1]
        found.append(re.search(r"```\w+\n(.*?)```", after, re.S).group(1))  # type: ignore[union-attr]
    return found[0], found[1], found[2]


def authorization_blocks() -> tuple[str, str]:
    readme = (ROOT / "README.md").read_text()
    found = []
    for name in ("toml", "shell"):
        after = readme.split(f"<!-- authorization-example:{name} -->", 1)[1]
        found.append(re.search(r"```\w+\n(.*?)```", after, re.S).group(1))  # type: ignore[union-attr]
    return found[0], found[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("kcat") is None or shutil.which("openssl") is None,
                    reason="needs kcat and openssl")
def test_the_readme_security_example_works(tmp_path: Path) -> None:
    shell, python, end = blocks()
    toml, authorization = authorization_blocks()
    (tmp_path / "server.toml").write_text(toml)
    ports = {"9092": str(free_port()), "9094": str(free_port())}
    script = shell + end + 'echo "--- authorization"\n' + authorization
    for old, new in ports.items():
        script = script.replace(old, new)
        python = python.replace(old, new)
    (tmp_path / "hello_sasl.py").write_text(python)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    try:
        result = subprocess.run(["bash", "-euc", script], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=180)
    finally:
        info = tmp_path / "data" / "server.json"
        if info.exists():  # the script failed before its `kill $server`
            pid = json.loads(info.read_text())["pid"]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "AAPL 189.5" in result.stdout
    assert "[(b'AAPL', b'189.5'), (b'MSFT', b'410.2')]" in result.stdout
    assert "alice-secret" not in result.stderr
    after = result.stdout.split("--- authorization", 1)[1]
    assert "189.5" in after and "410.2" in after, after  # alice reads prices
    assert " 0 topics:" in after, after  # the anonymous client lists none
