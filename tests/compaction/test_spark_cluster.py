"""Compaction on a real Spark standalone cluster: a master and one worker on 127.0.0.1,
started with scripts/spark-cluster.sh from the pip-installed pyspark. The result must
equal a local[*] run of the same topic, record for record."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactlog import LogStore, ProducerRecord
from compactlog.client.reader import Reader
from support.cli import ok, run
from support.paths import ROOT
from support.s3_support import (
    S3Server,
)
from support.spark import SPARK_TEST_CONF

pytestmark = pytest.mark.slow

SCRIPT = ROOT / "scripts" / "spark-cluster.sh"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    with started_cluster(tmp_path) as master:
        yield master


@contextlib.contextmanager
def started_cluster(tmp_path: Path) -> Iterator[str]:
    """A master and a worker; the worker (so its executors) inherits os.environ."""
    env = {**os.environ, "SPARK_CLUSTER_DIR": str(tmp_path / "spark-cluster"),
           "SPARK_MASTER_PORT": str(free_port()), "SPARK_MASTER_WEBUI_PORT": str(free_port()),
           "SPARK_WORKER_WEBUI_PORT": str(free_port()), "SPARK_WORKER_CORES": "2",
           "SPARK_WORKER_MEMORY": "2g"}
    started = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True,
                             text=True, timeout=180)
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert "is up with 1 worker" in started.stdout
        yield f"spark://127.0.0.1:{env['SPARK_MASTER_PORT']}"
    finally:
        stopped = subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True,
                                 text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        status = subprocess.run(["bash", str(SCRIPT), "status"], env=env, capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 1, "the master still answers after stop"


def make_topic(data: Path | str, local_dir: Path | None = None) -> None:
    with LogStore.open(data, local_dir=local_dir) as store:
        store.create_topic("t", partitions=3, config={
            "cleanup.policy": "compact", "segment.bytes": "4096",
            "min.compaction.lag.ms": "0"})
        for round_ in range(20):
            store.append("t", [
                ProducerRecord(b"k%d" % (i % 37), None if i % 11 == 0 else b"v%d-%d" % (round_, i))
                for i in range(50)])
        for partition in store.topic("t").partitions:
            partition.roll()


def compacted_view(data: Path | str, local_dir: Path | None = None
                   ) -> list[tuple[int, int, bytes | None, bytes | None]]:
    rows = []
    with LogStore.open(data, read_only=True, local_dir=local_dir) as store:
        for partition in range(3):
            reader = Reader(store, "t", partition, read_compacted=True)
            while batch := reader.poll(max_records=1000):
                rows += [(partition, r.offset, r.key, r.value) for r in batch]
    return rows


def test_compaction_on_a_standalone_cluster_equals_a_local_run(
        tmp_path: Path, cluster: str) -> None:
    make_topic(tmp_path / "cluster")
    shutil.copytree(tmp_path / "cluster", tmp_path / "local")
    conf = [arg for key, value in SPARK_TEST_CONF.items() if key != "spark.default.parallelism"
            for arg in ("--spark-conf", f"{key}={value}")]
    on_cluster = json.loads(ok(run(tmp_path / "cluster", "compact", "t", "--spark-master",
                                   cluster, *conf, "--json", timeout=600)))
    local = json.loads(ok(run(tmp_path / "local", "compact", "t", "--spark-master", "local[*]",
                              *conf, "--json", timeout=600)))
    # Everything but the ledger files' byte sizes, which differ by a byte or two between
    # runs (tombstone_since_ms holds each run's clock, and compresses a little differently).
    def summary(report: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in p.items() if k != "bytes_out"} for p in report["partitions"]]

    assert summary(on_cluster) == summary(local)
    assert sum(p["records_in"] for p in local["partitions"]) == 1000
    view = compacted_view(tmp_path / "cluster")
    assert view == compacted_view(tmp_path / "local")
    assert len(view) == sum(p["records_out"] for p in local["partitions"]) > 0


def test_compaction_of_an_s3_topic_on_a_standalone_cluster_equals_a_local_run(
        tmp_path: Path, s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers share nothing with the driver but the bucket: executors fetch their
    inputs from it and publish their ledger files to it (compaction/remote_files.py),
    with the AWS settings of their own environment; the driver commits."""
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    where = str(s3.location("cluster"))
    make_topic(where, tmp_path / "writer")
    make_topic(tmp_path / "local")
    conf = [arg for key, value in SPARK_TEST_CONF.items() if key != "spark.default.parallelism"
            for arg in ("--spark-conf", f"{key}={value}")]
    env = {"COMPACTLOG_DATA_DIR": where, "COMPACTLOG_LOCAL_DIR": str(tmp_path / "driver")}
    with started_cluster(tmp_path) as master:
        on_cluster = json.loads(ok(run(tmp_path, "compact", "t", "--spark-master", master,
                                       *conf, "--json", env=env, timeout=600)))
    local = json.loads(ok(run(tmp_path / "local", "compact", "t", "--spark-master",
                              "local[*]", *conf, "--json", timeout=600)))

    # Byte sizes differ (the two topics' records were appended at different times, and
    # their timestamps compress differently); records, keys, offsets and horizons do not.
    def summary(report: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in p.items() if k not in ("bytes_out", "bytes_in")}
                for p in report["partitions"]]

    assert summary(on_cluster) == summary(local)
    assert sum(p["records_in"] for p in local["partitions"]) == 1000
    # Offsets and records equal; read from the bucket by yet another local directory.
    assert compacted_view(where, tmp_path / "reader") == compacted_view(tmp_path / "local")
