"""The CLI against a running server on the same data directory (issue 12, part 6):
`topics create`, `topics alter`, `produce`, `compact`, `consume` and
`compaction-status` work while `compactlog serve` runs, the write commands going through
the server; `compactlog serve --data-dir DIR` starts; with no server, everything works
as before (the rest of the CLI tests)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from compactlog.storage.store import LogStore
from support.admin import server_config
from support.cli import ENV, LOCAL, TOPIC_CONFIG, ok, run
from support.kafka_server import COMPACTLOG, logged_server
from support.spark import SPARK_TEST_CONF


def test_write_commands_go_through_a_running_server(tmp_path: Path) -> None:
    data = tmp_path / "data"
    ok(run(data, "topics", "create", "seed"))  # a data directory, before the server
    with logged_server(data, tmp_path / "server.log") as server:
        created = ok(run(data, "topics", "create", "prices", "-p", "2",
                         "-c", "cleanup.policy=compact", "-c", "min.compaction.lag.ms=0",
                         "-c", "segment.bytes=2048"))
        assert f"through the server at {server.bootstrap}" in created
        altered = ok(run(data, "topics", "alter", "prices", "-c", "delete.retention.ms=1000"))
        assert "through the server" in altered
        lines = "".join(f"k{i % 10}\tv{i}\n" for i in range(300))
        done = run(data, "produce", "prices", stdin=lines)
        assert done.returncode == 0, done.stderr
        assert "produced 300 record(s)" in done.stderr and "through the server" in done.stderr
        tombstone = run(data, "produce", "prices", stdin='{"key": "k3", "value": null}\n')
        assert tombstone.returncode == 0, tombstone.stderr
        compacted = json.loads(ok(run(data, "compact", "prices", *LOCAL, "--json", env=ENV,
                                      timeout=120)))
        assert sum(p["records_in"] for p in compacted["partitions"]) > 0
        status = json.loads(ok(run(data, "compaction-status", "prices", "--json")))
        assert {p["state"] for p in status["partitions"]} == {"SUCCESS"}
        view = [json.loads(line) for line in ok(run(
            data, "consume", "prices", "--compacted", "--format", "json")).splitlines()]
        latest = {r["key"]: r["value"] for r in view}
        assert latest["k3"] is None and latest["k9"] == "v299"
        # A bad value is refused as without a server, in one line.
        refused = run(data, "topics", "alter", "prices", "-c", "segment.bytes=nope")
        assert refused.returncode == 1 and "segment.bytes" in refused.stderr
        assert "Traceback" not in refused.stderr
        server.assert_running()
    with LogStore.open(data, read_only=True) as store:
        assert store.list_topics() == ["prices", "seed"]
        assert store.topic("prices").config["delete.retention.ms"] == 1000


def test_a_writer_that_is_not_a_server_is_named_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic("t")
        done = run(data, "produce", "t", stdin="k\tv\n")
    assert done.returncode == 1
    assert "in use by another writer" in done.stderr and "not a compactlog server" in \
        done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_serve_takes_data_dir_after_the_command_name(tmp_path: Path) -> None:
    data = tmp_path / "data"
    process = subprocess.Popen([COMPACTLOG, "serve", "--data-dir", str(data), "--listen",
                                "127.0.0.1:0", "--no-auto-compaction"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert re.search(r"serving on 127\.0\.0\.1:\d+", line), line
        assert (data / "server.json").exists()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    assert process.returncode == 0
    assert not (data / "server.json").exists()
    # And on the other commands: after the command name, the same as before it.
    assert ok(run(tmp_path / "unused", "topics", "list", "--data-dir", str(data))) == ""


def produce_keyed(data: Path, topic: str, start: int, count: int) -> None:
    lines = "".join(f"k{i % 10}\tv{i}\n" for i in range(start, start + count))
    done = run(data, "produce", topic, stdin=lines)
    assert done.returncode == 0, done.stderr


def test_compact_goes_to_the_running_servers_worker(tmp_path: Path) -> None:
    """With a server and its admin API on the data directory, `compact` asks the server's
    warm worker (the server's compaction settings: here the local engine); --local, or a
    Spark option, runs it in the CLI's own process as before."""
    data = tmp_path / "data"
    config = server_config(tmp_path, service="local_engine:LocalCompactionServiceFactory")
    with logged_server(data, tmp_path / "server.log", "--admin-listen", "127.0.0.1:0",
                       *config, env=ENV) as server:
        ok(run(data, "topics", "create", "prices", *TOPIC_CONFIG))
        produce_keyed(data, "prices", 0, 300)
        done = run(data, "compact", "prices", "--json", env=ENV, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"running server's compaction worker ({server.admin_url})" in done.stderr
        report = json.loads(done.stdout)
        assert sum(p["records_in"] for p in report["partitions"]) > 0
        assert "compaction run" in server.log() or "compacted" in server.log()

        produce_keyed(data, "prices", 300, 300)  # 3 kB: rolls a segment (2 kB) to compact
        here = run(data, "compact", "prices", "--local", *LOCAL, "--json", env=ENV,
                   timeout=120)
        assert here.returncode == 0, here.stderr
        assert "compaction worker" not in here.stderr
        assert sum(p["records_in"] for p in json.loads(here.stdout)["partitions"]) > 0

        # --local and --server contradict each other: one line, no traceback.
        both = run(data, "compact", "prices", "--local", "--server", server.admin_url or "")
        assert both.returncode == 2 and "do not go with --server" in both.stderr
        server.assert_running()


@pytest.mark.slow
def test_compact_beside_a_server_pays_no_spark_start_up(tmp_path: Path) -> None:
    """Real Spark: the first CLI compaction starts the server's worker, the second finds
    it warm (startup 0 in its report), and both finish with the topic compacted."""
    data = tmp_path / "data"
    config = server_config(tmp_path, spark_master="local[1]", spark_conf=SPARK_TEST_CONF)
    with logged_server(data, tmp_path / "server.log", "--admin-listen", "127.0.0.1:0",
                       *config, env=ENV) as server:
        ok(run(data, "topics", "create", "prices", *TOPIC_CONFIG))
        reports: list[dict[str, Any]] = []
        for start in (0, 300):
            produce_keyed(data, "prices", start, 300)
            done = run(data, "compact", "prices", "--json", env=ENV, timeout=300)
            assert done.returncode == 0, done.stderr
            reports.append(json.loads(done.stdout))
        assert all(sum(p["records_in"] for p in r["partitions"]) for r in reports)
        assert reports[1]["startup_s"] == 0 and "spark start-up" not in reports[1]["stages"]
        assert server.log().count("started compaction worker") == 1
        view = [json.loads(line) for line in ok(run(
            data, "consume", "prices", "--compacted", "--format", "json")).splitlines()]
        assert {r["key"]: r["value"] for r in view} == {f"k{i}": f"v{590 + i}"
                                                        for i in range(10)}
