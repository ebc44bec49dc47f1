"""A partition's data files on S3 (backend/s3/volume.py) under faults injected by the proxy
of tests/support/s3_faults.py: a lost answer to the create-only PUT is recognised as this PUT's
own object (not "the name is taken"); a download cut short is read again; a name that
is really taken is refused and never replaced; errors name the object and never a
secret; the read cache evicts past its budget and a cached copy is never partial."""

from __future__ import annotations

from pathlib import Path

import pytest

from compactlog.backend import Location
from compactlog.backend.s3.volume import ObjectVolume, ReadCache
from compactlog.errors import StorageError
from support.s3_faults import (
    S3Proxy,
    fast,
    lost_answer,
    truncate,
)
from support.s3_support import (
    SECRET_ACCESS_KEY,
    SESSION_TOKEN,
    S3Server,
)


def volume_through(proxy: S3Proxy, tmp_path: Path,
                   location: Location | None = None) -> ObjectVolume:
    client = fast(proxy.env).boto3_client()
    location = location if location is not None else proxy.server.location("volume")
    return ObjectVolume(location, tmp_path / "cache", client,
                        ReadCache(tmp_path / "cache", 1 << 30))


def local_file(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_lost_answer_to_the_create_only_put_is_this_puts_own_object(
        s3_proxy: S3Proxy, tmp_path: Path) -> None:
    volume = volume_through(s3_proxy, tmp_path)
    s3_proxy.add(lost_answer(method="PUT", key=r"segments/a\.parquet$"))
    volume.publish(local_file(tmp_path, "a", b"A" * 1000), "segments/a.parquet")
    # botocore's retry met the object the first PUT created: recognised by its token.
    assert len(s3_proxy.requests("PUT", r"segments/a\.parquet$")) >= 2
    fresh = volume_through(s3_proxy, tmp_path / "other", volume.location)
    assert fresh.fetch("segments/a.parquet").read_bytes() == b"A" * 1000


def test_a_taken_name_is_refused_and_never_replaced(s3_proxy: S3Proxy, tmp_path: Path) -> None:
    volume = volume_through(s3_proxy, tmp_path)
    volume.publish(local_file(tmp_path, "first", b"first"), "ledger/x.parquet")
    second = local_file(tmp_path, "second", b"second")
    with pytest.raises(StorageError, match="the name is taken"):
        volume.publish(second, "ledger/x.parquet")
    assert not second.exists()
    fresh = volume_through(s3_proxy, tmp_path / "other", volume.location)
    assert fresh.fetch("ledger/x.parquet").read_bytes() == b"first"


def test_a_download_cut_short_is_read_again(s3_proxy: S3Proxy, tmp_path: Path) -> None:
    volume = volume_through(s3_proxy, tmp_path)
    data = bytes(range(256)) * 400
    volume.publish(local_file(tmp_path, "d", data), "segments/d.parquet")
    reader = volume_through(s3_proxy, tmp_path / "reader", volume.location)
    s3_proxy.add(truncate(method="GET", key=r"segments/d\.parquet$"))
    assert reader.fetch("segments/d.parquet").read_bytes() == data


def test_a_download_always_cut_short_fails_clearly_and_caches_nothing(
        s3_proxy: S3Proxy, tmp_path: Path) -> None:
    volume = volume_through(s3_proxy, tmp_path)
    volume.publish(local_file(tmp_path, "e", b"E" * 50_000), "segments/e.parquet")
    reader = volume_through(s3_proxy, tmp_path / "reader", volume.location)
    s3_proxy.add(truncate(method="GET", key=r"segments/e\.parquet$", count=None))
    with pytest.raises(StorageError) as raised:
        reader.fetch("segments/e.parquet")
    message = str(raised.value)
    assert "segments/e.parquet" in message and "GET" in message
    assert SECRET_ACCESS_KEY not in message and SESSION_TOKEN not in message
    cached = [p for p in (tmp_path / "reader").rglob("*") if p.is_file()]
    assert cached == []  # no partial copy, not even a temporary one


def test_a_missing_object_is_file_not_found(s3: S3Server, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    volume = ObjectVolume(s3.location("v"), tmp_path)
    with pytest.raises(FileNotFoundError):
        volume.fetch("segments/none.parquet")


def test_the_read_cache_evicts_the_least_recently_used(s3: S3Server, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env.items():
        monkeypatch.setenv(name, value)
    cache = ReadCache(tmp_path / "cache", max_bytes=2500)
    location: Location = s3.location("lru")
    writer = ObjectVolume(location, tmp_path / "w", cache=ReadCache(tmp_path / "w", 1 << 30))
    for name in "abc":
        writer.publish(local_file(tmp_path, name, name.encode() * 1000), f"segments/{name}")
    reader = ObjectVolume(location, tmp_path / "cache", cache=cache)
    a = reader.fetch("segments/a")
    reader.fetch("segments/b")
    reader.fetch("segments/a")  # a is now the most recently used
    reader.fetch("segments/c")  # over budget: b goes
    assert a.exists() and not reader.path_of("segments/b").exists()
    assert reader.fetch("segments/b").read_bytes() == b"b" * 1000  # downloaded again
