"""What a compaction covers and when it runs, as in Kafka's cleaner (issue 12):

- every segment but the active one, sealed or not yet sealed, whatever started the run;
- `compactlog compact` that finds another process' run on the same partitions waits for
  it and reports it;
- on a `compact,delete` topic, records older than retention.ms leave the compacted view
  on time alone, whether or not new records arrive.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from kafka import KafkaProducer

from compactlog.compaction.plan import plan_partition
from compactlog.compaction.scheduler import CompactionScheduler, SchedulerPolicy
from compactlog.server.cleaner import partition_load
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.cli import ENV, LOCAL, ok, run
from support.engines import compact
from support.fakes import FakeClock
from support.faultkit import read_all
from support.kafka_server import logged_server
from support.paths import TESTS_DIR

TESTS = TESTS_DIR
DAY_MS = 24 * 3600 * 1000


def test_compact_covers_rolled_segments_the_server_has_not_sealed_yet(
    tmp_path: Path
) -> None:
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic("t", 1, {"cleanup.policy": "compact", "segment.bytes": "2048",
                                    "min.compaction.lag.ms": "0"})
    settings = tmp_path / "server.toml"
    settings.write_text("upkeep_interval_s = 5.0\n")  # seals only every 5 s
    with logged_server(data, tmp_path / "server.log", "--config", str(settings)) as server:
        producer = KafkaProducer(bootstrap_servers=server.bootstrap, linger_ms=0)
        for i in range(60):
            producer.send("t", key=b"k%d" % (i % 10), value=b"v%03d" % i + b"." * 100).get(30)
        producer.close()
        with LogStore.open(data, read_only=True) as store:
            partition = store.topic("t").partition(0)
            rolled = [p for p in sorted(partition.log_dir.glob("*.log"))][:-1]
            active_base = int(sorted(partition.log_dir.glob("*.log"))[-1].stem)
        assert rolled, "the test needs rolled segments that upkeep has not sealed"
        done = ok(run(data, "compact", "t", *LOCAL, "--json", env=ENV, timeout=120))
        report = json.loads(done)
        (summary,) = report["partitions"]
        # Everything below the active segment as of the start is covered.
        assert summary["horizon"] == active_base - 1, summary
        assert not summary["rolled_unsealed"]


HELD_COMPACTOR = """
import pathlib, sys, time
tests, paused, release, data = sys.argv[1:]
sys.path.insert(0, tests)
import local_engine
from compactlog.compaction import load_factory
from compactlog.storage.store import LogStore
real = local_engine.LocalEngine._survivors
def held(*args, **kwargs):
    pathlib.Path(paused).touch()
    while not pathlib.Path(release).exists():
        time.sleep(0.01)
    return real(*args, **kwargs)
local_engine.LocalEngine._survivors = held
with LogStore.open(data, read_only=True) as store:
    load_factory("local_engine:LocalCompactionServiceFactory").new_service(
        store, "t", {}).compact()
"""


def test_compact_waits_for_another_processs_run_and_reports_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with LogStore.open(data) as store:
        store.create_topic("t", 2, {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"})
        store.append("t", [ProducerRecord(b"k%d" % i, b"v") for i in range(40)])
        for partition in store.topic("t").partitions:
            partition.roll()
    paused, release = tmp_path / "paused", tmp_path / "release"
    other = subprocess.Popen([sys.executable, "-c", HELD_COMPACTOR, str(TESTS), str(paused),
                              str(release), str(data)])
    try:
        deadline = time.monotonic() + 60
        while not paused.exists():
            assert other.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        cli = subprocess.Popen(
            [sys.executable, "-m", "compactlog", "--data-dir", str(data), "compact", "t",
             *LOCAL, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**__import__("os").environ, **ENV})
        time.sleep(1.0)
        assert cli.poll() is None, "compact must wait for the other run, not fail"
        release.touch()
        out, err = cli.communicate(timeout=120)
    finally:
        release.touch()
        other.wait(timeout=120)
    assert cli.returncode == 0, err
    report = json.loads(out)
    assert sorted(p["partition"] for p in report["partitions"]) == [0, 1]
    assert sum(p["records_in"] for p in report["partitions"]) == 40, report["partitions"]


def test_compact_delete_records_leave_the_view_on_time_alone(
    store: LogStore, clock: FakeClock
) -> None:
    store.create_topic("c", 1, {"cleanup.policy": "compact,delete", "retention.ms": str(DAY_MS),
                                "min.compaction.lag.ms": "0", "segment.bytes": "2048"})
    partition = store.topic("c").partition(0)
    store.append("c", [ProducerRecord(b"old%d" % i, b"v") for i in range(5)])
    clock.advance_ms(DAY_MS // 2)
    store.append("c", [ProducerRecord(b"new%d" % i, b"v") for i in range(5)])
    partition.roll()
    compact(store, "c", clock)
    assert len(read_all(partition, compacted=True)) == 10
    # No record arrives; the old ones pass retention.ms: they leave the view at once...
    clock.advance_ms(DAY_MS // 2 + 1)
    assert [r.key for r in read_all(partition, compacted=True)] == \
        [b"new%d" % i for i in range(5)]
    # ...and compaction becomes due for them (no dirty data: only retention).
    now_ms = clock.ms
    plan = plan_partition("c", 0, partition.directory, partition.manifest,
                          partition.manifest_version, partition.config, now_ms)
    assert plan.has_work and plan.ledger_expired and not plan.dirty
    load = partition_load("c", partition, now_ms)
    scheduler = CompactionScheduler(SchedulerPolicy(), clock)
    # One ledger file holds old and new records: not wholly expired yet (Kafka deletes a
    # segment once its newest record has expired), so no run is forced...
    assert "retention" not in scheduler.reasons(load, now_ms)
    clock.advance_ms(DAY_MS)
    load = partition_load("c", partition, clock.ms)
    assert "retention" in scheduler.reasons(load, clock.ms)
    report = compact(store, "c", clock)
    assert report.total("expired_removed") == 10
    assert read_all(partition, compacted=True) == []
