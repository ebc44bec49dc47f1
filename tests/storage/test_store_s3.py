"""The log store on an s3:// location (moto's S3 server on loopback): topics created,
listed, altered, deleted and re-created; a writer that closes seals what it holds, so a
reader on another machine (another local directory) reads every record from the bucket;
the CLI with `--data-dir s3://...`; no secret in any output."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from compactlog import LogStore, ProducerRecord
from compactlog.backend import Location
from compactlog.errors import TopicExistsError, UnknownTopicError
from support.cli import ok, run
from support.s3_support import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    S3Server,
)


@pytest.fixture
def s3_env(s3: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    yield s3.env


@pytest.fixture
def where(s3: S3Server, s3_env: dict[str, str]) -> Location:
    return s3.location("store")


def records(count: int, prefix: str = "k") -> list[ProducerRecord]:
    return [ProducerRecord(f"{prefix}{i % 7}".encode(), f"v{i}".encode()) for i in range(count)]


def test_topics_are_created_listed_altered_deleted_and_recreated(
        where: Location, tmp_path: Path) -> None:
    with LogStore.open(where, local_dir=tmp_path / "a") as store:
        store.create_topic("prices", 2, {"cleanup.policy": "compact"})
        store.create_topic("orders")
        assert store.list_topics() == ["orders", "prices"]
        with pytest.raises(TopicExistsError):
            store.create_topic("prices")
        store.alter_topic("prices", {"segment.bytes": "2048"})
        store.append("orders", records(5))
        store.delete_topic("orders")
        assert store.list_topics() == ["prices"]
        with pytest.raises(UnknownTopicError):
            store.topic("orders")
        recreated = store.create_topic("orders", 3)
        assert len(recreated.partitions) == 3
        assert all(p.log_end_offset == 0 for p in recreated.partitions)
    # Another machine (another local directory) sees the same topics and config.
    with LogStore.open(where, read_only=True, local_dir=tmp_path / "b") as reader:
        assert reader.list_topics() == ["orders", "prices"]
        assert reader.topic("prices").config["segment.bytes"] == 2048
        with pytest.raises(UnknownTopicError):
            reader.topic("nope")


def test_a_closing_writer_seals_everything_into_the_bucket(where: Location,
                                                           tmp_path: Path) -> None:
    with LogStore.open(where, local_dir=tmp_path / "writer") as store:
        store.create_topic("t", 2, {"segment.bytes": "1024"})
        store.append("t", records(300))
        ends = [p.log_end_offset for p in store.topic("t").partitions]
        # The writer serves only what is in the bucket (its high watermark): the sealed
        # part, not the active segments that closing uploads.
        assert sum(p.high_watermark for p in store.topic("t").partitions) < sum(ends)
    assert sum(ends) == 300
    with LogStore.open(where, read_only=True, local_dir=tmp_path / "elsewhere") as reader:
        partitions = reader.topic("t").partitions
        assert [p.log_end_offset for p in partitions] == ends
        assert [p.high_watermark for p in partitions] == ends
        read = [p.read(0, 10_000, 1 << 30) for p in partitions]
        assert [[r.offset for r in got] for got in read] == [list(range(end)) for end in ends]
        assert sorted(r.value for got in read for r in got) == sorted(
            r.value for r in records(300))
        assert not any(p.logs for p in partitions)  # nothing came from a local log


def test_the_cli_on_s3(where: Location, s3_env: dict[str, str], tmp_path: Path) -> None:
    url = str(where)
    env = {**s3_env, "COMPACTLOG_LOCAL_DIR": str(tmp_path / "local"),
           "COMPACTLOG_DATA_DIR": url}
    ok(run(tmp_path, "topics", "create", "prices", "--partitions", "2",
           "--config", "cleanup.policy=compact", env=env))
    ok(run(tmp_path, "produce", "prices", stdin="AAPL\t1\nMSFT\t2\nAAPL\t3\n", env=env))
    assert not (tmp_path / "topics").exists()
    # Another machine: another local directory, the same bucket.
    other = {**env, "COMPACTLOG_LOCAL_DIR": str(tmp_path / "other")}
    listed = ok(run(tmp_path, "topics", "list", env=other))
    assert listed.split() == ["prices"]
    out = ok(run(tmp_path, "consume", "prices", "--format", "json", env=other))
    got = sorted((r["key"], r["value"]) for r in map(json.loads, out.splitlines()))
    assert got == [("AAPL", "1"), ("AAPL", "3"), ("MSFT", "2")]
    described = run(tmp_path, "--log-level", "debug", "topics", "describe", "prices", env=other)
    ok(described)
    for output in (described.stdout, described.stderr, listed, out):
        for secret in (SECRET_ACCESS_KEY, SESSION_TOKEN, ACCESS_KEY_ID):
            assert secret not in output


@pytest.mark.parametrize(("url", "says"), [
    ("s3a://bucket/x", "s3a://"),
    ("s3:/bucket/x", "one slash"),
    ("s3://Bad_Bucket/x", "invalid bucket name"),
])
def test_a_bad_url_is_one_clear_line(tmp_path: Path, url: str, says: str) -> None:
    result = run(tmp_path, "topics", "list", env={"COMPACTLOG_DATA_DIR": url})
    assert result.returncode != 0
    assert says in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())


def test_local_dir_default_is_per_url(where: Location, monkeypatch: pytest.MonkeyPatch,
                                      tmp_path: Path) -> None:
    from compactlog.storage.store import default_local_dir

    monkeypatch.delenv("COMPACTLOG_LOCAL_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = default_local_dir(where)
    second = default_local_dir(where.join("other"))
    assert first != second and first.is_relative_to(tmp_path)
    assert os.environ.get("AWS_SECRET_ACCESS_KEY") not in str(first)


def test_a_second_writer_on_one_prefix_is_fenced_not_merged(where: Location,
                                                            tmp_path: Path) -> None:
    """Two writers (two local directories) append to one partition on one prefix, so
    both assign the same offsets: the first seal commits, the second is refused with
    FencedError and its partition stops taking writes; the manifest never lists two
    records for one offset."""
    from compactlog.errors import FencedError
    from compactlog.storage.partition import Partition

    with LogStore.open(where, local_dir=tmp_path / "a") as first:
        first.create_topic("t", 1)
        a = first.topic("t").partitions[0]
        b = Partition(tmp_path / "b" / "0", "t", 0, lambda: a.config, writable=True,
                      volume=a.volume).open()
        try:
            a.append(records(5, "a"))
            b.append(records(5, "b"))  # offsets 0..4 again, on the other machine
            assert a.roll()
            with pytest.raises(FencedError, match="another writer"):
                b.roll()
            with pytest.raises(FencedError):
                b.append(records(1))
            segments = a.volume.document("manifest").load()
            assert segments is not None
            listed = segments.body["segments"]
            assert [(s["base_offset"], s["last_offset"]) for s in listed] == [(0, 4)]
            assert [r.value for r in a.read(0, 100, 1 << 20)] == [
                r.value for r in records(5, "a")]
        finally:
            b.close()


def test_a_damaged_downloaded_copy_is_fetched_again(where: Location, tmp_path: Path) -> None:
    """The read cache's copy is damaged after its download (a bad disk under the cache):
    the read fails with CorruptionError naming the object, the copy is dropped, and the
    next read downloads the object again and succeeds."""
    from compactlog.errors import CorruptionError

    with LogStore.open(where, local_dir=tmp_path / "writer") as store:
        store.create_topic("t", 1)
        store.append("t", records(50))
    with LogStore.open(where, read_only=True, local_dir=tmp_path / "reader") as reader:
        partition = reader.topic("t").partitions[0]
        expected = partition.read(0, 1000, 1 << 30)
        (info,) = partition.manifest.segments
        copy = partition.volume.path_of(f"segments/{info.file}")
        data = bytearray(copy.read_bytes())
        data[len(data) // 2] ^= 0xFF
        copy.write_bytes(bytes(data))
    with LogStore.open(where, read_only=True, local_dir=tmp_path / "reader") as reader:
        partition = reader.topic("t").partitions[0]
        with pytest.raises(CorruptionError, match="CRC32C"):
            partition.read(0, 1000, 1 << 30)
        assert partition.read(0, 1000, 1 << 30) == expected


def test_a_failed_delete_of_a_retired_object_never_fails_the_commit(
        where: Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Retention retires sealed segments; a later commit forgets them and deletes their
    objects. A DELETE that fails (StorageError from the store) is logged and left to the
    sweep: the commit stands, and the seal that made it goes on normally."""
    from compactlog.backend.s3.volume import ObjectVolume
    from compactlog.errors import StorageError

    with LogStore.open(where, local_dir=tmp_path / "w") as store:
        store.create_topic("t", 1, {"retention.bytes": "1", "file.delete.delay.ms": "0",
                                    "segment.bytes": "1024"})
        partition = store.topic("t").partitions[0]

        def refuse(self: ObjectVolume, relative: str) -> bool:
            raise StorageError(f"{relative}: DELETE failed: injected 500")

        monkeypatch.setattr(ObjectVolume, "remove", refuse)
        for round_ in range(4):
            store.append("t", records(20, f"r{round_}-"))
            partition.roll()  # its commit forgets retired files: their DELETE fails
            # Retention's own sweep reports the failed DELETE to its caller (the upkeep
            # logs it and retries), after its commit.
            with pytest.raises(StorageError, match="injected"):
                partition.apply_retention()
        assert partition.failed is None
        store.append("t", records(5, "last"))
        assert partition.roll()  # seals on: no seal was ever refused or fenced
        assert partition.log_end_offset == 85 and partition.failed is None


