"""Compaction I/O throttling (compaction/io_throttle.py), for what it promises: the
bytes a run reads and writes, over its wall time, stay within the cap; without a cap
nothing waits. The arithmetic on a fake clock, then real runs whose rate is taken from
their own counters (the report's bytes and duration), not from a stopwatch here."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from compactlog.compaction import CompactionReport
from compactlog.compaction.io_throttle import (
    IO_CAP_SPARK_CONF,
    IoThrottle,
    observe_read,
    per_task,
    throttled,
)
from compactlog.compaction.spark_service import SparkCompactionService
from compactlog.errors import UserError
from compactlog.server.cleaner import CleanerConfig
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.admin import Servers, create_topic, get, http, produce, server_config, wait_until
from support.fakes import FakeClock
from support.paths import ROOT
from support.spark import SPARK_TEST_CONF

MB = 1_000_000
TOPIC = "t"


def throttle_on(clock: FakeClock, cap: float) -> IoThrottle:
    return IoThrottle(cap, clock=clock, sleep=clock.advance)


def test_a_fast_reader_is_held_to_the_cap_over_its_run() -> None:
    clock = FakeClock()
    throttle = throttle_on(clock, 1 * MB)
    started = clock()
    for _ in range(2000):  # 64 KiB blocks, each read in 1 ms: 65 MB/s unthrottled
        clock.advance(0.001)
        throttle.observe(65536)
    elapsed = clock() - started
    # Unpaid at the end: at most one check interval's bytes (the module's invariant).
    assert throttle.read_bytes <= MB * (elapsed + throttle.check_interval_s)
    assert throttle.read_bytes / elapsed > 0.9 * MB
    assert throttle.throttled_s == pytest.approx(elapsed - 2.0, abs=0.5)


def test_reads_and_writes_count_against_one_cap() -> None:
    clock = FakeClock()
    throttle = throttle_on(clock, 100.0)
    started = clock()
    throttle.observe(500)  # 5 s of the cap at once: paid at once, not a period later
    assert clock() - started == pytest.approx(5.0) == throttle.throttled_s
    throttle.observe(500, written=True)
    assert (throttle.read_bytes, throttle.written_bytes) == (500, 500)
    assert throttle.throttled_s == pytest.approx(10.0)


def test_below_the_cap_nothing_waits() -> None:
    clock = FakeClock()
    throttle = throttle_on(clock, 1 * MB)
    for _ in range(100):
        clock.advance(0.1)
        throttle.observe(50_000)  # 0.5 MB/s
    assert throttle.throttled_s == 0.0 and throttle.read_bytes == 5 * MB


def test_without_a_cap_bytes_are_counted_and_nothing_waits() -> None:
    clock = FakeClock()
    throttle = throttle_on(clock, 0.0)
    with throttled(throttle):
        observe_read(10 * MB)
    observe_read(1)  # outside the block: reported to nothing
    assert (throttle.read_bytes, throttle.throttled_s) == (10 * MB, 0.0)


def test_a_runs_cap_is_split_between_the_tasks_running_at_once() -> None:
    assert per_task(8 * MB, 4) == 2 * MB
    assert per_task(8 * MB, 0) == 8 * MB
    assert per_task(0.0, 4) == 0.0


def test_the_cleaner_hands_its_cap_to_the_compaction_processes() -> None:
    config = CleanerConfig(io_max_bytes_per_s=5e6, spark_conf={"spark.driver.memory": "1g"})
    assert config.run_spark_conf() == {"spark.driver.memory": "1g",
                                       IO_CAP_SPARK_CONF: "5000000.0"}
    assert IO_CAP_SPARK_CONF not in CleanerConfig().run_spark_conf()


def _fill(store: LogStore, clock: FakeClock, partitions: int, records: int,
          config: dict[str, str] | None = None) -> None:
    """`records` 1 KiB incompressible values per partition, every key distinct (so the
    ledger written is as large as the segments read), in sealed segments of ~1 MiB,
    copied, not adopted (which writes nothing: compaction/adoption.py)."""
    store.create_topic(TOPIC, partitions, {
        "cleanup.policy": "compact", "segment.bytes": str(1 << 20),
        "min.compaction.lag.ms": "0", "parquet.compression": "none",
        "compaction.segment.adopt.min.bytes": "-1", **(config or {})})
    rng = random.Random(3)
    for partition in range(partitions):
        for start in range(0, records, 200):
            store.append(TOPIC, [ProducerRecord(b"k%d" % i, rng.randbytes(1024), (), clock.ms)
                                 for i in range(start, start + 200)], partition=partition)
        store.topic(TOPIC).partition(partition).roll()


def _compact(tmp: Path, cap: float, spark: SparkSession | None = None) -> CompactionReport:
    """Compact two partitions' 4 MiB each with `cap`: in this process without Spark
    (local[2]: two tasks at once), or as a Spark job on `spark` (local[2])."""
    clock = FakeClock()
    with LogStore.open(tmp, clock=clock) as store:
        _fill(store, clock, 2, 4000, {} if spark else {"compaction.without.spark": "true"})
        conf = {IO_CAP_SPARK_CONF: str(cap)} if cap else {}
        engine = {"spark.session": spark} if spark else {"spark.master": "local[2]"}
        service = SparkCompactionService(store, TOPIC, {
            **engine, "spark.conf": conf, "clock": clock})
        report = service.compact()
        assert service.started_session is None
        assert report.engine.startswith("Spark") is bool(spark), report.engine
        return report


def _assert_within(report: CompactionReport, cap: float) -> None:
    moved = report.io_read_bytes + report.io_written_bytes
    rate = moved / report.duration_s
    assert report.io_written_bytes >= report.total("bytes_out") > 4 * MB
    assert report.io_read_bytes >= report.total("bytes_in")
    # Two tasks at once, each at half the cap; the run's own plan and commit (and a
    # Spark job's fixed cost) only lower the rate, the last unpaid check interval of
    # each task raises it a little.
    assert 0.6 * cap < rate <= 1.25 * cap, f"{rate / MB:.1f} MB/s against {cap / MB} MB/s"
    assert report.throttled_s > 0


def test_a_capped_run_reads_and_writes_within_the_cap(tmp_path: Path) -> None:
    _assert_within(_compact(tmp_path, 8 * MB), 8 * MB)


@pytest.mark.slow
def test_a_capped_spark_job_reads_and_writes_within_the_cap(
    tmp_path: Path, spark: SparkSession
) -> None:
    _compact(tmp_path / "warm-up", 0.0, spark)  # the Python workers' imports
    _assert_within(_compact(tmp_path / "capped", 8 * MB, spark), 8 * MB)


def test_an_uncapped_run_is_counted_and_never_waits(tmp_path: Path) -> None:
    report = _compact(tmp_path, 0.0)
    assert report.io_read_bytes >= report.total("bytes_in") > 4 * MB
    assert report.throttled_s == 0.0


def test_a_bad_cap_is_refused(tmp_path: Path) -> None:
    with LogStore.open(tmp_path, clock=FakeClock()) as store:
        for text in ("fast", "-1"):
            service = SparkCompactionService(store, TOPIC, {
                "spark.master": "local[1]", "spark.conf": {IO_CAP_SPARK_CONF: text}})
            with pytest.raises(UserError, match=IO_CAP_SPARK_CONF):
                service.io_max_bytes_per_s()


def test_the_cap_is_a_documented_server_setting() -> None:
    from compactlog.cli.serve import COMPACTION_SETTINGS
    from compactlog.config import SERVER_COMPACTION_KEYS

    (key,) = SERVER_COMPACTION_KEYS
    assert key.name.split(".", 1)[1] in COMPACTION_SETTINGS
    assert key.kafka_default == "log.cleaner.io.max.bytes.per.second"
    reference = (ROOT / "docs" / "configuration.md").read_text()
    assert f"## `{key.name}`" in reference and IO_CAP_SPARK_CONF in reference


@pytest.mark.slow
def test_the_servers_cleaner_runs_within_its_cap(tmp_path: Path) -> None:
    """`[compaction] io_max_bytes_per_s` reaches the warm worker's run: its report, as
    the admin API gives it, keeps the cap and says how long its tasks slept."""
    servers = Servers(tmp_path)
    try:
        _run_on_a_server(servers, tmp_path)
    finally:
        servers.stop()


def _run_on_a_server(servers: Servers, tmp_path: Path) -> None:
    cap = 2 * MB
    server = servers.start(*server_config(tmp_path, enabled=False, spark_master="local[1]",
                                          spark_conf=SPARK_TEST_CONF, io_max_bytes_per_s=cap))
    create_topic(server, TOPIC, 1, {"cleanup.policy": "compact", "segment.bytes": "262144",
                                    "min.compaction.lag.ms": "0",
                                    "parquet.compression": "none"})
    rng = random.Random(5)
    produce(server, TOPIC, [(b"k%d" % i, rng.randbytes(1024)) for i in range(2000)], batch=200)
    status, started = http("POST", f"{server.admin_url}/v1/topics/{TOPIC}/compaction")
    assert status == 202, started
    run = wait_until(lambda: (r := get(server, f"/v1/compactions/{started['id']}"))["state"]
                     != "RUNNING" and r, "the run", timeout=300)
    assert run["state"] == "SUCCESS", run
    report = run["report"]
    moved = report["io_read_bytes"] + report["io_written_bytes"]
    assert moved > 4 * MB and report["throttled_s"] > 0
    # The run's duration holds its Spark start-up too: only the upper bound is sharp.
    assert moved / (report["duration_s"] - report["startup_s"]) <= 1.25 * cap
