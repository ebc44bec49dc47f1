"""Every command in README.md and docs/*.md runs as written and gives the answer its text
says, in a fresh directory, in the order the page gives it (issue 24).

tests/support/docs_blocks.py reads the pages' blocks and their `docs-test` markers. Here:
- every shell, Python and TOML block says how it is tested (a session here, a named
  test, the server's config loader, a benchmark's script and flags, or a reason not to);
- the README's main job (`scripts/demo.sh`) runs, and then each "Try next" command it
  prints, as printed;
- the README's `readme` session runs in one shell, as a user types it: the CLI block,
  the server block (kcat, the admin API, /metrics), then the Python example, whose
  `# prints:` lines must be what it prints;
- every server settings block parses with the server's own loader
  (cli/serve.py's load_settings), so a documented key cannot be a typo;
- every benchmark command names a script in bench/ and only flags that script defines.

Only the ports change: a free port for 9092 (the Kafka listener, through
COMPACTLOG_LISTEN where a command leaves it to the default) and for 9093 (the admin
API). Every server and worker a block starts is stopped by its pid afterwards, whatever
the block did.
"""

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
import time
from pathlib import Path

import pytest

from support.docs_blocks import ROOT, Block, printed, runnable_blocks, session

SESSIONS = ("readme", "demo", "querying", "server-acls")
DIRECTIVES = ("session", "by", "config", "bench", "skip")
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def user_env(**extra: str) -> dict[str, str]:
    """A user's shell after setup: .venv/bin first on PATH, no compactlog settings."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("COMPACTLOG_") and key != "PYTHONPATH"}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env['PATH']}"
    env.update(extra)
    return env


def stop_everything(cwd: Path, env: dict[str, str]) -> None:
    """Stop what the blocks started and left running: servers (server.json's pid) and
    warm compaction workers (`compactlog worker stop`)."""
    for info in cwd.rglob("server.json"):
        with contextlib.suppress(ValueError, KeyError, OSError):
            os.kill(int(json.loads(info.read_text())["pid"]), signal.SIGTERM)
    for data in {info.parent for info in cwd.rglob("topics")}:
        subprocess.run([str(VENV_BIN / "compactlog"), "--data-dir", str(data), "worker",
                        "stop"], env=env, capture_output=True, timeout=60, check=False)


def sections(output: str) -> dict[str, str]:
    """The output of each block of a session script, keyed by block name."""
    found: dict[str, str] = {}
    for part in output.split("=== block ")[1:]:
        name, _, text = part.partition("\n")
        found[name] = text
    return found


def notebook(blocks: list[Block]) -> str:
    """Python blocks that build on each other (a page's `spark`, `prices`, ...) as one
    program, each block's output after a `=== block NAME` line."""
    parts = []
    for block in blocks:
        assert block.lang == "python", block.name
        parts.append(f"print('=== block {block.name}', flush=True)\n{block.text}")
    return "\n".join(parts)


def session_script(blocks: list[Block], cwd: Path, ports: dict[str, str]) -> str:
    lines = ["set -eo pipefail"]
    for block in blocks:
        lines.append(f"echo '=== block {block.name}'")
        text = block.text
        for old, new in ports.items():
            text = text.replace(old, new)
        if block.lang == "python":
            source = cwd / f"block-{block.line}.py"
            source.write_text(text)
            lines.append(f"python {source.name}")
        else:
            lines.append(text)
    return "\n".join(lines) + "\n"


def test_every_block_says_how_it_is_tested() -> None:
    wrong = []
    for block in runnable_blocks():
        if block.directive not in DIRECTIVES:
            wrong.append(f"{block.name}: no docs-test marker ({', '.join(DIRECTIVES)}) "
                         "above the block")
        elif block.directive == "session" and block.argument not in SESSIONS:
            wrong.append(f"{block.name}: unknown session {block.argument!r}")
        elif block.directive == "by":
            test = ROOT / block.argument
            page = Path(block.page).name
            if not test.is_file():
                wrong.append(f"{block.name}: {block.argument} does not exist")
            elif page not in test.read_text() and Path(page).stem not in test.read_text():
                wrong.append(f"{block.name}: {block.argument} never reads {page}")
        elif block.directive == "config" and block.argument != "server":
            wrong.append(f"{block.name}: unknown config kind {block.argument!r}")
        elif block.directive == "skip" and len(block.argument.split()) < 3:
            wrong.append(f"{block.name}: a skipped block says why, in words")
        elif block.directive == "bench" and not block.text.strip():
            wrong.append(f"{block.name}: an empty benchmark block")
    assert not wrong, "\n".join(wrong)


def test_every_settings_block_parses_with_the_servers_loader(tmp_path: Path) -> None:
    from compactlog.cli.serve import load_settings

    blocks = [block for block in runnable_blocks() if block.directive == "config"]
    assert blocks
    for block in blocks:
        path = tmp_path / f"{block.line}.toml"
        path.write_text(block.text)
        load_settings(path)  # a UserError names the key, the type or the syntax


def test_every_benchmark_command_names_a_script_and_its_flags() -> None:
    blocks = [block for block in runnable_blocks() if block.directive == "bench"]
    assert blocks
    for block in blocks:
        text = block.text.replace("\\\n", " ")
        commands = [line.split("#", 1)[0] for line in text.split("\n")
                    if "bench/" in line.split("#", 1)[0]]
        assert commands, f"{block.name}: no bench/ command"
        for command in commands:
            script = re.search(r"(bench/\S+\.py)", command)
            assert script is not None, f"{block.name}: {command!r} runs no bench/ script"
            path = ROOT / script.group(1)
            assert path.is_file(), f"{block.name}: {script.group(1)} does not exist"
            source = path.read_text()
            for flag in re.findall(r"\s(--[a-z][a-z0-9-]*)", command.split(script.group(1), 1)[1]):
                assert f'"{flag}"' in source, f"{block.name}: {path.name} has no {flag}"


def run_session(blocks: list[Block], cwd: Path, env: dict[str, str],
                ports: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    script = session_script(blocks, cwd, ports)
    try:
        return subprocess.run(["bash", "-c", script], cwd=cwd, env=env, text=True,
                              capture_output=True, timeout=timeout, check=False)
    finally:
        stop_everything(cwd, env)


# Slow (about 2 minutes: Spark starts twice); the README's main job is the default run's
# (test_the_main_job_and_the_next_steps_it_prints), and its Python block's output too
# (tests/cli/test_cli_output.py).
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("kcat") is None, reason="needs kcat (scripts/setup.sh --dev)")
def test_the_readme_runs_as_written_in_its_order(tmp_path: Path) -> None:
    blocks = session("readme")
    assert [block.lang for block in blocks] == ["sh", "sh", "python"], blocks
    kafka, admin = str(free_port()), str(free_port())
    env = user_env(COMPACTLOG_LISTEN=f"127.0.0.1:{kafka}")
    done = run_session(blocks, tmp_path, env, {"9092": kafka, "9093": admin}, timeout=400)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = sections(done.stdout)
    cli, server, python = (out[block.name] for block in blocks)

    # The CLI block: the tombstone is in the log, and the compacted view keeps MSFT's
    # record and AAPL's tombstone (delete.retention.ms), not AAPL's 189.5.
    compacted = cli.split("\n")
    assert any('"key": "AAPL"' in line and '"value": null' in line for line in compacted)
    assert "SUCCESS" in cli or "Compacted prices" in cli, cli
    # The server block: kcat reads what both produced, the run on the server's worker
    # is reported, /metrics shows the compaction's samples, and the server stops cleanly.
    assert "AAPL 190.1" in server, server
    assert "compactlog_compaction" in server, server
    assert "compactlog stopped" in done.stderr + server, done.stderr[-2000:]
    # The Python block prints what it says it prints.
    assert python == printed(blocks[2]), python


def test_the_main_job_and_the_next_steps_it_prints(tmp_path: Path) -> None:
    (block,) = session("demo")
    assert block.text.strip() == "scripts/demo.sh"
    env = user_env()
    env["PATH"] = env["PATH"].split(os.pathsep, 1)[1]  # the demo does not activate .venv
    try:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "demo.sh")], cwd=tmp_path,
                              env=env, text=True, capture_output=True, timeout=400,
                              check=False)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "both equal the expected table" in done.stdout, done.stdout[-3000:]
        # The main job compacts as a Spark job, and says so, the JVM's start apart.
        assert re.search(r"the run took [\d.]+ s on Spark local\[\*\]: job \d+ \(1 stage, "
                         r"\d+ tasks?\)", done.stdout), done.stdout[-3000:]
        assert "starting Spark (its JVM and session) took" in done.stdout
        steps = done.stdout.split("Try next:", 1)[1].strip().split("\n")
        assert steps
        for step in steps:
            command = step.split("  #", 1)[0].strip()
            if not command or command.startswith("#"):  # a pointer to the docs
                continue
            ran = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, text=True,
                                 capture_output=True, timeout=300, check=False)
            assert ran.returncode == 0, f"{command!r}: {ran.stdout[-1500:]}{ran.stderr[-1500:]}"
            assert ran.stdout.strip(), f"{command!r} printed nothing"
    finally:
        stop_everything(tmp_path, env)


