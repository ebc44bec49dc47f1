"""`compactlog worker start/status/stop` and `compact` on the worker it leaves
(compaction/daemon.py; issue 13, part 4).

The steps of daemon.serve: 1-3 (bind, warm up, publish) in
test_a_worker_serves_compact_and_stops; 4 (one request at a time, the idle clock) in
test_an_idle_worker_stops_by_itself; 5 (clean up on leaving) in both, and on SIGTERM in
test_sigterm_stops_the_worker_and_removes_its_file. The real-Spark case, where the
point is the warm JVM, in test_compact_on_a_warm_spark_worker (slow)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactlog.compaction.daemon import WORKER_FILE, running_worker
from support.cli import ENV, TOPIC_CONFIG, ok, run
from support.spark import SPARK_TEST_CONF

LOCAL_ENGINE = ["--service", "local_engine:LocalCompactionServiceFactory"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pid: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid):
        assert time.monotonic() < deadline, f"worker {pid} still runs"
        time.sleep(0.05)


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    """A data directory with a compacted topic of 300 records in three batches (so that
    segments of 2 kB roll and there is something to compact); any worker left on it is
    stopped by its pid at the end."""
    data = tmp_path / "data"
    ok(run(data, "topics", "create", "prices", *TOPIC_CONFIG))
    produce(data, 0, 300)
    yield data
    info = running_worker(data)
    if info is not None:
        os.kill(info.pid, signal.SIGKILL)


def produce(data: Path, start: int, end: int) -> None:
    for first in range(start, end, 100):
        lines = "".join(f"k{i % 10}\tv{i}\n" for i in range(first, first + 100))
        assert run(data, "produce", "prices", stdin=lines).returncode == 0


def compact_json(data: Path) -> tuple[dict[str, Any], str]:
    done = run(data, "compact", "prices", "--json", env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_a_worker_serves_compact_and_stops(data: Path) -> None:
    started = ok(run(data, "worker", "start", *LOCAL_ENGINE, env=ENV, timeout=120))
    assert "compaction worker ready" in started
    info = running_worker(data)
    assert info is not None
    # A second start finds it and leaves it be.
    again = ok(run(data, "worker", "start", *LOCAL_ENGINE, env=ENV))
    assert f"already runs on {data} (pid {info.pid}" in again

    report, stderr = compact_json(data)
    assert f"warm compaction worker (pid {info.pid}" in stderr
    assert sum(p["records_in"] for p in report["partitions"]) > 0
    status = json.loads(ok(run(data, "worker", "status", "--json")))
    assert (status["pid"], status["runs"]) == (info.pid, 1)
    # --local runs it here, not on the worker.
    here = run(data, "compact", "prices", "--local", *LOCAL_ENGINE, env=ENV)
    assert here.returncode == 0 and "worker" not in here.stderr, here.stderr
    assert json.loads(ok(run(data, "worker", "status", "--json")))["runs"] == 1

    assert f"stopped the compaction worker (pid {info.pid})" in ok(run(data, "worker", "stop"))
    wait_gone(info.pid)
    assert not (data / WORKER_FILE).exists() and not Path(info.socket).exists()
    gone = run(data, "worker", "status")
    assert gone.returncode == 3 and "no compaction worker runs" in gone.stderr


def test_a_failed_run_is_reported_and_the_worker_goes_on(data: Path) -> None:
    ok(run(data, "worker", "start", *LOCAL_ENGINE, env=ENV, timeout=120))
    missing = run(data, "compact", "no-such-topic", env=ENV)
    # The run fails on the worker (an unknown topic): the CLI says so in one line.
    assert missing.returncode == 1, missing.stderr
    assert "compaction of no-such-topic on the worker failed" in missing.stderr
    assert "Traceback" not in missing.stderr
    report, _ = compact_json(data)
    assert sum(p["records_in"] for p in report["partitions"]) > 0
    ok(run(data, "worker", "stop"))


@pytest.mark.slow  # waits out an idle timeout: ~10 s
def test_an_idle_worker_stops_by_itself(data: Path) -> None:
    ok(run(data, "worker", "start", *LOCAL_ENGINE, "--idle-timeout", "1", env=ENV,
           timeout=120))
    info = running_worker(data)
    assert info is not None
    wait_gone(info.pid)
    assert not (data / WORKER_FILE).exists()
    assert "idle for 1 s: exiting" in (data / "compaction-worker.log").read_text()
    # Without a worker, compact runs in its own process again.
    done = run(data, "compact", "prices", *LOCAL_ENGINE, "--json", env=ENV)
    assert done.returncode == 0 and "worker" not in done.stderr, done.stderr


def test_sigterm_stops_the_worker_and_removes_its_file(data: Path) -> None:
    ok(run(data, "worker", "start", *LOCAL_ENGINE, env=ENV, timeout=120))
    info = running_worker(data)
    assert info is not None
    os.kill(info.pid, signal.SIGTERM)
    wait_gone(info.pid)
    assert not (data / WORKER_FILE).exists() and not Path(info.socket).exists()


@pytest.mark.slow  # starts a worker, kills it, starts another: ~14 s
def test_a_worker_that_died_is_ignored(data: Path) -> None:
    ok(run(data, "worker", "start", *LOCAL_ENGINE, env=ENV, timeout=120))
    info = running_worker(data)
    assert info is not None
    os.kill(info.pid, signal.SIGKILL)
    wait_gone(info.pid)
    assert running_worker(data) is None  # its file is left, but names a dead pid
    done = run(data, "compact", "prices", *LOCAL_ENGINE, "--json", env=ENV)
    assert done.returncode == 0, done.stderr
    # And a new worker replaces the stale file.
    ok(run(data, "worker", "start", *LOCAL_ENGINE, env=ENV, timeout=120))
    assert running_worker(data) is not None
    ok(run(data, "worker", "stop"))


def test_a_worker_that_cannot_start_says_why(tmp_path: Path) -> None:
    done = run(tmp_path / "data", "worker", "start", "--service", "no_such_module:Factory",
               env=ENV, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "exited with status" in done.stderr and "no_such_module" in done.stderr


@pytest.mark.slow
def test_compact_on_a_warm_spark_worker(data: Path) -> None:
    conf = [arg for key, value in SPARK_TEST_CONF.items()
            for arg in ("--spark-conf", f"{key}={value}")]
    ok(run(data, "worker", "start", "--spark-master", "local[1]", *conf, env=ENV,
           timeout=300))
    first, _ = compact_json(data)
    assert first["startup_s"] == 0 and "spark start-up" not in first["stages"]
    produce(data, 300, 600)
    second, _ = compact_json(data)
    assert second["startup_s"] == 0
    assert sum(p["records_in"] for p in second["partitions"]) > 0
    view = [json.loads(line) for line in ok(run(
        data, "consume", "prices", "--compacted", "--format", "json")).splitlines()]
    assert {r["key"]: r["value"] for r in view} == {f"k{i}": f"v{590 + i}" for i in range(10)}
    ok(run(data, "worker", "stop"))
