"""A long-lived compaction worker keeps its Spark session's Python workers warm
(compaction/worker.py): Spark closes Python workers idle for a minute, and a run after
that waits for new ones to import the pipeline. While a session is kept, the worker
touches it (the factory's `keep_warm`) once nothing ran for `keep_warm_s`: never during
a run, never after close, and not at all for a factory that cannot.

With a stand-in factory (no JVM), then, slow, with Spark itself: after 75 idle seconds
the same Python worker processes run the next job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from compactlog.compaction import CompactionReport
from compactlog.compaction.worker import CompactionWorker
from compactlog.storage import LogStore
from support.paths import ROOT


class Session:
    def __init__(self) -> None:
        self.stopped = 0

    def stop(self) -> None:
        self.stopped += 1


class Service:
    def __init__(self, factory: Factory) -> None:
        self.factory = factory
        self.started_session = factory.session

    def compact(self, partitions: Any = None) -> CompactionReport:
        self.factory.running.set()
        self.factory.release.wait(5)
        self.factory.running.clear()
        return CompactionReport(topic="t", run_id="r", duration_s=0.0)


class Factory:
    """start_session, new_service and keep_warm, recording when each touch happened."""

    def __init__(self) -> None:
        self.session = Session()
        self.touched: list[float] = []
        self.touched_during_run = 0
        self.running = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def start_session(self, settings: dict[str, Any]) -> Session:
        return self.session

    def new_service(self, store: LogStore, topic: str, settings: Any) -> Service:
        return Service(self)

    def keep_warm(self, session: Session) -> None:
        assert session is self.session and not session.stopped
        self.touched_during_run += self.running.is_set()
        self.touched.append(time.monotonic())


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    with LogStore.open(tmp_path / "data"):
        pass
    return tmp_path / "data"


def wait_for(condition: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_idle_kept_session_is_touched_and_a_run_is_never_interrupted(
        data_dir: Path) -> None:
    factory = Factory()
    worker = CompactionWorker(data_dir, factory, {}, keep_warm_s=0.2)
    worker.warm_up()
    wait_for(lambda: len(factory.touched) >= 2)
    assert factory.touched[1] - factory.touched[0] >= 0.2 * 0.9  # not more often
    # A long run: no touch while it holds the worker, however long it takes.
    factory.release.clear()
    run = threading.Thread(target=worker.compact, args=("t", None))
    run.start()
    wait_for(factory.running.is_set)
    during = len(factory.touched)
    time.sleep(0.6)
    assert len(factory.touched) == during
    factory.release.set()
    run.join()
    wait_for(lambda: len(factory.touched) > during)
    assert factory.touched_during_run == 0
    worker.close()
    after_close = len(factory.touched)
    time.sleep(0.5)
    assert len(factory.touched) == after_close and factory.session.stopped == 1
    assert worker.touches == after_close


def test_a_session_started_by_a_run_is_kept_warm_too(data_dir: Path) -> None:
    """The server's worker starts no session before its first run (no warm_up): the
    session that run started is the one kept, and touched."""
    factory = Factory()
    worker = CompactionWorker(data_dir, factory, {}, keep_warm_s=0.1)
    assert not factory.touched
    worker.compact("t", None)
    wait_for(lambda: factory.touched)
    worker.close()


def test_a_factory_without_keep_warm_or_a_zero_interval_starts_no_thread(
        data_dir: Path) -> None:
    class Plain(Factory):
        keep_warm = None  # type: ignore[assignment]

    for factory, seconds in ((Plain(), 0.1), (Factory(), 0.0)):
        worker = CompactionWorker(data_dir, factory, {}, keep_warm_s=seconds)
        worker.warm_up()
        time.sleep(0.3)
        assert worker._keeper is None and not factory.touched
        worker.close()


# Run in a process of its own: its JVM must not be the test session's (close stops it).
SPARK_SCRIPT = """
import json, os, sys, time
from pathlib import Path
from compactlog.compaction.spark_service import SparkCompactionServiceFactory
from compactlog.compaction.worker import CompactionWorker

worker = CompactionWorker(Path(sys.argv[1]), SparkCompactionServiceFactory(),
                          {"spark.master": "local[2]"})
try:
    worker.warm_up()
    context = worker.settings["spark.session"].sparkContext

    def pids():
        return set(context.parallelize(range(2), 2).map(lambda _: os.getpid()).collect())

    before = pids()
    time.sleep(75)
    print(json.dumps({"touches": worker.touches, "before": sorted(before),
                      "after": sorted(pids())}))
finally:
    worker.close()
"""


@pytest.mark.slow  # 75 idle seconds: Spark closes idle Python workers after a minute
@pytest.mark.timeout(300)
def test_spark_keeps_the_same_python_workers_past_its_idle_minute(data_dir: Path) -> None:
    found = subprocess.run([sys.executable, "-c", SPARK_SCRIPT, str(data_dir)],
                           capture_output=True, text=True, timeout=240,
                           env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert found.returncode == 0, found.stderr[-3000:]
    result = json.loads(found.stdout.strip().splitlines()[-1])
    assert result["touches"] >= 1
    assert result["after"] == result["before"], result
