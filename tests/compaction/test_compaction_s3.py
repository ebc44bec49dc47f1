"""Compaction of a topic on an s3:// location (moto on loopback): the Arrow tasks fetch
their inputs from the bucket and publish their ledger files and deletion vectors to it
(compaction/remote_files.py), the driver commits by conditional PUT. Checked against an
oracle (the latest record of every key), from the writer's machine and from another
local directory; a failed upload commits nothing; of two compactions of one partition
from two machines, one wins and the other's commit conflicts."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from compactlog import LogStore, ProducerRecord, faults
from compactlog.backend import Location
from compactlog.backend.s3.volume import ObjectVolume, s3_client
from compactlog.compaction import TopicCompactionService, load_factory
from compactlog.errors import ConflictError, StorageError
from compactlog.storage.records import Record
from support.paths import ROOT
from support.s3_support import (
    S3Server,
)
from support.spark import SPARK_TEST_CONF

# The Spark service runs a Spark job even for these small runs (every run is one), so its
# executors' fetch and publish are what is tested.
COMPACT = {"cleanup.policy": "compact", "segment.bytes": "4096",
           "delete.retention.ms": "0", "min.cleanable.dirty.ratio": "0"}
Compactor = Callable[[LogStore, str], TopicCompactionService]
COMPACTLOG = str(ROOT / ".venv" / "bin" / "compactlog")


@pytest.fixture
def where(s3_env: S3Server) -> Location:
    return s3_env.location("compaction")


def local_service(store: LogStore, topic: str) -> TopicCompactionService:
    """The Spark service's Arrow tasks, run in this process (so faults reach them)."""
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    return factory.new_service(store, topic, {"engine": "arrow"})


def driver_service(store: LogStore, topic: str) -> TopicCompactionService:
    """A service that reads its inputs and writes its ledger where the driver runs, as
    a third-party engine may (no deletion vectors): runner steps 2 and 5a."""
    factory = load_factory("local_engine:LocalCompactionServiceFactory")
    return factory.new_service(store, topic, {})


