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

from compactlog.storage.store import LogStore
from kafka_server import COMPACTLOG, logged_server
from test_cli import ok, run
from test_cli_compaction import ENV, LOCAL


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
