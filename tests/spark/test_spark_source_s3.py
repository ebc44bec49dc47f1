"""The `compactlog` Spark data source and `read_topic` with `path` an s3:// URL (moto's S3
server on loopback).

One topic is written once for the module by a writer with its own local directory and
sealed into the bucket (a closing writer seals everything). Then:
- the plan: file tasks name the partition volume (an s3:// URL) and the file's relative
  name, never a path of the driver, and no task, plan or pickled reader holds a secret;
- the executor side without Spark: each planned file task, read in a process whose read
  cache is empty, gives the store's own records; a damaged object fails its task with
  an error naming the object (not the executor's cached copy);
- a writer still holding unsealed records: a reader on S3 plans the sealed part only;
- Spark (in a process of its own started with the AWS settings, as a worker would be:
  spark_s3_job.py): the raw view through the data source, through `read_topic` and
  through a streaming query (availableNow, several micro-batches) equals the store's
  reads; the compacted view after a Spark compaction on S3 too.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactlog.backend.s3 import volume as volume_module
from compactlog.errors import CorruptionError
from compactlog.spark.options import parse_read_options
from compactlog.spark.read import read_part
from compactlog.spark.read_plan import FilePart, TailPart, plan_read
from compactlog.spark.source import CompactlogReader
from compactlog.storage.records import ProducerRecord
from compactlog.storage.store import LogStore
from support.paths import SUPPORT_DIR, TESTS_DIR
from support.s3_support import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    S3Server,
)
from support.spark_source import millis

TOPIC = "prices"
PARTITIONS = 3
CONFIG = {"cleanup.policy": "compact", "segment.bytes": "2048", "min.compaction.lag.ms": "0",
          "compaction.deletion.vectors": "true",
          "compaction.ledger.rewrite.live.fraction": "0"}
SECRETS = (SECRET_ACCESS_KEY, SESSION_TOKEN, ACCESS_KEY_ID)
Row = list[Any]


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    yield s3.env


def produce(store: LogStore, start: int, count: int, keys: int = 40) -> None:
    for i in range(start, start + count):
        value = None if i % 23 == 7 else b"price-%d" % i  # every 23rd record a tombstone
        headers = (("source", b"feed-%d" % (i % 3)),) if i % 4 == 0 else ()
        store.append(TOPIC, [ProducerRecord(b"sym-%d" % (i % keys), value, headers)])


def write_topic(s3: S3Server, where: Path) -> str:
    url = str(s3.location("store"))
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3.env.items():
            patch.setenv(name, value)
        with LogStore.open(url, local_dir=where / "writer") as store:
            store.create_topic(TOPIC, PARTITIONS, CONFIG)
            produce(store, 0, 300)
    return url


@pytest.fixture(scope="module")
def topic_url(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A topic in the bucket, all sealed (the writer closed), with several segments."""
    return write_topic(s3, tmp_path_factory.mktemp("spark-s3"))


def row(partition: int, record: Any) -> Row:
    return [partition, record.offset, record.timestamp,
            None if record.key is None else record.key.hex(),
            None if record.value is None else record.value.hex(),
            [[key, None if value is None else value.hex()] for key, value in record.headers]]


def store_rows(url: str, local_dir: Path, view: str) -> list[Row]:
    """The view as the store's own reads give it, on another machine (local directory)."""
    found = []
    with LogStore.open(url, read_only=True, local_dir=local_dir) as store:
        for partition in store.topic(TOPIC).partitions:
            offset = 0
            while batch := (partition.read_compacted(offset, 100) if view == "compacted"
                            else partition.read(offset, 100)):
                found += [row(partition.index, record) for record in batch]
                offset = batch[-1].offset + 1
    return found


def arrow_rows(batches: Iterator[Any]) -> list[Row]:
    found = []
    for batch in batches:
        for item in batch.to_pylist():
            found.append([item["partition"], item["offset"], millis(item["timestamp"]),
                          None if item["key"] is None else item["key"].hex(),
                          None if item["value"] is None else item["value"].hex(),
                          [[h["key"], None if h["value"] is None else h["value"].hex()]
                           for h in item["headers"] or []]])
    return found


def test_file_tasks_name_the_bucket_and_carry_no_secret(topic_url: str,
                                                        s3_env: dict[str, str]) -> None:
    options = parse_read_options({"path": topic_url, "topic": TOPIC})
    parts = plan_read(options)
    files = [part for part in parts if isinstance(part, FilePart)]
    assert len(files) == len(parts) > PARTITIONS  # several segments; no tail on S3
    for part in files:
        spec = dict(part.volume)
        assert spec["kind"] == "s3" and spec["url"].startswith(topic_url + "/topics/")
        assert part.relative.startswith("segments/") and part.local_path is None
        assert part.where.startswith("s3://")
    # What Spark pickles: the reader (planning options) and each task.
    payloads = [pickle.dumps(parts), pickle.dumps(CompactlogReader(
        {"path": topic_url, "topic": TOPIC, "view": "compacted"}))]
    for payload in payloads:
        for secret in SECRETS:
            assert secret.encode() not in payload