def make_querying_data(root: Path) -> None:
    """The data directory docs/querying.md says its examples ran on: topic `prices`, 4
    partitions, cleanup.policy=compact, 20,000 price updates over 300 symbols with some
    tombstones, compacted once, then 500 more updates (each symbol's last a price)."""
    from compactlog.storage.records import ProducerRecord
    from compactlog.storage.store import LogStore
    from local_engine import LocalCompactionService

    with LogStore.open(root / "compactlog-data") as store:
        store.create_topic("prices", 4, {"cleanup.policy": "compact",
                                         "min.compaction.lag.ms": "0"})
        store.append("prices", [
            ProducerRecord(b"SYM%d" % (i * 7 % 300),
                           None if i % 97 == 5 else b"%.2f" % (400 + i % 90))
            for i in range(20_000)])
        for partition in store.topic("prices").partitions:
            partition.roll()
        LocalCompactionService(store, "prices", {"engine": "arrow"}).compact()
        store.append("prices", [ProducerRecord(b"SYM%d" % (i % 300), b"%.2f" % (500 + i))
                                for i in range(500)])


@pytest.mark.slow
def test_the_querying_pages_spark_and_parquet_examples(tmp_path: Path) -> None:
    """The Spark data source, read_topic, the stream, the writer, and the plain Parquet
    readers of docs/querying.md, in one Python as a notebook runs them (each block uses
    the `spark` and `prices` of those before it). The DuckDB and Polars views and the
    Iceberg examples are tests/docs/test_docs_querying.py's and test_docs_iceberg.py's."""
    blocks = session("querying")
    make_querying_data(tmp_path)
    (tmp_path / "notebook.py").write_text(notebook(blocks))
    done = subprocess.run([sys.executable, "notebook.py"], cwd=tmp_path, env=user_env(),
                          text=True, capture_output=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = sections(done.stdout)
    first, state = out[blocks[0].name], out[blocks[1].name]
    assert "in the compacted view, 20500 in the raw log" in first, first
    assert "|partition|offset|" in first and "symbol" in first, first
    assert state.strip() == "300 symbols", state
    stream = out[next(b.name for b in blocks if "readStream" in b.text)]
    assert re.search(r"batch \d+: \d+ records", stream), stream
    parquet = out[next(b.name for b in blocks if "spark.read.parquet" in b.text)]
    assert "|partition|records|last_offset|" in parquet, parquet


SERVER_TOML = """\
[authorization]
enabled = true
super_users = ["User:ANONYMOUS", "User:admin"]  # the test's clients, as the page's
admin_tokens_file = "admin-tokens"              # super user ("+ SASL settings")
"""


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_the_server_pages_acl_and_admin_examples(tmp_path: Path) -> None:
    """docs/server.md's ACL examples (confluent-kafka's and kafka-python's admin clients,
    then `compactlog acls` beside the running server) and the admin API's compaction
    with a bearer token, against a server on ./data with the authorizer on. The page's
    clients connect as a super user over SASL; here that super user is the PLAINTEXT
    listener's User:ANONYMOUS, so the blocks run without SASL settings."""
    blocks = session("server-acls")
    kafka, admin = str(free_port()), str(free_port())
    (tmp_path / "server.toml").write_text(SERVER_TOML)
    (tmp_path / "admin-tokens").write_text("User:admin docs-test-token-0123456789\n")
    (tmp_path / "admin-tokens").chmod(0o600)
    env = user_env(TOKEN="docs-test-token-0123456789")
    compactlog = str(VENV_BIN / "compactlog")
    subprocess.run([compactlog, "--data-dir", "data", "topics", "create", "prices",
                    "--config", "cleanup.policy=compact"], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=120)
    server = subprocess.Popen(
        [compactlog, "--data-dir", "data", "serve", "--listen", f"127.0.0.1:{kafka}",
         "--admin-listen", f"127.0.0.1:{admin}", "--config", "server.toml"],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if (tmp_path / "data" / "server.json").exists() or server.poll() is not None:
                break
            time.sleep(0.2)
        assert server.poll() is None, server.stderr.read() if server.stderr else ""
        done = run_session(blocks, tmp_path, env, {"9092": kafka, "9093": admin},
                           timeout=400)
    finally:
        server.terminate()
        server.wait(timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = sections(done.stdout)
    confluent, _kafka_python, cli, api = (out[block.name] for block in blocks)
    assert "User:reporting" in confluent and "prices-" in confluent, confluent
    assert "User:app" in cli and "prices-" in cli, cli  # acls list: what applies
    assert '"id"' in api or "SUCCESS" in api, api