class CliSparkService:
    """`compactlog compact` on local[2] in a process of its own, from another local
    directory: a Spark job whose Python workers inherit the AWS settings, as a cluster's
    executors get them from their environment. (The test run's shared Spark session
    started before these tests set the AWS variables, so its workers lack them.)"""

    def __init__(self, store: LogStore, topic: str, scratch: Path) -> None:
        self.store, self.topic, self.scratch = store, topic, scratch

    def compact(self) -> CliReport:
        conf = [arg for key, value in SPARK_TEST_CONF.items()
                for arg in ("--spark-conf", f"{key}={value}")]
        env = {**os.environ, "COMPACTLOG_DATA_DIR": str(self.store.location),
               "COMPACTLOG_LOCAL_DIR": str(self.scratch / "compactor")}
        done = subprocess.run([COMPACTLOG, "compact", self.topic, "--json", "--spark-master",
                               "local[2]", *conf], env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr
        for partition in self.store.topic(self.topic).partitions:
            partition.refresh()  # committed by the other process
        return CliReport(json.loads(done.stdout))


class CliReport:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def total(self, name: str) -> int:
        return sum(int(part[name]) for part in self.body["partitions"])


# The Spark job (a process of its own, ~25 s each) only in the slow run; the same task
# function runs in process in "inline-arrow".
@pytest.fixture(params=[pytest.param("spark", marks=pytest.mark.slow), "inline-arrow", "driver"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Compactor:
    if request.param == "spark":
        return lambda store, topic: CliSparkService(store, topic, tmp_path)  # type: ignore[return-value]
    return local_service if request.param == "inline-arrow" else driver_service


def produce(store: LogStore, topic: str, start: int, count: int, keys: int = 50) -> None:
    batch = []
    for i in range(start, start + count):
        value = None if i % 11 == 0 else f"v{i}".encode()
        batch.append(ProducerRecord(f"k{i % keys}".encode(), value))
    store.append(topic, batch)
    for partition in store.topic(topic).partitions:
        partition.roll()


def latest_by_key(store: LogStore, topic: str,
                  compacted: bool) -> dict[tuple[int, bytes], Record]:
    """The last record of every (partition, key), read from the compacted view or from
    the raw log."""
    found: dict[tuple[int, bytes], Record] = {}
    for partition in store.topic(topic).partitions:
        read = partition.read_compacted if compacted else partition.read
        offset = 0
        while batch := read(offset, 1000):
            for record in batch:
                assert record.key is not None
                found[(partition.index, record.key)] = record
            offset = batch[-1].offset + 1
    return found


def view(store: LogStore, topic: str) -> dict[tuple[int, bytes], Record]:
    return latest_by_key(store, topic, compacted=True)


def oracle(store: LogStore, topic: str) -> dict[tuple[int, bytes], Record]:
    """The latest live record of every key, from the raw log (tombstones dropped, as
    delete.retention.ms=0 drops them)."""
    latest = latest_by_key(store, topic, compacted=False)
    return {key: record for key, record in latest.items() if record.value is not None}


def list_keys(where: Location) -> list[str]:
    listed = s3_client().list_objects_v2(Bucket=str(where.bucket), Prefix=where.path + "/")
    return [item["Key"] for item in listed.get("Contents", [])]


def ledger_objects(s3: S3Server, where: Location) -> list[str]:
    return [key for key in list_keys(where) if "/ledger/" in key]


@pytest.mark.parametrize("dvs", ["false", "true", "adopt"])
def test_compaction_on_s3_keeps_the_latest_record_of_every_key(
        where: Location, s3: S3Server, tmp_path: Path, service: Compactor, dvs: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # adopt: deletion vectors, and dirty segments adopted into the ledger as they are
    # (compaction/adoption.py; copied within the bucket, remote_files.py step 3).
    copied: list[str] = []
    publish_copy = ObjectVolume.publish_copy

    def copy_and_note(volume: ObjectVolume, temp: Path, relative: str, source: str) -> None:
        copied.append(relative)
        assert source.startswith("segments/")
        publish_copy(volume, temp, relative, source)

    monkeypatch.setattr(ObjectVolume, "publish_copy", copy_and_note)
    config = {**COMPACT, "compaction.deletion.vectors": "false" if dvs == "false" else "true",
              "compaction.ledger.rewrite.live.fraction": "0.1",
              "compaction.segment.adopt.min.bytes": "0" if dvs == "adopt" else "-1",
              "compaction.segment.adopt.live.fraction": "0"}
    with LogStore.open(where, local_dir=tmp_path / "writer") as store:
        store.create_topic("t", 2, config)
        produce(store, "t", 0, 400)
        report = service(store, "t").compact()
        assert report.total("records_in") == 400
        assert view(store, "t") == oracle(store, "t")
        first = set(ledger_objects(s3, where))
        assert any(key.endswith(".parquet") for key in first)
        produce(store, "t", 400, 30)  # an incremental run over a few new records
        service(store, "t").compact()
        assert view(store, "t") == oracle(store, "t")
        if dvs != "false" and service is not driver_service:
            assert any(".dv-" in key for key in ledger_objects(s3, where))
        if dvs == "adopt" and service is not driver_service:
            adopted = [key for key in ledger_objects(s3, where)
                       if key.endswith("-adopted.parquet")]
            assert adopted
            if service is local_service:  # in this process: its copies are seen here
                assert {key.rpartition("/ledger/")[2] for key in adopted} <= {
                    relative.removeprefix("ledger/") for relative in copied}
        expected = oracle(store, "t")
    # Another machine: its own local directory, nothing but the bucket.
    with LogStore.open(where, read_only=True, local_dir=tmp_path / "reader") as reader:
        assert view(reader, "t") == expected


def test_a_file_the_engine_never_wrote_fails_the_run_before_its_commit(
        where: Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 5a: an engine that claims a ledger file it wrote nowhere (a buggy
    third-party service) fails the run; no manifest lists a missing object."""
    import compactlog.compaction.remote_files as remote_files

    def publish_nothing(task: dict[str, object], body: remote_files.TaskBody) -> dict[
            str, object]:
        result = remote_files.compact_on_volume(task, body)
        client = s3_client()
        for key in [k for k in list_keys(where) if "/ledger/" in k]:
            client.delete_object(Bucket=where.bucket, Key=key)
        return result

    with LogStore.open(where, local_dir=tmp_path / "w") as store:
        store.create_topic("t", 1, COMPACT)
        produce(store, "t", 0, 50)
        monkeypatch.setattr("compactlog.compaction.arrow_pipeline.compact_on_volume",
                            publish_nothing)
        with pytest.raises(StorageError, match="neither to the bucket"):
            local_service(store, "t").compact()
        assert store.topic("t").partitions[0].manifest.horizon is None


@pytest.mark.parametrize("nth", [1, 2])
def test_a_failed_upload_commits_nothing_and_a_rerun_succeeds(
        where: Location, tmp_path: Path, nth: int) -> None:
    with LogStore.open(where, local_dir=tmp_path / "w") as store:
        store.create_topic("t", 2, {**COMPACT, "segment.bytes": "1024"})
        produce(store, "t", 0, 300)
        seen = 0

        def fail_an_upload(point: str, path: str) -> None:
            nonlocal seen
            if point == "upload" and "ledger" in path:
                seen += 1
                if seen == nth:
                    raise OSError(5, "injected EIO on upload")

        before = [p.manifest.compaction for p in store.topic("t").partitions]
        with faults.injected(fail_an_upload), pytest.raises(Exception, match="injected"):
            local_service(store, "t").compact()
        for partition, compaction in zip(store.topic("t").partitions, before, strict=True):
            partition.refresh()
            assert partition.manifest.compaction == compaction
        assert seen >= nth
        local_service(store, "t").compact()
        assert view(store, "t") == oracle(store, "t")


def test_two_compactions_from_two_machines_one_wins(where: Location, tmp_path: Path) -> None:
    with LogStore.open(where, local_dir=tmp_path / "writer") as store:
        store.create_topic("t", 1, COMPACT)
        produce(store, "t", 0, 300)
        expected = oracle(store, "t")
    stalled = threading.Event()
    release = threading.Event()

    def stall_first_machine(point: str, path: str) -> None:
        if (point == "upload" and threading.current_thread().name == "machine-a"
                and not release.is_set()):
            stalled.set()
            release.wait(30)

    outcome: dict[str, BaseException | None] = {}

    def machine_a() -> None:
        try:
            with LogStore.open(where, read_only=True, local_dir=tmp_path / "a") as a:
                local_service(a, "t").compact()
            outcome["a"] = None
        except BaseException as error:  # the assertion below says what it must be
            outcome["a"] = error

    with faults.injected(stall_first_machine):
        thread = threading.Thread(target=machine_a, name="machine-a")
        thread.start()
        assert stalled.wait(30), outcome
        # Meanwhile machine B (another local directory, so another compaction lock)
        # compacts the same partition and commits.
        with LogStore.open(where, read_only=True, local_dir=tmp_path / "b") as b:
            local_service(b, "t").compact()
        release.set()
        thread.join(60)
    assert isinstance(outcome["a"], ConflictError), outcome
    with LogStore.open(where, read_only=True, local_dir=tmp_path / "c") as reader:
        assert view(reader, "t") == expected


@pytest.fixture(autouse=True)
def _no_leftover_injector() -> Iterator[None]:
    yield
    faults.install(None)