def test_tasks_read_from_the_bucket_into_an_empty_cache(
        topic_url: str, s3_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    parts = plan_read(parse_read_options({"path": topic_url, "topic": TOPIC}))
    # An executor elsewhere: its own (empty) read cache, and no path of the driver.
    monkeypatch.setattr(volume_module, "_TASK_CACHE", [tmp_path / "executor-cache"])
    got = [r for part in parts for r in arrow_rows(read_part(part))]  # type: ignore[arg-type]
    assert got == store_rows(topic_url, tmp_path / "reader", "raw")
    assert any((tmp_path / "executor-cache").rglob("*.parquet"))


def test_a_damaged_object_fails_the_task_naming_the_object(
        s3: S3Server, s3_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    url = write_topic(s3, tmp_path)
    part = next(p for p in plan_read(parse_read_options({"path": url, "topic": TOPIC}))
                if isinstance(p, FilePart))
    bucket, key = part.where.removeprefix("s3://").split("/", 1)
    client = s3.client()
    body = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    body[len(body) // 2] ^= 0xFF  # outside damage: the object is replaced by another
    client.put_object(Bucket=bucket, Key=key, Body=bytes(body))
    monkeypatch.setattr(volume_module, "_TASK_CACHE", [tmp_path / "executor-cache"])
    with pytest.raises(CorruptionError) as caught:
        list(read_part(part))
    assert part.where in str(caught.value) and "executor-cache" not in str(caught.value)


def test_a_reader_on_s3_plans_the_sealed_part_only(
        s3: S3Server, s3_env: dict[str, str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(volume_module, "_TASK_CACHE", [tmp_path / "executor-cache"])
    url = str(s3.location("tail"))
    with LogStore.open(url, local_dir=tmp_path / "writer") as store:
        store.create_topic(TOPIC, 1, CONFIG)
        produce(store, 0, 100)
        partition = store.topic(TOPIC).partition(0)
        sealed_end = partition.manifest.sealed_end_offset
        assert 0 < sealed_end < partition.log_end_offset  # a tail on the writer's disk
        parts = plan_read(parse_read_options({"path": url, "topic": TOPIC}))
        assert not any(isinstance(part, TailPart) for part in parts)
        got = [r for part in parts for r in arrow_rows(read_part(part))]  # type: ignore[arg-type]
        assert [r[1] for r in got] == list(range(sealed_end))


def run_job(s3: S3Server, url: str, tmp: Path, *args: str
            ) -> dict[str, dict[str, list[Row]]]:
    # TMPDIR: the executors' read caches (and Spark's scratch) go under the test's tmp.
    (tmp / "job-tmp").mkdir()
    env = {**os.environ, **s3.env, "TMPDIR": str(tmp / "job-tmp"),
           "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS_DIR),
                                                       os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(SUPPORT_DIR / "spark_s3_job.py"), url, TOPIC,
                           *args], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    for secret in SECRETS:
        assert secret not in done.stdout and secret not in done.stderr
    result: dict[str, dict[str, list[Row]]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow  # a Spark job in a process of its own: ~25 s
def test_spark_reads_the_raw_topic_from_the_bucket(s3: S3Server, topic_url: str,
                                                   tmp_path: Path) -> None:
    result = run_job(s3, topic_url, tmp_path, "raw")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3.env.items():
            patch.setenv(name, value)
        expected = store_rows(topic_url, tmp_path / "reader", "raw")
    assert len(expected) == 300
    assert result["raw"]["source"] == expected
    assert result["raw"]["fast"] == expected
    assert result["raw"]["stream"] == expected


@pytest.mark.slow  # a Spark job in a process of its own: ~25 s
def test_spark_reads_the_compacted_view_from_the_bucket(s3: S3Server, tmp_path: Path) -> None:
    url = write_topic(s3, tmp_path)
    result = run_job(s3, url, tmp_path, "--compact", "compacted", "raw")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3.env.items():
            patch.setenv(name, value)
        with LogStore.open(url, read_only=True, local_dir=tmp_path / "check") as store:
            assert any(p.manifest.horizon is not None for p in store.topic(TOPIC).partitions)
        expected = store_rows(url, tmp_path / "reader", "compacted")
    assert len(expected) < 300
    assert result["compacted"]["source"] == expected
    assert result["compacted"]["fast"] == expected
    assert result["compacted"]["stream"] == expected