def test_a_topic_change_killed_at_its_commit_point_does_not_block_the_next(
        where: Location, s3: S3Server, tmp_path: Path) -> None:
    """A writer killed between the audit copy and current.json of a topic's metadata
    (backend/s3/document.py steps 3-4) leaves a claim on the next version; the next alter
    or create of that topic clears it and lands (update_document), and the next delete
    clears it and is refused once, for the caller to retry, instead of failing for
    good."""
    from typing import Any

    from compactlog.backend.s3.document import ObjectDocument
    from compactlog.errors import ConflictError
    from support.s3_support import FaultyClient

    class Killed(BaseException):
        pass

    def kill_at_the_commit_point(operation: str, kwargs: dict[str, Any]) -> None:
        if operation == "put_object" and kwargs["Key"].endswith("/current.json"):
            raise Killed

    def claim_next() -> None:
        document = ObjectDocument(FaultyClient(s3.client(), kill_at_the_commit_point),
                                  str(where.bucket), where.key("topics/t/meta"))
        snapshot = document.load()
        with pytest.raises(Killed):
            document.commit(snapshot.version if snapshot is not None else 0, {})

    with LogStore.open(where, local_dir=tmp_path / "local") as store:
        store.create_topic("t", 1)
        claim_next()
        store.alter_topic("t", {"retention.ms": "1000"})  # cleared and altered at once
        assert store.topic("t").config["retention.ms"] == 1000
        claim_next()
        with pytest.raises(ConflictError):
            store.delete_topic("t")
        store.delete_topic("t")
        claim_next()
        store.create_topic("t", 2)  # cleared and created at once
        assert len(store.topic("t").partitions) == 2
